"""The verl / SkyRL training body, lowered once to the canonical frame, and results lifted back.

The deployed integrations send `{batch, meta, processing}` to `fwd_bwd` and `fwd_no_grad`:
`batch.input_ids [B, P+R]` with the prompt left-padded (columns `< P`, `P` = `prompts.shape[1]`
or `meta.max_prompt_len`) and the response right-padded (columns `>= P`).

Alignment — the deployed contract (Arctic-Platform's pipeline and verl_grpo loss), which both
callers rely on:

- **Inputs** (`old_log_probs`, `ref_log_prob`, `advantages`, `response_mask`, `loss_mask`): response
  tensors, token-aligned — column `P + j` holds the value of response token `j` — sent as
  `[B, R]` or zero-left-padded to `[B, P+R]`, with ZoRRO on or off. Their prompt columns are
  zero by that construction: a log-prob tensor with anything else there is not one (refused,
  naming the field) — except a tensor this client itself returned from `fwd_no_grad` and gets
  back unchanged (SkyRL sends `batch.logprobs` straight back as `old_log_probs`): its alignment is
  known (`aligned`), so it is lowered as what it is, never guessed.
- **Outputs** (`batch.logprobs` / `log_probs`, `entropy`) follow `meta.zorro_train_enable`, as the
  deployed server's did: ZoRRO off — predict-next over the whole row, column `i` = log-prob of
  `input_ids[:, i+1]` (verl's worker reads the response from column `P - 1`); ZoRRO on —
  response-aligned, column `P + j` = log-prob of response token `j`, zero on the prompt (verl's
  worker shifts that back itself; SkyRL sends it back as token-aligned `old_log_probs`). So
  both frameworks' round trips are on-policy-exact with either setting.

`lower(payload, train=...)` builds the canonical body of `training.proto` — `{args, kwargs,
context, processing}` — with every row left-aligned (real tokens first, then padding: what the
Cortex microbatch packer needs, and a plain right-padded row for every server); log-prob inputs
move to the frame's `_shifted` alignment (`t[:, i]` = log-prob of `input_ids[:, i+1]`). Knobs
the canonical losses cannot honour are refused *before anything is sent*, all of them in one
`UnsupportedKnobsError` (code `unsupported_option`, `details.options` listing each).
`Lowered.lift_outputs` maps the result tensors back to the caller's rows and columns in the
alignment above. Tensors come back as torch when the caller sent torch.

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
- `meta.load_balancer` (verl), or `meta.zorro_train_enable` (SkyRL's `use_zorro`) with
  `meta.zorro_train_load_balancer` (default true) → `processing.balance_rows`: a multi-rank
  trainer assigns rows to ranks token-balanced (ZoRRO's load balancer; the same result).
- `batch.loss_mask` (else `response_mask`), `advantages` → `context.loss_mask`, `advantages`;
  `batch.old_log_probs` → `context.old_log_probs_shifted`. A forward (`fwd_no_grad`) gets only
  the context its loss reads — none without a loss (`read_by_forward`): SkyRL's `forward` sends
  its whole batch, `advantages` included, which a loss-free forward would refuse.

Accepted without effect on the result (dispatch and memory knobs of the deployed server):
`rollout_n`, `max_prompt_len`, `max_response_len`, `max_token_len_per_gpu`, `pad_token_id`,
`drop_position_ids`, `logits_optimization*`, `logits_compute_in_fp32`,
`zorro_train_max_rollouts` (our trainer does not deduplicate prompts, so prompt groups need not
stay on one rank), `global_batch_size`, `dp_size` (the spec never divides the loss by ranks),
`calculate_entropy` (adds `compute_entropy`). The PPO dual-clip bound `clip_ratio_c` is not
applied by the canonical `grpo`; it only binds when the importance ratio exceeds `c` (3 by
default) on a negative advantage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf import descriptor_pool

from ..errors import InvalidArgumentError, refused_locally
from ..spec.pb.arctic.v1 import options_pb2
from .aliases import LOG_PROBS_KEY, LOGPROBS_KEY
from .knobs import BATCH_KEYS, LOGPROB_KEYS, RESPONSE_KEYS, UnsupportedKnobsError, knobs

__all__ = [
    "Lowered",
    "UnsupportedKnobsError",
    "is_canonical",
    "lower",
    "read_by_forward",
    "to_numpy",
]
_LOSS_CONTEXT = "arctic.v1.LossContext"


def read_by_forward(context: Mapping[str, Any], loss_fn: str | None) -> dict[str, Any]:
    """The context fields a forward reads: none without a loss (SkyRL's `forward` sends its
    whole batch, `advantages` included, asking only for log-probs); with one, those the spec says
    it reads (`(arctic.v1.field).losses` of `LossContext`). A forward refuses the others."""
    if loss_fn is None:
        return {}
    desc = descriptor_pool.Default().FindMessageTypeByName(_LOSS_CONTEXT)
    out: dict[str, Any] = {}
    for name, value in context.items():
        fd = desc.fields_by_name.get(name)
        losses = fd.GetOptions().Extensions[options_pb2.field].losses if fd is not None else ()
        if not losses or loss_fn in losses:
            out[name] = value
    return out


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


PREDICT_NEXT = "predict_next"  # column i: the log-prob of token i + 1 (ZoRRO off)
RESPONSE = "response"  # column P + j: the log-prob of response token j (ZoRRO on)


def zorro_on(meta: Mapping[str, Any]) -> bool:
    """SkyRL's `use_zorro` / verl's `zorro_train.enable`, as the body says it."""
    return bool(meta.get("zorro_train_enable") or meta.get("use_zorro"))


@dataclass
class Lowered:
    """A lowered body and what maps its outputs back to the caller's layout."""

    frame: dict[str, Any]
    starts: np.ndarray
    lengths: np.ndarray
    width: int
    torch_out: bool
    post: tuple[str, ...] = field(default_factory=tuple)
    align: str = PREDICT_NEXT
    prompt_width: int = 0

    def expand(self, t: Any) -> Any:
        """A shifted `[B, S]` output of the left-aligned rows in the caller's columns, in the
        body's output alignment (module doc)."""
        arr = np.asarray(t)
        out = np.zeros((arr.shape[0], self.width), arr.dtype)
        for b, (s, n) in enumerate(zip(self.starts, self.lengths, strict=True)):
            if self.align == PREDICT_NEXT:
                out[b, s : s + n] = arr[b, :n]
                continue
            # response-aligned: caller column c = s + k holds the log-prob of its own token,
            # the prediction of row position k - 1; only the response columns (c >= P)
            first = max(1, self.prompt_width - s)
            if n > first:
                out[b, s + first : s + n] = arr[b, first - 1 : n - 1]
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


