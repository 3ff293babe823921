"""The verl / SkyRL training body, lowered once to the canonical frame, and results lifted back.

The deployed integrations send `{batch, meta, processing}` to `fwd_bwd` and `fwd_no_grad`:
`batch.input_ids [B, P+R]` with the prompt left-padded (columns `< P`) and the response
right-padded (columns `>= P`); response-only tensors (`response_mask`, `advantages`,
`old_log_probs`, `ref_log_prob`, `loss_mask`) zero-left-padded to `[B, P+R]`, so column `P+j`
holds the value of response token `j` (token-aligned). A response tensor sent as `[B, R]` is
left-padded here.

`lower(payload, train=...)` builds the canonical body of `training.proto` — `{args, kwargs,
context, processing}` — with every row left-aligned (real tokens first, then padding: what the
Cortex microbatch packer needs, and a plain right-padded row for every server); log-prob inputs
move to the frame's `_shifted` alignment (`t[:, i]` = log-prob of `input_ids[:, i+1]`). Knobs
the canonical losses cannot honour are refused *before anything is sent*, all of them in one
`UnsupportedKnobsError` (code `unsupported_option`, `details.options` listing each).

`Lowered.lift_outputs` maps the result tensors back to the caller's rows and columns, in the
deployed server's convention: `logprobs` `[B, P+R]` with column `i` the log-prob of
`input_ids[:, i+1]` (roll -1), 0 on padding and on the last real column; `entropy` aligned the
same way. Tensors come back as torch when the caller sent torch.

Mapping (legacy → canonical):

- `processing.loss_fn`: `verl_grpo`, `grpo` → `grpo`; `sft`, `sft_ce` → `cross_entropy`; other
  canonical names kept; None → a forward without loss.
- `processing.post`: `compute_entropy_and_logprobs` → `compute_logprobs` + `compute_entropy`;
  `apply_temperature` with `meta.temperature` → `config.temperature`.
- `meta.actor_config`: `clip_ratio` / `clip_ratio_low` → `eps_clip`, `clip_ratio_high` →
  `eps_clip_high`; `loss_agg_mode` `token-mean` / `seq-mean-token-mean` → `token-mean` /
  `seq-mean`; `entropy_coeff` → `entropy_coeff`; `use_kl_loss` + `kl_loss_coef` +
  `kl_loss_type` → `kl_coeff` + `kl_type` with `batch.ref_log_prob` → `ref_log_probs_shifted`.
- `meta.batch_num_tokens` (token-mean) → `config.global_num_tokens`.
- `batch.loss_mask` (else `response_mask`), `advantages` → `context.loss_mask`, `advantages`;
  `batch.old_log_probs` → `context.old_log_probs_shifted`.

Accepted without effect on the result (dispatch and memory knobs of the deployed server):
`rollout_n`, `max_prompt_len`, `max_response_len`, `max_token_len_per_gpu`, `pad_token_id`,
`drop_position_ids`, `logits_optimization*`, `logits_compute_in_fp32`, `load_balancer`,
`zorro_train_load_balancer`, `zorro_train_max_rollouts`, `global_batch_size`, `dp_size` (the
spec never divides the loss by ranks), `calculate_entropy` (adds `compute_entropy`). The PPO
dual-clip bound `clip_ratio_c` is not applied by the canonical `grpo`; it only binds when the
importance ratio exceeds `c` (3 by default) on a negative advantage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, UnsupportedOptionError, refused_locally
from .aliases import LOG_PROBS_KEY, LOGPROBS_KEY

__all__ = ["Lowered", "UnsupportedKnobsError", "is_canonical", "lower", "to_numpy"]

BATCH_KEYS = frozenset(
    {
        "input_ids",
        "attention_mask",
        "position_ids",
        "prompts",
        "responses",
        "labels",
        "response_mask",
        "loss_mask",
        "advantages",
        "old_log_probs",
        "ref_log_prob",
        "rollout_is_weights",
    }
)
RESPONSE_KEYS = ("response_mask", "loss_mask", "advantages", "old_log_probs", "ref_log_prob")
NO_EFFECT_META = frozenset(
    {
        "rollout_n",
        "max_prompt_len",
        "max_response_len",
        "max_token_len_per_gpu",
        "pad_token_id",
        "drop_position_ids",
        "logits_optimization",
        "logits_optimization_peak_mem_size_in_gib",
        "logits_compute_in_fp32",
        "load_balancer",
        "zorro_train_load_balancer",
        "zorro_train_max_rollouts",
        "global_batch_size",
        "dp_size",
        "calculate_entropy",
        "temperature",
        "actor_config",
        "policy_loss_config",
        "batch_num_tokens",
        "rollout_is_weights",
        "zorro_train_enable",
        "use_zorro",
    }
)
LOSS_FNS = {
    "verl_grpo": "grpo",
    "grpo": "grpo",
    "ppo": "ppo",
    "importance_sampling": "importance_sampling",
    "cispo": "cispo",
    "cross_entropy": "cross_entropy",
    "sft": "cross_entropy",
    "sft_ce": "cross_entropy",
    "weighted_logprob": "weighted_logprob",
}
POST = {
    "compute_entropy_and_logprobs": ("compute_logprobs", "compute_entropy"),
    "compute_logprobs": ("compute_logprobs",),
    "compute_entropy": ("compute_entropy",),
    "apply_temperature": (),
    "identity": (),
}
AGG_MODES = {"token-mean": "token-mean", "seq-mean-token-mean": "seq-mean", "seq-mean": "seq-mean"}
KL_TYPES = {
    "low_var_kl": "low_var_kl",
    "k3": "low_var_kl",
    "kl": "kl",
    "k1": "kl",
    "mse": "mse",
    "k2": "mse",
}
#: actor_config knobs that change the loss and have no canonical form: refused unless unset.
UNSET_ONLY = {"loss_scale_factor": (None,), "tis_imp_ratio_cap": (None, 0, -1, 0.0, -1.0)}


class UnsupportedKnobsError(UnsupportedOptionError):
    """Knobs of a legacy body the canonical frame cannot honour; `options` lists every one."""

    def __init__(self, problems: list[str]) -> None:
        self.options = [p.split(" ", 1)[0] for p in problems]
        super().__init__(
            f"{len(problems)} knob(s) cannot be honoured, nothing was sent: " + "; ".join(problems),
            code="unsupported_option",
            details={"options": self.options, "problems": problems},
        )


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def to_numpy(x: Any, name: str) -> np.ndarray:
    """A NumPy array of a tensor-like value (torch tensors through `.cpu()`, half floats to f32)."""
    if _is_torch(x):
        t = x.detach().cpu()
        if t.is_floating_point() and t.element_size() < 4:
            t = t.float()
        return np.asarray(t.numpy())
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"field batch.{name}: not a tensor ({exc})") from None


def is_canonical(payload: Mapping[str, Any]) -> bool:
    """True for a body already in the canonical frame (`kwargs` holds the model inputs)."""
    return "kwargs" in payload and "batch" not in payload


@dataclass
class Lowered:
    """A lowered body and what maps its outputs back to the caller's layout."""

    frame: dict[str, Any]
    starts: np.ndarray
    lengths: np.ndarray
    width: int
    torch_out: bool
    post: tuple[str, ...] = field(default_factory=tuple)

    def expand(self, t: Any) -> Any:
        """A `[B, S]` output of the left-aligned rows back in the caller's columns."""
        arr = np.asarray(t)
        out = np.zeros((arr.shape[0], self.width), arr.dtype)
        for b, (s, n) in enumerate(zip(self.starts, self.lengths, strict=True)):
            out[b, s : s + n] = arr[b, :n]
        return _torch(out) if self.torch_out else out

    def lift_outputs(self, result: Mapping[str, Any]) -> dict[str, Any]:
        """`batch` of the legacy response: `logprobs`/`log_probs`, `entropy`/`entropies`."""
        outputs = result.get("outputs") or {}
        batch: dict[str, Any] = {}
        lp = outputs.get("logprobs_shifted")
        if lp is not None:
            batch[LOGPROBS_KEY] = self.expand(lp)
            batch[LOG_PROBS_KEY] = batch[LOGPROBS_KEY]
        ent = outputs.get("entropy")
        if ent is not None:
            batch["entropy"] = self.expand(ent)
            batch["entropies"] = batch["entropy"]
        return batch


