"""Semantic checks of data-plane bodies, run before a call is accepted (so bad input is a 4xx).

The protocol layer has checked field names, types, dtypes and the B/S shapes against the spec.
These add what the schema cannot say: token ids inside the model's vocabulary, 0/1 masks, the
loss's options and required context tensors (through the losses module, the same code the trainer
runs), sampling parameters, checkpoint ids, sync methods.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from arctic_sdk.spec import value_rules
from arctic_sdk.spec.tables.request_rules import BOUNDS

from ..rules import checkpoint_ids, token_budget
from ..rules.errors import ProtocolError
from ..rules.sub_jobs import field_error
from . import structured
from .losses import table as loss_config

POST = ("compute_logprobs", "compute_entropy")
SAMPLING_PARAMS = "arctic.v1.SamplingParams"


bad = field_error


def _ints(
    value: Any,
    path: str,
    lo: int,
    hi: int,
    mask: np.ndarray | None = None,
    allow: tuple[int, ...] = (),
) -> None:
    arr = np.asarray(value)
    if arr.dtype.kind not in "iub":
        raise bad(
            path, f"dtype {arr.dtype} is not an integer type", "dtype_mismatch", expected="I64/I32"
        )
    badm = ~((arr >= lo) & (arr < hi))
    for a in allow:
        badm &= arr != a
    if mask is not None:
        badm &= mask != 0
    if badm.any():
        first = int(arr[badm].flat[0])
        raise bad(
            path,
            f"value {first} is outside [{lo}, {hi})",
            expected=f"values in [{lo}, {hi})" + (f" or {list(allow)}" if allow else ""),
        )


def _finite(value: Any, path: str) -> None:
    arr = np.asarray(value)
    if arr.dtype.kind == "f" and not np.isfinite(arr.astype(np.float64)).all():
        raise bad(path, "holds NaN or infinity", expected="finite values")


def tokens(ids: Any, mask: Any, path: str, vocab: int) -> np.ndarray | None:
    arr = np.asarray(ids)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise bad(
            f"{path}input_ids",
            f"has shape {list(arr.shape)}; need [B >= 1, S >= 1]",
            "shape_mismatch",
        )
    m = None
    if mask is not None:
        m = np.asarray(mask)
        _ints(m.astype(np.int64) if m.dtype == bool else m, f"{path}attention_mask", 0, 2)
    if vocab > 0:
        # padding positions may hold any id; real tokens must be in the vocabulary
        _ints(arr, f"{path}input_ids", 0, vocab, mask=m)
    return m


def train_body(body: Mapping[str, Any], vocab: int) -> loss_config.LossSettings:
    """ForwardBackwardRequest / ForwardRequest: both have a loss (`loss_fn` defaults to
    cross_entropy, PROTOCOL.md §9), so both get its checks. Answers the loss settings it parsed
    (`processing` with its defaults), so that no one parses them again."""
    if body.get("args"):
        raise bad("args", "must be empty (a deployed field kept for compatibility)", expected="[]")
    kw: Mapping[str, Any] = body["kwargs"]
    ctx: Mapping[str, Any] = body.get("context") or {}
    proc: Mapping[str, Any] = body.get("processing") or {}
    m = tokens(kw["input_ids"], kw.get("attention_mask"), "kwargs.", vocab)
    if kw.get("position_ids") is not None:
        _ints(kw["position_ids"], "kwargs.position_ids", 0, 2**31)
    if kw.get("labels") is not None and vocab > 0:
        _ints(kw["labels"], "kwargs.labels", 0, vocab, mask=m, allow=(-100,))
    if ctx.get("input_ids") is not None and not np.array_equal(
        np.asarray(ctx["input_ids"]), np.asarray(kw["input_ids"])
    ):
        raise bad("context.input_ids", "differs from kwargs.input_ids", expected="equal tensors")
    for name in (
        "advantages",
        "loss_mask",
        "old_log_probs_shifted",
        "ref_log_probs_shifted",
        "weights",
    ):
        if ctx.get(name) is not None:
            _finite(ctx[name], f"context.{name}")
    if (
        ctx.get("loss_mask") is not None
        and (np.asarray(ctx["loss_mask"]).astype(np.float64) < 0).any()
    ):
        raise bad("context.loss_mask", "holds a negative value", expected="values >= 0")
    post = [str(p) for p in proc.get("post") or []]
    unknown = [f"processing.post={p!r}" for p in post if p not in POST]
    if unknown:
        raise ProtocolError(
            "unsupported_option",
            f"unknown post-processor(s): {', '.join(unknown)}; known: {list(POST)}",
            options=unknown,
            field="processing.post",
        )
    try:
        st = loss_config.parse_processing({k: v for k, v in proc.items() if k != "post"})
        loss_config.check_context(st, {k: v for k, v in ctx.items() if v is not None})
    except loss_config.LossConfigError as exc:
        raise ProtocolError(exc.code, exc.message, **exc.details) from None
    return st


def vllm_forward(body: Mapping[str, Any]) -> None:
    """A forward on a vLLM sub-job: vLLM scores the prompt tokens at temperature 1, so entropy,
    another temperature, `labels` and `position_ids` cannot be honoured (`unsupported_option`,
    all named); the loss itself is computed from those log-probs."""
    proc: Mapping[str, Any] = body.get("processing") or {}
    cfg: Mapping[str, Any] = proc.get("config") or {}
    kw: Mapping[str, Any] = body.get("kwargs") or {}
    bad = [
        name
        for name, on in (
            ("processing.post=compute_entropy", "compute_entropy" in (proc.get("post") or [])),
            ("processing.config.entropy_coeff", bool(cfg.get("entropy_coeff"))),
            ("processing.config.temperature", cfg.get("temperature") not in (None, 1, 1.0)),
            ("kwargs.labels", kw.get("labels") is not None),
            ("kwargs.position_ids", kw.get("position_ids") is not None),
        )
        if on
    ]
    if bad:
        raise ProtocolError(
            "unsupported_option",
            f"a vLLM sub-job scores the prompt tokens at temperature 1 only: {', '.join(bad)}",
            options=bad,
            field=bad[0].split("=")[0],
        )


def log_probs_body(body: Mapping[str, Any], vocab: int) -> None:
    tokens(body["input_ids"], body.get("attention_mask"), "", vocab)


def prompts(body: Mapping[str, Any], vocab: int) -> list[str | list[int]]:
    raw = body.get("prompts")
    if not isinstance(raw, list | tuple) or not raw:
        raise bad(
            "prompts",
            "must be a non-empty list",
            "missing_field" if not raw else "invalid_argument",
        )
    out: list[str | list[int]] = []
    for i, p in enumerate(raw):
        path = f"prompts[{i}]"
        if isinstance(p, Mapping):  # the message form {"text": ...} / {"token_ids": {"ids": [...]}}
            p = p.get("text", p.get("token_ids"))
            if isinstance(p, Mapping):
                p = p.get("ids")
        if isinstance(p, str):
            if not p:
                raise bad(path, "is an empty string", expected="a non-empty prompt")
            out.append(p)
            continue
        if isinstance(p, np.ndarray):
            p = p.tolist()
        top = vocab - 1 if vocab > 0 else math.inf
        if isinstance(p, list | tuple) and p and value_rules.plain_ints_within(p, 0, top):
            out.append(list(p))  # the common case, in one pass; else the checks below say why
            continue
        if (
            not isinstance(p, list | tuple)
            or not p
            or not all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in p)
        ):
            raise bad(
                path,
                "is neither a non-empty string nor a non-empty list of token ids",
                expected="text or token ids",
            )
        if vocab > 0 and any(t < 0 or t >= vocab for t in p):
            first = next(t for t in p if t < 0 or t >= vocab)
            raise bad(
                path, f"token id {first} is outside [0, {vocab})", expected=f"ids in [0, {vocab})"
            )
        out.append([int(t) for t in p])
    return out


def prompt_room(body: Mapping[str, Any], max_model_len: int) -> None:
    """Token-id prompts and `max_tokens` against the sampler's context (`max_model_len`, 0 =
    not known yet) when the call is accepted, so that a call that cannot run is refused rather
    than failing later; text prompts are checked by the engine once tokenized."""
    if max_model_len <= 0:
        return
    sp: Mapping[str, Any] = body.get("sampling_params") or {}
    asked = token_budget.requested(sp.get("max_tokens"))
    clamp = bool(body.get("clamp_max_tokens"))
    for i, p in enumerate(prompts(body, 0)):
        if not isinstance(p, str):
            token_budget.budget(
                asked, len(p), max_model_len, clamp=clamp, prompt_field=f"prompts[{i}]"
            )


def sampling_params(body: Mapping[str, Any]) -> None:
    """`SamplingParams`: each field's bounds (the spec's, `tables.request_rules`; a generate
    body's were checked on arrival, this covers every other path), then what a bound cannot
    say: `min_tokens` at most `max_tokens`, non-empty stop strings."""
    sp: Mapping[str, Any] = body.get("sampling_params") or {}
    wrong = value_rules.bound_error(BOUNDS[SAMPLING_PARAMS], sp, "sampling_params.")
    if wrong is not None:
        raise bad(wrong[0], wrong[1], expected=wrong[2])
    mt = token_budget.requested(sp.get("max_tokens"))  # an integer >= 1, or absent
    mn = sp.get("min_tokens")
    if mn is not None and int(mn) > (mt or token_budget.DEFAULT_MAX_TOKENS):
        raise bad(
            "sampling_params.min_tokens",
            f"{mn} is not in [0, max_tokens]",
            expected="0 <= min_tokens <= max_tokens",
        )
    for i, s in enumerate(sp.get("stop") or []):
        if not isinstance(s, str) or s == "":
            raise bad(
                f"sampling_params.stop[{i}]", "an empty stop string", expected="non-empty strings"
            )
    structured.parse(sp)  # one constraint, JSON text of the right shape


def checkpoint_id(value: Any, path: str = "checkpoint_id") -> str:
    """The spec's checkpoint-id rule (`rules/checkpoint_ids.py`)."""
    return checkpoint_ids.check_id(value, path)


def save_body(body: Mapping[str, Any]) -> None:
    """`checkpoint_type`'s values are the spec's (checked on arrival); the id's rule here."""
    if body.get("checkpoint_id"):
        checkpoint_id(body["checkpoint_id"])


def filename(value: Any) -> str:
    """The spec's exported-file-name rule (`rules/checkpoint_ids.py`)."""
    return checkpoint_ids.check_filename(value)


def one_of(body: Mapping[str, Any], name: str, allowed: Sequence[str], path: str = "") -> None:
    v = body.get(name)
    if v not in (None, "") and v not in allowed:
        raise bad(path + name, f"{v!r} is not one of {list(allowed)}", expected=list(allowed))
