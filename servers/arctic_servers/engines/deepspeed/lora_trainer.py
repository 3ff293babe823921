"""LoRA on the DeepSpeed trainer (PROTOCOL.md §3.6): PEFT adapters over a frozen base model.

`wrap` turns the loaded HF model into a `peft.PeftModel` before `deepspeed.initialize`, so the
adapter's tensors are the only parameters with `requires_grad` and the only ones the optimizer
gets (its state is adapter-sized, ZeRO 1-3, any number of ranks). Forward passes, losses and
`step` are the full-weight ones: PEFT's forward is the model's forward.

The rest reads the trained adapter out of the engine's module (ZeRO-3: inside
`GatheredParameters`, or PEFT would save empty tensors): its tensors in PEFT's file names
(`adapter_tensors`, what a weight sync sends), a PEFT adapter directory (`save_adapter_dir`:
`adapter_config.json` + `adapter_model.safetensors`, loadable by `PeftModel.from_pretrained` and
vLLM's `LoRARequest`), and the merged full weights in HF names (`merged_state_dict`: base + the
scaled B A of every adapted module, what a weights-only checkpoint and an HF export hold).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, cast

import torch

from ...rules.lora_config import EMBEDDING_MODULE, LM_HEAD_MODULE

ADAPTER = "default"  # PEFT's adapter name
PEFT_PREFIX = "base_model.model."


class _DeltaLayer(Protocol):
    """What `_merged` calls on a PEFT `LoraLayer`: PEFT's base class does not declare it, each
    concrete layer (Linear, Embedding, the convolutions, MultiheadAttention, ParamWrapper)
    defines it."""

    def get_delta_weight(self, adapter: str) -> torch.Tensor: ...


def peft_config(lora: Mapping[str, Any]) -> Any:
    """The `peft.LoraConfig` of a normalised `training_config.lora`."""
    from peft import LoraConfig

    targets = list(lora["target_modules"])
    if lora.get("train_embeddings"):
        targets.append(EMBEDDING_MODULE)
    if lora.get("train_lm_head"):
        targets.append(LM_HEAD_MODULE)
    return LoraConfig(
        r=int(lora["rank"]),
        # PEFT annotates lora_alpha as int, yet only computes with it (scaling = alpha / r): a
        # fractional alpha (rules/lora_config.py allows any number > 0) is passed as it is
        lora_alpha=float(lora["alpha"]),  # type: ignore[arg-type]
        lora_dropout=float(lora["dropout"]),
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )


def wrap(model: Any, lora: Mapping[str, Any]) -> Any:
    """`model` with a fresh LoRA adapter (B = 0: step 0 is the base model); only the adapter
    trains. Raises ValueError naming a target module the model lacks."""
    from peft import get_peft_model

    try:
        peft_model = get_peft_model(model, peft_config(lora))
    except ValueError as exc:  # PEFT: "Target modules {...} not found in the base model"
        raise ValueError(f"training_config.lora.target_modules: {exc}") from None
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    stray = [n for n in trainable if "lora_" not in n]
    if stray or not trainable:
        raise RuntimeError(f"LoRA: trainable parameters outside the adapter: {stray[:4]}")
    return peft_model


@contextlib.contextmanager
def gathered(module: Any, stage: int) -> Iterator[None]:
    """Every parameter whole (ZeRO-3 partitions them), read-only."""
    if stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            yield
    else:
        yield


def adapter_config_json(module: Any, adapter: str = ADAPTER) -> dict[str, Any]:
    """The adapter's `adapter_config.json` (as PEFT writes it)."""
    cfg = module.peft_config[adapter].to_dict()
    out: dict[str, Any] = json.loads(json.dumps(cfg, default=_jsonable))
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, set | frozenset):
        return sorted(v)
    return str(v)


def adapter_tensors(module: Any, stage: int, adapter: str = ADAPTER) -> dict[str, torch.Tensor]:
    """The adapter's tensors in PEFT's file names (`...q_proj.lora_A.weight`), on CPU."""
    return snapshot(module, stage, merged=False, adapter=adapter)[0]


