"""`reach controller --workers 2`: two processes on the same REST and gRPC ports. Both serve,
a key revoked through one is refused by every one of them, steps run through either, and
SIGTERM stops them all."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.e2e.processes import all_terminal, api, cluster, wait_until
from tests.e2e.test_cluster import plan, sink_tools
from tests.support.sink import Response, Sink

pytestmark = pytest.mark.e2e

WORKERS = 2
# Each worker re-reads a key's record at most every 2 s; twice that and more, for slow machines.
REVOKED_WITHIN_S = 10.0


def _one_client_per_worker(base_url: str, headers: dict[str, str]) -> dict[int, httpx.Client]:
    """A keep-alive client (so one connection, so one process) for every worker: new
    connections are opened until the kernel has handed one to each."""
    clients: dict[int, httpx.Client] = {}

    def connect() -> bool:
        client = httpx.Client(base_url=base_url, headers=headers, timeout=30)
        pid = client.get("/healthz").json()["process"]
        if pid in clients:
            client.close()
        else:
            clients[pid] = client
        return len(clients) == WORKERS

    wait_until(connect, within=30, what="a connection to every worker")
    return clients


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_workers_share_the_ports_and_a_revoked_key_is_refused_by_every_one(
    postgres_url: str, tmp_path: Path
) -> None:
    with Sink() as sink, cluster(tmp_path) as c:
        sink.script("/ledger", [Response(json={"ok": True})])
        tools = sink_tools(tmp_path, sink.url)
        ctl = c.controller(
            "controller", database_url=postgres_url, tools=tools, extra=["--workers", str(WORKERS)]
        )
        pids = ctl.info["workers"]
        assert len(pids) == WORKERS
        assert ctl.popen.pid not in pids
        admin = api(ctl)
        created = admin.post("/v1/keys", json={"name": "svc", "roles": ["admin"]})
        assert created.status_code == 201, created.text
        key = created.json()
        clients = _one_client_per_worker(
            f"http://{ctl.info['http']}", {"Authorization": f"Bearer {key['token']}"}
        )
        assert sorted(clients) == sorted(pids)
        for client in clients.values():
            assert client.get("/v1/tasks").status_code == 200

        # Steps submitted through both workers run, leased through either worker's gRPC.
        executor = c.executor("executor", controller=ctl)
        task_ids = [
            client.post("/v1/tasks", json=plan(5, 10 * n)).json()["task_id"]
            for n, client in enumerate(clients.values())
        ]
        done = wait_until(
            lambda: all_terminal(admin, task_ids), within=60, what="both workers' tasks to end"
        )
        assert {t["status"] for t in done} == {"succeeded"}

        revoked = admin.post(f"/v1/keys/{key['key_id']}/revoke")
        assert revoked.status_code == 200, revoked.text
        for pid, client in clients.items():
            wait_until(
                lambda client=client: client.get("/v1/tasks").status_code == 401,
                within=REVOKED_WITHIN_S,
                what=f"worker {pid} to refuse the revoked key",
            )
        for client in clients.values():
            client.close()
        admin.close()
        executor.terminate()

        ctl.popen.send_signal(signal.SIGTERM)
        assert ctl.popen.wait(timeout=60) == 0
        assert not [pid for pid in pids if _alive(pid)]


def test_workers_need_postgres(tmp_path: Path) -> None:
    with cluster(tmp_path) as c:
        proc = c._spawn(
            "controller",
            ["controller", "--workers", "2", "--database-url", f"sqlite:///{tmp_path}/x.db"],
        )
        assert proc.popen.wait(timeout=60) == 2
        assert "--workers needs Postgres" in proc.output()
