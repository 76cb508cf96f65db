"""Long-term memory over HTTP on both backends: every route, refusals that point at the field
(a secret refused and never echoed), quotas and stale versions, the role actions, and another
tenant that sees and moves nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_reach_controller.api.app import create_app
from tests.integration.stack import api_client, components_for, key_for, write_tools

pytestmark = pytest.mark.asyncio

SUBJECT = "tenants/acme/users/7"  # a "/" in a subject: it is never a path segment
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
URL = "http://reach.test"


def entry(key: str = "city", text: str = "Lives in Wuhan", **more: Any) -> dict[str, Any]:
    return {"subject": SUBJECT, "type": "fact", "key": key, "text": text} | more


def pointers(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "invalid_request", answer.text
    return [e["pointer"] for e in answer.json()["errors"]]


async def test_every_route_writes_reads_searches_patches_and_forgets(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        components_for(database_url, write_tools(tmp_path, [])) as c,
        api_client(c) as api,
    ):
        created = await api.post("/v1/memory", json=entry())
        assert created.status_code == 201, created.text
        first = created.json()
        assert created.headers["etag"] == '"1"'
        assert created.headers["location"] == f"/v1/memory/{first['memory_id']}"
        assert {k: first[k] for k in ("subject", "origin", "untrusted", "written_by")} == {
            "subject": SUBJECT,
            "origin": "user",
            "untrusted": False,
            "written_by": "tester",
        }
        moved = await api.post("/v1/memory", json=entry(text="Lives in Oslo", pinned=True))
        again = await api.post("/v1/memory", json=entry(text="Lives in Oslo", pinned=True))
        assert (moved.status_code, again.status_code) == (200, 200), moved.text
        assert moved.json()["memory_id"] == first["memory_id"]
        assert (moved.json()["version"], again.json()["version"]) == (2, 2)  # unchanged: no write
        await api.post(
            "/v1/memory",
            json=entry(
                "channel",
                "Prefers email over phone calls",
                type="preference",
                value={"channel": "email"},
                confidence=0.8,
                expires_at="2999-01-01T00:00:00Z",
            ),
        )
        await api.post("/v1/memory", json=entry(subject="bob", text="Lives in Lima"))

        subjects = (await api.get("/v1/memory/subjects")).json()
        page = (await api.get("/v1/memory/subjects", params={"limit": 1})).json()
        rest = (await api.get("/v1/memory/subjects", params={"after": page["next_after"]})).json()
        listed = (await api.get("/v1/memory", params={"subject": SUBJECT})).json()["memories"]
        facts = (
            await api.get("/v1/memory", params={"subject": SUBJECT, "type": "fact,goal"})
        ).json()["memories"]
        found = (
            await api.get("/v1/memory/search", params={"subject": SUBJECT, "q": "email me?"})
        ).json()["memories"]
        one = await api.get(f"/v1/memory/{first['memory_id']}")
        patched = await api.patch(
            f"/v1/memory/{first['memory_id']}",
            json={"text": "Lives in Bergen", "value": {"city": "Bergen"}, "expires_at": None},
            headers={"If-Match": '"2"'},
        )
        stale = await api.patch(
            f"/v1/memory/{first['memory_id']}", json={"pinned": False}, headers={"If-Match": '"2"'}
        )
        forgotten = await api.delete(f"/v1/memory/{first['memory_id']}")
        gone = await api.get(f"/v1/memory/{first['memory_id']}")
        whole = await api.delete("/v1/memory", params={"subject": SUBJECT})
        left = (await api.get("/v1/memory", params={"subject": SUBJECT})).json()["memories"]
        bobs = (await api.get("/v1/memory", params={"subject": "bob"})).json()["memories"]

    assert subjects["subjects"] == [
        {"subject": "bob", "entries": 1, "updated_at": subjects["subjects"][0]["updated_at"]},
        {"subject": SUBJECT, "entries": 2, "updated_at": subjects["subjects"][1]["updated_at"]},
    ]
    assert subjects["next_after"] is None
    assert ([s["subject"] for s in page["subjects"]], page["next_after"]) == (["bob"], "bob")
    assert [s["subject"] for s in rest["subjects"]] == [SUBJECT]
    assert [m["key"] for m in listed] == ["channel", "city"]  # newest first
    assert listed[0]["value"] == {"channel": "email"}
    assert (listed[0]["confidence"], listed[0]["expires_at"]) == (0.8, "2999-01-01T00:00:00.000Z")
    assert [m["key"] for m in facts] == ["city"]
    assert [m["key"] for m in found] == ["channel"]
    assert found[0]["score"] > 0
    assert (one.status_code, one.headers["etag"], one.json()["pinned"]) == (200, '"2"', True)
    assert patched.status_code == 200, patched.text
    assert (patched.json()["text"], patched.json()["version"]) == ("Lives in Bergen", 3)
    assert patched.headers["etag"] == '"3"'
    assert (stale.status_code, stale.json()["code"]) == (412, "memory_changed")
    assert forgotten.status_code == 204
    assert (gone.status_code, gone.json()["title"]) == (404, "No such memory")
    assert (whole.status_code, whole.json()) == (200, {"forgotten": 1})
    assert left == []
    assert [m["text"] for m in bobs] == ["Lives in Lima"]  # another subject is left alone


async def test_bad_input_is_refused_with_pointers_and_a_secret_is_never_echoed(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        components_for(database_url, write_tools(tmp_path, [])) as c,
        api_client(c) as api,
    ):
        written = (await api.post("/v1/memory", json=entry())).json()
        url = f"/v1/memory/{written['memory_id']}"
        bodies = {
            "/body/type": entry(type="opinion"),
            "/body/text": entry(text="x" * 1001),
            "/body/key": entry(key="a b"),
            "/body/subject": entry(subject="bad\x07subject"),
            "/body/confidence": entry(confidence=1.5),
            "/body/colour": entry(colour="blue"),
            "/body/expires_at": entry(expires_at="tomorrow"),
        }
        answers = {p: await api.post("/v1/memory", json=b) for p, b in bodies.items()}
        nul = await api.post("/v1/memory", json=entry(text="a\x00b"))
        nan = await api.post(
            "/v1/memory",
            content=b'{"subject": "u", "type": "fact", "key": "k", "text": "t", "value": NaN}',
            headers={"Content-Type": "application/json"},
        )
        secret = await api.post("/v1/memory", json=entry(key="aws", text=f"my key {AWS_KEY}"))
        secret_value = await api.post("/v1/memory", json=entry(key="aws", value={"k": AWS_KEY}))
        reserved = await api.post("/v1/memory", json=entry(type="profile", key="name"))
        patches = {
            "/body/origin": {"origin": "model"},
            "/body/text": {"text": None},
            "/body/pinned": {"pinned": "maybe"},
            "/body": {},
            "/body/key": {"key": "other"},
        }
        patched = {p: await api.patch(url, json=b) for p, b in patches.items()}
        patched_secret = await api.patch(url, json={"text": f"now {AWS_KEY}"})
        unknown_type = await api.get("/v1/memory", params={"subject": SUBJECT, "type": "x,fact"})
        no_subject = await api.get("/v1/memory")
        # A NUL no database stores (Postgres refuses it even in a WHERE): refused before.
        nul_subject = await api.get("/v1/memory", params={"subject": "a\x00b"})
        nul_forget = await api.delete("/v1/memory", params={"subject": "a\x00b"})
        nul_id = await api.get("/v1/memory/a%00b")
        still = (await api.get(url)).json()

    for pointer, answer in answers.items():
        assert pointers(answer) == [pointer], answer.text
    assert pointers(nul) == ["/body/text"]
    assert pointers(nan) == ["/body/value"]
    assert pointers(secret) == ["/body/text"]
    assert pointers(secret_value) == ["/body/value"]
    assert pointers(patched_secret) == ["/body/text"]
    for refused in (secret, secret_value, patched_secret):
        assert AWS_KEY not in refused.text
        assert "secret" in refused.json()["errors"][0]["detail"]
    assert reserved.status_code == 201, reserved.text  # reserved for callers, and this is one
    for pointer, answer in patched.items():
        assert pointers(answer) == [pointer], answer.text
    assert pointers(unknown_type) == ["/query/type"]
    assert pointers(no_subject) == ["/query/subject"]
    assert pointers(nul_subject) == pointers(nul_forget) == ["/query/subject"]
    assert pointers(nul_id) == ["/path/memory_id"]
    assert (still["text"], still["version"]) == ("Lives in Wuhan", 1)  # no refusal wrote


async def test_quota_unknown_ids_and_a_malformed_if_match(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        components_for(database_url, write_tools(tmp_path, []), memory_per_subject=2) as c,
        api_client(c) as api,
    ):
        one = (await api.post("/v1/memory", json=entry("a"))).json()
        await api.post("/v1/memory", json=entry("b"))
        full = await api.post("/v1/memory", json=entry("c"))
        update = await api.post("/v1/memory", json=entry("a", text="Still fits: an update"))
        elsewhere = await api.post("/v1/memory", json=entry("c", subject="other"))
        nobody = "0190b2a4-0000-7000-8000-000000000000"
        missing = [
            await api.get(f"/v1/memory/{nobody}"),
            await api.patch(f"/v1/memory/{nobody}", json={"pinned": True}),
            await api.delete(f"/v1/memory/{nobody}"),
        ]
        garbled = await api.patch(
            f"/v1/memory/{one['memory_id']}", json={"pinned": True}, headers={"If-Match": "abc"}
        )
        wildcard = await api.patch(
            f"/v1/memory/{one['memory_id']}", json={"pinned": True}, headers={"If-Match": "*"}
        )
    assert full.status_code == 409, full.text
    assert full.json()["code"] == "memory_quota_exceeded"
    assert (update.status_code, elsewhere.status_code) == (200, 201)
    assert [m.status_code for m in missing] == [404, 404, 404]
    assert {m.json()["code"] for m in missing} == {"not_found"}
    assert (garbled.status_code, garbled.json()["code"]) == (412, "memory_changed")
    assert wildcard.status_code == 200, wildcard.text


async def test_another_tenant_sees_and_moves_nothing(database_url: str, tmp_path: Path) -> None:
    async with (
        components_for(database_url, write_tools(tmp_path, [])) as c,
        api_client(c) as api,
    ):
        mine = (await api.post("/v1/memory", json=entry())).json()
        url = f"/v1/memory/{mine['memory_id']}"
        other = await key_for(c, roles=("admin",), tenant="globex", name="eve")
        theirs = [
            await api.get(url, headers=other),
            await api.patch(url, json={"text": "Lives in Hell"}, headers=other),
            await api.patch(url, json={"origin": "user"}, headers=other),
            await api.delete(url, headers=other),
        ]
        listed = await api.get("/v1/memory", params={"subject": SUBJECT}, headers=other)
        found = await api.get(
            "/v1/memory/search", params={"subject": SUBJECT, "q": "Wuhan"}, headers=other
        )
        subjects = await api.get("/v1/memory/subjects", headers=other)
        forgotten = await api.delete("/v1/memory", params={"subject": SUBJECT}, headers=other)
        # Their own entry of the same subject and key is theirs: a new one, not mine.
        own = await api.post("/v1/memory", json=entry(text="Lives in Rome"), headers=other)
        still = (await api.get(url)).json()
        my_list = (await api.get("/v1/memory", params={"subject": SUBJECT})).json()["memories"]
    assert [t.status_code for t in theirs] == [404] * 4, [t.text for t in theirs]
    assert listed.json() == {"memories": []}
    assert found.json() == {"memories": []}
    assert subjects.json() == {"subjects": [], "next_after": None}
    assert forgotten.json() == {"forgotten": 0}
    assert own.status_code == 201, own.text
    assert own.json()["memory_id"] != mine["memory_id"]
    assert (still["text"], still["version"]) == ("Lives in Wuhan", 1)
    assert [m["memory_id"] for m in my_list] == [mine["memory_id"]]


async def test_roles_decide_who_reads_writes_and_forgets(sqlite_url: str, tmp_path: Path) -> None:
    async with (
        components_for(sqlite_url, write_tools(tmp_path, [])) as c,
        api_client(c) as api,
    ):
        written = (await api.post("/v1/memory", json=entry())).json()
        url = f"/v1/memory/{written['memory_id']}"
        routes = [
            ("read", "GET", "/v1/memory/subjects", None, None),
            ("read", "GET", "/v1/memory", {"subject": SUBJECT}, None),
            ("read", "GET", "/v1/memory/search", {"subject": SUBJECT, "q": "Wuhan"}, None),
            ("read", "GET", url, None, None),
            ("write", "POST", "/v1/memory", None, entry("goal", type="goal")),
            ("write", "PATCH", url, None, {"pinned": True}),
            ("forget", "DELETE", url, None, None),
            ("forget", "DELETE", "/v1/memory", {"subject": "nobody"}, None),
        ]
        allowed = {
            "viewer": {"read"},
            "approver": set(),
            "agent": {"read", "write"},
            "operator": {"read", "write", "forget"},
        }
        seen: dict[str, dict[str, set[int]]] = {}
        for role, may in allowed.items():
            headers = await key_for(c, roles=(role,), name=f"k-{role}")
            seen[role] = {"allowed": set(), "refused": set()}
            for what, method, path, params, body in routes:
                if what == "forget" and path == url:
                    continue  # the delete of the one entry goes last, for the operator only
                answer = await api.request(method, path, params=params, json=body, headers=headers)
                seen[role]["allowed" if what in may else "refused"].add(answer.status_code)
        deleted = await api.delete(url, headers=await key_for(c, roles=("operator",), name="o"))
        bare = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(c)), base_url=URL)
        async with bare:
            anonymous = [await bare.request(m, p, params=q, json=b) for _, m, p, q, b in routes]
    for role, codes in seen.items():
        assert codes["refused"] <= {403}, (role, codes)
        assert codes["allowed"] <= {200, 201}, (role, codes)
    assert seen["approver"]["allowed"] == set()
    assert deleted.status_code == 204
    assert {a.status_code for a in anonymous} == {401}, [a.text for a in anonymous]