def _torch(arr: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(arr))


def _rows(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start column and length of each row's real tokens; refuses a row with holes."""
    real = mask != 0
    lengths = real.sum(axis=1).astype(np.int64)
    starts = np.where(lengths > 0, real.argmax(axis=1), 0).astype(np.int64)
    for b in range(mask.shape[0]):
        s, n = int(starts[b]), int(lengths[b])
        if n and not real[b, s : s + n].all():
            raise InvalidArgumentError(
                f"field batch.attention_mask: row {b} has padding between real tokens; expected "
                "a left-padded prompt followed by a right-padded response",
                code="invalid_argument",
                details={"field": "batch.attention_mask", "row": b},
            )
    return starts, lengths


def _compact(t: np.ndarray, starts: np.ndarray, lengths: np.ndarray, fill: Any) -> np.ndarray:
    out = np.full(t.shape, fill, t.dtype)
    for b, (s, n) in enumerate(zip(starts, lengths, strict=True)):
        out[b, :n] = t[b, s : s + n]
    return out


def _shift(t: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Token-aligned (left-aligned rows) to `_shifted`: column i <- column i + 1, last real 0."""
    out = np.zeros(t.shape, np.float32)
    for b, n in enumerate(lengths):
        if n > 1:
            out[b, : n - 1] = t[b, 1:n]
    return out


def _full_width(arr: np.ndarray, name: str, shape: tuple[int, int], resp_width: int | None) -> Any:
    if arr.shape == shape:
        return arr
    if arr.ndim == 2 and arr.shape[0] == shape[0] and arr.shape[1] == resp_width:
        pad = np.zeros((shape[0], shape[1] - arr.shape[1]), arr.dtype)
        return np.concatenate([pad, arr], axis=1)  # response-only: zero-left-padded to P+R
    raise refused_locally(
        "shape_mismatch",
        f"field batch.{name}: shape {list(arr.shape)}, expected {list(shape)}"
        + (f" or [{shape[0]}, {resp_width}]" if resp_width else ""),
        details={"field": f"batch.{name}", "expected": list(shape)},
    )


def _knobs(
    meta: Mapping[str, Any], processing: Mapping[str, Any], train: bool, batch: Mapping[str, Any]
) -> tuple[list[str], str | None, tuple[str, ...], dict[str, Any]]:
    """(problems, canonical loss_fn, post, config) of a legacy body."""
    problems: list[str] = []
    for k in sorted(set(processing) - {"post", "loss_fn", "config"}):
        problems.append(f"processing.{k} (unknown key; known: post, loss_fn, config)")
    raw_fn = processing.get("loss_fn")
    loss_fn: str | None = None
    if raw_fn is not None:
        loss_fn = LOSS_FNS.get(str(raw_fn))
        if loss_fn is None:
            problems.append(f"processing.loss_fn={raw_fn!r} (known: {sorted(LOSS_FNS)})")
    elif train:
        problems.append("processing.loss_fn=None (forward-backward needs a loss)")
    post: list[str] = []
    raw_post = list(processing.get("post") or [])
    for p in raw_post:
        if p not in POST:
            problems.append(f"processing.post={p!r} (known: {sorted(POST)})")
        post.extend(x for x in POST.get(p, ()) if x not in post)
    if "compute_logprobs" not in post:
        post.insert(0, "compute_logprobs")
    if meta.get("calculate_entropy") and "compute_entropy" not in post:
        post.append("compute_entropy")
    for k in sorted(set(meta) - NO_EFFECT_META):
        problems.append(f"meta.{k} (unknown key)")
    for k in ("zorro_train_enable", "use_zorro"):
        if meta.get(k):
            problems.append(f"meta.{k}=True (ZoRRO training is not available)")
    if meta.get("rollout_is_weights") is not None or batch.get("rollout_is_weights") is not None:
        problems.append("meta.rollout_is_weights (rollout importance-sampling weights)")
    config: dict[str, Any] = dict(processing.get("config") or {})
    if "apply_temperature" in raw_post:
        temp = float(meta.get("temperature") or 1.0)
        if temp != 1.0:
            config.setdefault("temperature", temp)
    actor = dict(meta.get("actor_config") or {})
    policy = dict(meta.get("policy_loss_config") or actor.get("policy_loss") or {})
    mode = policy.get("loss_mode", "vanilla")
    if mode not in (None, "vanilla"):
        problems.append(f"meta.policy_loss_config.loss_mode={mode!r} (only 'vanilla')")
    for k, ok in UNSET_ONLY.items():
        if actor.get(k) not in ok:
            problems.append(f"meta.actor_config.{k}={actor.get(k)!r} (no canonical form)")
    if loss_fn is None:
        return problems, loss_fn, tuple(post), config
    agg = actor.get("loss_agg_mode")
    if agg is not None:
        if agg in AGG_MODES:
            config.setdefault("loss_agg_mode", AGG_MODES[agg])
        else:
            problems.append(f"meta.actor_config.loss_agg_mode={agg!r} (known: {sorted(AGG_MODES)})")
    if config.get("loss_agg_mode", "token-mean") == "token-mean" and meta.get("batch_num_tokens"):
        config.setdefault("global_num_tokens", int(to_numpy(meta["batch_num_tokens"], "meta")))
    if loss_fn in ("grpo", "ppo", "cispo"):
        low = actor.get("clip_ratio_low", actor.get("clip_ratio"))
        high = actor.get("clip_ratio_high", actor.get("clip_ratio"))
        if low is not None:
            config.setdefault("eps_clip", float(low))
        if high is not None:
            config.setdefault("eps_clip_high", float(high))
    if actor.get("entropy_coeff"):
        config.setdefault("entropy_coeff", float(actor["entropy_coeff"]))
    if actor.get("use_kl_loss"):
        kl_type = actor.get("kl_loss_type", "low_var_kl")
        if kl_type not in KL_TYPES:
            problems.append(
                f"meta.actor_config.kl_loss_type={kl_type!r} (known: {sorted(KL_TYPES)})"
            )
        if batch.get("ref_log_prob") is None:
            problems.append("meta.actor_config.use_kl_loss=True (batch.ref_log_prob is missing)")
        config.setdefault("kl_coeff", float(actor.get("kl_loss_coef", 0.001)))
        config.setdefault("kl_type", KL_TYPES.get(str(kl_type), "low_var_kl"))
    return problems, loss_fn, tuple(post), config


def lower(payload: Mapping[str, Any], *, train: bool) -> Lowered:
    """Lower a `{batch, meta, processing}` body to the canonical frame (see the module doc)."""
    batch = dict(payload.get("batch") or {})
    meta = dict(payload.get("meta") or {})
    processing = dict(payload.get("processing") or {})
    problems = [
        f"{k} (unknown top-level key)"
        for k in sorted(set(payload) - {"batch", "meta", "processing"})
    ]
    problems += [f"batch.{k} (unknown key)" for k in sorted(set(batch) - BATCH_KEYS)]
    if "input_ids" not in batch:
        raise refused_locally(
            "missing_field",
            "field batch.input_ids: required",
            details={"field": "batch.input_ids"},
        )
    knob_problems, loss_fn, post, config = _knobs(meta, processing, train, batch)
    problems += knob_problems
    if problems:
        raise UnsupportedKnobsError(problems)
    torch_out = any(_is_torch(v) for v in batch.values())
    ids = to_numpy(batch["input_ids"], "input_ids").astype(np.int64, copy=False)
    if ids.ndim != 2:
        raise refused_locally(
            "shape_mismatch",
            f"field batch.input_ids: rank {ids.ndim}, expected [B, P+R]",
            details={"field": "batch.input_ids"},
        )
    shape = (int(ids.shape[0]), int(ids.shape[1]))
    mask = batch.get("attention_mask")
    attn = np.ones(shape, np.int64) if mask is None else to_numpy(mask, "attention_mask")
    attn = (_full_width(attn, "attention_mask", shape, None) != 0).astype(np.int64)
    resp_width = None
    if batch.get("prompts") is not None:
        resp_width = shape[1] - int(to_numpy(batch["prompts"], "prompts").shape[-1])
    elif batch.get("responses") is not None:
        resp_width = int(to_numpy(batch["responses"], "responses").shape[-1])
    starts, lengths = _rows(attn)
    pad_id = int(meta.get("pad_token_id") or 0)
    kwargs: dict[str, Any] = {
        "input_ids": _compact(ids, starts, lengths, pad_id),
        "attention_mask": _compact(attn, starts, lengths, 0),
    }
    if batch.get("position_ids") is not None and not meta.get("drop_position_ids"):
        pos = to_numpy(batch["position_ids"], "position_ids").astype(np.int64, copy=False)
        kwargs["position_ids"] = _compact(
            _full_width(pos, "position_ids", shape, None), starts, lengths, 0
        )
    if batch.get("labels") is not None:
        labels = to_numpy(batch["labels"], "labels").astype(np.int64, copy=False)
        kwargs["labels"] = _compact(
            _full_width(labels, "labels", shape, None), starts, lengths, -100
        )
    resp: dict[str, np.ndarray] = {}
    for name in RESPONSE_KEYS:
        if batch.get(name) is not None:
            arr = _full_width(to_numpy(batch[name], name), name, shape, resp_width)
            resp[name] = _compact(arr, starts, lengths, 0)
    context: dict[str, Any] = {}
    loss_mask = resp.get("loss_mask", resp.get("response_mask"))
    if loss_mask is not None:
        context["loss_mask"] = (
            (loss_mask != 0).astype(np.int64) if loss_mask.dtype == bool else loss_mask
        )
    if "advantages" in resp:
        context["advantages"] = resp["advantages"].astype(np.float32, copy=False)
    if "old_log_probs" in resp:
        context["old_log_probs_shifted"] = _shift(resp["old_log_probs"], lengths)
    if "ref_log_prob" in resp and config.get("kl_coeff"):
        context["ref_log_probs_shifted"] = _shift(resp["ref_log_prob"], lengths)
    proc: dict[str, Any] = {"post": list(post)}
    if loss_fn is not None:
        proc["loss_fn"] = loss_fn
    if config:
        proc["config"] = config
    frame: dict[str, Any] = {"kwargs": kwargs, "processing": proc}
    if context:
        frame["context"] = context
    return Lowered(frame, starts, lengths, shape[1], torch_out, post)
