"""Forward-backward, forward and log-probs bodies: strict semantic checks, then NUMERICS.md.

The protocol layer has already checked field names, types, dtypes and the B/S shape agreement;
this module checks what the message schema cannot say (value ranges, which context tensors a
loss needs, option names) and turns a body into `numerics` inputs and a result dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arctic_servers.protocol.errors import ProtocolError

from . import numerics as nx

POST = ("compute_logprobs", "compute_entropy")


def _bad(path: str, message: str, code: str = "invalid_argument", **details: Any) -> ProtocolError:
    return ProtocolError(code, f"field {path}: {message}", field=path, **details)


@dataclass
class TrainCall:
    """A checked forward-backward / forward body."""

    batch: nx.Batch
    spec: nx.LossSpec | None  # None: forward without a loss
    inputs: nx.LossInputs = field(default_factory=nx.LossInputs)
    post: frozenset[str] = frozenset()


def _ints(value: Any, path: str, lo: int, hi: int, allow: tuple[int, ...] = ()) -> None:
    arr = np.asarray(value)
    bad = ~((arr >= lo) & (arr < hi))
    for a in allow:
        bad &= arr != a
    if bad.any():
        first = arr[bad].flat[0]
        raise _bad(
            path,
            f"value {int(first)} is outside [{lo}, {hi})",
            expected=f"values in [{lo}, {hi})" + (f" or {allow}" if allow else ""),
        )


def _floats(value: Any, path: str) -> nx.F64:
    arr = np.asarray(value).astype(np.float64)
    if not np.isfinite(arr).all():
        raise _bad(path, "holds NaN or infinity", expected="finite values")
    return arr


def check_tokens(ids: Any, mask: Any, path: str, vocab_size: int) -> None:
    shape = np.asarray(ids).shape
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        raise _bad(
            f"{path}input_ids",
            f"has shape {list(shape)}; need at least one row and column",
            code="shape_mismatch",
            expected="[B >= 1, S >= 1]",
        )
    _ints(ids, f"{path}input_ids", 0, vocab_size)
    if mask is not None:
        _ints(mask, f"{path}attention_mask", 0, 2)


def _number(
    cfg: Mapping[str, Any],
    name: str,
    default: float,
    *,
    lo: float | None = None,
    positive: bool = False,
) -> float:
    v = cfg.get(name)
    if v is None:
        return default
    x = float(v)
    path = f"processing.config.{name}"
    if not np.isfinite(x) or (lo is not None and x < lo) or (positive and x <= 0):
        want = "> 0" if positive else f">= {lo}" if lo is not None else "finite"
        raise _bad(path, f"{v!r} is not {want}", expected=want)
    return x


def loss_spec(processing: Mapping[str, Any]) -> nx.LossSpec:
    fn = processing.get("loss_fn") or "cross_entropy"
    if fn not in nx.LOSS_FNS:
        raise _bad(
            "processing.loss_fn",
            f"{fn!r} is not a loss this server knows",
            expected=list(nx.LOSS_FNS),
        )
    cfg: Mapping[str, Any] = processing.get("config") or {}
    agg = cfg.get("loss_agg_mode") or "token-mean"
    if agg not in nx.AGG_MODES:
        raise _bad(
            "processing.config.loss_agg_mode",
            f"{agg!r} is not one of {list(nx.AGG_MODES)}",
            expected=list(nx.AGG_MODES),
        )
    gnt = int(cfg.get("global_num_tokens") or 0)
    if gnt < 0 or (gnt > 0 and agg != "token-mean"):
        raise _bad(
            "processing.config.global_num_tokens",
            f"{gnt} needs loss_agg_mode token-mean and a value >= 0",
            expected=">= 0, with token-mean",
        )
    kl_type = cfg.get("kl_type") or "low_var_kl"
    if kl_type not in nx.KL_TYPES:
        raise _bad(
            "processing.config.kl_type",
            f"{kl_type!r} is not one of {list(nx.KL_TYPES)}",
            expected=list(nx.KL_TYPES),
        )
    eps = _number(cfg, "eps_clip", 0.2, lo=0.0)
    return nx.LossSpec(
        loss_fn=str(fn),
        loss_agg_mode=str(agg),
        global_num_tokens=gnt,
        eps_clip=eps,
        eps_clip_high=_number(cfg, "eps_clip_high", eps, lo=0.0),
        entropy_coeff=_number(cfg, "entropy_coeff", 0.0),
        kl_coeff=_number(cfg, "kl_coeff", 0.0, lo=0.0),
        kl_type=str(kl_type),
        temperature=_number(cfg, "temperature", 1.0, positive=True),
    )


def _post(processing: Mapping[str, Any]) -> frozenset[str]:
    post = [str(p) for p in processing.get("post") or []]
    unknown = [f"processing.post={p!r}" for p in post if p not in POST]
    if unknown:
        raise ProtocolError(
            "unsupported_option",
            f"unknown post-processor(s): {', '.join(unknown)}; known: {list(POST)}",
            options=unknown,
            field="processing.post",
        )
    return frozenset(post)


def parse_train(body: Mapping[str, Any], vocab_size: int, *, need_loss: bool) -> TrainCall:
    """Check a ForwardBackwardRequest / ForwardRequest and convert it."""
    if body.get("args"):
        raise _bad("args", "must be empty (a deployed field kept for compatibility)", expected="[]")
    kw: Mapping[str, Any] = body["kwargs"]
    ctx: Mapping[str, Any] = body.get("context") or {}
    processing: Mapping[str, Any] = body.get("processing") or {}
    ids, mask = kw["input_ids"], kw.get("attention_mask")
    check_tokens(ids, mask, "kwargs.", vocab_size)
    if kw.get("position_ids") is not None:
        _ints(kw["position_ids"], "kwargs.position_ids", 0, 2**31)
    if kw.get("labels") is not None:
        _ints(kw["labels"], "kwargs.labels", 0, vocab_size, allow=(nx.IGNORE_INDEX,))
    if ctx.get("input_ids") is not None and not np.array_equal(ctx["input_ids"], ids):
        raise _bad("context.input_ids", "differs from kwargs.input_ids", expected="equal tensors")
    batch = nx.make_batch(ids, mask, kw.get("position_ids"))
    post = _post(processing)
    if not need_loss and not processing.get("loss_fn"):
        return TrainCall(batch, None, post=post)
    spec = loss_spec(processing)
    fn = spec.loss_fn
    required = []
    if fn != "cross_entropy":
        required.append("loss_mask")
    if fn in nx.ADVANTAGE_LOSSES:
        required.append("advantages")
    if fn == "weighted_logprob":
        required.append("weights")
    if spec.kl_coeff > 0:
        required.append("ref_log_probs_shifted")
    for name in required:
        if ctx.get(name) is None:
            raise _bad(
                f"context.{name}",
                f"is required by loss_fn {fn!r}"
                + (" with kl_coeff > 0" if name.startswith("ref") else ""),
                code="missing_field",
            )
    floats = {
        n: _floats(ctx[n], f"context.{n}")
        for n in (
            "loss_mask",
            "advantages",
            "weights",
            "old_log_probs_shifted",
            "ref_log_probs_shifted",
        )
        if ctx.get(n) is not None
    }
    if "loss_mask" in floats and (floats["loss_mask"] < 0).any():
        raise _bad("context.loss_mask", "holds a negative value", expected="values >= 0")
    labels = kw.get("labels")
    inputs = nx.LossInputs(
        loss_mask=floats.get("loss_mask"),
        labels=None if labels is None else np.asarray(labels).astype(np.int64),
        advantages=floats.get("advantages"),
        weights=floats.get("weights"),
        old_shifted=floats.get("old_log_probs_shifted"),
        ref_shifted=floats.get("ref_log_probs_shifted"),
    )
    return TrainCall(batch, spec, inputs, post)


def outputs(call: TrainCall, step: int, *, logprobs: bool, entropy: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    temp = call.spec.temperature if call.spec is not None else 1.0
    if logprobs:
        out["logprobs_shifted"] = (nx.shifted_logprobs(call.batch, step) / temp).astype(np.float32)
    if entropy:
        out["entropy"] = nx.shifted_entropy(call.batch, step).astype(np.float32)
    return out


def run(
    call: TrainCall, step: int, *, forward: bool
) -> tuple[dict[str, Any], nx.LossResult | None]:
    """The ForwardBackwardResult of a call and, when a loss was computed, its LossResult."""
    lr: nx.LossResult | None = None
    if call.spec is not None:
        lr = nx.compute_loss(call.batch, step, call.spec, call.inputs)
        metrics = dict(lr.metrics)
        loss = lr.loss
    else:
        loss = 0.0
        metrics = {
            "loss": 0.0,
            "num_tokens": int(call.batch.pair.sum()),
            "num_sequences": int(call.batch.ids.shape[0]),
        }
    if not forward:  # one rank: it ran every real token of the call (NUMERICS.md §3)
        real = int((np.asarray(call.batch.mask) != 0).sum())
        metrics["rank_tokens_max"] = metrics["rank_tokens_min"] = real
    want_ent = "compute_entropy" in call.post
    if want_ent:
        ent = nx.shifted_entropy(call.batch, step)[:, :-1][call.batch.pair != 0]
        metrics["entropy"] = float(ent.mean()) if ent.size else 0.0
    outs = outputs(
        call, step, logprobs=forward or "compute_logprobs" in call.post, entropy=want_ent
    )
    return {"loss": loss, "metrics": metrics, "outputs": outs}, lr


def log_probs(body: Mapping[str, Any], vocab_size: int, step: int) -> dict[str, Any]:
    """LogProbsRequest -> ForwardBackwardResult (log-probs, optionally entropy)."""
    ids, mask = body["input_ids"], body.get("attention_mask")
    check_tokens(ids, mask, "", vocab_size)
    call = TrainCall(nx.make_batch(ids, mask), None)
    outs = outputs(call, step, logprobs=True, entropy=bool(body.get("entropy")))
    metrics = {
        "loss": 0.0,
        "num_tokens": int(call.batch.pair.sum()),
        "num_sequences": int(call.batch.ids.shape[0]),
    }
    return {"loss": 0.0, "metrics": metrics, "outputs": outs}
