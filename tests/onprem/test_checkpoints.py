"""Checkpoints and gradient accumulation on a training-only server (real DeepSpeed, fp32).

- save → a fresh training sub-job (another job) → load restores identical log-probs, and the
  next step lands where the original's did (optimizer state restored too);
- the same batch as one forward-backward or split into two (with `global_num_tokens`) before one
  step gives the same update; a call split into micro-batches by the trainer's
  `micro_batch_size` gives the same update as one pass;
- export writes an HF directory that transformers (a training sub-job started on it) and vLLM (a
  sampling sub-job started on it) load, with the checkpoint's log-probs; list and delete.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M

from .conftest import ServerInfo, cancel_job, create_job, start_server, stop_server
from .helpers import ROWS, pad, sft_body
from .raw import CallError, Http

pytestmark = pytest.mark.slow


def trainer(stage: int, **extra: Any) -> dict[str, Any]:
    cfg = {
        "zero_stage": stage,
        "optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0},
        **extra,
    }
    return {"sub_job_configs": [{"job_type": "training", "training_config": cfg}]}


@pytest.fixture(scope="module")
def trainsrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    srv = start_server(
        tmp_path_factory.mktemp("trainsrv"), "--prewarm", "deepspeed", name="training-only"
    )
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture
async def thttp(trainsrv: ServerInfo) -> Any:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        yield Http(session, trainsrv.prefix_url)


PROBE = pad([list(r) for r in ROWS], left=True)


async def probe(http: Http, job: str, headers: dict[str, str] | None = None) -> np.ndarray:
    ids, mask = PROBE
    res = await http.run(
        M.FORWARD, job, {"kwargs": {"input_ids": ids, "attention_mask": mask}}, headers=headers
    )
    return np.asarray(res["outputs"]["logprobs_shifted"])


async def sft_step(http: Http, job: str, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    for b in bodies:
        await http.run(M.FORWARD_BACKWARD, job, b)
    return dict((await http.run(M.STEP, job, {}))["metrics"])


STATE: dict[str, Any] = {}


async def test_save_then_load_into_a_fresh_sub_job(thttp: Http, trainsrv: ServerInfo) -> None:
    t1 = create_job(trainsrv, trainer(2))
    for _ in range(3):
        await sft_step(thttp, t1, [sft_body()])
    saved = (await thttp.run(M.SAVE_CHECKPOINT, t1, {"checkpoint_id": "ck1"}))["checkpoint"]
    assert (
        saved["checkpoint_id"] == "ck1" and saved["global_steps"] == 3 and saved["size_bytes"] > 0
    )
    l_saved = await probe(thttp, t1)
    next_metrics = await sft_step(thttp, t1, [sft_body()])
    l_next = await probe(thttp, t1)
    listed = await thttp.run(M.LIST_CHECKPOINTS, t1)
    assert [c["checkpoint_id"] for c in listed["checkpoints"]] == ["ck1"]

    # a fresh job whose trainer splits every call into micro-batches of 2 rows
    t2 = create_job(trainsrv, trainer(2, micro_batch_size=2))
    l_fresh = await probe(thttp, t2)
    loaded = (
        await thttp.run(M.LOAD_CHECKPOINT, t2, {"checkpoint_id": "ck1", "source_job_id": t1})
    )["checkpoint"]
    assert loaded["global_steps"] == 3
    l_loaded = await probe(thttp, t2)
    job = await thttp.get_job(t2)
    assert job["global_step"] == 3
    resumed_metrics = await sft_step(thttp, t2, [sft_body()])
    l_resumed = await probe(thttp, t2)
    d_load = float(np.abs(l_loaded - l_saved).max())
    d_next = float(np.abs(l_resumed - l_next).max())
    print(
        f"\ncheckpoint: fresh vs saved max|Δ| {np.abs(l_fresh - l_saved).max():.3g}; "
        "loaded vs saved "
        f"{d_load:.3g}; next step (micro-batched) vs original {d_next:.3g}; grad_norm "
        f"{resumed_metrics['grad_norm']:.6f} vs {next_metrics['grad_norm']:.6f}"
    )
    assert np.abs(l_fresh - l_saved).max() > 1e-2
    assert d_load == 0.0
    assert d_next <= 1e-5
    assert resumed_metrics["grad_norm"] == pytest.approx(next_metrics["grad_norm"], rel=1e-5)
    assert resumed_metrics["loss"] == pytest.approx(next_metrics["loss"], rel=1e-5)
    STATE.update(t1=t1, t2=t2, l_saved=l_saved)


async def test_split_batch_gives_the_same_update(thttp: Http) -> None:
    job = STATE.get("t1")
    if job is None:
        pytest.skip("needs the job of test_save_then_load_into_a_fresh_sub_job")
    await thttp.run(M.SAVE_CHECKPOINT, job, {"checkpoint_id": "base"})
    ids, mask = pad(ROWS)
    n_tokens = int(((mask[:, :-1] != 0) & (mask[:, 1:] != 0)).sum())
    cfg = {"loss_agg_mode": "token-mean", "global_num_tokens": n_tokens}

    def body(sl: slice) -> dict[str, Any]:
        return {
            "kwargs": {"input_ids": ids[sl], "attention_mask": mask[sl]},
            "processing": {"loss_fn": "cross_entropy", "config": cfg},
        }

    one = await sft_step(thttp, job, [body(slice(None))])
    l_one = await probe(thttp, job)
    await thttp.run(M.LOAD_CHECKPOINT, job, {"checkpoint_id": "base"})
    two = await sft_step(thttp, job, [body(slice(0, 2)), body(slice(2, None))])
    l_two = await probe(thttp, job)
    d = float(np.abs(l_one - l_two).max())
    print(
        f"\nsplit batch: loss {one['loss']:.6f} vs {two['loss']:.6f}; "
        f"grad_norm {one['grad_norm']:.6f} "
        f"vs {two['grad_norm']:.6f}; log-probs after the step max|Δ| {d:.3g}"
    )
    assert two["num_tokens"] == one["num_tokens"] == n_tokens
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert d <= 1e-5


async def test_export_loads_in_transformers_and_vllm(
    thttp: Http, http: Http, trainsrv: ServerInfo, onprem: ServerInfo, tmp_path: Path
) -> None:
    t1, l_saved = STATE.get("t1"), STATE.get("l_saved")
    if t1 is None:
        pytest.skip("needs the job of test_save_then_load_into_a_fresh_sub_job")
    exp = await thttp.run(M.EXPORT_CHECKPOINT, t1, checkpoint_id="ck1")
    names = {f["filename"] for f in exp["files"]}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    out = tmp_path / "exported"
    out.mkdir()
    for f in exp["files"]:
        resp = await thttp.request("GET", f"{trainsrv.prefix_url}/{f['url']}")
        assert resp.status == 200, resp.data
        assert (
            hashlib.sha256(resp.data).hexdigest() == f["sha256"]
            and len(resp.data) == f["size_bytes"]
        )
        (out / f["filename"]).write_bytes(resp.data)

    # transformers: a training sub-job started on the exported directory
    t3 = create_job(
        trainsrv,
        {
            "sub_job_configs": [
                {
                    "job_type": "training",
                    "model_name": str(out),
                    "training_config": {"zero_stage": 3},
                }
            ]
        },
    )
    d_hf = float(np.abs(await probe(thttp, t3) - l_saved).max())
    # ZeRO-3 trains and saves a weights-only checkpoint from the exported model
    await sft_step(thttp, t3, [sft_body()])
    w = (await thttp.run(M.SAVE_CHECKPOINT, t3, {"checkpoint_type": "weights-only"}))["checkpoint"]
    assert w["checkpoint_type"] == "weights-only" and w["global_steps"] == 1
    cancel_job(trainsrv, t3)

    # vLLM: a sampling sub-job started on it (scored through forward on the sampling sub-job)
    s = create_job(onprem, {"sub_job_configs": [{"job_type": "sampling", "model_name": str(out)}]})
    l_vllm = await probe(http, s, headers={"X-Arctic-Sub-Job": f"{s}:sampling:0"})
    ids, mask = PROBE
    scored = await http.run(
        M.LOG_PROBS,
        s,
        {"input_ids": ids, "attention_mask": mask},
        headers={"X-Arctic-Sub-Job": f"{s}:sampling:0"},
    )
    assert np.abs(scored["outputs"]["logprobs_shifted"] - l_vllm).max() == 0.0
    gen = await http.run(
        M.GENERATE, s, {"prompts": ["hello"], "sampling_params": {"max_tokens": 4}}
    )
    assert len(gen["results"][0]["samples"][0]["token_ids"]) >= 1
    cancel_job(onprem, s)
    d_vllm = float(np.abs(l_vllm - l_saved).max())
    print(f"\nexport: {sorted(names)}; transformers max|Δ| {d_hf:.3g}; vLLM max|Δ| {d_vllm:.3g}")
    assert d_hf <= 1e-5
    assert d_vllm <= 1e-4

    deleted = await thttp.run(M.DELETE_CHECKPOINT, t1, checkpoint_id="ck1")
    assert deleted == {"deleted": True}
    listed = await thttp.run(M.LIST_CHECKPOINTS, t1)
    assert "ck1" not in [c["checkpoint_id"] for c in listed["checkpoints"]]
    with pytest.raises(CallError) as err:
        await thttp.run(M.LOAD_CHECKPOINT, t1, {"checkpoint_id": "ck1"})
    assert err.value.code == "checkpoint_not_found"
