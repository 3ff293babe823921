"""An abandoned generate is aborted in the real vLLM sampler (issue 37), through the on-prem
server: the SDK's cancelled task sends cancel-request, the core cancels the request's task, the
worker aborts the command in its engine batch (`LLMEngine.abort_request`). Checked on the
sampler's own log (tail-logs): the abort line, and the busy period that ends with far fewer
engine steps than the generate's `max_tokens`. A training call cancelled while the trainer runs
it runs to its end and answers what ran.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from arctic_sdk import AsyncClient

from .conftest import ServerInfo
from .helpers import sft_body
from .test_concurrency import _busy_periods, _logs

MAX_TOKENS = 960  # the tiny model's context is 1024
SAMPLING = {"n": 32, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 1.0, "seed": 7}


async def test_abandoned_generate_is_aborted_in_vllm(onprem: ServerInfo, shared_job: str) -> None:
    async with AsyncClient(onprem.base_url, job_id=shared_job, timeout=600) as client:
        before = len(await _logs(client))
        task = asyncio.ensure_future(
            client.generate(prompts=[[11, 23, 5, 42, 77]], sampling_params=SAMPLING)
        )
        await asyncio.sleep(2.0)
        assert not task.done(), "the generate ended before it could be abandoned"
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as info:
            await task
        left = time.monotonic() - t0
        rid = getattr(info.value, "request_id", "")
        assert rid, "the CancelledError names no request id"
        assert left < 2.5, f"cancelling took {left:.2f} s"
        assert (await client.get_request(request_id=rid))["status"] == "cancelled"
        lines: list[str] = []
        end = time.monotonic() + 30
        while time.monotonic() < end:
            lines = (await _logs(client))[before:]
            if _busy_periods(lines):
                break
            await asyncio.sleep(0.2)
        print("\n".join(lines[-5:]))
        print(f"abandon -> caller back (server cancelled): {left:.2f} s")
        assert any(": aborted (" in ln for ln in lines), lines
        periods = _busy_periods(lines)
        assert periods, lines
        steps = periods[-1][2]
        # far fewer than the generate asked for (a quiet 2-core machine runs ~200 steps a second)
        assert steps < MAX_TOKENS * 3 // 4, f"the sampler ran {steps} steps of {MAX_TOKENS}"


async def test_cancelled_training_call_runs_to_its_end(onprem: ServerInfo, shared_job: str) -> None:
    """PROTOCOL.md §3.3: a training call cancelled while the trainer runs it runs to its end
    there (DeepSpeed has no safe point midway) and the request answers what ran: `completed`,
    its cancel answered `cancelled: false`, as on the gateway. (The on-prem server used to
    record it `cancelled` at once while the trainer ran it anyway.) A `forward` (no effect on
    the shared job), sized to take about a second, abandoned halfway through."""
    rows = [[(7 * i + j) % 200 + 3 for j in range(256)] for i in range(8)]
    async with AsyncClient(onprem.base_url, job_id=shared_job, timeout=600) as client:
        took = 0.0
        while took < 0.6 and len(rows) <= 128:  # long enough to be abandoned while it runs
            rows = rows * 2
            t0 = time.monotonic()
            await client.forward(sft_body(rows))
            took = time.monotonic() - t0
        task = asyncio.ensure_future(client.forward(sft_body(rows)))
        await asyncio.sleep(took / 2)
        assert not task.done(), "the forward ended before it could be abandoned"
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as info:
            await task
        rid = getattr(info.value, "request_id", "")
        notes = "\n".join(getattr(info.value, "__notes__", []))
        print(f"forward of {len(rows)} rows: {took:.2f} s; {notes}")
        assert rid, notes
        status = await client.get_request(request_id=rid)
        assert status["status"] == "completed", status
        assert "ended (completed)" in notes or "now running" in notes, notes
