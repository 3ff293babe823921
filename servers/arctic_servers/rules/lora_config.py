"""LoRA jobs (PROTOCOL.md §3.6, jobs.proto `LoraConfig` / `LoraSupport`): the rules every server
shares for `training_config.lora`, its defaults, the job-level limit of the samplers, the
capabilities' `lora` document, and generate's `adapter` option.

`check_lora` returns the config with every default filled in, so the trainer reads one normalised
shape. The module names are those of the Llama / Qwen2 decoder family (the models the servers
build and test with); a trainer additionally fails a job whose model lacks one of them (PEFT
names the missing module).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ProtocolError
from .sub_jobs import field_error, refuse_unknown_keys

LORA_KEYS = frozenset(
    {"rank", "alpha", "dropout", "target_modules", "train_embeddings", "train_lm_head"}
)
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES = ATTENTION_MODULES + MLP_MODULES
EMBEDDING_MODULE, LM_HEAD_MODULE = "embed_tokens", "lm_head"
ALL_LINEAR = "all-linear"
DEFAULT_RANK = 8
# vLLM's `max_lora_rank` takes one of these; a sampler is started with the smallest >= the rank.
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MAX_RANK = VLLM_RANKS[-1]
BASE_ADAPTER = "base"


@dataclass(frozen=True)
class LoraSupport:
    """A server's LoRA support (the capabilities' `lora`); the rules below follow it."""

    training: bool = True
    sampling: bool = True
    max_rank: int = MAX_RANK
    target_modules: tuple[str, ...] = TARGET_MODULES
    train_embeddings: bool = True
    train_lm_head: bool = True
    # vLLM 0.32 serves no embedding / lm_head LoRA for Qwen2 (ENGINE_NOTES.md §LoRA)
    sampler_embeddings: bool = False
    shared_sampler: bool = False
    # ... so such a job's syncs merge the adapter and push full weights (`adapter_sync` false)
    merged_sync: bool = True
    why: str = ""  # why `training` is off, for the refusal

    def json(self) -> dict[str, Any]:
        return {
            "training": self.training,
            "sampling": self.sampling,
            "max_rank": self.max_rank,
            "target_modules": list(self.target_modules),
            "default_rank": DEFAULT_RANK,
            "train_embeddings": self.train_embeddings,
            "train_lm_head": self.train_lm_head,
            "sampler_embeddings": self.sampler_embeddings,
            "shared_sampler": self.shared_sampler,
            "merged_sync": self.merged_sync,
        }


SUPPORT = LoraSupport()


def _bool(conf: Mapping[str, Any], key: str, path: str) -> bool:
    v = conf.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise field_error(f"{path}.{key}", f"{v!r} is not a boolean", expected="true or false")
    return v


def _number(conf: Mapping[str, Any], key: str, path: str) -> float | None:
    v = conf.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
        raise field_error(f"{path}.{key}", f"{v!r} is not a finite number", expected="a number")
    return float(v)


def _modules(v: Any, path: str, support: LoraSupport) -> list[str]:
    avail = list(support.target_modules)
    if v is None or v == ALL_LINEAR:
        return avail
    if isinstance(v, str) or not isinstance(v, Sequence) or not v:
        raise field_error(
            path, f"{v!r} is not a non-empty list of module names", expected=[*avail, ALL_LINEAR]
        )
    out: list[str] = []
    for i, name in enumerate(v):
        hint = ""
        if name == EMBEDDING_MODULE:
            hint = "; use train_embeddings"
        elif name == LM_HEAD_MODULE:
            hint = "; use train_lm_head"
        if not isinstance(name, str) or name not in avail:
            raise field_error(
                f"{path}[{i}]",
                f"unknown module {name!r}{hint}; the model's available modules: {avail}",
                expected=avail,
                available=avail,
            )
        if name not in out:
            out.append(name)
    return out


def check_lora(lora: Any, path: str, support: LoraSupport = SUPPORT) -> dict[str, Any]:
    """`training_config.lora` checked, every default filled in (a 4xx naming the field)."""
    if not support.training:
        why = support.why
        raise ProtocolError(
            "unsupported_option",
            f"{path}: this server trains no LoRA adapters" + (f" ({why})" if why else ""),
            options=[path],
            field=path,
        )
    if not isinstance(lora, Mapping):
        raise field_error(path, "must be an object", expected='{"rank": 8, ...}')
    refuse_unknown_keys(lora, LORA_KEYS, path, "LoRA")
    rank = lora.get("rank", DEFAULT_RANK)
    if isinstance(rank, float) and rank.is_integer():
        rank = int(rank)
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= support.max_rank:
        raise field_error(
            f"{path}.rank",
            f"{rank!r} is not an integer in 1..{support.max_rank}",
            expected=f"1..{support.max_rank}",
        )
    alpha = _number(lora, "alpha", path)
    if alpha is not None and alpha <= 0:
        raise field_error(f"{path}.alpha", f"{alpha!r} is not > 0", expected="> 0")
    dropout = _number(lora, "dropout", path) or 0.0
    if not 0.0 <= dropout < 1.0:
        raise field_error(f"{path}.dropout", f"{dropout!r} is not in [0, 1)", expected="[0, 1)")
    out: dict[str, Any] = {
        "rank": rank,
        "alpha": float(alpha if alpha is not None else 2 * rank),
        "dropout": dropout,
        "target_modules": _modules(lora.get("target_modules"), f"{path}.target_modules", support),
        "train_embeddings": _bool(lora, "train_embeddings", path),
        "train_lm_head": _bool(lora, "train_lm_head", path),
    }
    for key, ok in (
        ("train_embeddings", support.train_embeddings),
        ("train_lm_head", support.train_lm_head),
    ):
        if out[key] and not ok:
            raise ProtocolError(
                "unsupported_option",
                f"{path}.{key}: this server trains no adapter there",
                options=[f"{path}.{key}"],
                field=f"{path}.{key}",
            )
    return out


def check_job_lora(
    configs: Sequence[tuple[str, str, Mapping[str, Any]]], support: LoraSupport = SUPPORT
) -> None:
    """Job-level rules of a LoRA job: `configs` is (role, config path, config) per sub-job."""
    roles = {role for role, _, _ in configs}
    for role, path, conf in configs:
        lora = conf.get("lora") if role == "training" else None
        if not isinstance(lora, Mapping) or "sampling" not in roles:
            continue
        if not support.sampling:
            raise ProtocolError(
                "unsupported_option",
                f"{path}.lora: this server's samplers cannot load LoRA adapters",
                options=[f"{path}.lora"],
                field=f"{path}.lora",
            )
        for key in ("train_embeddings", "train_lm_head"):
            if lora.get(key) and not (support.sampler_embeddings or support.merged_sync):
                opt = f"{path}.lora.{key}"
                raise ProtocolError(
                    "unsupported_option",
                    f"{opt}: the job has a sampling sub-job and its engine (vLLM) cannot serve a "
                    "LoRA adapter on the embedding or lm_head of this model; drop the sampling "
                    "sub-job or train the projections only",
                    options=[opt],
                    field=opt,
                )


def adapter_sync(lora: Mapping[str, Any] | None, support: LoraSupport = SUPPORT) -> bool:
    """Whether a job with this (normalised) `lora` syncs its adapter into samplers that load it
    as a new adapter version; False for a full-weight job and for a merge-and-push one (an
    embedding / lm_head adapter the samplers cannot serve: each sync sends the merged full
    weights through the full-weight path, and the samplers hold no base model)."""
    if lora is None:
        return False
    unservable = bool(lora.get("train_embeddings") or lora.get("train_lm_head"))
    return not unservable or support.sampler_embeddings


def vllm_max_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds `rank`."""
    return next(r for r in VLLM_RANKS if r >= rank)


