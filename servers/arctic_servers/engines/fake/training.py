"""Forward-backward, forward and log-probs bodies: the servers' shared checks, then NUMERICS.md.

The protocol layer has already checked field names, types, dtypes, the B/S shape agreement and
the per-loss field table; the semantic checks (token ids in the vocabulary, 0/1 masks, finite
tensors, the loss's options and the context tensors it needs) are the on-prem server's own
(`arctic_servers.engines.checks`, torch-free), so the fake refuses exactly what it refuses. This
module turns a checked body into `numerics` inputs and a result dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import checks
from . import numerics as nx


@dataclass
class TrainCall:
    """A checked forward-backward / forward body."""

    batch: nx.Batch
    spec: nx.LossSpec
    inputs: nx.LossInputs = field(default_factory=nx.LossInputs)
    post: frozenset[str] = frozenset()


def check_tokens(ids: Any, mask: Any, vocab_size: int) -> None:
    """A LogProbsRequest's tokens (the servers' check)."""
    checks.log_probs_body({"input_ids": ids, "attention_mask": mask}, vocab_size)


def parse_train(body: Mapping[str, Any], vocab_size: int) -> TrainCall:
    """Check a ForwardBackwardRequest / ForwardRequest and convert it (the loss defaults to
    cross_entropy for both, PROTOCOL.md §9)."""
    return to_call(body, checks.train_body(body, vocab_size))


def to_call(body: Mapping[str, Any], spec: nx.LossSpec) -> TrainCall:
    """A body `checks.train_body` accepted, with the loss settings it parsed, as `numerics`
    inputs (nothing is checked or parsed again)."""
    kw: Mapping[str, Any] = body["kwargs"]
    ctx: Mapping[str, Any] = body.get("context") or {}
    processing: Mapping[str, Any] = body.get("processing") or {}
    batch = nx.make_batch(kw["input_ids"], kw.get("attention_mask"), kw.get("position_ids"))

    def floats(name: str) -> nx.F64 | None:
        v = ctx.get(name)
        return None if v is None else np.asarray(v).astype(np.float64)

    labels = kw.get("labels")
    inputs = nx.LossInputs(
        loss_mask=floats("loss_mask"),
        labels=None if labels is None else np.asarray(labels).astype(np.int64),
        advantages=floats("advantages"),
        weights=floats("weights"),
        old_shifted=floats("old_log_probs_shifted"),
        ref_shifted=floats("ref_log_probs_shifted"),
    )
    return TrainCall(batch, spec, inputs, frozenset(str(p) for p in processing.get("post") or []))


def outputs(call: TrainCall, step: int, *, logprobs: bool, entropy: bool) -> dict[str, Any]:
    """The call's output tensors: the log-probs are of the tokens its loss scores (a
    cross_entropy call's `labels` where they are not -100, NUMERICS.md §2-§3)."""
    out: dict[str, Any] = {}
    temp = call.spec.temperature
    if logprobs:
        lp = nx.shifted_logprobs(
            call.batch, step, nx.loss_targets(call.batch, call.spec, call.inputs)
        )
        out["logprobs_shifted"] = (lp / temp).astype(np.float32)
    if entropy:
        out["entropy"] = nx.shifted_entropy(call.batch, step).astype(np.float32)
    return out


def run(call: TrainCall, step: int, *, forward: bool) -> tuple[dict[str, Any], nx.LossResult]:
    """The ForwardBackwardResult of a call (forward: the same loss and metrics, no gradient)
    and its LossResult."""
    lr = nx.compute_loss(call.batch, step, call.spec, call.inputs)
    metrics = dict(lr.metrics)
    loss = lr.loss
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
    check_tokens(ids, mask, vocab_size)
    call = TrainCall(nx.make_batch(ids, mask), nx.LossSpec())
    outs = outputs(call, step, logprobs=True, entropy=bool(body.get("entropy")))
    metrics = {
        "loss": 0.0,
        "num_tokens": int(call.batch.pair.sum()),
        "num_sequences": int(call.batch.ids.shape[0]),
    }
    return {"loss": 0.0, "metrics": metrics, "outputs": outs}
