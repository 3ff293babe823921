"""The collective weight sync on real engines (DeepSpeed trainer -> vLLM sampler, HF scorer).

The trainer broadcasts its weights over a gloo group of its own (`engines/weight_transfer/`),
bucket by bucket, into vLLM's weight-transfer hooks and the scorer's module; the server only
coordinates (`serving/collective_sync.py`). Here:

- after a collective sync, the sampler's log-probs of its sampled tokens equal the trainer's
  (max |Δ| <= 1e-4 in fp32), and the result says method, backend, bytes, buckets and seconds;
- the group is built once and kept: the next sync reuses it (no set-up);
- naming another target (the reference scorer) rebuilds it, and the scorer then holds the
  trainer's weights exactly;
- with 1 MiB buckets the model goes in several, none larger; a target that stalls (SIGSTOP)
  fails the sync with `unavailable` within the server's `--weight-sync-timeout`, never hangs
  it; the next sync builds a new group and succeeds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M

from ..rawwire import pad
from .conftest import SHARED_JOB, ServerInfo, create_job, start_server, stop_server
from .helpers import CHAT, ROWS, TEXTS, sampled, sft_body, trainer_vs_sampler
from .raw import CallError, Http

pytestmark = pytest.mark.slow
PARAMS = {
    "n": 4,
    "max_tokens": 16,
    "ignore_eos": True,
    "logprobs": 0,
    "seed": 7,
    "temperature": 1.0,
}


async def train(http: Http, job: str, steps: int = 1) -> None:
    for _ in range(steps):
        await http.run(M.FORWARD_BACKWARD, job, sft_body())
        await http.run(M.STEP, job, {})


async def sampler_vs_trainer(http: Http, job: str) -> tuple[float, int, int]:
    """max |Δ| over the sampled tokens, their number, and the weight version that sampled."""
    prompts: list[object] = [CHAT.format(t) for t in TEXTS] + [list(r) for r in ROWS]
    gen = await http.run(M.GENERATE, job, {"prompts": prompts, "sampling_params": PARAMS})
    rows, plens, lps = sampled(gen)
    ids, mask = pad(rows, left=True)
    fwd = await http.run(M.FORWARD, job, {"kwargs": {"input_ids": ids, "attention_mask": mask}})
    d = trainer_vs_sampler(fwd["outputs"]["logprobs_shifted"], rows, plens, lps, left=True)
    return float(d.max()), int(d.size), int(gen["weight_version"])


async def test_collective_sync_agrees_and_keeps_its_group(
    onprem: ServerInfo, http: Http, shared_job: str
) -> None:
    job = shared_job
    # the session's shared job may hold a group from an earlier test's `auto` sync: a sync with
    # other members first, so the default sync below builds its group whatever ran before
    both = [f"{job}:sampling:0", f"{job}:log_prob:0"]
    await http.run(M.SYNC_WEIGHTS, job, {"method": "collective", "target_sub_job_ids": both})
    await train(http, job, 2)
    before, _, _ = await sampler_vs_trainer(http, job)
    first = await http.run(M.SYNC_WEIGHTS, job, {"method": "collective"})
    after, n, version = await sampler_vs_trainer(http, job)
    print(f"\ncollective sync: {first}\n  before max|Δ| {before:.3g}, after {after:.3g} ({n} tok)")
    assert first["method"] == "collective" and first["backend"] == "gloo"
    assert first["num_tensors"] > 0 and first["num_bytes"] > 0
    assert first["num_buckets"] >= 1 and 0 < first["bucket_bytes"] <= first["num_bytes"]
    assert first["setup_seconds"] > 0 and first["seconds"] >= first["setup_seconds"]
    assert 0 < first["load_seconds"] < first["seconds"]  # vLLM's reload of what arrived
    assert version == first["weight_version"]
    assert before >= 1e-2 and n >= 256
    assert after <= 1e-4

    # the group stays: the next sync pays no set-up
    await train(http, job)
    second = await http.run(M.SYNC_WEIGHTS, job, {"method": "collective"})
    after2, _, version2 = await sampler_vs_trainer(http, job)
    assert second["setup_seconds"] == 0.0 and version2 == second["weight_version"] == version + 1
    assert after2 <= 1e-4

    # another member (the reference scorer): the group is rebuilt with it
    ids, mask = pad([list(r) for r in ROWS])
    body = {"kwargs": {"input_ids": ids, "attention_mask": mask}}
    scorer = {"X-Arctic-Sub-Job": f"{job}:log_prob:0"}
    trainer_lp = (await http.run(M.FORWARD, job, body))["outputs"]["logprobs_shifted"]
    stale = (await http.run(M.FORWARD, job, body, headers=scorer))["outputs"]["logprobs_shifted"]
    targets = [f"{job}:sampling:0", f"{job}:log_prob:0"]
    third = await http.run(
        M.SYNC_WEIGHTS, job, {"method": "collective", "target_sub_job_ids": targets}
    )
    synced = (await http.run(M.FORWARD, job, body, headers=scorer))["outputs"]["logprobs_shifted"]
    assert third["setup_seconds"] > 0
    assert np.abs(stale - trainer_lp).max() >= 1e-2
    assert np.abs(synced - trainer_lp).max() <= 1e-6
    # a default sync again (the sampler only): a third group, built and kept
    fourth = await http.run(M.SYNC_WEIGHTS, job, {"method": "collective"})
    assert fourth["setup_seconds"] > 0


async def test_unknown_and_impossible_methods_are_refused(http: Http, shared_job: str) -> None:
    with pytest.raises(CallError) as e:
        await http.run(M.SYNC_WEIGHTS, shared_job, {"method": "nccl"})
    assert e.value.code == "unsupported_option" and "CUDA" in str(e.value.body)
    with pytest.raises(CallError) as e:
        await http.run(M.SYNC_WEIGHTS, shared_job, {"method": "carrier-pigeon"})
    assert e.value.code == "invalid_argument"


# ------------------------------------------------------------------ a stalled target

STALL_TIMEOUT_S = 20


@pytest.fixture(scope="module")
def short_timeout_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    srv = start_server(
        tmp_path_factory.mktemp("onprem-sync"),
        "--weight-sync-timeout",
        str(STALL_TIMEOUT_S),
        "--weight-sync-bucket-mib",
        "1",
        "--prewarm",
        "",
        name="onprem-sync",
    )
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture
async def shttp(short_timeout_server: ServerInfo) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        yield Http(session, short_timeout_server.prefix_url)


def worker_pid(srv: ServerInfo, job: str, role: str) -> int:
    for w in srv.admin(job)["workers"]:
        if w["role"] == role:
            return int(w["pid"])
    raise AssertionError(f"no {role} worker in {srv.admin(job)}")


async def test_a_stalled_sampler_fails_the_sync_and_the_next_one_rebuilds(
    short_timeout_server: ServerInfo, shttp: Http
) -> None:
    srv = short_timeout_server
    job = create_job(srv, {**SHARED_JOB, "sub_job_configs": SHARED_JOB["sub_job_configs"][:2]})
    await train(shttp, job)
    ok = await shttp.run(M.SYNC_WEIGHTS, job, {"method": "collective"})
    assert ok["setup_seconds"] > 0
    # 1 MiB buckets: the tiny model (1.7 MB) goes in several, each at most 1 MiB
    assert ok["num_buckets"] > 1 and ok["bucket_bytes"] <= 1 << 20
    pid = worker_pid(srv, job, "sampling")
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with pytest.raises(CallError) as e:
            await shttp.run(M.SYNC_WEIGHTS, job, {"method": "collective"})
        took = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"\nstalled sampler: {e.value.code} after {took:.1f} s: {e.value.body}")
    assert e.value.code == "unavailable"
    assert "weight group" in str(e.value.body)
    assert took < STALL_TIMEOUT_S + 40  # the timeout, 2 x 10 s of grace, a loaded machine
    await asyncio.sleep(1.0)
    again = await shttp.run(M.SYNC_WEIGHTS, job, {"method": "collective"})
    assert again["setup_seconds"] > 0
    d, _, v = await sampler_vs_trainer(shttp, job)
    assert d <= 1e-4 and v == again["weight_version"]
