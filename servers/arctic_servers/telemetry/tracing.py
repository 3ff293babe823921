"""The servers' OpenTelemetry spans, over `arctic_sdk.tracing` (off by default, free when off).

A call's path, as spans of one trace (the SDK's `arctic.sdk <op>` span is the root):

- `arctic.server <op>` (SERVER): the protocol core answering one call (`ProtocolCore.handle`;
  the span is `protocol/calls.py`'s `call_span`), continued from the call's `traceparent`;
  attributes `arctic.op`, `arctic.transport`, `arctic.request_id` (the id the answer names),
  `arctic.code`;
- `arctic.request <op>`: a recorded data-plane request from its recording to its end, with
  its children `arctic.queue` (waiting for its sequence turn) and `arctic.execute` (the
  servicer's call); it outlives an answer given early (202);
- `arctic.engine <command>` (CLIENT): one command sent to a sub-job's worker (`engine_call`),
  whose context travels in the command message (`trace`), so that the worker's
  `arctic.worker <command>` span (SERVER, `worker_span`, in the worker process) joins the trace.

Servers turn tracing on with `--tracing` (or `ARCTIC_TRACING=1`), which their worker processes
inherit; each process exports its own spans (`arctic_sdk.tracing.setup_from_env`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

from arctic_sdk import tracing as t
from arctic_sdk.tracing import enabled, extract, record_error, span, use_span

__all__ = [
    "WorkerSpans",
    "answered",
    "enabled",
    "engine_call",
    "record_error",
    "span",
    "use_span",
    "worker_span",
]

TRACE_KEY = "trace"  # the W3C carrier in a worker command message (or its `meta`)


def answered(span: Any, request_id: str, code: str) -> None:
    if span is not None:
        span.set_attribute("arctic.request_id", request_id)
        span.set_attribute("arctic.code", code)


@contextmanager
def engine_call(cmd: str, sub_job_id: str, message: MutableMapping[str, Any]) -> Iterator[Any]:
    """A span around one engine command; its context goes into `message[TRACE_KEY]`."""
    if not t.enabled():
        yield None
        return
    attrs = {"arctic.engine_command": cmd, "arctic.sub_job_id": sub_job_id}
    with span(f"arctic.engine {cmd}", kind="client", attributes=attrs) as s:
        carrier = t.current_carrier()
        if carrier:
            message[TRACE_KEY] = carrier
        yield s


@contextmanager
def worker_span(cmd: str, carrier: Mapping[str, str] | None, **attrs: Any) -> Iterator[Any]:
    """The worker's span of a command whose message carried `carrier` (nothing when off)."""
    if not t.enabled() or not carrier:
        yield None
        return
    s = t.start_span(
        f"arctic.worker {cmd}",
        kind="server",
        parent=extract(carrier),
        attributes={"arctic.engine_command": cmd, **attrs},
    )
    with use_span(s):
        yield s


class WorkerSpans:
    """Spans of commands that run in an engine's batch (a sampler's generates): started when the
    command joins the batch, ended when its final reply goes out (`end`). Empty when off."""

    def __init__(self) -> None:
        self._open: dict[Any, Any] = {}

    def start(self, key: Any, cmd: str, carrier: Mapping[str, str] | None) -> None:
        if not t.enabled() or not carrier:
            return
        self._open[key] = t.start_span(
            f"arctic.worker {cmd}",
            kind="server",
            parent=extract(carrier),
            attributes={"arctic.engine_command": cmd, "arctic.batched": True},
        )

    def end(self, key: Any, ok: bool = True) -> None:
        if not self._open:
            return
        s = self._open.pop(key, None)
        if s is not None:
            if not ok:
                from opentelemetry.trace import Status, StatusCode

                s.set_status(Status(StatusCode.ERROR))
            s.end()
