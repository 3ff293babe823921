"""The multi-rank (data-parallel) DeepSpeed trainer on the on-prem server: CPU, gloo, fp32, W = 2.

A training sub-job with `n_gpus: 2` runs two rank processes under torch.distributed; rank 0 splits
each forward-backward's rows between them, computes the whole call's loss on the gathered
log-probs, and DeepSpeed all-reduces the gradients (`engines/deepspeed/dp_training.py`).

- W = 2 and W = 1 on the same batches (B = 4, B = 3 with seq-mean, B = 1 < W, left-padded with
  sum; rows in contiguous slices and token-balanced (`balance_rows`, ZoRRO); micro-batched
  inside the ranks with ZeRO-1 and ZeRO-3; a call of 1 row split from 3): equal loss, token
  count and grad_norm, and equal log-probs after each step; `balance_rows` a no-op on W = 1;
- the SDK's forward-backward, step, save and load round trip on a W = 2 sub-job;
- `kill -9` of rank 1 fails the call in flight with `sub_job_failed` naming the rank, and the
  job, within seconds.

One server and two shared jobs (W = 1 and W = 2) for the module; the kill test has its own job.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M

from .conftest import ServerInfo, create_job, start_server, stop_server
from .helpers import ROWS, sft_body
from .raw import CallError, Http

pytestmark = pytest.mark.slow

TRAIN = {
    "zero_stage": 1,
    "gradient_clipping": 1.0,
    "optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0},
}
REL = 1e-5
UNEVEN = (ROWS[2], ROWS[0], ROWS[1], ROWS[3])


def trainer_job(n_gpus: int, **extra: Any) -> dict[str, Any]:
    conf = {**TRAIN, "n_gpus": n_gpus, **extra}
    return {
        "sub_job_configs": [{"job_type": "training", "dtype": "float32", "training_config": conf}],
        "experiment_name": f"multirank-w{n_gpus}",
    }


@pytest.fixture(scope="module")
def mr_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    # 1 MiB weight-sync buckets: the tiny model's collective sync goes in several
    srv = start_server(
        tmp_path_factory.mktemp("multirank"),
        "--prewarm",
        "",
        "--weight-sync-bucket-mib",
        "1",
        name="multirank",
    )
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def jobs(mr_server: ServerInfo) -> dict[int, str]:
    return {1: create_job(mr_server, trainer_job(1)), 2: create_job(mr_server, trainer_job(2))}


@pytest.fixture
async def mr_http(mr_server: ServerInfo) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        yield Http(session, mr_server.prefix_url)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def test_two_ranks_are_processes_of_the_sub_job(
    mr_server: ServerInfo, jobs: dict[int, str]
) -> None:
    w2 = mr_server.admin(jobs[2])["workers"][0]["info"]
    w1 = mr_server.admin(jobs[1])["workers"][0]["info"]
    assert w2["world_size"] == 2 and w2["backend"] == "gloo"
    assert len(set(w2["rank_pids"])) == 2
    assert all(os.path.exists(f"/proc/{p}") for p in w2["rank_pids"])
    assert "world_size" not in w1  # W = 1: one process, today's engine
    # DeepSpeed's /dev/shm all-reduce buffers are mapped but already unlinked: a rank killed with
    # SIGKILL leaves no 70 MB file behind
    for pid in w2["rank_pids"]:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        shm = [ln.split(maxsplit=5)[-1] for ln in maps if "/dev/shm/deepspeed_" in ln]
        assert shm, f"rank pid {pid} maps no DeepSpeed all-reduce buffer"
        assert all(m.endswith("(deleted)") for m in shm), shm


async def test_two_ranks_equal_one_rank(mr_http: Http, jobs: dict[int, str]) -> None:
    batches = {
        "B=4 token-mean": sft_body(ROWS, post=["compute_logprobs"]),
        "B=3 seq-mean": sft_body(
            ROWS[:3], post=["compute_logprobs"], config={"loss_agg_mode": "seq-mean"}
        ),
        "B=1 < W": sft_body(ROWS[2:3], post=["compute_logprobs"]),
        "B=3 left-padded, sum": sft_body(
            ROWS[1:], left=True, post=["compute_logprobs"], config={"loss_agg_mode": "sum"}
        ),
        # 14, 12, 8, 6 real tokens: contiguous slices carry 26 | 14, token-balanced 20 | 20
        "B=4 contiguous": sft_body(UNEVEN, post=["compute_logprobs"]),
        "B=4 balanced (ZoRRO)": sft_body(UNEVEN, post=["compute_logprobs"], balance_rows=True),
    }
    ranks = {"B=4 contiguous": (26, 14), "B=4 balanced (ZoRRO)": (20, 20)}
    report = []
    for name, body in batches.items():
        fb = {w: await mr_http.run(M.FORWARD_BACKWARD, jobs[w], body) for w in (1, 2)}
        st = {w: await mr_http.run(M.STEP, jobs[w], {}) for w in (1, 2)}
        fwd = {w: await mr_http.run(M.FORWARD, jobs[w], {"kwargs": body["kwargs"]}) for w in (1, 2)}
        d_loss = _rel(fb[1]["loss"], fb[2]["loss"])
        d_gn = _rel(st[1]["metrics"]["grad_norm"], st[2]["metrics"]["grad_norm"])
        d_lp_in = np.abs(
            fb[1]["outputs"]["logprobs_shifted"] - fb[2]["outputs"]["logprobs_shifted"]
        ).max()
        d_lp = np.abs(
            fwd[1]["outputs"]["logprobs_shifted"] - fwd[2]["outputs"]["logprobs_shifted"]
        ).max()
        report.append(
            f"{name}: loss {fb[1]['loss']:.6f} rel {d_loss:.2g}; grad_norm "
            f"{st[1]['metrics']['grad_norm']:.6f} rel {d_gn:.2g}; log-probs max|d| in the call "
            f"{d_lp_in:.2g}, after the step {d_lp:.2g}"
        )
        assert d_loss <= REL, name
        assert fb[1]["metrics"]["num_tokens"] == fb[2]["metrics"]["num_tokens"], name
        assert fb[1]["metrics"]["num_sequences"] == fb[2]["metrics"]["num_sequences"], name
        assert d_gn <= REL, name
        assert st[1]["metrics"]["grad_norm"] > 0
        assert st[1]["metrics"]["global_step"] == st[2]["metrics"]["global_step"]
        assert d_lp_in <= 1e-5 and d_lp <= 1e-5, name
        total = int(np.asarray(body["kwargs"]["attention_mask"]).sum())
        m1, m2 = fb[1]["metrics"], fb[2]["metrics"]
        assert m1["rank_tokens_max"] == m1["rank_tokens_min"] == total, name  # W = 1: no-op
        assert m2["rank_tokens_max"] + m2["rank_tokens_min"] == total, name
        if name in ranks:
            assert (m2["rank_tokens_max"], m2["rank_tokens_min"]) == ranks[name], name
    print("\nW=2 vs W=1: " + "; ".join(report))


async def test_balance_rows_is_a_no_op_on_one_rank(mr_http: Http, jobs: dict[int, str]) -> None:
    """The same call with and without `balance_rows` on the same weights: W = 1 answers the
    same bits (nothing to balance); W = 2 the same values (other rows per rank)."""
    body = sft_body(UNEVEN, post=["compute_logprobs"])
    balanced = sft_body(UNEVEN, post=["compute_logprobs"], balance_rows=True)
    for w in (1, 2):
        a = await mr_http.run(M.FORWARD_BACKWARD, jobs[w], body)
        b = await mr_http.run(M.FORWARD_BACKWARD, jobs[w], balanced)
        await mr_http.run(M.STEP, jobs[w], {})
        la, lb = a["outputs"]["logprobs_shifted"], b["outputs"]["logprobs_shifted"]
        if w == 1:
            assert a["loss"] == b["loss"] and np.array_equal(la, lb)
            assert a["metrics"]["rank_tokens_max"] == b["metrics"]["rank_tokens_min"] == 40
        else:
            assert _rel(a["loss"], b["loss"]) <= REL and np.abs(la - lb).max() <= 1e-5
            assert (b["metrics"]["rank_tokens_max"], b["metrics"]["rank_tokens_min"]) == (20, 20)


async def test_two_ranks_micro_batched_and_two_calls(mr_http: Http, mr_server: ServerInfo) -> None:
    """micro_batch_size 1 inside each rank (ZeRO-1; and ZeRO-3, where every rank joins every
    parameter gather), gradients of two calls adding up before a step, against one rank's single
    pass (the shared W = 1 job's state is not used)."""
    w1 = create_job(mr_server, trainer_job(1))
    w2 = {
        stage: create_job(mr_server, trainer_job(2, micro_batch_size=1, zero_stage=stage))
        for stage in (1, 3)
    }
    try:
        body = sft_body(ROWS, post=["compute_logprobs"])
        n = int(sum(len(r) - 1 for r in ROWS))
        halves = [
            sft_body(ROWS[:3], post=["compute_logprobs"], config={"global_num_tokens": n}),
            sft_body(ROWS[3:], post=["compute_logprobs"], config={"global_num_tokens": n}),
        ]
        one = await mr_http.run(M.FORWARD_BACKWARD, w1, body)
        s1 = await mr_http.run(M.STEP, w1, {})
        f1 = await mr_http.run(M.FORWARD, w1, {"kwargs": body["kwargs"]})
        report = []
        for stage, job in w2.items():
            two = [await mr_http.run(M.FORWARD_BACKWARD, job, h) for h in halves]
            s2 = await mr_http.run(M.STEP, job, {})
            f2 = await mr_http.run(M.FORWARD, job, {"kwargs": body["kwargs"]})
            d = np.abs(f1["outputs"]["logprobs_shifted"] - f2["outputs"]["logprobs_shifted"]).max()
            d_gn = _rel(s1["metrics"]["grad_norm"], s2["metrics"]["grad_norm"])
            report.append(f"ZeRO-{stage}: grad_norm rel {d_gn:.2g}, log-probs after the step "
                          f"max|d| {d:.2g}")  # fmt: skip
            assert _rel(one["loss"], sum(t["loss"] for t in two)) <= REL, stage
            assert d_gn <= REL, stage
            assert d <= 1e-5, stage
        print("\nW=2 micro-batched (size 1), two calls (3 + 1 rows) vs W=1 one call: "
              + "; ".join(report))  # fmt: skip
    finally:
        for job in (w1, *w2.values()):
            await mr_http.control(M.CANCEL_JOB, job_id=job)


async def test_zero3_two_ranks_collective_sync(mr_http: Http, mr_server: ServerInfo) -> None:
    """A ZeRO-3 trainer on two ranks broadcasts its weights in 1 MiB buckets, each gathered for
    its bucket only (rank 1 joins every gather: `join_send`); the sampler then equals it."""
    from .helpers import CHAT, TEXTS, pad, sampled, trainer_vs_sampler

    body = trainer_job(2, zero_stage=3)
    body["sub_job_configs"].append({"job_type": "sampling", "dtype": "float32"})
    job = create_job(mr_server, body)
    try:
        await mr_http.run(M.FORWARD_BACKWARD, job, sft_body(ROWS))
        await mr_http.run(M.STEP, job, {})
        sync = await mr_http.run(M.SYNC_WEIGHTS, job, {"method": "collective"})
        prompts = [CHAT.format(t) for t in TEXTS]
        params = {"n": 4, "max_tokens": 16, "ignore_eos": True, "logprobs": 0, "seed": 3}
        gen = await mr_http.run(M.GENERATE, job, {"prompts": prompts, "sampling_params": params})
        rows, plens, lps = sampled(gen)
        ids, mask = pad(rows, left=True)
        fwd = await mr_http.run(
            M.FORWARD, job, {"kwargs": {"input_ids": ids, "attention_mask": mask}}
        )
        d = trainer_vs_sampler(fwd["outputs"]["logprobs_shifted"], rows, plens, lps, left=True)
        print(f"\nZeRO-3 x2 collective sync: {sync}; sampler vs trainer max|d| {d.max():.3g}")
        assert sync["method"] == "collective" and sync["num_buckets"] > 1
        assert sync["bucket_bytes"] <= 1 << 20
        assert gen["weight_version"] == sync["weight_version"] == 1
        assert d.size >= 128 and d.max() <= 1e-4
    finally:
        await mr_http.control(M.CANCEL_JOB, job_id=job)


async def test_sdk_round_trip_on_two_ranks(mr_server: ServerInfo) -> None:
    from arctic_sdk import AsyncClient

    body = sft_body(ROWS, post=["compute_logprobs"])
    async with AsyncClient(mr_server.base_url) as client:
        await client.create_job(trainer_job(2))
        await client.wait_until_running(timeout=600)
        fb = await client.forward_backward(body)
        st = await client.step()
        assert fb["metrics"]["num_tokens"] == sum(len(r) - 1 for r in ROWS)
        assert st["metrics"]["grad_norm"] > 0 and st["metrics"]["global_step"] == 1
        saved = (await client.save_checkpoint(checkpoint_id="w2"))["checkpoint"]
        assert saved["global_steps"] == 1 and saved["size_bytes"] > 0
        lp_saved = (await client.forward({"kwargs": body["kwargs"]}))["outputs"]["logprobs_shifted"]
        after = {"fb": await client.forward_backward(body), "st": await client.step()}
        lp_next = (await client.forward({"kwargs": body["kwargs"]}))["outputs"]["logprobs_shifted"]
        assert np.abs(lp_next - lp_saved).max() > 1e-3  # the step moved the weights
        loaded = (await client.load_checkpoint(checkpoint_id="w2"))["checkpoint"]
        assert loaded["global_steps"] == 1
        lp_loaded = (await client.forward({"kwargs": body["kwargs"]}))["outputs"][
            "logprobs_shifted"
        ]
        # the same step again from the loaded weights and optimizer state (both ranks' parts)
        again = {"fb": await client.forward_backward(body), "st": await client.step()}
        lp_again = (await client.forward({"kwargs": body["kwargs"]}))["outputs"]["logprobs_shifted"]
        print(
            f"\nW=2 save/load: loaded vs saved log-probs max|d| "
            f"{np.abs(lp_loaded - lp_saved).max():.2g}; replayed step vs original: loss rel "
            f"{_rel(again['fb']['loss'], after['fb']['loss']):.2g}, log-probs max|d| "
            f"{np.abs(lp_again - lp_next).max():.2g}"
        )
        assert np.abs(lp_loaded - lp_saved).max() <= 1e-6
        assert _rel(again["fb"]["loss"], after["fb"]["loss"]) <= REL
        assert _rel(again["st"]["metrics"]["grad_norm"], after["st"]["metrics"]["grad_norm"]) <= REL
        assert again["st"]["metrics"]["global_step"] == 2
        assert np.abs(lp_again - lp_next).max() <= 1e-5
        await client.cancel_job()


async def test_kill9_of_rank1_fails_the_sub_job(mr_http: Http, mr_server: ServerInfo) -> None:
    job = create_job(mr_server, trainer_job(2))
    info = mr_server.admin(job)["workers"][0]["info"]
    rank1 = int(info["rank_pids"][1])
    # a call long enough to be in flight when rank 1 dies
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 500, (64, 512), dtype=np.int64)
    big = {"kwargs": {"input_ids": ids}, "processing": {"loss_fn": "cross_entropy"}}
    task = asyncio.create_task(mr_http.run(M.FORWARD_BACKWARD, job, big))
    await asyncio.sleep(0.5)
    assert not task.done(), "the call finished before the kill: make it longer"
    t0 = time.monotonic()
    os.kill(rank1, signal.SIGKILL)
    with pytest.raises(CallError) as inflight:
        await asyncio.wait_for(task, 30)
    t_inflight = time.monotonic() - t0
    with pytest.raises(CallError) as nxt:
        await asyncio.wait_for(mr_http.run(M.STEP, job, {}), 30)
    t_next = time.monotonic() - t0
    state = await mr_http.get_job(job)
    reason = inflight.value.body["details"]["reason"]
    print(
        f"\nkill -9 of rank 1: in-flight call failed after {t_inflight:.2f} s "
        f"({inflight.value.code}: {reason[:140]}); next call after {t_next:.2f} s "
        f"({nxt.value.code}); job {state['state']}"
    )
    assert inflight.value.code == "sub_job_failed"
    assert inflight.value.body["details"]["sub_job_id"] == f"{job}:training:0"
    assert "rank 1 of 2" in reason and "SIGKILL" in reason
    assert nxt.value.code in ("job_terminal", "sub_job_failed")
    assert "rank 1 of 2" in str(nxt.value.body.get("message"))
    assert t_inflight < 10 and t_next < 10
    assert state["state"] == "failed" and "rank 1 of 2" in state["reason"]
    sub = state["sub_jobs"][0]
    assert sub["state"] == "failed" and "rank 1 of 2" in sub["reason"]
    deadline = time.monotonic() + 30  # rank 0 and the rank group are gone
    while any(os.path.exists(f"/proc/{p}") and _alive(p) for p in info["rank_pids"]):
        assert time.monotonic() < deadline, "rank processes left behind"
        await asyncio.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False