def check_adapter(body: Mapping[str, Any], lora_job: bool, path: str = "") -> str:
    """generate's `adapter`: "" (current weights) or "base" (a LoRA job's base model);
    `lora_job`: the job's samplers load adapters (`adapter_sync`)."""
    v = body.get("adapter")
    if v is None or v == "":
        return ""
    if v != BASE_ADAPTER:
        raise field_error(
            f"{path}adapter", f"{v!r} is not '' or {BASE_ADAPTER!r}", expected=["", BASE_ADAPTER]
        )
    if not lora_job:
        raise field_error(
            f"{path}adapter",
            "'base' needs a LoRA job whose samplers load adapters: this job's sampler holds the "
            "synced full weights only (a full-weight job, or a LoRA job on the embedding / "
            "lm_head, whose syncs push merged weights)",
            expected="a job whose training sub-job has training_config.lora on projections only",
        )
    return BASE_ADAPTER


def job_lora(configs: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any] | None:
    """The (normalised) `lora` of a job's training sub-job, from (role, config) pairs; None for a
    full-weight job."""
    for role, conf in configs:
        lora = conf.get("lora") if role == "training" else None
        if isinstance(lora, Mapping):
            return dict(lora)
    return None


EXPORT_FORMATS = ("hf", "peft")
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")
PEFT_EXPORT = "export-peft"  # a LoRA checkpoint's adapter directory, as exported


def export_format(body: Mapping[str, Any], lora_checkpoint: bool) -> str:
    """ExportCheckpoint's `format`: "hf" (default) or "peft" (a LoRA checkpoint's adapter)."""
    fmt = body.get("format") or "hf"
    if fmt not in EXPORT_FORMATS:
        raise field_error("format", f"{fmt!r} is not one of {list(EXPORT_FORMATS)}",
                          expected=list(EXPORT_FORMATS))  # fmt: skip
    if fmt == "peft" and not lora_checkpoint:
        raise field_error(
            "format",
            "'peft' exports a LoRA checkpoint's adapter; this checkpoint holds full weights",
            expected="hf",
        )
    return str(fmt)


# the deployed `weight-sync` operation's `weight_format` (Cortex): the weights a sync moves
WEIGHT_FORMATS = ("vllm", "hf", "lora")


def check_weight_format(payload: Mapping[str, Any], lora_job: bool, path: str) -> None:
    """`weight_format`: "vllm" / "hf" (full weights: what a full-weight job syncs) or "lora"
    (the adapter: what a LoRA job syncs); the other one of a job is refused by name."""
    fmt = payload.get("weight_format")
    if fmt is None or fmt == "":
        return
    where = f"{path}weight_format"
    if fmt not in WEIGHT_FORMATS:
        raise field_error(where, f"{fmt!r} is not one of {list(WEIGHT_FORMATS)}",
                          expected=list(WEIGHT_FORMATS))  # fmt: skip
    if lora_job and fmt != "lora":
        raise ProtocolError(
            "unsupported_option",
            f'{where}: {fmt!r}; a LoRA job syncs its adapter ("lora"), not merged full weights',
            options=[where],
            field=where,
        )
    if not lora_job and fmt == "lora":
        raise field_error(
            where,
            "'lora' needs a LoRA job whose samplers load adapters (training_config.lora on the "
            "projections only; an embedding / lm_head adapter syncs merged full weights)",
            expected=["vllm", "hf"],
        )
