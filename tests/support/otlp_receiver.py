"""An OTLP/HTTP trace receiver on loopback: decodes what exporters POST to /v1/traces (protobuf).

    with otlp_receiver() as rx:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.url}
        ...
        rx.spans  # every span received so far, decoded
"""

from __future__ import annotations

import contextlib
import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class ReceivedSpan:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[str]
    start_ns: int
    end_ns: int


@dataclass
class Receiver:
    url: str
    spans: list[ReceivedSpan] = field(default_factory=list)

    def named(self, prefix: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name.startswith(prefix)]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _decode(body: bytes) -> list[ReceivedSpan]:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out = []
    for rs in req.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(ReceivedSpan(
                    name=s.name, service=str(resource.get("service.name")), trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(), parent_span_id=s.parent_span_id.hex(), kind=s.kind,
                    attributes={a.key: _value(a.value) for a in s.attributes},
                    events=[e.name for e in s.events], start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano))
    return out


@contextlib.contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    lock = threading.Lock()
    holder: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            spans = _decode(body) if self.path.endswith("/v1/traces") else []
            with lock:
                holder["rx"].spans.extend(spans)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder["rx"] = Receiver(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder["rx"]
    finally:
        server.shutdown()
        server.server_close()
