"""OpenTelemetry spans for arctic-sdk calls and the servers that answer them (optional).

Off by default, and free when off: nothing imports `opentelemetry` until tracing is turned on,
and every hook is one `is None` test. Turn it on with `arctic_sdk.tracing.enable()` in the
process (after configuring a `TracerProvider`, or with `setup=True` to build one from the
environment), or with `ARCTIC_TRACING=1` in the environment (the servers and their workers
then build their provider from the environment: `setup_from_env`). Install the `otel` extra
(`pip install "arctic-sdk[otel]"`).

A call's span (`arctic.sdk <op>`, kind CLIENT) covers the whole call — retries, chunks, polls —
and each HTTP request or gRPC call carries its context in the W3C `traceparent` header, so the
server's spans (`arctic_servers.telemetry.tracing`) join the caller's trace. Spans carry the
request id the server answered (`arctic.request_id`) and the op (`arctic.op`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

__all__ = [
    "ENV",
    "current_carrier",
    "enable",
    "enabled",
    "extract",
    "inject",
    "record_error",
    "setup_from_env",
    "span",
    "start_span",
    "use_span",
]

ENV = "ARCTIC_TRACING"
FILE_ENV = "ARCTIC_TRACES_FILE"  # setup_from_env: spans as JSON lines appended to this file
_TRACER: Any = None
_CONFIGURED = False


def enabled() -> bool:
    return _TRACER is not None


def enable(*, setup: bool = False, service_name: str = "arctic-sdk") -> None:
    """Turn spans on in this process (through the global `TracerProvider`; `setup=True` first
    builds one from the environment when none is set: `setup_from_env`)."""
    global _TRACER
    from opentelemetry import trace

    if setup:
        setup_from_env(service_name)
    _TRACER = trace.get_tracer("arctic_sdk")


def disable() -> None:
    global _TRACER
    _TRACER = None


def setup_from_env(service_name: str) -> None:
    """A `TracerProvider` with an exporter chosen by the environment, unless one is set:
    `OTEL_TRACES_EXPORTER` = `otlp` (default; OTLP/HTTP, `OTEL_EXPORTER_OTLP_*` say where),
    `console` or `none`; `ARCTIC_TRACES_FILE=PATH` appends each span as a JSON line to PATH
    instead (one file may collect a server's and its workers' spans)."""
    global _CONFIGURED
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
        SpanExporter,
    )

    if _CONFIGURED or isinstance(trace.get_tracer_provider(), TracerProvider):
        return
    _CONFIGURED = True
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    path = os.environ.get(FILE_ENV)
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if path:
        out = open(path, "a", buffering=1)  # noqa: SIM115  (lives as long as the process)
        exporter: SpanExporter = ConsoleSpanExporter(
            out=out, formatter=lambda s: s.to_json(indent=None) + "\n"
        )
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif kind == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif kind == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def _from_env() -> None:
    if os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        try:
            enable(setup=True, service_name=os.environ.get("OTEL_SERVICE_NAME") or "arctic")
        except ImportError:  # the otel extra is not installed: stay off
            disable()


_KINDS = {"client": "CLIENT", "server": "SERVER", "internal": "INTERNAL"}


def start_span(
    name: str,
    *,
    kind: str = "internal",
    attributes: Mapping[str, Any] | None = None,
    parent: Any = None,
) -> Any:
    """A started span (the current context's child, or `parent`'s: a context from `extract`),
    or None when tracing is off. End it with `use_span` or `.end()`."""
    if _TRACER is None:
        return None
    from opentelemetry.trace import SpanKind

    attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
    return _TRACER.start_span(name, context=parent, kind=SpanKind[_KINDS[kind]], attributes=attrs)


@contextmanager
def use_span(span: Any, *, end: bool = True) -> Iterator[Any]:
    """`span` as the current span for the block (nothing when None); errors are recorded."""
    if span is None:
        yield None
        return
    from opentelemetry import trace

    with trace.use_span(span, end_on_exit=end, record_exception=True, set_status_on_exception=True):
        yield span


@contextmanager
def span(
    name: str, *, kind: str = "internal", attributes: Mapping[str, Any] | None = None
) -> Iterator[Any]:
    """A child span of the current one for the block (nothing when tracing is off)."""
    if _TRACER is None:
        yield None
        return
    with use_span(start_span(name, kind=kind, attributes=attributes)) as s:
        yield s


def record_error(span: Any, exc: BaseException) -> None:
    """Mark `span` failed with `exc` (its code and request id as attributes, when it has them)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    code = getattr(exc, "code", None)
    rid = getattr(exc, "request_id", None)
    if code:
        span.set_attribute("arctic.error_code", str(code))
    if rid:
        span.set_attribute("arctic.request_id", str(rid))
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500]))


def inject(carrier: MutableMapping[str, str]) -> None:
    """Put the current span's context in `carrier` (headers, gRPC metadata, a worker message)."""
    if _TRACER is None:
        return
    from opentelemetry import propagate

    propagate.inject(carrier)


def current_carrier() -> dict[str, str] | None:
    """The current context as a W3C carrier dict, or None when tracing is off."""
    if _TRACER is None:
        return None
    out: dict[str, str] = {}
    inject(out)
    return out or None


def extract(carrier: Mapping[str, str] | None) -> Any:
    """The context a carrier holds (None when tracing is off or it holds none)."""
    if _TRACER is None or not carrier:
        return None
    from opentelemetry import propagate

    return propagate.extract(dict(carrier))


_from_env()
