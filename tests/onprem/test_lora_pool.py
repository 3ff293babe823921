"""LoRA pools on the on-prem server's real engines (PROTOCOL.md §3.6): many LoRA jobs over one
base model share one DeepSpeed-worker trainer and one vLLM sampler, each with its own adapter,
optimizer, schedule, weight_version and checkpoints.

Its own server (`--lora-pool *=3`, two tokens), one pool for the whole module:

- sharing: two jobs (one with an lm_head adapter, Tinker's default) run on the same two worker
  processes, the capabilities list the pool, a sync moves the adapter only (lm_head included),
  by file (`auto`; a weight group, `collective`, is refused by name: serving/lora_sync.py);
- isolation (the issue's proof): tenant B's sequence (forward-backward with adapter dropout,
  step, sync, greedy generate with log-probs, trainer log-probs) run once alone and once with
  tenant A's forward-backward / step / sync / generate / prefix-cache reset / checkpoint and
  malformed calls interleaved, and concurrent: every loss, gradient norm, log-prob and sampled
  token of B bitwise identical; another token's job is 404;
- fairness: a busy tenant with a backlog of forward-backwards and an occasional one: at most
  two of the busy one's calls start between the occasional one's arrival and its start (arrival
  order would run the whole backlog first);
- the shared continuous batch (both tenants' requests in one engine step), the adapter limit
  (a retryable 429 past it, room again once a job ends), cancel and lease expiry (a client that
  vanished) freeing only their adapter, and a tenant's checkpoints.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M

from .conftest import ServerInfo, start_server, stop_server
from .helpers import ROWS, sampled, sft_body
from .raw import CallError, Http

TOKENS = ("pat-a", "pat-b")
LIMIT = 3
PROMPTS: list[object] = [list(r) for r in ROWS]
GREEDY = {"n": 1, "max_tokens": 12, "temperature": 0.0, "logprobs": 0, "ignore_eos": True}


def lora_job(*, lr: float = 2e-2, seed: int = 7, **lora: Any) -> list[dict[str, Any]]:
    return [
        {
            "job_type": "training",
            "dtype": "float32",
            "seed": seed,
            "training_config": {
                "optimizer": {"name": "adamw", "lr": lr, "weight_decay": 0.0},
                "lr_scheduler": {"type": "cosine", "warmup_steps": 2, "total_steps": 20},
                "lora": {"rank": 8, **lora},
            },
        },
        {"job_type": "sampling", "dtype": "float32"},
    ]


@pytest.fixture(scope="module")
def pool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    args = ["--lora-pool", f"*={LIMIT}", "--lora-pool-idle-s", "3600"]
    for t in TOKENS:
        args += ["--token", t]
    srv = start_server(tmp_path_factory.mktemp("lora-pool"), *args, name="pool")
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture
async def clients(pool_server: ServerInfo) -> AsyncIterator[tuple[Http, Http]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as s:
        yield Http(s, pool_server.prefix_url, TOKENS[0]), Http(s, pool_server.prefix_url, TOKENS[1])


async def new_job(h: Http, configs: list[dict[str, Any]], **extra: Any) -> str:
    job = await h.create_job(configs, **extra)
    await h.wait_running(job, 900)
    return job


async def cancel(h: Http, job: str) -> None:
    resp = await h.call(M.CANCEL_JOB, job_id=job)
    assert resp.status == 200 or resp.code == "job_terminal", resp.data


async def pools(h: Http, srv: ServerInfo) -> list[dict[str, Any]]:
    r = await h.request("GET", f"{srv.admin_url}/pools")
    assert r.status == 200, r.data
    return list(r.data["pools"])


async def live_pool(h: Http, srv: ServerInfo) -> dict[str, Any]:
    (pool,) = [p for p in await pools(h, srv) if p["state"] == "ready"]
    return pool


def fb_body(seed: int, rows: int = 4, cols: int = 24) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 500, size=(rows, cols)).astype(np.int64)
    return {"kwargs": {"input_ids": ids}, "processing": {"post": ["compute_logprobs"]}}


async def test_jobs_share_the_pools_engines(
    clients: tuple[Http, Http], pool_server: ServerInfo
) -> None:
    ha, _ = clients
    caps = await ha.control(M.GET_CAPABILITIES)
    assert caps["lora"]["shared_sampler"] is True
    assert {"base_model": "*", "max_adapters": LIMIT}.items() <= caps["lora"]["pools"][0].items()
    a = await new_job(ha, lora_job())
    b = await new_job(ha, lora_job(train_lm_head=True))  # Tinker's default train_unembed
    try:
        pool = await live_pool(ha, pool_server)
        assert sorted(pool["jobs"]) == sorted([a, b]) and pool["adapters"] == 2
        pids = {e["pid"] for e in pool["engines"].values()}
        for j in (a, b):
            r = await ha.request("GET", f"{pool_server.admin_url}/jobs/{j}")
            views = {v["role"]: v for v in r.data["workers"]}
            assert {v["pid"] for v in views.values()} == pids  # no engine of their own
            assert views["training"]["info"]["pooled"] is True
        rows = {c["base_model"]: c for c in (await ha.control(M.GET_CAPABILITIES))["lora"]["pools"]}
        assert rows[""]["adapters"] == 2 and rows[""]["warm"] is True
        for job, n_tensors in ((a, 28), (b, 30)):  # the adapter only; b's has the lm_head's A, B
            await ha.run(M.FORWARD_BACKWARD, job, sft_body(ROWS))
            await ha.run(M.STEP, job, {})
            with pytest.raises(CallError) as group:  # the pool's engines are shared: a file
                await ha.run(M.SYNC_WEIGHTS, job, {"method": "collective"})
            assert group.value.code == "unsupported_option", group.value
            assert group.value.body["details"]["field"] == "method"
            # `auto` (the weight group for a job with its own engines on this host) is the file
            sync = await ha.run(M.SYNC_WEIGHTS, job, {})
            assert sync["num_tensors"] == n_tensors and sync["weight_version"] == 1
            assert sync["num_bytes"] < 200_000  # the full model is 1.7 MB
            assert sync["method"] == "shm" and sync["num_buckets"] == 1, sync
            assert sync["bucket_bytes"] == sync["num_bytes"] and sync["setup_seconds"] == 0.0
            g = await ha.run(M.GENERATE, job, {"prompts": PROMPTS, "sampling_params": GREEDY})
            base = {"prompts": PROMPTS, "sampling_params": GREEDY, "adapter": "base"}
            assert g["weight_version"] == 1
            assert (await ha.run(M.GENERATE, job, base))["weight_version"] == 0
    finally:
        for j in (a, b):
            await cancel(ha, j)


async def tenant_b_sequence(h: Http, job: str, between: Any) -> list[Any]:
    """Tenant B's calls, `between()` awaited after each; everything B observes."""
    seen: list[Any] = []
    for i in range(3):
        fb = await h.run(M.FORWARD_BACKWARD, job, fb_body(i))
        seen += [fb["loss"], fb["outputs"]["logprobs_shifted"].tobytes()]
        await between()
        st = await h.run(M.STEP, job, {})
        seen += [st["metrics"]["grad_norm"], st["metrics"]["lr"], st["metrics"]["loss"]]
        await between()
    twice = [await h.run(M.FORWARD_BACKWARD, job, fb_body(5)) for _ in range(2)]
    assert twice[0]["loss"] != twice[1]["loss"]  # adapter dropout: new masks call after call
    seen += [fb["loss"] for fb in twice]
    await between()
    seen.append((await h.run(M.SYNC_WEIGHTS, job, {}))["weight_version"])
    await between()
    for _ in range(2):  # the second one may hit the prefix cache
        g = await h.run(M.GENERATE, job, {"prompts": PROMPTS, "sampling_params": GREEDY})
        rows, _, lps = sampled(g)
        seen += [rows, [np.asarray(x, np.float64).tobytes() for x in lps], g["weight_version"]]
        await between()
    fwd = await h.run(M.FORWARD, job, fb_body(9))
    seen.append(fwd["outputs"]["logprobs_shifted"].tobytes())
    return seen


