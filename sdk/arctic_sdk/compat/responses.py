"""Legacy response shapes (the deployed clients' mirrors) and legacy sampling parameters.

Servers answer the one response schema of `training.proto`; the compatibility client adds what
the integrations read back (`adapters.md` §1.3, §2.2, `arctic.md` §2.6):

- forward / forward-backward: top-level `loss` and `avg_loss`; `metrics` with the canonical
  metrics plus verl's names (`actor/pg_loss`, `actor/pg_clipfrac`, `actor/ppo_kl`,
  `actor/pg_clipfrac_lower`, `actor/entropy`, `kl_loss`, `kl_coef`) and `mfu` (always present:
  verl pops it); `batch` with `logprobs` and `log_probs` (and `entropy`), in the caller's layout.
- step: `metrics["grad_norm"]` and `metrics["last_lr"]` as per-rank lists, one entry per
  data-parallel rank (SkyRL reads `grad_norm[0]`, verl `last_lr[-1]`), plus scalar `lr` and
  `mfu`; `batch: {}`.
- generate: a flat list of `{text, token_ids, finish_reason, ...}`, prompt-major.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import refused_locally

__all__ = ["forward_response", "generate_results", "sampling_params", "step_response"]

#: SamplingParams fields of `training.proto`.
SAMPLING_FIELDS = frozenset(
    {
        "n",
        "temperature",
        "top_p",
        "top_k",
        "max_tokens",
        "stop",
        "stop_token_ids",
        "seed",
        "logprobs",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_tokens",
        "ignore_eos",
        "min_p",
        "include_stop_str_in_output",
    }
)
#: vLLM knobs that only shape the text and are honoured by how results are built: accepted.
TEXT_ONLY = {"detokenize": True, "skip_special_tokens": True}


def _scalar(value: Any) -> float:
    if isinstance(value, list | tuple):
        return float(sum(value) / len(value)) if value else 0.0
    return float(value)


def forward_response(
    result: Mapping[str, Any],
    batch: dict[str, Any],
    job_id: str | None,
) -> dict[str, Any]:
    """A legacy forward / fwd-bwd answer from a canonical `ForwardBackwardResult`."""
    metrics: dict[str, Any] = dict(result.get("metrics") or {})
    loss = float(result.get("loss", metrics.get("loss", 0.0)) or 0.0)
    metrics.setdefault("loss", loss)
    mirrors = {
        "actor/pg_loss": "loss",
        "actor/pg_clipfrac": "clip_fraction",
        "actor/ppo_kl": "approx_kl",
        "actor/entropy": "entropy",
        "kl_loss": "kl",
    }
    for legacy, canonical in mirrors.items():
        if canonical in metrics:
            metrics.setdefault(legacy, metrics[canonical])
    if "clip_fraction" in metrics:
        metrics.setdefault("actor/pg_clipfrac_lower", 0.0)  # no dual-clip: its fraction is 0
    metrics.setdefault("mfu", 0.0)
    return {
        "job_id": job_id,
        "loss": loss,
        "avg_loss": loss,
        "metrics": metrics,
        "batch": batch,
        "post_process_outputs": {},
    }


def step_response(result: Mapping[str, Any], job_id: str | None, ranks: int = 1) -> dict[str, Any]:
    """A legacy step answer: per-data-parallel-rank lists for `grad_norm` and `last_lr` (every
    rank of the trainer steps with the same global norm and rate)."""
    metrics: dict[str, Any] = dict(result.get("metrics") or {})
    grad = metrics.get("grad_norm")
    lr = metrics.get("lr")
    if grad is not None:
        metrics["grad_norm"] = [_scalar(grad)] * ranks
    if lr is not None:
        metrics["last_lr"] = [_scalar(lr)] * ranks
        metrics["lr"] = _scalar(lr)
    metrics.setdefault("mfu", 0.0)
    return {"job_id": job_id, "metrics": metrics, "batch": {}}


def sampling_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Legacy / verl sampling params to `SamplingParams`; refuses (all at once) what cannot be.

    `max_new_tokens` → `max_tokens`; verl's boolean `logprobs` → 0 (the sampled token's log-prob)
    or absent; `stop` as a string → a list; None values are dropped.
    """
    out: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in (params or {}).items():
        if value is None:
            continue
        if key == "max_new_tokens":
            out.setdefault("max_tokens", int(value))
        elif key == "logprobs" and isinstance(value, bool):
            if value:
                out["logprobs"] = 0
        elif key == "stop" and isinstance(value, str):
            out["stop"] = [value]
        elif key in TEXT_ONLY:
            if bool(value) != TEXT_ONLY[key]:
                problems.append(f"sampling_params.{key}={value!r}")
        elif key in SAMPLING_FIELDS:
            out[key] = value
        else:
            problems.append(f"sampling_params.{key}")
    if problems:
        raise refused_locally(
            "unsupported_option",
            f"{len(problems)} sampling knob(s) cannot be honoured, nothing was sent: "
            + ", ".join(problems)
            + f" (known: {sorted(SAMPLING_FIELDS)}, max_new_tokens)",
            details={"options": problems},
        )
    return out


def generate_results(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The flat legacy list of samples (prompt-major) from a canonical `GenerateResult`."""
    out: list[dict[str, Any]] = []
    version = result.get("weight_version")
    for i, completion in enumerate(result.get("results") or []):
        prompt_ids = [int(t) for t in completion.get("prompt_token_ids") or []]
        for k, s in enumerate(completion.get("samples") or []):
            item: dict[str, Any] = {
                "text": s.get("text", ""),
                "token_ids": [int(t) for t in s.get("token_ids") or []],
                "finish_reason": s.get("finish_reason") or "length",
                "prompt_token_ids": prompt_ids,
                "prompt_index": i,
                "sample_index": k,
                "prompt_len": len(prompt_ids),
                "generation_len": len(s.get("token_ids") or []),
                "weight_version": version,
            }
            if s.get("logprobs") is not None:
                item["logprobs"] = [float(x) for x in s["logprobs"]]
            if s.get("stop_reason"):
                item["stop_reason"] = s["stop_reason"]
            if completion.get("clamped_max_tokens"):  # max_tokens lowered to the prompt's room
                item["clamped_max_tokens"] = int(completion["clamped_max_tokens"])
            out.append(item)
    return out
