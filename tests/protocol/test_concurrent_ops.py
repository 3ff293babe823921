"""The request queue runs a job's generates at once (PROTOCOL.md §7.2), with a toy servicer.

Sequenced or not, generate calls reach the servicer together (so a sampler can batch them);
a run of consecutive sequenced generates starts after the op before it has executed, and the op
after it waits until every one of them has; the gap timeout counts only while a number is
missing, not while its request runs.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp

import dssst1
from arctic_sdk.spec.tables import methods as M
from arctic_servers._generated.servicer import ServicerBase
from arctic_servers.protocol.config import ProtocolConfig, ProtocolLimits
from arctic_servers.protocol.context import CallContext
from arctic_servers.serving.serve import start_server

PREFIX = "/api/v2/databases/db/schemas/sc/cortex-training"
OCTET = {"Content-Type": "application/octet-stream"}
BODY = {"prompts": [[1, 2, 3]], "sampling_params": {"max_tokens": 4}}


class Toy(ServicerBase):
    """Generates take `gen_s` and count how many run at once; steps note what was running."""

    def __init__(self, gen_s: float = 0.2, step_s: float = 0.05) -> None:
        self.gen_s, self.step_s = gen_s, step_s
        self.running = 0
        self.peak = 0
        self.log: list[tuple[str, int | None, int]] = []  # (event, seq, generates running)

    async def generate(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.log.append(("generate", ctx.seq, self.running))
        await asyncio.sleep(self.gen_s)
        self.running -= 1
        self.log.append(("generated", ctx.seq, self.running))
        return {"results": [{"prompt_token_ids": [1, 2, 3], "samples": []}], "weight_version": 0}

    async def step(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        self.log.append(("step", ctx.seq, self.running))
        await asyncio.sleep(self.step_s)
        self.log.append(("stepped", ctx.seq, self.running))
        return {"metrics": {"loss": 0.0, "num_tokens": 0, "global_step": 1}}


def _generate_frame() -> bytes:
    (frame,) = dssst1.encode_chunks(
        dssst1.dumps(BODY), kind="request", operation=M.GENERATE.name, max_bytes=1 << 20,
        chunk_group_id=uuid.uuid4().hex,
    )  # fmt: skip
    return bytes(frame)


async def _call(s: aiohttp.ClientSession, base: str, op: str, seq: int | None) -> dict[str, Any]:
    headers = {"X-Arctic-Seq": str(seq)} if seq is not None else {}
    if op == M.GENERATE.name:
        kw: dict[str, Any] = {"data": _generate_frame(), "headers": {**OCTET, **headers}}
    else:
        kw = {"json": {}, "headers": headers}
    async with s.post(f"{base}/7/{op}", **kw) as r:
        body = await r.json()
    assert r.status == 200 and body["status"] == "completed", body
    return dict(body)


async def _run(toy: Toy, calls: list[tuple[str, int | None]], **cfg: Any) -> None:
    srv = await start_server(toy, ProtocolConfig(answer_mode="inline", **cfg))
    try:
        async with aiohttp.ClientSession() as s:
            base = srv.base_url + PREFIX
            await asyncio.gather(*(_call(s, base, op, seq) for op, seq in calls))
    finally:
        await srv.close()


def _index(log: list[tuple[str, int | None, int]], event: str, seq: int) -> int:
    return next(i for i, e in enumerate(log) if e[0] == event and e[1] == seq)


async def test_unsequenced_generates_run_at_once() -> None:
    toy = Toy()
    await _run(toy, [(M.GENERATE.name, None)] * 8)
    assert toy.peak == 8


async def test_a_run_of_sequenced_generates_runs_at_once_between_steps() -> None:
    """1 step, 2..9 generate, 10 step, sent in reverse order: the generates run together after
    step 1 has executed, and step 10 runs after all of them."""
    toy = Toy()
    gens = [(M.GENERATE.name, n) for n in range(2, 10)]
    calls = [(M.STEP.name, 10), *reversed(gens), (M.STEP.name, 1)]
    await _run(toy, calls)
    assert toy.peak == 8
    stepped1 = _index(toy.log, "stepped", 1)
    step10 = _index(toy.log, "step", 10)
    for _, n in gens:
        assert stepped1 < _index(toy.log, "generate", n) < _index(toy.log, "generated", n) < step10
    assert toy.log[step10][2] == 0  # no generate was running when step 10 began


async def test_a_generate_after_a_step_in_a_run_waits_for_it() -> None:
    """2, 3 generate, 4 step, 5 generate: 5 does not join 2 and 3 (the step is between)."""
    toy = Toy(gen_s=0.15)
    calls = [(M.STEP.name, 1), (M.GENERATE.name, 2), (M.GENERATE.name, 3), (M.STEP.name, 4),
             (M.GENERATE.name, 5)]  # fmt: skip
    await _run(toy, list(reversed(calls)))
    assert toy.peak == 2
    assert _index(toy.log, "stepped", 4) < _index(toy.log, "generate", 5)
    assert max(_index(toy.log, "generated", n) for n in (2, 3)) < _index(toy.log, "step", 4)


async def test_the_gap_timeout_counts_only_while_a_number_is_missing() -> None:
    """Step 2 waits for a generate run longer than the gap timeout: that is not a gap."""
    toy = Toy(gen_s=0.8)
    limits = ProtocolLimits(sequence_gap_timeout_seconds=0.3)
    calls = [(M.STEP.name, 1), (M.GENERATE.name, 2), (M.GENERATE.name, 3), (M.STEP.name, 4)]
    await _run(toy, calls, limits=limits)
    assert _index(toy.log, "generated", 3) < _index(toy.log, "step", 4)


# ---------------------------------------------------------------------- backpressure


async def test_sampling_requests_past_the_bound_are_refused_with_429() -> None:
    """limits.max_sampling_requests_per_job: 6 generates at once against a bound of 3 — three
    run, three are refused before they are recorded (429, Retry-After, the limit in details);
    another job is not affected, and once the three ended a generate is admitted again."""
    toy = Toy(gen_s=0.5)
    limits = ProtocolLimits(max_sampling_requests_per_job=3)
    srv = await start_server(toy, ProtocolConfig(answer_mode="inline", limits=limits))
    base = srv.base_url + PREFIX
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/capabilities") as r:
                assert (await r.json())["limits"]["max_sampling_requests_per_job"] == 3

            async def post(job: str) -> tuple[int, dict[str, str], Any]:
                async with s.post(f"{base}/{job}/generate", data=_generate_frame(),
                                  headers=OCTET) as r:  # fmt: skip
                    return r.status, dict(r.headers), await r.json()

            answers = await asyncio.gather(*(post("7") for _ in range(6)), post("8"))
            ok = [a for a in answers[:6] if a[0] == 200]
            refused = [a for a in answers[:6] if a[0] == 429]
            assert len(ok) == len(refused) == 3 and answers[6][0] == 200
            for _, headers, body in refused:
                err = body["error"]
                assert err["code"] == "rate_limited" and headers["Retry-After"] == "1"
                assert err["details"]["limit"] == 3 and err["details"]["queued"] == 3
                assert "max_sampling_requests_per_job" in err["message"]
            assert toy.peak == 4  # job 7's three and job 8's one
            assert (await post("7"))[0] == 200
    finally:
        await srv.close()


async def test_the_sdk_waits_out_retry_after_and_every_call_succeeds(
    caplog: Any,
) -> None:
    """The SDK (unmodified) retries a refused generate after the server's Retry-After."""
    import logging

    from arctic_sdk import AsyncClient

    toy = Toy(gen_s=0.3)
    limits = ProtocolLimits(max_sampling_requests_per_job=2)
    srv = await start_server(toy, ProtocolConfig(answer_mode="inline", limits=limits))
    caplog.set_level(logging.INFO, logger="arctic_sdk")
    try:
        async with AsyncClient(srv.base_url, job_id="7") as client:
            results = await asyncio.gather(
                *(client.generate(prompts=[[1, 2, 3]], sampling_params={"max_tokens": 4})
                  for _ in range(5))
            )  # fmt: skip
    finally:
        await srv.close()
    assert len(results) == 5 and toy.peak == 2
    waits = [r.__dict__.get("arctic_wait") for r in caplog.records if "retrying" in r.msg]
    assert waits and all(w == 1 for w in waits), waits
