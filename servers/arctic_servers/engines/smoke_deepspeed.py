"""Smoke test: DeepSpeed ZeRO 1/2/3 on CPU with the tiny model, one process, no launcher.

Run in the on-prem venv from the repository root::

    PYTHONPATH=servers python -m arctic_servers.engines.smoke_deepspeed [--stages 1 2 3] [--out F]

Per stage: ``deepspeed.initialize`` (fp32, ``torch_adam``), 5 x forward/backward/step on one fixed
batch (loss must fall), ``save_checkpoint`` -> one more step -> ``load_checkpoint`` into a fresh
engine (loss and weights must equal the saved ones), and a gather of the full fp32 state dict in HF
names (ZeRO-3: ``deepspeed.zero.GatheredParameters``), written as safetensors the way a weight sync
hands it to vLLM. The gathered weights of every stage are compared with each other: same data, same
seed, same optimizer -> the same weights up to float reassociation.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

DEFAULT_MODEL_DIR = Path(os.environ.get("ARCTIC_TINY_MODEL_DIR", "/tmp/arctic-engines/tiny-qwen2"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_ds_env() -> None:
    """Single-process torch.distributed rendezvous for DeepSpeed on CPU (no launcher, no MPI)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_SIZE", "1")  # CPU accelerator's device_count()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def ds_config(
    stage: int, *, lr: float = 1e-3, micro_batch: int = 4, offload_optimizer: bool = False
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": lr,
                "betas": [0.9, 0.999],
                "eps": 1e-8,
                "weight_decay": 0.0,
                "torch_adam": True,
            },
        },
        "zero_optimization": {
            "stage": stage,
            # keep every tensor in one bucket/partition on a tiny model; harmless defaults otherwise
            "stage3_param_persistence_threshold": 0,
        },
    }
    if offload_optimizer:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    return cfg