async def test_tenants_are_isolated_bitwise(
    clients: tuple[Http, Http], pool_server: ServerInfo
) -> None:
    """B's sequence alone, then a fresh B (same seed and config) with A active in between and
    beside it: B observes exactly the same numbers. A's malformed calls fail alone."""
    ha, hb = clients
    dropout = {"dropout": 0.1}  # the adapter's dropout draws from B's own generator

    async def idle() -> None:
        return None

    b1 = await new_job(hb, lora_job(**dropout))
    alone = await tenant_b_sequence(hb, b1, idle)
    await cancel(hb, b1)

    a = await new_job(ha, lora_job(lr=5e-2, seed=1, train_lm_head=True, dropout=0.2))
    b2 = await new_job(hb, lora_job(**dropout))
    step = 0

    async def a_acts() -> None:
        nonlocal step
        step += 1
        await ha.run(M.FORWARD_BACKWARD, a, fb_body(100 + step))
        if step % 2:  # its own Adam settings too (StepRequest.adam: its optimizer only)
            adam = {"beta1": 0.8, "eps": 1e-6, "gradient_clipping": 0.5}
            await ha.run(M.STEP, a, {"learning_rate": 0.1, "adam": adam})
            await ha.run(M.SYNC_WEIGHTS, a, {})
        await ha.run(M.GENERATE, a, {"prompts": PROMPTS, "sampling_params": {"max_tokens": 5}})
        if step == 3:
            await ha.run(M.RESET_PREFIX_CACHE, a, {})
            await ha.run(M.SAVE_CHECKPOINT, a, {"checkpoint_id": "a-mid"})
        with pytest.raises(CallError) as bad:  # refused by the server
            await ha.run(M.FORWARD_BACKWARD, a, {"kwargs": {"input_ids": np.full((1, 4), 999)}})
        assert bad.value.code == "invalid_argument"

    try:
        with_a = await tenant_b_sequence(hb, b2, a_acts)
        # and concurrently: A's calls, one refused by the shared sampler itself, beside B's
        long_prompt = {"prompts": [[5] * 1100], "sampling_params": {"max_tokens": 2}}
        res = await asyncio.gather(
            hb.run(M.FORWARD, b2, fb_body(9)),
            ha.run(M.FORWARD_BACKWARD, a, fb_body(7)),
            ha.run(M.GENERATE, a, long_prompt),
            hb.run(M.GENERATE, b2, {"prompts": PROMPTS, "sampling_params": GREEDY}),
            return_exceptions=True,
        )
        assert isinstance(res[2], CallError) and res[2].code == "invalid_argument", res[2]
        assert not any(isinstance(r, BaseException) for r in (res[0], res[1], res[3])), res
        assert res[0]["outputs"]["logprobs_shifted"].tobytes() == with_a[-1]
        # another token sees no job of the other
        with pytest.raises(CallError) as other:
            await hb.run(M.FORWARD_BACKWARD, a, fb_body(0))
        assert other.value.status == 404 and other.value.code == "job_not_found"
    finally:
        await cancel(ha, a)
        await cancel(hb, b2)
    assert len(alone) == len(with_a)
    diffs = [i for i, (x, y) in enumerate(zip(alone, with_a, strict=True)) if x != y]
    print(f"\nisolation: {len(alone)} observations of B, {len(diffs)} differ: {diffs}")
    assert not diffs


