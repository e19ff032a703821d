"""OpenTelemetry tracing and metrics, set up once per process.

By default nothing is exported (the API's no-op providers stay in place, so
instruments cost almost nothing); `exporter = "console"` or `"otlp"` in a
service's config turns export on, and `prometheus=True` (a service with a
`metrics_port`) makes the `sf_*` metrics readable at `/metrics` through
OpenTelemetry's Prometheus exporter (see libs/metrics_http.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from opentelemetry import metrics, trace

Exporter = Literal["none", "console", "otlp"]
_configured = False


def setup(service_name: str, exporter: Exporter = "none", otlp_endpoint: str = "", *,
          prometheus: bool = False) -> None:
    """Once per process: the first call that asks for any export decides (providers cannot be replaced)."""
    global _configured
    if _configured or (exporter == "none" and not prometheus):
        return
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({"service.name": f"statefleet-{service_name}"})
    readers: list[MetricReader] = []
    if prometheus:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers.append(PrometheusMetricReader())  # registers with prometheus_client's default registry
    if exporter != "none":
        readers.append(PeriodicExportingMetricReader(_exporters(exporter, otlp_endpoint, resource),
                                                     export_interval_millis=15_000))
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
    _configured = True


def _exporters(exporter: Exporter, otlp_endpoint: str, resource):
    """Set up span export and return the metric exporter, for "console" or "otlp"."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if exporter == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        span_exporter, metric_exporter = ConsoleSpanExporter(), ConsoleMetricExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        base = otlp_endpoint.rstrip("/")
        span_exporter = OTLPSpanExporter(endpoint=f"{base}/v1/traces") if base else OTLPSpanExporter()
        metric_exporter = OTLPMetricExporter(endpoint=f"{base}/v1/metrics") if base else OTLPMetricExporter()
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    trace.set_tracer_provider(tracer_provider)
    return metric_exporter


def tracer(name: str = "statefleet") -> trace.Tracer:
    return trace.get_tracer(name)


def meter(name: str = "statefleet") -> metrics.Meter:
    return metrics.get_meter(name)


def counter(name: str, description: str) -> metrics.Counter:
    return meter().create_counter(name, description=description)


def histogram(name: str, description: str, unit: str = "ms") -> metrics.Histogram:
    return meter().create_histogram(name, description=description, unit=unit)


def traced(span_name: str, handler: Callable[[Any], Awaitable[Any]], *,
           tracer_name: str = "statefleet", **attributes: str) -> Callable[[Any], Awaitable[Any]]:
    """Wrap a request handler in a span named `span_name`, tagged with the request's session_id (if any)
    and the given constant attributes."""
    spans = tracer(tracer_name)

    async def run(req: Any) -> Any:
        attrs = {"session_id": getattr(req, "session_id", ""), **attributes}
        with spans.start_as_current_span(span_name, attributes=attrs):
            return await handler(req)

    return run