def make_batch(tokenizer: Any, *, batch: int = 4, seq_len: int = 32) -> dict[str, Any]:
    import torch

    texts = [
        "The quick brown fox jumps over the lazy dog.",
        "User: What is two plus two? Assistant: Two plus two is four.",
        "The weather today is sunny with a light breeze.",
        "Questions and answers, prompts and completions, tokens and weights.",
    ]
    rows = []
    for i in range(batch):
        ids = tokenizer(texts[i % len(texts)], add_special_tokens=False)["input_ids"]
        ids = (ids * ((seq_len // max(1, len(ids))) + 1))[:seq_len]
        rows.append(ids)
    input_ids = torch.tensor(rows, dtype=torch.long)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "labels": input_ids.clone(),
    }


def load_hf_model(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM  # type: ignore[import-not-found, unused-ignore]

    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager"
    )
    model.train()
    return model


def init_engine(
    model_dir: Path, stage: int, *, seed: int = 0, offload_optimizer: bool = False
) -> Any:
    import deepspeed  # type: ignore[import-not-found, unused-ignore]
    import torch

    torch.manual_seed(seed)
    model = load_hf_model(model_dir)
    engine, _opt, _dl, _sched = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config(stage, offload_optimizer=offload_optimizer),
    )
    return engine


def train_step(engine: Any, batch: dict[str, Any]) -> float:
    out = engine(**batch)
    loss = out.loss
    engine.backward(loss)
    engine.step()
    return float(loss.detach())


def eval_loss(engine: Any, batch: dict[str, Any]) -> float:
    import torch

    with torch.no_grad():
        return float(engine(**batch).loss)


def gather_full_state_dict(engine: Any) -> dict[str, Any]:
    """Full fp32 weights in HF names, on CPU, detached copies (what a weight sync sends)."""
    import deepspeed  # type: ignore[import-not-found, unused-ignore]

    module = engine.module
    if engine.zero_optimization_stage() == 3:
        params = list(module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            sd = {n: p.detach().clone().cpu() for n, p in module.named_parameters()}
    else:
        # ZeRO 1/2 partition optimizer state/grads only; fp32 training keeps full module params.
        sd = {n: p.detach().clone().cpu() for n, p in module.named_parameters()}
    return sd


def max_tensor_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys(), (sorted(a.keys() ^ b.keys()))[:5]
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def run_stage(
    model_dir: Path, stage: int, work: Path, *, offload_optimizer: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer  # type: ignore[import-not-found, unused-ignore]

    r: dict[str, Any] = {"stage": stage}
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    batch = make_batch(tok)
    t = time.perf_counter()
    engine = init_engine(model_dir, stage, offload_optimizer=offload_optimizer)
    r["offload_optimizer"] = offload_optimizer
    r["initialize_s"] = round(time.perf_counter() - t, 3)
    r["optimizer"] = type(engine.optimizer).__name__
    inner = getattr(engine.optimizer, "optimizer", None)
    r["inner_optimizer"] = type(inner).__name__ if inner is not None else None
    losses = []
    step_s = []
    for _ in range(5):
        t = time.perf_counter()
        losses.append(train_step(engine, batch))
        step_s.append(time.perf_counter() - t)
    r["losses"] = [round(x, 5) for x in losses]
    r["loss_decreasing"] = all(b < a for a, b in pairwise(losses))
    r["step_s_mean"] = round(sum(step_s[1:]) / max(1, len(step_s) - 1), 4)
    r["step_s_first"] = round(step_s[0], 4)

    ckpt = work / f"ckpt-z{stage}"
    saved_loss = eval_loss(engine, batch)
    t = time.perf_counter()
    sd_saved = gather_full_state_dict(engine)
    r["gather_s"] = round(time.perf_counter() - t, 4)
    t = time.perf_counter()
    engine.save_checkpoint(str(ckpt), tag="step5", client_state={"step": 5})  # not-an-op
    r["save_checkpoint_s"] = round(time.perf_counter() - t, 3)
    r["checkpoint_bytes"] = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    r["checkpoint_files"] = sorted(str(f.relative_to(ckpt)) for f in ckpt.rglob("*") if f.is_file())
    train_step(engine, batch)  # move away from the saved state
    r["loss_after_extra_step"] = round(eval_loss(engine, batch), 5)

    # Resume into a fresh engine (the realistic path; also the only one ZeRO-3 supports).
    engine2 = init_engine(model_dir, stage, seed=123, offload_optimizer=offload_optimizer)
    t = time.perf_counter()
    _load_path, client_state = engine2.load_checkpoint(str(ckpt), tag="step5")
    r["load_checkpoint_s"] = round(time.perf_counter() - t, 3)
    r["load_client_state"] = client_state
    r["loaded_loss"] = round(eval_loss(engine2, batch), 6)
    r["saved_loss"] = round(saved_loss, 6)
    sd_loaded = gather_full_state_dict(engine2)
    r["roundtrip_max_abs_diff"] = max_tensor_diff(sd_saved, sd_loaded)
    # The optimizer state came back too: the step after the checkpoint lands where engine 1's did.
    train_step(engine2, batch)
    r["resumed_loss_after_extra_step"] = round(eval_loss(engine2, batch), 5)
    r["resume_matches"] = (
        abs(r["resumed_loss_after_extra_step"] - r["loss_after_extra_step"]) < 1e-5
    )

    out = work / f"gathered-z{stage}.safetensors"
    t = time.perf_counter()
    save_file({k: v.contiguous() for k, v in sd_saved.items()}, str(out))
    # Offline consolidation from the checkpoint files (what an export job would use).
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # type: ignore[import-not-found, unused-ignore]

    t = time.perf_counter()
    sd_ckpt = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="step5")
    r["zero_to_fp32_s"] = round(time.perf_counter() - t, 4)
    r["zero_to_fp32_max_abs_diff"] = max_tensor_diff(
        sd_saved, {k: v for k, v in sd_ckpt.items() if k in sd_saved}
    )
    r["zero_to_fp32_extra_keys"] = sorted(set(sd_ckpt) - set(sd_saved))
    r["write_safetensors_s"] = round(time.perf_counter() - t, 4)
    r["gathered_dtypes"] = sorted({str(v.dtype) for v in sd_saved.values()})
    r["gathered_n"] = len(sd_saved)
    for e in (engine, engine2):
        e.destroy()
    del engine, engine2
    torch.set_grad_enabled(True)
    return r, sd_saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--work", type=Path)
    ap.add_argument(
        "--offload-optimizer",
        action="store_true",
        help='zero_optimization.offload_optimizer.device="cpu"',
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    set_ds_env()
    from arctic_servers.engines.tiny_model import build_tiny_model

    res: dict[str, Any] = {
        "env": {
            k: os.environ[k]
            for k in ("DS_ACCELERATOR", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        }
    }
    model_dir = build_tiny_model(args.model_dir)
    t = time.perf_counter()
    import deepspeed  # type: ignore[import-not-found, unused-ignore]
    import torch

    res["import_deepspeed_s"] = round(time.perf_counter() - t, 3)
    res["versions"] = {"deepspeed": deepspeed.__version__, "torch": torch.__version__}
    from deepspeed.accelerator import get_accelerator  # type: ignore[import-not-found, unused-ignore]

    res["accelerator"] = get_accelerator().device_name()
    res["comm_backend"] = get_accelerator().communication_backend_name()
    work = args.work or Path(tempfile.mkdtemp(prefix="arctic-ds-smoke-"))
    ok = True
    gathered: dict[int, dict[str, Any]] = {}
    res["stages"] = []
    for stage in args.stages:
        try:
            r, sd = run_stage(model_dir, stage, work, offload_optimizer=args.offload_optimizer)
            gathered[stage] = sd
            ok &= (
                r["loss_decreasing"]
                and r["roundtrip_max_abs_diff"] == 0.0
                and abs(r["loaded_loss"] - r["saved_loss"]) < 1e-6
                and r["resume_matches"]
            )
        except Exception as e:
            import traceback

            r = {
                "stage": stage,
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-3000:],
            }
            ok = False
        res["stages"].append(r)
        print(json.dumps(r, default=str), flush=True)
    stages = sorted(gathered)
    res["cross_stage_max_abs_diff"] = {
        f"z{a}-z{b}": max_tensor_diff(gathered[a], gathered[b])
        for a in stages
        for b in stages
        if a < b
    }
    if args.work is None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    else:
        res["work_dir"] = str(work)
    res["ok"] = bool(ok)
    print("SMOKE_RESULT " + json.dumps(res, indent=1, default=str), flush=True)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
