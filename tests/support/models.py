"""A scripted model server on 127.0.0.1 speaking OpenAI Chat Completions, OpenAI Responses and
Anthropic Messages: it answers from a script of replies, each said once in the dialect of the path
asked, records every request, and misbehaves on demand. No network, no model.

    with ScriptedModels([call_tools([("echo_say", {"text": "hi"})]), answer("done")]) as models:
        ...  # point a client at models.url (ends in /v1; Anthropic's SDK wants models.root)

Without a script it plays a two-turn agent loop (the examples' test): asked first, it calls the
tools in `CALLS`; given their results, it answers with a sentence quoting them. A reply is a
`Reply`: text, tool calls and usage, or a misbehaviour (an error status, a redirect, a gzip body,
padding past a size cap, a cut tool call, arguments that are not JSON, another dialect).

It also answers `POST /v1/embeddings` (OpenAI's), from a deterministic embedder: each word,
lowercased and hashed, adds ±1 to one of 64 dimensions, and the sum is normalised (`embed`). Texts
that share words point the same way; no meaning is involved, so it proves the plumbing only.
Embeddings take no reply from the script (a run's chat script is unchanged by them); they take one
from `embed_script` when it has any left (a misbehaviour: status, raw body, gzip).

For crash tests: `replay=True` answers a request it has seen before (same path, same body) with
the reply it gave then, as a model at temperature 0 would, so a call made again after a kill
does not take the script's next reply; `hold(after=n)` keeps every request after the n-th
waiting, once recorded, until `release()` (a model call in flight for as long as a test needs).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.server import HttpServer

# The longest a held request waits for `release()` before it is answered anyway.
HOLD_LIMIT_S = 120.0

# The calls the model makes on its first turn: (tool name as the model sees it, arguments).
CALLS = [("echo_say", {"text": "hi"}), ("echo_say", {"text": 5})]

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
EMBEDDINGS = "/v1/embeddings"
DIALECTS = {CHAT: "openai_chat", RESPONSES: "openai_responses", MESSAGES: "anthropic"}
# The scripted embedder's size, and the words it ignores (they would make every text alike).
EMBED_DIMENSIONS = 64
_WORD = re.compile(r"[^\W_]+")
_STOP = frozenset(
    re.findall(
        r"\w+",
        "a an and are as at be by do for from has have how i in is it its me my of on or our "
        "she so that the their they this to was we what when where which who will with you your",
    )
)


@dataclass(frozen=True, kw_only=True)
class Usage:
    """What a reply says it used (which a lying model makes up)."""

    input: int = 10
    output: int = 5
    cached: int = 0


@dataclass(frozen=True, kw_only=True)
class Reply:
    """One scripted answer.

    `calls`: (name, arguments) of tool calls; arguments that are a string go out verbatim (cut or
    not JSON), anything else as JSON. `finish`: "length" says the reply was cut at max tokens.
    `status` other than 200 answers with that status (`headers` too) and an error body.
    `dialect`: answer in this endpoint kind whatever the path. `pad`: bytes of filler added to
    the text. `gzip`: the body goes gzip-compressed (Content-Encoding: gzip). `raw`: the body
    as it is, whatever the dialect (HTML from a proxy, say).
    """

    text: str | None = None
    calls: tuple[tuple[str, Any], ...] = ()
    usage: Usage = field(default_factory=Usage)
    finish: str | None = None
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    dialect: str | None = None
    pad: int = 0
    gzip: bool = False
    raw: bytes | None = None


def answer(text: str, *, usage: Usage | None = None) -> Reply:
    """A final answer."""
    return Reply(text=text, usage=usage or Usage())


def call_tools(calls: Iterable[tuple[str, Any]], *, usage: Usage | None = None) -> Reply:
    """A reply that calls these tools."""
    return Reply(calls=tuple(calls), usage=usage or Usage())


def cut_call(name: str, partial_arguments: str) -> Reply:
    """A reply cut at max tokens in the middle of a tool call's arguments."""
    return Reply(calls=((name, partial_arguments),), finish="length")