def snapshot(
    module: Any, stage: int, *, merged: bool = True, adapter: str = ADAPTER
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """The adapter's tensors and (with `merged`) the merged full weights, read in ONE gather:
    under ZeRO-3 with several ranks every rank makes the same gathers, so a save or an export
    is one gather on each (the followers join it with `state_dict()`). `adapter`: which of the
    module's adapters (a LoRA pool's trainer holds one per tenant)."""
    from peft import get_peft_model_state_dict

    with gathered(module, stage), torch.no_grad():
        own = {
            n: p.detach().clone().cpu().contiguous()
            for n, p in module.named_parameters()
            if is_adapter_param(n, adapter)
        }
        sd = get_peft_model_state_dict(
            module, state_dict=own, adapter_name=adapter, save_embedding_layers=False
        )
        full = _merged(module, adapter) if merged else None
    return {k: v.contiguous() for k, v in sd.items()}, full


def save_adapter_dir(
    module: Any, tensors: Mapping[str, torch.Tensor], out: Path, adapter: str = ADAPTER
) -> Path:
    """A PEFT adapter directory: `adapter_config.json` + `adapter_model.safetensors`."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(dict(tensors), str(out / "adapter_model.safetensors"))
    cfg = adapter_config_json(module, adapter)
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=1))
    return out


def load_adapter_dir(module: Any, stage: int, src: Path, adapter: str = ADAPTER) -> int:
    """Copy a PEFT adapter directory's tensors into the live adapter; the number copied."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    sd = load_file(str(src / "adapter_model.safetensors"))
    if stage == 3:
        import deepspeed

        params = list(module.parameters())
        ctx: Any = deepspeed.zero.GatheredParameters(params, modifier_rank=0)
    else:
        ctx = contextlib.nullcontext()
    with ctx, torch.no_grad():
        res = set_peft_model_state_dict(module, sd, adapter_name=adapter)
    missing = [k for k in getattr(res, "missing_keys", []) if is_adapter_param(k, adapter)]
    if missing:
        raise ValueError(f"adapter {src} lacks {len(missing)} tensors, e.g. {missing[:2]}")
    return len(sd)


def is_adapter_param(name: str, adapter: str = ADAPTER) -> bool:
    """Whether PEFT parameter `name` is one of adapter `adapter`'s (`...lora_A.{adapter}.weight`,
    `...lora_embedding_A.{adapter}`)."""
    return "lora_" in name and (f".{adapter}." in name or name.endswith(f".{adapter}"))


def hf_name(peft_name: str) -> str:
    """PEFT's parameter name -> the HF one (`base_model.model.` and `.base_layer` dropped)."""
    return peft_name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def merged_state_dict(module: Any, stage: int, adapter: str = ADAPTER) -> dict[str, torch.Tensor]:
    """Full weights in HF names with the adapter merged in (W + (alpha / r) B A), on CPU; the
    live model is left as it is."""
    full = snapshot(module, stage, adapter=adapter)[1]
    assert full is not None
    return full


def _merged(module: Any, adapter: str = ADAPTER) -> dict[str, torch.Tensor]:
    """`merged_state_dict` of a module whose parameters are whole (gathered)."""
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    for name, mod in module.named_modules():
        if isinstance(mod, LoraLayer) and (
            adapter in mod.lora_A or adapter in mod.lora_embedding_A
        ):
            key = hf_name(f"{name}.base_layer.weight")
            deltas[key] = cast(_DeltaLayer, mod).get_delta_weight(adapter).detach().cpu()
    out: dict[str, torch.Tensor] = {}
    for n, p in module.named_parameters():
        if "lora_" in n:
            continue
        key = hf_name(n)
        t = p.detach().clone().cpu()
        if key in deltas:
            t = t + deltas[key].to(t.dtype)
        out[key] = t.contiguous()
    return out


def trainable_numel(engine: Any) -> dict[str, int]:
    """Parameters that train vs all, the optimizer's parameters and the numel of its state
    (Adam: 2 per trainable element, allocated at the first step), as measured on the live
    engine (ZeRO-3: `ds_numel`)."""

    def numel(p: Any) -> int:
        return int(getattr(p, "ds_numel", 0) or p.numel())

    params = list(engine.module.parameters())
    opt = engine.optimizer
    inner = getattr(opt, "optimizer", opt)
    state = 0
    for st in getattr(inner, "state", {}).values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                state += int(v.numel())
    groups = getattr(inner, "param_groups", [])
    return {
        "trainable_numel": sum(numel(p) for p in params if p.requires_grad),
        "total_numel": sum(numel(p) for p in params),
        # what the optimizer holds (and sizes its state to): this rank's fp32 partitions
        "optimizer_param_numel": sum(int(p.numel()) for g in groups for p in g["params"]),
        "optimizer_state_numel": state,
    }
