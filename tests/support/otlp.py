"""A real OTLP/HTTP trace receiver on 127.0.0.1: decodes the protobuf every exporter sends.

with OtlpReceiver() as otlp:
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp.url
    ...
    spans = otlp.spans()   # every span received so far, decoded
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.support.server import HttpServer

__all__ = ["OtlpReceiver", "ReceivedSpan"]

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status_code: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any] = field(default_factory=dict)
    instance: str = ""  # the resource's service.instance.id: which process sent it
    status_message: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)  # name and attributes of each


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    found = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=KINDS.get(span.kind, str(span.kind)),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        status_code=span.status.code,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        instance=str(resource.get("service.instance.id", "")),
                        status_message=span.status.message,
                        events=[
                            {"name": e.name, **{a.key: _value(a.value) for a in e.attributes}}
                            for e in span.events
                        ],
                    )
                )
    return found


class OtlpReceiver(HttpServer):
    """Accepts POST /v1/traces (application/x-protobuf, optionally gzip) and keeps the spans.

    Bodies are kept as received and decoded when `spans()` is asked, so a benchmark's load
    generator hosting the receiver does not pay for decoding while it measures.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bodies: list[bytes] = []
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        self.received_bytes = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                gzipped = self.headers.get("Content-Encoding") == "gzip"
                with receiver._lock:
                    receiver.requests += 1
                    receiver.received_bytes += len(body)
                    if self.path == "/v1/traces":
                        receiver._bodies.append(gzip.decompress(body) if gzipped else body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        super().__init__(Handler, name="otlp")

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            bodies, self._bodies = self._bodies, []
            for body in bodies:
                self._spans.extend(decode(body))
            return list(self._spans)
