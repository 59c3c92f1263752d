"""``latencykit lab --otlp``: the lab's telemetry, exported to an OTLP/HTTP collector.

The lab's calls go through ``latencykit.telemetry`` with the OpenTelemetry SDK and its OTLP/HTTP
exporters (the ``otlp`` extra: ``pip install 'latencykit[otlp]'``), so a local collector, Jaeger
or Grafana stack shows the demo's spans and metrics. Where they go: the ``--otlp`` URL, else the
SDK's own variables (``OTEL_EXPORTER_OTLP_ENDPOINT``, default ``http://localhost:4318``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["ENDPOINT_VARIABLE", "exporting"]

ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"
"""The SDK's variable for the collector's base URL; ``--otlp`` without a URL uses it."""


@contextlib.contextmanager
def exporting(endpoint: str | None) -> Iterator[None]:
    """Export latencykit's telemetry to the OTLP/HTTP collector at ``endpoint`` (a base URL:
    ``/v1/traces`` and ``/v1/metrics`` are added; ``None``: the SDK's environment variables)
    while the block runs; everything is flushed when it ends."""
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise RuntimeError(
            "latencykit lab --otlp needs the OpenTelemetry SDK and OTLP exporter: "
            "pip install 'latencykit[otlp]'"
        ) from exc

    from .. import telemetry

    base = None if endpoint is None else endpoint.rstrip("/")
    resource = Resource.create({"service.name": "latencykit-lab"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=None if base is None else f"{base}/v1/traces"))
    )
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=None if base is None else f"{base}/v1/metrics"),
        export_interval_millis=5_000,
    )
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    try:
        with telemetry.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider):
            yield
    finally:
        tracer_provider.shutdown()  # flushes the spans still batched
        meter_provider.shutdown()  # and exports the metrics one last time