def failure(status: int, *, retry_after: str | None = None) -> Reply:
    """An error status (429 with `retry_after`, 500, 401, ...)."""
    headers = () if retry_after is None else (("Retry-After", retry_after),)
    return Reply(status=status, headers=headers)


def redirect(location: str, *, status: int = 307) -> Reply:
    """A redirect elsewhere."""
    return Reply(status=status, headers=(("Location", location),))


def oversized(size: int) -> Reply:
    """An answer of more than `size` bytes."""
    return Reply(text="big", pad=size)


def gzip_bomb(size: int) -> Reply:
    """A small gzip body that inflates past `size` bytes."""
    return Reply(text="bomb", pad=size, gzip=True)


def in_dialect(dialect: str, reply: Reply) -> Reply:
    """`reply` said in another endpoint kind than the path asked."""
    return replace(reply, dialect=dialect)


def _arguments(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args)


def _text(reply: Reply) -> str | None:
    if reply.text is None:
        return None
    return reply.text + " " * reply.pad if reply.pad else reply.text


def chat_reply(reply: Reply, model: str) -> dict[str, Any]:
    """`reply` as an OpenAI ChatCompletion."""
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": name, "arguments": _arguments(args)},
        }
        for i, (name, args) in enumerate(reply.calls)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": _text(reply)}
    if calls:
        message["tool_calls"] = calls
    finish = reply.finish or ("tool_calls" if calls else "stop")
    usage = reply.usage
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": usage.input,
            "completion_tokens": usage.output,
            "total_tokens": usage.input + usage.output,
            "prompt_tokens_details": {"cached_tokens": usage.cached},
        },
    }


def responses_reply(reply: Reply, model: str) -> dict[str, Any]:
    """`reply` as an OpenAI Responses `Response`."""
    output: list[dict[str, Any]] = [
        {
            "type": "function_call",
            "id": f"fc_{i}",
            "call_id": f"call_{i}",
            "name": name,
            "arguments": _arguments(args),
            "status": "completed",
        }
        for i, (name, args) in enumerate(reply.calls)
    ]
    text = _text(reply)
    if text is not None:
        output.append(
            {
                "type": "message",
                "id": "msg_2",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    cut = reply.finish == "length"
    usage = reply.usage
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": model,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage.input,
            "input_tokens_details": {"cached_tokens": usage.cached, "cache_write_tokens": 0},
            "output_tokens": usage.output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.input + usage.output,
        },
    }


def _input_of(args: Any) -> Any:
    """Anthropic's tool_use input is an object: a cut or non-JSON string goes as it parses."""
    if not isinstance(args, str):
        return args
    try:
        return json.loads(args)
    except ValueError:
        return {"_raw": args}


def messages_reply(reply: Reply, model: str) -> dict[str, Any]:
    """`reply` as an Anthropic `Message`."""
    content: list[dict[str, Any]] = []
    text = _text(reply)
    if text is not None:
        content.append({"type": "text", "text": text})
    content += [
        {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": _input_of(args)}
        for i, (name, args) in enumerate(reply.calls)
    ]
    stop = {"length": "max_tokens"}.get(
        reply.finish or "", "tool_use" if reply.calls else "end_turn"
    )
    usage = reply.usage
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            # Anthropic counts cache reads apart; `Usage.input` counts them as OpenAI does.
            "input_tokens": usage.input - usage.cached,
            "output_tokens": usage.output,
            "cache_read_input_tokens": usage.cached,
            "cache_creation_input_tokens": 0,
        },
    }


RENDER = {
    "openai_chat": chat_reply,
    "openai_responses": responses_reply,
    "anthropic": messages_reply,
}


