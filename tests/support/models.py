"""A scripted model server on 127.0.0.1 that speaks just enough OpenAI Chat Completions, OpenAI
Responses and Anthropic Messages for an agent loop: asked first, it calls tools; given their
results, it answers with a sentence quoting them. No network, no model, the vendors' own SDKs as
its clients."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.server import HttpServer

# The calls the model makes on its first turn: (tool name as the model sees it, arguments).
CALLS = [("echo_say", {"text": "hi"}), ("echo_say", {"text": 5})]


def _text_of(results: list[str]) -> str:
    return "the tools said: " + " | ".join(results)


def chat(body: dict[str, Any]) -> dict[str, Any]:
    results = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    if results:
        message: dict[str, Any] = {"role": "assistant", "content": _text_of(results)}
        finish = "stop"
    else:
        calls = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for i, (name, args) in enumerate(CALLS)
        ]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls"
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": body["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def responses(body: dict[str, Any]) -> dict[str, Any]:
    items = body["input"] if isinstance(body["input"], list) else []
    results = [i["output"] for i in items if i.get("type") == "function_call_output"]
    if results:
        text = _text_of(results)
        output: list[dict[str, Any]] = [
            {
                "type": "message",
                "id": "msg_2",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]
    else:
        output = [
            {
                "type": "function_call",
                "id": f"fc_{i}",
                "call_id": f"call_{i}",
                "name": name,
                "arguments": json.dumps(args),
                "status": "completed",
            }
            for i, (name, args) in enumerate(CALLS)
        ]
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": body["model"],
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": body.get("tools", []),
    }


def messages(body: dict[str, Any]) -> dict[str, Any]:
    last = body["messages"][-1]
    blocks = last["content"] if isinstance(last["content"], list) else []
    results = [b["content"] for b in blocks if b.get("type") == "tool_result"]
    if results:
        content: list[dict[str, Any]] = [{"type": "text", "text": _text_of(results)}]
        stop = "end_turn"
    else:
        content = [
            {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args}
            for i, (name, args) in enumerate(CALLS)
        ]
        stop = "tool_use"
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


ROUTES = {"/v1/chat/completions": chat, "/v1/responses": responses, "/v1/messages": messages}


class _Server(ThreadingHTTPServer):
    requests: list[tuple[str, dict[str, Any]]]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        route = ROUTES.get(self.path.split("?")[0])
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if route is None:
            self.send_error(404)
            return
        self.server.requests.append((self.path, body))
        payload = json.dumps(route(body)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ScriptedModels(HttpServer):
    """Start with `with ScriptedModels() as models:`; `models.url` ends in /v1."""

    def __init__(self) -> None:
        super().__init__(_Handler, server_class=_Server, name="models")
        assert isinstance(self._server, _Server)
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._server.requests = self.requests

    @property
    def url(self) -> str:
        return f"{super().url}/v1"
