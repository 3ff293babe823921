"""OpenTelemetry spans (issue 35): one trace from the SDK call through the server's queue to the
engine command and the worker that runs it, with the request id as an attribute; nothing of
OpenTelemetry is imported while tracing is off."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from arctic_sdk import AsyncClient, Client, rollouts, tracing
from conformance.fake import BackgroundFake

ROOT = Path(__file__).resolve().parents[2]
JOB = {
    "sub_job_configs": [
        {"job_type": "training", "model_name": "fake-model"},
        {"job_type": "sampling", "model_name": "fake-model"},
    ]
}
_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The in-memory exporter of this process's provider, tracing on for the test."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    if not getattr(provider, "_arctic_test_exporter", False):
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        provider._arctic_test_exporter = True  # type: ignore[attr-defined]
    _EXPORTER.clear()
    tracing.enable()
    try:
        yield _EXPORTER
    finally:
        tracing.disable()
        _EXPORTER.clear()


def by_name(found: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in found if s.name.startswith(prefix)]


def parent_of(s: ReadableSpan) -> int | None:
    return s.parent.span_id if s.parent is not None else None


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_one_trace_from_the_sdk_call_through_the_queue(
    spans: InMemorySpanExporter, transport: str
) -> None:
    with BackgroundFake() as fake, Client(fake.base_url, transport=transport) as client:
        client.create_job(JOB)
        client.wait_until_running()
        out = client.generate(prompts=["a"], sampling_params={"n": 2, "max_tokens": 4, "seed": 1})
        frame = rollouts.forward_backward_frame(
            rollouts.from_generate(out), np.zeros(2, np.float32), loss_fn="grpo"
        )
        spans.clear()
        with trace.get_tracer("test").start_as_current_span("driver step") as root:
            client.forward_backward(frame)
    found = list(spans.get_finished_spans())
    (sdk,) = by_name(found, "arctic.sdk forward-backward")
    assert sdk.kind is trace.SpanKind.CLIENT and parent_of(sdk) == root.get_span_context().span_id
    trace_id = sdk.context.trace_id
    assert {s.context.trace_id for s in found} == {trace_id}  # one trace, the driver's
    servers = by_name(found, "arctic.server forward-backward")
    assert servers and all(parent_of(s) == sdk.context.span_id for s in servers)
    assert all(s.kind is trace.SpanKind.SERVER for s in servers)
    (request,) = by_name(found, "arctic.request forward-backward")
    rid = request.attributes["arctic.request_id"]  # type: ignore[index]
    assert parent_of(request) in {s.context.span_id for s in servers}
    (queue,) = by_name(found, "arctic.queue")
    (execute,) = by_name(found, "arctic.execute")
    assert parent_of(queue) == parent_of(execute) == request.context.span_id
    assert queue.end_time <= execute.start_time  # type: ignore[operator]
    # the request id the server answered is on the SDK's span and the server's
    assert sdk.attributes["arctic.request_id"] == rid  # type: ignore[index]
    assert servers[-1].attributes["arctic.request_id"] == rid  # type: ignore[index]
    assert servers[-1].attributes["arctic.transport"] == transport  # type: ignore[index]


def test_a_refused_call_marks_both_spans_with_its_code_and_id(
    spans: InMemorySpanExporter,
) -> None:
    with (
        BackgroundFake() as fake,
        Client(fake.base_url) as client,
        pytest.raises(Exception) as refused,
    ):
        client.get_job(job_id="no-such-job")
    found = list(spans.get_finished_spans())
    (sdk,) = by_name(found, "arctic.sdk get-job")
    (server,) = by_name(found, "arctic.server get-job")
    assert sdk.status.status_code is trace.StatusCode.ERROR
    assert server.status.status_code is trace.StatusCode.ERROR
    assert sdk.attributes["arctic.error_code"] == "job_not_found"  # type: ignore[index]
    rid = refused.value.request_id  # type: ignore[attr-defined]
    assert rid and sdk.attributes["arctic.request_id"] == rid  # type: ignore[index]
    assert parent_of(server) == sdk.context.span_id


async def test_gateway_worker_spans_join_the_callers_trace(
    spans: InMemorySpanExporter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's engine command carries its context over the worker link: the worker host
    (another process, exporting to a file) runs the command in a child span of it."""
    from arctic_servers.gateway.server import start_gateway
    from arctic_servers.gateway.settings import GatewaySettings

    worker_spans = tmp_path / "worker-spans.jsonl"
    monkeypatch.setenv(tracing.ENV, "1")  # the worker hosts inherit it
    monkeypatch.setenv(tracing.FILE_ENV, str(worker_spans))
    gw = await start_gateway(
        GatewaySettings(db=tmp_path / "state.db", engine="fake"), answer_mode="inline"
    )
    try:
        async with AsyncClient(gw.base_url, grpc_target=gw.grpc_target) as client:
            await client.create_job(JOB)
            await client.wait_until_running(timeout=120)
            spans.clear()
            await client.step(learning_rate=1e-3)
            await client.cancel_job()
        for _ in range(600):  # its workers stopped (and reaped) before the gateway closes
            if not any(j.placed for j in gw.servicer.jobs.jobs.values()):
                break
            await asyncio.sleep(0.05)
    finally:
        await gw.close()
    found = list(spans.get_finished_spans())
    (sdk,) = by_name(found, "arctic.sdk step")
    (engine,) = by_name(found, "arctic.engine step")
    assert engine.kind is trace.SpanKind.CLIENT
    assert engine.context.trace_id == sdk.context.trace_id
    assert engine.attributes["arctic.sub_job_id"].endswith(":training:0")  # type: ignore[index]
    (execute,) = by_name(found, "arctic.execute")
    assert parent_of(engine) == execute.context.span_id
    lines = [json.loads(x) for x in worker_spans.read_text().splitlines() if x.strip()]
    (worker,) = [w for w in lines if w["name"] == "arctic.worker step"]
    assert worker["kind"] == "SpanKind.SERVER"
    assert int(worker["context"]["trace_id"], 16) == sdk.context.trace_id
    assert int(worker["parent_id"], 16) == engine.context.span_id
    assert worker["resource"]["attributes"]["service.name"].endswith("-worker")


def test_no_opentelemetry_import_while_tracing_is_off() -> None:
    """Off (the default), a client and the servers never import OpenTelemetry."""
    code = """
import sys
from arctic_sdk import Client
from conformance.fake import BackgroundFake
with BackgroundFake() as fake, Client(fake.base_url) as client:
    client.create_job({"sub_job_configs": [{"job_type": "training", "model_name": "m"}]})
    client.wait_until_running()
    client.step(learning_rate=1e-3)
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
assert not loaded, loaded
print("clean")
"""
    env: dict[str, Any] = {k: v for k, v in os.environ.items() if k != tracing.ENV}
    paths = [str(ROOT / "servers"), str(ROOT / "sdk"), str(ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("PYTHONWARNINGS", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr[-2000:]
