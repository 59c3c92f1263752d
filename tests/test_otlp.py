"""The lab's OTLP export (latencykit.lab.otlp) to a collector on 127.0.0.1 that decodes what the
real OTLP/HTTP exporters send (protobuf, as a collector would)."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

import latencykit as lk
from latencykit.__main__ import main as latencykit_main
from latencykit.lab.otlp import exporting
from latencykit.testing import Behavior, FakeProvider

SECRET = "sk-otlp-secret-0123456789"


def _value(any_value: Any) -> Any:
    """The Python value of an OTLP ``AnyValue`` (strings, numbers, booleans)."""
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


class Collector:
    """An OTLP/HTTP receiver: keeps the span names, their attributes, and the metric names."""

    def __init__(self) -> None:
        self.spans: dict[str, dict[str, Any]] = {}
        self.metrics: set[str] = set()
        self.bodies: list[bytes] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                collector.receive(self.path, body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def receive(self, path: str, body: bytes) -> None:
        self.bodies.append(body)
        if path == "/v1/traces":
            traces = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            for resource in traces.resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        self.spans[span.name] = {a.key: _value(a.value) for a in span.attributes}
        elif path == "/v1/metrics":
            exported = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
            for resource in exported.resource_metrics:
                for scope in resource.scope_metrics:
                    self.metrics.update(metric.name for metric in scope.metrics)


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    found.thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()


@pytest.mark.anyio
async def test_the_lab_exports_spans_and_metrics_over_otlp(
    fake_provider: FakeProvider, collector: Collector
) -> None:
    fake_provider.script("exported", Behavior(output_tokens=3))
    llm = lk.LLM("openai/exported", api_base=fake_provider.base_url, api_key=SECRET)
    with exporting(collector.url):
        for _ in range(3):
            await llm.acompletion(messages=[{"role": "user", "content": "hi"}])
    # Shutting down flushed everything: the collector has decoded both signals.
    call = collector.spans["chat exported"]
    assert call["gen_ai.request.model"] == "exported"
    assert call["gen_ai.provider.name"] == "openai"
    assert "attempt openai/exported" in collector.spans
    assert {"gen_ai.client.operation.duration", "latencykit.attempts"} <= collector.metrics
    assert all(SECRET.encode() not in body for body in collector.bodies)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_latencykit_lab_otlp_sends_the_demo_to_the_collector(collector: Collector) -> None:
    argv = ["lab", "--rows", "hedge", "--requests", "20", "--concurrency", "5", "--scale", "0.01"]
    argv += [
        "--no-outage",
        "--no-streaming",
        "--no-turn",
        "--no-fast-lane",
        "--json",
        "-",
        "--otlp",
        collector.url,
    ]
    assert latencykit_main(argv) == 0
    assert collector.spans["chat lab-primary"]["server.address"] == "127.0.0.1"
    assert {"gen_ai.client.operation.duration", "latencykit.attempts"} <= collector.metrics
