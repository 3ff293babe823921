"""The per-op check table: the semantic checks a data-plane body gets before its call is accepted
(a 4xx, never a failed request), one row per op, used by all three servers (the on-prem server,
the gateway with either engine profile, the fake gateway).

The protocol layer has already checked the fields' names, types, values and bounds (the spec's
rules, `rules/validate.py`). A row adds what those rules cannot say, through `checks.py`
(token ids inside the vocabulary, the loss's options and context tensors, sampling parameters,
checkpoint ids). What differs between the servers is only what they know of the call, which
each one hands the row as `CallFacts`: the target sub-job's vocabulary, engine and context
length, whether the job samples with adapters, which jobs the caller sees, and its own
weight-sync checks (sync placement and LoRA pools are each server's).

Each check runs once per call: a forward-backward's or forward's row answers the loss settings
it parsed (`losses/table.parse_processing`), which a server whose engine runs in process hands
to the engine instead of parsing them again (the fake gateway: `CallContext.checked`).

Here, not in `protocol/`: the rows run `checks.py` and the losses table, which are the engines'
(servers/README.md: servers -> engines -> protocol). Imports no engine but the fake's sampling
checks, and those only when a fake sub-job's generate is checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M

from ..rules import checkpoint_ids
from ..rules.jobs import JobRecord, sub_job_by_id
from ..rules.lora_config import check_adapter
from ..rules.operation_types import OP_FORWARD, OP_WEIGHT_SYNC, check_operation
from . import checks
from .losses.table import LossSettings


def vocab_of(size: int) -> Callable[[], int]:
    """A vocabulary already known."""
    return lambda: size


def _no_sync_checks(body: Mapping[str, Any], path: str) -> None:
    """A server without weight-sync checks of its own (the spec's rules still ran)."""


def _nobody(job_id: str) -> object:
    raise AssertionError(f"no visibility rule was given for job {job_id!r}")


OperationForward = Callable[
    [Mapping[str, Any], Mapping[str, Any]], tuple[dict[str, Any], "CallFacts"]
]


@dataclass(frozen=True)
class CallFacts:
    """What the checks need to know of one call, each server's own answer."""

    job: JobRecord[Any]
    # the target sub-job's vocabulary (0: not known; ids are not checked), asked only by the rows
    # that check token ids (the on-prem server may read it from the model's files)
    vocab: Callable[[], int] = lambda: 0
    engine: str = ""  # the target's engine: "fake" samples as the fake engine, else as vLLM
    scores_with_vllm: bool = False  # a forward on it is vLLM's prompt scoring (temperature 1)
    max_context: int = 0  # a sampler's context, prompt + max_tokens (0: not known yet)
    adapter_job: bool = False  # the job's samplers load adapter versions (generate's `adapter`)
    visible: Callable[[str], object] = _nobody  # a job the caller may load from, else raises
    check_sync: Callable[[Mapping[str, Any], str], None] = _no_sync_checks  # (body, path)
    operation_types: Iterable[str] = ()
    # an /operation forward (its envelope, its payload): its ForwardRequest body and the facts
    # of the sub-job it runs on
    operation_forward: OperationForward | None = None


Check = Callable[[CallFacts, Mapping[str, Any]], LossSettings | None]


def _train(method: MethodInfo) -> Check:
    def check(facts: CallFacts, body: Mapping[str, Any]) -> LossSettings:
        loss = checks.train_body(body, facts.vocab())
        if method is M.FORWARD and facts.scores_with_vllm:
            checks.vllm_forward(body)
        return loss

    return check


def _log_probs(facts: CallFacts, body: Mapping[str, Any]) -> None:
    checks.log_probs_body(body, facts.vocab())


def _generate(facts: CallFacts, body: Mapping[str, Any]) -> None:
    if facts.engine == "fake":  # the fake engine's own limits too (n, constrained decoding)
        from .fake import sampling

        sampling.prompt_ids(body, facts.vocab(), facts.max_context)
    else:
        checks.sampling_params(body)
        checks.prompts(body, facts.vocab())
        checks.prompt_room(body, facts.max_context)
    check_adapter(body, facts.adapter_job)


def _save(facts: CallFacts, body: Mapping[str, Any]) -> None:
    checks.save_body(body)


def _load(facts: CallFacts, body: Mapping[str, Any]) -> None:
    if not body.get("checkpoint_id"):
        raise checks.bad("checkpoint_id", "is required", "missing_field")
    checks.checkpoint_id(body["checkpoint_id"])
    checkpoint_ids.check_source_job(body, facts.job.job_id, facts.visible)
    target = body.get("target_sub_job_id")
    if target:  # any sub-job: a sampler loads the checkpoint's exported weights
        sub_job_by_id(facts.job, target)


def _checkpoint(facts: CallFacts, body: Mapping[str, Any]) -> None:
    checks.checkpoint_id(body.get("checkpoint_id"))  # the spec's rule: a name, never a path


def _download(facts: CallFacts, body: Mapping[str, Any]) -> None:
    checks.checkpoint_id(body.get("checkpoint_id"))
    checks.filename(body.get("filename"))


def _sync(facts: CallFacts, body: Mapping[str, Any]) -> None:
    facts.check_sync(body, "")


def _operation(facts: CallFacts, body: Mapping[str, Any]) -> None:
    """The `/operation` envelope (PROTOCOL.md §3.4), then its payload as the op it stands for."""
    otype, payload = check_operation(facts.job, body, facts.operation_types)
    if otype == OP_WEIGHT_SYNC:
        facts.check_sync(payload, "payload.")
    elif otype == OP_FORWARD and facts.operation_forward is not None:
        fwd, target = facts.operation_forward(body, payload)
        _train(M.FORWARD)(target, fwd)


#: op -> its check; an op with no row has nothing beyond the spec's rules
TABLE: Mapping[MethodInfo, Check] = {
    M.FORWARD_BACKWARD: _train(M.FORWARD_BACKWARD),
    M.FORWARD: _train(M.FORWARD),
    M.LOG_PROBS: _log_probs,
    M.GENERATE: _generate,
    M.SAVE_CHECKPOINT: _save,
    M.LOAD_CHECKPOINT: _load,
    M.EXPORT_CHECKPOINT: _checkpoint,
    M.DELETE_CHECKPOINT: _checkpoint,
    M.DOWNLOAD_CHECKPOINT_FILE: _download,
    M.SYNC_WEIGHTS: _sync,
    M.OPERATION: _operation,
}


def check(method: MethodInfo, facts: CallFacts, body: Mapping[str, Any]) -> LossSettings | None:
    """Run `method`'s row on `body`; what it parsed (a training op's loss settings), else None."""
    row = TABLE.get(method)
    return None if row is None else row(facts, body)
