"""LoRA jobs on the real engines (PROTOCOL.md §3.6): PEFT adapters on the DeepSpeed trainer,
adapter versions on the vLLM sampler, only the adapter synced.

On the session's shared server (`onprem`), beside the full-weight `shared_job`:

- a ZeRO-1 LoRA job (training + sampling): SFT lowers the loss; before any sync the sampler is the
  base model; after a sync the sampler's log-probs equal the trainer's (max |Δ| <= 1e-3 on >= 256
  sampled tokens, the full-weight proof's bound), `weight_version` follows adapter versions, the
  base model is still sampleable (`adapter: "base"`) and unchanged, and a second sync is a new
  version (not the cached old one, and sent over the job's weight group: `collective`); the
  sync moves the adapter's bytes only;
- a ZeRO-3 LoRA job on two ranks: the same parity after training and a sync.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M

from .conftest import ServerInfo, cancel_job, create_job
from .helpers import CHAT, ROWS, TEXTS, pad, sampled, sft_body, trainer_vs_sampler
from .raw import CallError, Http

LORA = {"rank": 8, "alpha": 16}
OPT = {"name": "adamw", "lr": 2e-2, "weight_decay": 0.0}
PARAMS = {"n": 4, "max_tokens": 16, "ignore_eos": True, "logprobs": 0, "seed": 99}
PROMPTS: list[object] = [CHAT.format(t) for t in TEXTS] + [list(r) for r in ROWS]


def lora_job(**training: Any) -> dict[str, Any]:
    return {
        "sub_job_configs": [
            {
                "job_type": "training",
                "dtype": "float32",
                "training_config": {"optimizer": OPT, "lora": LORA, **training},
            },
            {"job_type": "sampling", "dtype": "float32"},
        ],
        "experiment_name": "onprem-lora-tests",
    }


@pytest.fixture(scope="module")
def lora_z1(onprem: ServerInfo) -> Any:
    job = create_job(onprem, lora_job(zero_stage=1), timeout=900)
    yield job
    cancel_job(onprem, job)


async def _parity(http: Http, job: str, **gen: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """|trainer - sampler| over every sampled token, and the generate result."""
    body = {"prompts": PROMPTS, "sampling_params": PARAMS, **gen}
    res = await http.run(M.GENERATE, job, body)
    rows, plens, lps = sampled(res)
    ids, mask = pad(rows, left=True)
    fwd = await http.run(M.FORWARD, job, {"kwargs": {"input_ids": ids, "attention_mask": mask}})
    d = trainer_vs_sampler(fwd["outputs"]["logprobs_shifted"], rows, plens, lps, left=True)
    return d, res


async def _sft(http: Http, job: str, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        fb = await http.run(M.FORWARD_BACKWARD, job, sft_body(ROWS))
        st = await http.run(M.STEP, job, {})
        assert st["metrics"]["grad_norm"] > 0
        losses.append(float(fb["loss"]))
    return losses


async def test_lora_trainer_is_adapter_only(onprem: ServerInfo, lora_z1: str) -> None:
    views = {v["role"]: v for v in onprem.admin(lora_z1)["workers"]}
    info = views["training"]["info"]
    assert info["lora"]["rank"] == 8 and info["lora"]["target_modules"][0] == "q_proj"
    # 2 layers x 7 projections x r (in + out): the tiny model's adapter
    assert info["trainable_numel"] == 32_768 < info["total_numel"] // 10
    # the optimizer holds the adapter only (ZeRO-1: its fp32 copy; Adam's state follows it)
    assert info["optimizer_param_numel"] == info["trainable_numel"]
    assert views["sampling"]["weight_version"] == 0


async def test_lora_sft_sync_parity_and_versions(http: Http, lora_z1: str, shared_job: str) -> None:
    job = lora_z1
    d0, g0 = await _parity(http, job)  # B = 0: trainer and sampler are both the base model
    assert g0["weight_version"] == 0 and d0.max() <= 1e-3
    losses = await _sft(http, job, 6)
    print(f"\nLoRA SFT losses (ZeRO-1, r=8, lr 2e-2): {[round(x, 4) for x in losses]}")
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < 0.5 * losses[0]
    before, _ = await _parity(http, job)  # trained adapter, not synced yet
    sync = await http.run(M.SYNC_WEIGHTS, job, {})
    after, g1 = await _parity(http, job)
    full = await http.run(M.SYNC_WEIGHTS, shared_job, {})
    print(
        f"LoRA sync proof: {after.size} tokens; before sync max|Δ| {before.max():.4g}; after "
        f"max|Δ| {after.max():.3g} (mean {after.mean():.3g}); LoRA sync {sync['num_tensors']} "
        f"tensors {sync['num_bytes']} B in {sync['seconds'] * 1e3:.1f} ms vs full sync "
        f"{full['num_tensors']} tensors {full['num_bytes']} B in {full['seconds'] * 1e3:.1f} ms"
    )
    assert after.size >= 256 and after.max() <= 1e-3
    assert before.max() >= 1e-2
    assert sync["weight_version"] == 1 == g1["weight_version"]
    assert sync["num_tensors"] == 28 and sync["num_bytes"] == 4 * 32_768
    assert sync["num_bytes"] * 10 < full["num_bytes"]
    # the base model is still there, unchanged: the first generate's samples again
    base = await http.run(
        M.GENERATE, job, {"prompts": PROMPTS, "sampling_params": PARAMS, "adapter": "base"}
    )
    assert base["weight_version"] == 0
    assert sampled(base)[0] == sampled(g0)[0]
    assert np.allclose(np.concatenate(sampled(base)[2]), np.concatenate(sampled(g0)[2]), atol=1e-4)
    # a second version replaces the first (a reused vLLM adapter id would keep the old one);
    # it goes over the job's weight group: the adapter only, into a new adapter version
    await _sft(http, job, 2)
    sync2 = await http.run(M.SYNC_WEIGHTS, job, {"method": "collective"})
    after2, g2 = await _parity(http, job)
    print(f"second adapter version (collective): {sync2}; max|Δ| {after2.max():.3g}")
    assert sync2["weight_version"] == 2 == g2["weight_version"] and after2.max() <= 1e-3
    assert sync2["method"] == "collective" and sync2["num_bytes"] == 4 * 32_768
    assert sync2["load_seconds"] > 0  # the adapter registered as its next version


async def test_lora_refusals_on_a_live_job(http: Http, lora_z1: str, shared_job: str) -> None:
    body = {"prompts": [[1, 2, 3]], "sampling_params": {"max_tokens": 2}, "adapter": "base"}
    with pytest.raises(CallError) as e:
        await http.run(M.GENERATE, shared_job, body)  # a full-weight job has no base to go to
    assert e.value.code == "invalid_argument" and "adapter" in str(e.value.body)
    with pytest.raises(CallError) as e:
        await http.run(M.GENERATE, lora_z1, {**body, "adapter": "v7"})
    assert e.value.code == "invalid_argument"
    with pytest.raises(CallError) as e:
        await http.run(M.SYNC_WEIGHTS, lora_z1, {"method": "nccl"})
    assert e.value.code == "unsupported_option"


async def test_lora_checkpoints_and_exports(http: Http, onprem: ServerInfo, lora_z1: str) -> None:
    """Checkpoints hold the adapter (small); exports give the merged HF weights and the PEFT
    directory; a LoRA checkpoint loads back into the trainer and, as an adapter version, into
    the sampler (which then equals the trainer again)."""
    job = lora_z1
    await _sft(http, job, 1)
    res = (await http.run(M.SAVE_CHECKPOINT, job, {"checkpoint_id": "lora-r"}))["checkpoint"]
    wo = {"checkpoint_id": "lora-w", "checkpoint_type": "weights-only"}
    await http.run(M.SAVE_CHECKPOINT, job, wo)
    peft = await http.run(M.EXPORT_CHECKPOINT, job, {"format": "peft"}, checkpoint_id="lora-r")
    names = sorted(f["filename"] for f in peft["files"])
    assert names == ["adapter_config.json", "adapter_model.safetensors"]
    url = next(f["url"] for f in peft["files"] if f["filename"] == "adapter_model.safetensors")
    resp = await http.request("GET", f"{onprem.prefix_url}/{url}")
    assert resp.status == 200, resp.data
    from safetensors.numpy import load

    tensors = load(bytes(resp.data))
    assert len(tensors) == 28 and all(".lora_" in k for k in tensors)
    for ck in ("lora-r", "lora-w"):  # merged full weights, as an HF directory
        hf = await http.run(M.EXPORT_CHECKPOINT, job, {}, checkpoint_id=ck)
        files = {f["filename"]: f["size_bytes"] for f in hf["files"]}
        assert "config.json" in files and files["model.safetensors"] > 1_500_000, files
    print(f"\nLoRA resumable checkpoint: {res}")
    # back into the trainer, then the adapter into the sampler: trainer == sampler again
    one = {"prompts": [[1, 2, 3]], "sampling_params": {"max_tokens": 1}}
    v0 = (await http.run(M.GENERATE, job, one))["weight_version"]
    await http.run(M.LOAD_CHECKPOINT, job, {"checkpoint_id": "lora-r"})
    sampler = f"{job}:sampling:0"
    loaded = await http.run(
        M.LOAD_CHECKPOINT, job, {"checkpoint_id": "lora-r", "target_sub_job_id": sampler}
    )
    assert loaded["checkpoint"]["checkpoint_id"] == "lora-r"
    d, g = await _parity(http, job)
    print(f"after loading the LoRA checkpoint into both: max|Δ| {d.max():.3g}")
    assert d.max() <= 1e-3 and g["weight_version"] == v0 + 1


async def test_lora_zero3_two_ranks_sync_parity(http: Http, onprem: ServerInfo) -> None:
    job = create_job(onprem, lora_job(zero_stage=3, n_gpus=2), timeout=900)
    try:
        losses = await _sft(http, job, 4)
        print(f"\nLoRA SFT losses (ZeRO-3, 2 ranks): {[round(x, 4) for x in losses]}")
        assert losses[-1] < losses[0]
        sync = await http.run(M.SYNC_WEIGHTS, job, {})
        after, g = await _parity(http, job)
        print(f"ZeRO-3 x2 LoRA sync: max|Δ| {after.max():.3g} over {after.size} tokens")
        assert g["weight_version"] == sync["weight_version"] == 1
        assert after.size >= 256 and after.max() <= 1e-3
        assert sync["num_bytes"] == 4 * 32_768
    finally:
        cancel_job(onprem, job)