async def test_a_busy_tenant_does_not_starve_an_occasional_one(
    clients: tuple[Http, Http], pool_server: ServerInfo
) -> None:
    ha, hb = clients
    busy = await new_job(ha, lora_job())
    occasional = await new_job(hb, lora_job())
    backlog = 10
    big = fb_body(1, rows=24, cols=192)
    try:
        flood = [
            asyncio.ensure_future(ha.run(M.FORWARD_BACKWARD, busy, big)) for _ in range(backlog)
        ]
        # (not a timing assertion: time for the backlog to reach the trainer's queue; no probe of
        # the trainer, which would itself wait in that queue)
        await asyncio.sleep(1.0)
        sent = time.time()
        await hb.run(M.FORWARD_BACKWARD, occasional, fb_body(2))
        waited = time.time() - sent
        await asyncio.gather(*flood)
        recent = (await live_pool(ha, pool_server))["engines"]["training"]["stats"]["recent"]
        order = [(t0, tenant) for t0, tenant, cmd in recent if cmd == "forward_backward"]
        started = next(t0 for t0, tenant in order if tenant == occasional)
        ahead = [t0 for t0, tenant in order if tenant == busy and sent < t0 < started]
        busy_runs = sorted(t0 for t0, tenant in order if tenant == busy)
        per_call = (busy_runs[-1] - busy_runs[0]) / max(1, len(busy_runs) - 1)
        print(
            f"\nfairness: {backlog} queued calls of the busy tenant ({per_call:.2f} s each); "
            f"the occasional one waited {waited:.2f} s, behind {len(ahead)} of them"
        )
        behind = [t0 for t0, tenant in order if tenant == busy and t0 > started]
        assert len(ahead) + len(behind) >= backlog // 2, "the backlog had drained: no contest"
        assert len(ahead) <= 2, (ahead, order)
    finally:
        await cancel(ha, busy)
        await cancel(hb, occasional)