def _results(path: str, body: dict[str, Any]) -> list[Any]:
    """The tool results the request carries back to the model, in its dialect."""
    if path == CHAT:
        return [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    if path == RESPONSES:
        items = body["input"] if isinstance(body["input"], list) else []
        return [i["output"] for i in items if i.get("type") == "function_call_output"]
    last = body["messages"][-1]
    blocks = last["content"] if isinstance(last["content"], list) else []
    return [b["content"] for b in blocks if b.get("type") == "tool_result"]


def agent_loop(path: str, body: dict[str, Any]) -> Reply:
    """The unscripted model: call `CALLS`, then answer quoting their results."""
    results = _results(path, body)
    if results:
        return answer("the tools said: " + " | ".join(str(r) for r in results))
    return call_tools(CALLS, usage=Usage(input=1, output=1))


def chat(body: dict[str, Any]) -> dict[str, Any]:
    return chat_reply(agent_loop(CHAT, body), body["model"])


def responses(body: dict[str, Any]) -> dict[str, Any]:
    return responses_reply(agent_loop(RESPONSES, body), body["model"])


def messages(body: dict[str, Any]) -> dict[str, Any]:
    return messages_reply(agent_loop(MESSAGES, body), body["model"])


ROUTES = {CHAT: chat, RESPONSES: responses, MESSAGES: messages}


def embed(text: str, dimensions: int = EMBED_DIMENSIONS) -> list[float]:
    """The scripted embedder: a hashed bag of words, normalised (a text of no words points
    along the first axis). A word's trailing `s` is dropped, so plurals meet."""
    vector = [0.0] * dimensions
    for found in _WORD.findall(text.lower()):
        if found in _STOP:
            continue
        word = found[:-1] if len(found) > 3 and found.endswith("s") else found
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        vector[int.from_bytes(digest[:4], "little") % dimensions] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if not norm:
        return [1.0] + [0.0] * (dimensions - 1)
    return [x / norm for x in vector]


def embeddings_reply(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI CreateEmbeddingResponse for a request `body` (input: a text or a list)."""
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else list(texts or [])
    dimensions = body.get("dimensions")
    size = dimensions if isinstance(dimensions, int) and dimensions > 0 else EMBED_DIMENSIONS
    tokens = sum(len(str(t).split()) for t in texts)
    return {
        "object": "list",
        "model": str(body.get("model", "scripted-embedder")),
        "data": [
            {"object": "embedding", "index": i, "embedding": embed(str(t), size)}
            for i, t in enumerate(texts)
        ],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _error_body(status: int) -> dict[str, Any]:
    return {"error": {"type": "scripted_error", "message": f"scripted status {status}"}}


class _Server(ThreadingHTTPServer):
    requests: list[tuple[str, dict[str, Any]]]
    headers_seen: list[dict[str, str]]
    script: list[Reply] | None
    embed_script: list[Reply]
    lock: threading.Lock
    replay: bool
    given: dict[str, Reply]  # with replay: what each request (path and body) was answered
    hold_after: int | None  # requests after this many wait for `released`
    held: int
    released: threading.Event


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if path not in DIALECTS and path != EMBEDDINGS:
            self.send_error(404)
            return
        with self.server.lock:
            self.server.requests.append((self.path, body))
            self.server.headers_seen.append({k.lower(): v for k, v in self.headers.items()})
            reply: Reply | None
            if path == EMBEDDINGS:
                scripted = self.server.embed_script
                reply = scripted.pop(0) if scripted else Reply()
            else:
                reply = self._reply(path, body)
            hold = self.server.hold_after is not None and (
                len(self.server.requests) > self.server.hold_after
            )
        if hold:
            self._wait_release()
        if reply is None:
            self._send(500, json.dumps(_error_body(500)).encode(), ())
            return
        if reply.status != 200:
            redirected = 300 <= reply.status < 400
            payload = b"" if redirected else json.dumps(_error_body(reply.status)).encode()
            self._send(reply.status, payload, reply.headers)
            return
        if reply.raw is not None:
            payload = reply.raw
        elif path == EMBEDDINGS:
            payload = json.dumps(embeddings_reply(body)).encode()
        else:
            render = RENDER[reply.dialect or DIALECTS[path]]
            payload = json.dumps(render(reply, str(body.get("model", "scripted")))).encode()
        headers = reply.headers
        if reply.gzip:
            payload = gzip.compress(payload, compresslevel=9)
            headers = (*headers, ("Content-Encoding", "gzip"))
        self._send(200, payload, headers)

    def _reply(self, path: str, body: dict[str, Any]) -> Reply | None:
        """The next reply (with the server's lock held); with replay, the one given before."""
        server = self.server
        seen = path + json.dumps(body, sort_keys=True)
        if server.replay and seen in server.given:
            return server.given[seen]
        script = server.script
        reply = agent_loop(path, body) if script is None else (script.pop(0) if script else None)
        if server.replay and reply is not None:
            server.given[seen] = reply
        return reply

    def _wait_release(self) -> None:
        with self.server.lock:
            self.server.held += 1
        try:
            self.server.released.wait(HOLD_LIMIT_S)
        finally:
            with self.server.lock:
                self.server.held -= 1

    def _send(self, status: int, payload: bytes, headers: Sequence[tuple[str, str]]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ScriptedModels(HttpServer):
    """Start with `with ScriptedModels(script) as models:`; `models.url` ends in /v1.

    `script`: the replies, each given once, in order (a request past its end answers 500);
    None: the unscripted agent loop. `requests` holds (path, body) of every request received,
    `headers_seen` their headers (lower-case names), in order. `replay`: a request seen before
    is answered as it was then, without taking a reply from the script. `embed_script`: replies
    (misbehaviours) for `/v1/embeddings`, each given once; past its end the embedder answers.
    """

    def __init__(
        self,
        script: Iterable[Reply] | None = None,
        *,
        replay: bool = False,
        embed_script: Iterable[Reply] = (),
    ) -> None:
        super().__init__(_Handler, server_class=_Server, name="models", poll_interval=0.05)
        assert isinstance(self._server, _Server)
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.headers_seen: list[dict[str, str]] = []
        self.script: list[Reply] | None = None if script is None else list(script)
        self._server.requests = self.requests
        self._server.headers_seen = self.headers_seen
        self._server.script = self.script
        self.embed_script: list[Reply] = list(embed_script)
        self._server.embed_script = self.embed_script
        self._server.lock = threading.Lock()
        self._server.replay = replay
        self._server.given = {}
        self._server.hold_after = None
        self._server.held = 0
        self._server.released = threading.Event()

    @property
    def _state(self) -> _Server:
        assert isinstance(self._server, _Server)
        return self._server

    def hold(self, *, after: int = 0) -> None:
        """Requests after the first `after` ever received wait, once recorded and their reply
        chosen, until `release()` (or the server stops, or `HOLD_LIMIT_S` passes)."""
        with self._state.lock:
            self._state.released.clear()
            self._state.hold_after = after

    def release(self) -> None:
        """Answer the held requests, and hold no more."""
        with self._state.lock:
            self._state.hold_after = None
            self._state.released.set()

    @property
    def held(self) -> int:
        """How many requests are waiting for `release()` now."""
        with self._state.lock:
            return self._state.held

    def _stop(self) -> None:
        self.release()  # a held handler would keep the server from closing
        super()._stop()

    @property
    def root(self) -> str:
        """`http://127.0.0.1:<port>`: Anthropic's SDK adds /v1 itself."""
        return super().url

    @property
    def url(self) -> str:
        return f"{super().url}/v1"

    def count(self, path: str | None = None) -> int:
        """How many requests arrived (to `path` only, when given)."""
        return sum(1 for asked, _ in self.requests if path is None or asked.split("?")[0] == path)