def _shift(t: np.ndarray, lengths: np.ndarray, align: str = "token") -> np.ndarray:
    """A log-prob input on left-aligned rows to `_shifted`: token-aligned moves column i + 1 to
    column i; predict-next already is; the last real column is 0 either way."""
    out = np.zeros(t.shape, np.float32)
    for b, n in enumerate(lengths):
        if n > 1:
            out[b, : n - 1] = t[b, 1:n] if align == "token" else t[b, : n - 1]
    return out


def _prompt_columns_zero(arr: np.ndarray, name: str, prompt_width: int) -> None:
    """A zero-left-padded response tensor has nothing in its prompt columns (module doc)."""
    if prompt_width <= 0 or arr.shape[1] <= prompt_width:
        return
    head = arr[:, :prompt_width]
    if np.any(head != 0):
        b, c = (int(x[0]) for x in np.nonzero(head != 0))
        raise InvalidArgumentError(
            f"field batch.{name}: column {c} of row {b} (< P = {prompt_width}, the prompt) is "
            f"{float(head[b, c])!r}; a [B, P+R] log-prob input is a response tensor, "
            "token-aligned and zero-left-padded (column P + j = response token j). A "
            "predict-next tensor (column i = token i + 1, what fwd_no_grad answers with ZoRRO "
            "off) must be sent back as the object fwd_no_grad returned, or sliced to [B, R] "
            "from column P - 1",
            code="invalid_argument",
            details={"field": f"batch.{name}", "row": b, "column": c},
        )


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


def lower(
    payload: Mapping[str, Any], *, train: bool, aligned: Mapping[str, str] | None = None
) -> Lowered:
    """Lower a `{batch, meta, processing}` body to the canonical frame (see the module doc).

    `aligned` names log-prob inputs whose alignment the caller knows for certain (arrays this
    client returned, coming back unchanged): field -> `predict_next` or `response`."""
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
    knob_problems, loss_fn, post, config = knobs(meta, processing, train, batch)
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
    elif meta.get("max_prompt_len") is not None:
        resp_width = shape[1] - int(meta["max_prompt_len"])
    prompt_width = shape[1] - resp_width if resp_width is not None else 0
    align = RESPONSE if zorro_on(meta) else PREDICT_NEXT
    if align == RESPONSE and resp_width is None:
        raise InvalidArgumentError(
            "field meta.zorro_train_enable: the response columns are unknown; send "
            "batch.prompts (or batch.responses, or meta.max_prompt_len)",
            code="invalid_argument",
            details={"field": "meta.zorro_train_enable"},
        )
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
    known = dict(aligned or {})
    for name in RESPONSE_KEYS:
        if batch.get(name) is not None:
            raw = to_numpy(batch[name], name)
            arr = _full_width(raw, name, shape, resp_width)
            if name in LOGPROB_KEYS and known.get(name) != PREDICT_NEXT and raw.shape == shape:
                _prompt_columns_zero(arr, name, prompt_width)
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
        how = "next" if known.get("old_log_probs") == PREDICT_NEXT else "token"
        context["old_log_probs_shifted"] = _shift(resp["old_log_probs"], lengths, how)
    if "ref_log_prob" in resp and config.get("kl_coeff"):
        how = "next" if known.get("ref_log_prob") == PREDICT_NEXT else "token"
        context["ref_log_probs_shifted"] = _shift(resp["ref_log_prob"], lengths, how)
    if not train:
        context = read_by_forward(context, loss_fn)
    proc: dict[str, Any] = {"post": list(post)}
    if loss_fn is not None:
        proc["loss_fn"] = loss_fn
    if config:
        proc["config"] = config
    if meta.get("load_balancer") or (
        zorro_on(meta) and meta.get("zorro_train_load_balancer", True)
    ):
        proc["balance_rows"] = True
    frame: dict[str, Any] = {"kwargs": kwargs, "processing": proc}
    if context:
        frame["context"] = context
    return Lowered(frame, starts, lengths, shape[1], torch_out, post, align, prompt_width)
