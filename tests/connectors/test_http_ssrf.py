"""The http connector's SSRF guard end to end, with nothing leaving 127.0.0.1.

Destinations are refused before any connection (the real Sink records zero requests), admitted
by `allow_hosts`, re-checked on every redirect hop, and pinned to the address that was checked:
a scripted resolver that changes its answer (DNS rebinding) can never move a connection. Names
that need resolving go to a fake resolver, never to the system's DNS; the one public address
in it is only ever refused (it comes with a loopback one).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent_reach_connectors import ConnectorError, ToolCall
from agent_reach_connectors.http import HttpConnector
from tests.support.sink import Response, Sink

CANARY = "canary-5f0c2a"
PUBLIC = "93.184.216.34"  # only ever answered beside a loopback address, so never reached


def call(config: dict[str, Any], args: dict[str, Any] | None = None, **kw: Any) -> ToolCall:
    values: dict[str, Any] = {
        "tool": "order.query",
        "task_id": "task",
        "step_id": "s1",
        "args": args or {},
        "config": config,
        "idempotency_key": "task:s1",
        "attempt": 1,
        "max_attempts": 3,
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "traceparent": "",
        "timeout_s": 5.0,
    }
    values.update(kw)
    return ToolCall(**values)


class Resolver:
    """A scripted DNS: each name answers its scripted lists in turn (the last one repeats)."""

    def __init__(self, answers: dict[str, list[list[str]]] | None = None) -> None:
        self.answers = answers or {}
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append(host)
        script = self.answers.get(host)
        if not script:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        index = min(self.asked.count(host), len(script)) - 1
        return script[index]


FAKE_DNS = {
    "sink.test": [["127.0.0.1"]],
    "v6.test": [["::1"]],
    "meta.test": [["169.254.169.254"]],
    "corp.test": [["10.1.2.3"]],
    "mixed.test": [[PUBLIC, "127.0.0.1"]],
    "mapped.test": [["::ffff:127.0.0.1"]],
}


@pytest.fixture
def sink():
    with Sink() as s:
        yield s


@pytest.fixture
def other():
    with Sink() as s:
        yield s


@pytest.fixture
async def http():
    connector = HttpConnector(resolver=Resolver(FAKE_DNS))
    yield connector
    await connector.close()


async def failure(http: HttpConnector, tool_call: ToolCall) -> ConnectorError:
    with pytest.raises(ConnectorError) as info:
        await http.invoke(tool_call)
    return info.value


def port_of(sink: Sink) -> int:
    return int(sink.url.rsplit(":", 1)[1])


# URLs that reach the sink if nothing stops them (everything here is 127.0.0.1 or resolves to
# it); `{p}` is the sink's port.
SPELLINGS = [
    "http://127.0.0.1:{p}/x",
    "https://127.0.0.1:{p}/x",
    "http://2130706433:{p}/x",
    "http://0x7f000001:{p}/x",
    "http://0x7f.1:{p}/x",
    "http://127.1:{p}/x",
    "http://127.0.1:{p}/x",
    "http://017700000001:{p}/x",
    "http://127.0.0.1.:{p}/x",
    "http://%31%32%37.0.0.1:{p}/x",
    "http://127\u30020\u30020\u30021:{p}/x",
    "http://[::1]:{p}/x",
    "http://[::ffff:127.0.0.1]:{p}/x",
    "http://[::ffff:7f00:1]:{p}/x",
    "http://[0:0:0:0:0:ffff:7f00:1]:{p}/x",
    "http://0:{p}/x",
    "http://0.0.0.0:{p}/x",
    "http://0177.0.0.1:{p}/x",
    "http://[::]:{p}/x",
    "http://localhost:{p}/x",
    "http://LOCALHOST:{p}/x",
    "http://localhost.:{p}/x",
    "http://app.localhost:{p}/x",
    "http://evil.com@127.0.0.1:{p}/x",
    "http://user:pass@127.0.0.1:{p}/x",
    "http://evil.com\\@127.0.0.1:{p}/x",
    "http://sink.test:{p}/x",
    "http://v6.test:{p}/x",
    "http://mixed.test:{p}/x",
    "http://mapped.test:{p}/x",
    "http://meta.test/latest/meta-data/",
    "http://corp.test:{p}/x",
    "gopher://127.0.0.1:{p}/_x",
    "file:///etc/passwd",
]
# The URL parser cannot read these: refused as a bad URL, still before any connection.
UNPARSABLE = ["http://[::1:{p}/x", "http://[127.0.0.1]:{p}/x"]


async def test_special_destinations_are_refused_before_connecting(http, sink) -> None:
    tried = refused = 0
    for template in SPELLINGS + UNPARSABLE:
        url = template.format(p=port_of(sink))
        tried += 1
        error = await failure(http, call({"url": url}))
        expected = "connector_error" if template in UNPARSABLE else "destination_refused"
        assert (error.code, error.retryable, error.maybe_applied) == (expected, False, False), url
        if expected == "destination_refused":
            assert error.message.startswith("order.query: refused "), url
        refused += 1
    assert sink.requests() == []  # not one of them reached the sink
    print(f"\nSSRF through the connector: {tried} URLs tried, {refused} refused, 0 connected")


async def test_the_refusal_is_one_honest_sentence(http, sink) -> None:
    error = await failure(http, call({"url": f"{sink.url}/x"}))
    assert error.code == "destination_refused"
    assert error.message == (
        f"order.query: refused {sink.url}/x: 127.0.0.1 is a loopback address; "
        "add it to the tool's allow_hosts to permit it"
    )
    error = await failure(http, call({"url": f"http://sink.test:{port_of(sink)}/x"}))
    assert "sink.test resolves to 127.0.0.1, a loopback address" in error.message
    error = await failure(http, call({"url": "http://meta.test/latest/meta-data/"}))
    assert "the cloud metadata address" in error.message
    error = await failure(http, call({"url": "http://2130706433/"}))
    assert "2130706433 (127.0.0.1) is a loopback address" in error.message


async def test_names_refused_by_name_are_never_looked_up(sink) -> None:
    resolver = Resolver(FAKE_DNS)
    connector = HttpConnector(resolver=resolver)
    try:
        for url in ("http://localhost/", "http://x.localhost/", f"{sink.url}/", "http://[::1]/"):
            await failure(connector, call({"url": url}))
    finally:
        await connector.close()
    assert resolver.asked == []


# Allowlists -----------------------------------------------------------------------------------


async def test_an_allowlisted_address_is_reached(http, sink) -> None:
    p = port_of(sink)
    for url, allow in [
        (f"{sink.url}/a", ["127.0.0.1"]),
        (f"{sink.url}/b", [f"127.0.0.1:{p}"]),
        (f"{sink.url}/c", ["127.0.0.0/8"]),
        (f"http://2130706433:{p}/d", ["127.0.0.1"]),
        (f"http://sink.test:{p}/e", ["127.0.0.1"]),  # an address entry admits it by any name
        (f"http://sink.test:{p}/f", ["sink.test"]),
        (f"http://sink.test:{p}/g", ["*.test"]),
        (f"http://mapped.test:{p}/h", ["127.0.0.1"]),
    ]:
        assert await http.invoke(call({"url": url, "allow_hosts": allow})) == {}, url
    hosts = [(d.path, d.headers["host"]) for d in sink.requests()]
    assert hosts == [
        ("/a", f"127.0.0.1:{p}"),
        ("/b", f"127.0.0.1:{p}"),
        ("/c", f"127.0.0.1:{p}"),
        ("/d", f"2130706433:{p}"),
        ("/e", f"sink.test:{p}"),  # the Host header keeps the name; the connection is pinned
        ("/f", f"sink.test:{p}"),
        ("/g", f"sink.test:{p}"),
        ("/h", f"mapped.test:{p}"),
    ]


async def test_the_allowlist_admits_only_what_it_names(http, sink) -> None:
    p = port_of(sink)
    for url, allow in [
        (f"{sink.url}/x", [f"127.0.0.1:{p + 1 if p < 65535 else p - 1}"]),  # another port
        (f"{sink.url}/x", ["127.0.0.2", "10.0.0.0/8"]),
        (f"http://[::1]:{p}/x", ["127.0.0.1"]),
        (f"http://sink.test:{p}/x", ["other.test", "*.sink.test"]),
        (f"http://corp.test:{p}/x", ["127.0.0.1"]),
    ]:
        error = await failure(http, call({"url": url, "allow_hosts": allow}))
        assert error.code == "destination_refused", url
    assert sink.requests() == []


# Redirects ------------------------------------------------------------------------------------


def redirect(location: str, status: int = 302) -> Response:
    return Response(status=status, headers=(("Location", location),))


@pytest.mark.parametrize(
    "location",
    [
        "http://127.0.0.1:{q}/in",
        "http://localhost:{q}/in",
        "http://[::1]:{q}/in",
        "http://[::ffff:127.0.0.1]:{q}/in",
        "http://2130706433:{q}/in",
        "http://0x7f.1:{q}/in",
        "http://sink.test:{q}/in",
        "//127.0.0.1:{q}/in",
        "http://169.254.169.254/latest/meta-data/",
        "http://meta.test/latest/meta-data/",
        "file:///etc/passwd",
        "gopher://127.0.0.1:{q}/_x",
    ],
)
async def test_a_redirect_to_a_destination_not_allowed_is_refused_before_connecting(
    http, sink, other, location
) -> None:
    allow = [f"127.0.0.1:{port_of(sink)}"]
    sink.script("/go", [redirect(location.format(q=port_of(other)))])
    error = await failure(http, call({"url": f"{sink.url}/go", "allow_hosts": allow}))
    assert (error.code, error.retryable) == ("destination_refused", False)
    assert error.message.startswith("order.query: refused the redirect to ")
    assert len(sink.requests("/go")) == 1
    assert other.requests() == []  # the second port got nothing


async def test_an_allowed_redirect_is_followed_and_credentials_stay_home(
    http, sink, other, monkeypatch
) -> None:
    monkeypatch.setenv("SINK_TOKEN", CANARY)
    allow = [f"127.0.0.1:{port_of(sink)}", f"127.0.0.1:{port_of(other)}"]
    sink.script("/go", [redirect(f"{other.url}/in?x=1")])
    sink.script("/same", [redirect("/home")])
    other.script("/in", [Response(json={"landed": True})])
    config = {
        "url": f"{sink.url}/go",
        "allow_hosts": allow,
        "headers": {"Authorization": "Bearer t", "X-Key": "${env:SINK_TOKEN}", "X-Plain": "p"},
    }
    assert await http.invoke(call(config)) == {"landed": True}
    [landed] = other.requests("/in")
    assert landed.query == {"x": ["1"]}
    assert landed.key == "task:s1"  # the same idempotency key on every hop
    assert landed.headers["x-plain"] == "p"
    assert "authorization" not in landed.headers  # another origin: no credentials
    assert "x-key" not in landed.headers  # nor any header holding a secret
    assert await http.invoke(call({**config, "url": f"{sink.url}/same"})) == {}
    [home] = sink.requests("/home")
    assert home.headers["authorization"] == "Bearer t"  # the same origin keeps them
    assert home.headers["x-key"] == CANARY


async def test_redirect_methods_and_bodies(http, sink) -> None:
    allow = ["127.0.0.1"]
    sink.script("/303", [redirect("/after-303", 303)])
    sink.script("/307", [redirect("/after-307", 307)])
    sink.script("/302", [redirect("/after-302", 302)])
    for status in ("303", "307", "302"):
        config = {"method": "POST", "url": f"{sink.url}/{status}", "allow_hosts": allow}
        await http.invoke(call(config, {"amount": 5}))
    [see_other] = sink.requests("/after-303")
    assert (see_other.method, see_other.body) == ("GET", b"")
    [temporary] = sink.requests("/after-307")
    assert (temporary.method, temporary.json()) == ("POST", {"amount": 5})
    [found] = sink.requests("/after-302")
    assert found.method == "GET"


async def test_the_hop_limit_and_max_redirects_zero(http, sink) -> None:
    sink.script("/loop", [redirect("/loop")])
    config = {"url": f"{sink.url}/loop", "allow_hosts": ["127.0.0.1"], "max_redirects": 3}
    error = await failure(http, call(config))
    assert (error.code, error.retryable) == ("downstream_rejected", False)
    assert "still redirected after 3 redirects" in error.message
    assert len(sink.requests("/loop")) == 4
    error = await failure(http, call({**config, "max_redirects": 0}))
    assert error.message == "order.query: downstream answered 302 Found"
    assert len(sink.requests("/loop")) == 5


async def test_a_write_redirected_then_refused_may_have_been_applied(http, sink) -> None:
    sink.script("/pay", [redirect("http://127.0.0.1:9/receipt", 303)])
    config = {
        "method": "POST",
        "url": f"{sink.url}/pay",
        "allow_hosts": [f"127.0.0.1:{port_of(sink)}"],
    }
    error = await failure(http, call(config, {"amount": 5}))
    assert (error.code, error.maybe_applied) == ("destination_refused", True)
    sink.script("/put", [redirect("http://127.0.0.1:9/elsewhere", 307)])
    error = await failure(http, call({**config, "url": f"{sink.url}/put"}, {"amount": 5}))
    assert (error.code, error.maybe_applied) == ("destination_refused", False)


# DNS rebinding --------------------------------------------------------------------------------


async def test_the_connection_goes_to_the_checked_address_only(sink) -> None:
    # "rebind.test" exists only in this resolver: the system's DNS cannot resolve it, so the
    # request can only have arrived through the pinned address. The second answer would be
    # refused; it is never asked for within a call.
    resolver = Resolver({"rebind.test": [["127.0.0.1"], ["10.0.0.1"]]})
    connector = HttpConnector(resolver=resolver)
    config = {"url": f"http://rebind.test:{port_of(sink)}/x", "allow_hosts": ["127.0.0.1"]}
    try:
        assert await connector.invoke(call(config)) == {}
        assert resolver.asked == ["rebind.test"]
        [delivery] = sink.requests("/x")
        assert delivery.headers["host"] == f"rebind.test:{port_of(sink)}"
        error = await failure(connector, call(config))  # the next call asks again: now refused
    finally:
        await connector.close()
    assert "rebind.test resolves to 10.0.0.1, a private address" in error.message
    assert len(sink.requests()) == 1


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_a_rebinding_answer_never_moves_the_connection(tmp_path, sink, scheme) -> None:
    # Admitted at check time, refused afterwards: the first call is pinned to the address it
    # checked (over https, the name is still what TLS verifies), the next call asks again and
    # is refused before connecting. The name exists only in this resolver.
    resolver = Resolver({"rebind.test": [["127.0.0.1"], ["127.0.0.2"]]})
    with contextlib.ExitStack() as stack:
        if scheme == "https":
            port, trust, paths = stack.enter_context(tls_server(tmp_path, "rebind.test"))
        else:
            port, trust, paths = port_of(sink), None, None
        connector = HttpConnector(resolver=resolver, verify=trust)
        config = {"url": f"{scheme}://rebind.test:{port}/x", "allow_hosts": ["127.0.0.1"]}
        try:
            first = await connector.invoke(call(config))
            error = await failure(connector, call(config))
        finally:
            await connector.close()
    if scheme == "https":
        assert first == {"host": f"rebind.test:{port}"}
        assert paths == ["/x"]
    else:
        assert first == {}
        [delivery] = sink.requests()
        assert delivery.headers["host"] == f"rebind.test:{port}"
    assert resolver.asked == ["rebind.test", "rebind.test"]
    assert (error.code, error.maybe_applied) == ("destination_refused", False)
    assert "rebind.test resolves to 127.0.0.2, a loopback address" in error.message


async def test_the_first_address_that_accepts_is_used(sink) -> None:
    # Nothing listens on 127.0.0.2 at the sink's port (the connection is refused, so nothing
    # was sent): the next checked address is tried, as a dual-stack client would.
    dead = socket.socket()
    dead.bind(("127.0.0.2", 0))
    port = dead.getsockname()[1]
    dead.close()
    resolver = Resolver({"two.test": [["127.0.0.2", "127.0.0.1"]]})
    connector = HttpConnector(resolver=resolver)
    try:
        config = {"url": f"http://two.test:{port_of(sink)}/x", "allow_hosts": ["127.0.0.0/8"]}
        assert await connector.invoke(call(config)) == {}
        config = {"url": f"http://two.test:{port}/x", "allow_hosts": ["127.0.0.0/8"]}
        error = await failure(connector, call(config))
    finally:
        await connector.close()
    assert len(sink.requests("/x")) == 1
    assert error.code == "connection_error"


async def test_resolver_failures_are_classified(sink) -> None:
    async def slow(host: str, port: int) -> Sequence[str]:
        import asyncio

        await asyncio.sleep(5)
        return ["127.0.0.1"]

    resolvers: list[tuple[Callable[..., Any], str]] = [
        (Resolver({}), "connection_error"),
        (Resolver({"junk.test": [["not-an-address"]]}), "connection_error"),
        (slow, "timeout"),
    ]
    for resolver, code in resolvers:
        connector = HttpConnector(resolver=resolver)
        try:
            config = {"url": "http://junk.test/x", "timeout": 0.2}
            error = await failure(connector, call(config))
        finally:
            await connector.close()
        assert (error.code, error.maybe_applied) == (code, False)
        assert "junk.test" in error.message


# Secrets ----------------------------------------------------------------------------------


async def test_refusals_never_show_a_secret(http, sink, monkeypatch) -> None:
    monkeypatch.setenv("SINK_TOKEN", CANARY)
    monkeypatch.setenv("SINK_HOST", f"{CANARY}.localhost")
    for config in [
        {"url": f"{sink.url}/s/${{env:SINK_TOKEN}}?t=${{env:SINK_TOKEN}}"},
        {"url": "http://${env:SINK_HOST}/x"},
        {"url": "http://u:${env:SINK_TOKEN}@127.0.0.1/x"},
    ]:
        error = await failure(http, call(config))
        assert error.code == "destination_refused"
        assert CANARY not in error.message
        assert CANARY not in str(error)
    assert sink.requests() == []


# TLS: the pinned address, the verified name ------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def tls_server(directory: Path, name: str) -> Iterator[tuple[int, ssl.SSLContext, list[str]]]:
    """An HTTPS server on 127.0.0.1 with a certificate for `name` only, signed by a throwaway
    CA; yields its port, a client context trusting that CA, and the paths it was asked for."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=agent-reach test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign", cwd=directory)  # fmt: skip
    _openssl("req", *ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", f"/CN={name}",
             cwd=directory)  # fmt: skip
    (directory / "leaf.ext").write_text(
        f"subjectAltName=DNS:{name}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
        "extendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    _openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "leaf.pem", "-days", "1", "-extfile", "leaf.ext",
             cwd=directory)  # fmt: skip
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a reusable connection is there to be reused

        def do_GET(self) -> None:
            paths.append(self.path)
            data = json.dumps({"host": self.headers["Host"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(directory / "leaf.pem", directory / "leaf.key")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = server_side.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield (
            server.server_address[1],
            ssl.create_default_context(cafile=directory / "ca.pem"),
            paths,
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def test_tls_verifies_the_name_while_connecting_to_the_pinned_address(tmp_path) -> None:
    with tls_server(tmp_path, "tls.test") as (port, trust, paths):
        resolver = Resolver({"tls.test": [["127.0.0.1"]], "evil.test": [["127.0.0.1"]]})
        connector = HttpConnector(resolver=resolver, verify=trust)  # one pool, to reuse
        allow = ["127.0.0.1"]
        try:
            ok = await connector.invoke(
                call({"url": f"https://tls.test:{port}/a", "allow_hosts": allow})
            )
            # The same address under another name: the pooled connection (verified for tls.test)
            # must not be reused, and a new handshake for evil.test fails verification.
            wrong_name = await failure(
                connector, call({"url": f"https://evil.test:{port}/b", "allow_hosts": allow})
            )
            no_name = await failure(
                connector, call({"url": f"https://127.0.0.1:{port}/c", "allow_hosts": allow})
            )
            again = await connector.invoke(
                call({"url": f"https://tls.test:{port}/d", "allow_hosts": allow})
            )
        finally:
            await connector.close()
    assert ok == again == {"host": f"tls.test:{port}"}
    assert (wrong_name.code, wrong_name.maybe_applied) == ("connection_error", False)
    assert (no_name.code, no_name.maybe_applied) == ("connection_error", False)
    assert paths == ["/a", "/d"]