async def test_shared_batch_limit_cancel_and_lease(
    clients: tuple[Http, Http], pool_server: ServerInfo
) -> None:
    ha, hb = clients
    a = await new_job(ha, lora_job())
    b = await new_job(hb, lora_job(seed=3))
    c = await new_job(ha, lora_job(seed=4), lease_seconds=20)
    try:
        # both tenants' generates (each with its own adapter version) in one continuous batch
        for h, j in ((ha, a), (hb, b)):
            await h.run(M.FORWARD_BACKWARD, j, sft_body(ROWS))
            await h.run(M.STEP, j, {})
            await h.run(M.SYNC_WEIGHTS, j, {})
        gen = {
            "prompts": PROMPTS,
            "sampling_params": {"n": 4, "max_tokens": 48, "ignore_eos": True},
        }
        await asyncio.gather(*(h.run(M.GENERATE, j, gen) for h, j in ((ha, a), (hb, b)) * 2))
        stats = (await live_pool(ha, pool_server))["engines"]["sampling"]["stats"]
        assert stats["peak_adapters"] >= 2, stats
        # the limit: a fourth poolable job is refused, retryably, naming the pool
        resp = await ha.call(M.CREATE_JOB, {"sub_job_configs": lora_job()})
        assert resp.status == 429 and resp.code == "rate_limited", resp.data
        err = resp.error
        assert err["details"]["limit"] == LIMIT and err["details"]["pool"].startswith("pool-")
        assert int(resp.headers["Retry-After"]) > 0
        # c's client vanishes: its lease expires; only its adapter leaves the pool
        deadline = time.monotonic() + 120
        while (await ha.get_job(c))["state"] != "cancelled":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)
        pool = await live_pool(ha, pool_server)
        assert sorted(pool["jobs"]) == sorted([a, b])
        for e in pool["engines"].values():
            assert set(e["stats"]["tenants"]) == {a, b}
        # b's cancel frees only b's adapter; a goes on; there is room again
        await cancel(hb, b)
        await asyncio.sleep(0.5)
        assert (await live_pool(ha, pool_server))["jobs"] == [a]
        await ha.run(M.FORWARD_BACKWARD, a, sft_body(ROWS))
        d = await new_job(ha, lora_job(seed=5))
        await cancel(ha, d)
    finally:
        await cancel(ha, a)
        await cancel(hb, b)


async def test_a_tenants_checkpoints(clients: tuple[Http, Http], pool_server: ServerInfo) -> None:
    """A tenant's resumable checkpoint restores its adapter and optimizer; its exports are the
    PEFT adapter and the merged weights; a new pooled job loads it by source_job_id."""
    ha, _ = clients
    job = await new_job(ha, lora_job())
    other = ""
    try:
        for _ in range(2):
            await ha.run(M.FORWARD_BACKWARD, job, sft_body(ROWS))
            await ha.run(M.STEP, job, {})
        await ha.run(M.SAVE_CHECKPOINT, job, {"checkpoint_id": "r"})
        after = [await _fb_step(ha, job) for _ in range(2)]
        await ha.run(M.LOAD_CHECKPOINT, job, {"checkpoint_id": "r"})
        again = [await _fb_step(ha, job) for _ in range(2)]
        assert after == again  # adapter, Adam moments and schedule all restored
        peft = await ha.run(M.EXPORT_CHECKPOINT, job, {"format": "peft"}, checkpoint_id="r")
        assert sorted(f["filename"] for f in peft["files"]) == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]
        hf = await ha.run(M.EXPORT_CHECKPOINT, job, {}, checkpoint_id="r")
        assert {f["filename"] for f in hf["files"]} >= {"config.json", "model.safetensors"}
        other = await new_job(ha, lora_job(seed=11))
        body = {"checkpoint_id": "r", "source_job_id": job}
        await ha.run(M.LOAD_CHECKPOINT, other, body)
        assert [await _fb_step(ha, other) for _ in range(2)] == after
    finally:
        await cancel(ha, job)
        if other:
            await cancel(ha, other)


async def test_a_tenants_step_adam_is_its_own(
    clients: tuple[Http, Http], pool_server: ServerInfo
) -> None:
    """`StepRequest.adam` (Tinker's per-call AdamParams) on a pooled job: applied to its own
    optimizer and clip — eps 1 and a clip of 1e-9 leave its adapter where it was, where the
    same step without them moves a twin job's — and refused by name on an SGD tenant."""
    ha, _ = clients
    twins = [await new_job(ha, lora_job()) for _ in range(2)]
    sgd = lora_job()
    sgd[0]["training_config"]["optimizer"] = {"name": "sgd", "lr": 1e-2}
    other = await new_job(ha, sgd)
    try:
        before = (await ha.run(M.FORWARD, twins[0], fb_body(3)))["outputs"]["logprobs_shifted"]
        frozen = {"learning_rate": 0.05, "adam": {"eps": 1.0, "gradient_clipping": 1e-9}}
        after = []
        for job, step in zip(twins, (frozen, {"learning_rate": 0.05}), strict=True):
            await ha.run(M.FORWARD_BACKWARD, job, sft_body(ROWS))
            await ha.run(M.STEP, job, step)
            fwd = await ha.run(M.FORWARD, job, fb_body(3))
            after.append(fwd["outputs"]["logprobs_shifted"])
        assert np.abs(after[0] - before).max() <= 1e-6  # its eps and clip held the step back
        assert np.abs(after[1] - before).max() >= 1e-3  # the twin's default Adam moved
        await ha.run(M.FORWARD_BACKWARD, other, sft_body(ROWS))
        with pytest.raises(CallError) as e:
            await ha.run(M.STEP, other, {"adam": {"eps": 1e-8}})
        assert e.value.code == "unsupported_option" and "sgd" in str(e.value.body), e.value
    finally:
        for j in (*twins, other):
            await cancel(ha, j)


async def _fb_step(h: Http, job: str) -> tuple[float, float]:
    fb = await h.run(M.FORWARD_BACKWARD, job, sft_body(ROWS))
    st = await h.run(M.STEP, job, {})
    return float(fb["loss"]), float(st["metrics"]["grad_norm"])
