"""Rollouts to training frames: single-turn samples of `generate`, and multi-turn transcripts.

Single turn: `from_generate(result)` turns a `generate` result (asked with `logprobs: 0`) into
one rollout per sample — prompt + completion, `loss_mask` 1 on the completion, the sampler's
log-probs — and `forward_backward_frame(rollouts, advantages, loss_fn="grpo")` builds the
canonical forward-backward body with every column in its alignment (`loss_mask`, `advantages`
token-aligned; the sampler's log-probs moved to `old_log_probs_shifted`).

    >>> out = {"results": [{"prompt_token_ids": [5, 6], "samples": [
    ...     {"token_ids": [7, 8], "logprobs": [-0.5, -0.25]}]}]}
    >>> r = from_generate(out)[0]
    >>> r.input_ids, r.loss_mask, r.logprobs
    ([5, 6, 7, 8], [0, 0, 1, 1], [0.0, 0.0, -0.5, -0.25])
    >>> frame = forward_backward_frame([r], [1.0], loss_fn="grpo")
    >>> frame["context"]["old_log_probs_shifted"].tolist()  # column i: log-prob of token i + 1
    [[0.0, -0.5, -0.25, 0.0]]

Multi-turn rollouts: an agent transcript to one trainable sequence.

An agent loop that samples through the OpenAI-compatible endpoint gets, per turn, the *full*
prompt it sent (history included) and the completion the model produced, both as token ids
(vLLM's `prompt_token_ids` and per-choice `token_ids`). `flatten_turns` joins them into one
sequence `input_ids` with a token-aligned `loss_mask`: 1 on every model-produced token of every
turn, 0 on the first prompt and on everything the environment added between turns (tool output,
user messages, chat-template glue).

The turns concatenate when each prompt starts with the previous prompt followed by the previous
completion (`prompt[i + 1][: len(prompt[i]) + len(completion[i])] == prompt[i] + completion[i]`);
then the last prompt plus the last completion holds every turn, and each completion sits at the
offset `len(prompt[i])`. When a chat template re-renders an earlier assistant turn differently
(a dropped end-of-turn token, a re-tokenised boundary), that invariant breaks; `flatten_turns`
then falls back to the last turn only (its prompt as context, only its completion trained) and
warns with `TurnsDoNotConcatenateWarning`, naming the turn and the first differing position.

    >>> r = flatten_turns([[1, 2], [1, 2, 7, 8, 3]], [[7, 8], [9]])
    >>> r.input_ids, r.loss_mask
    ([1, 2, 7, 8, 3, 9], [0, 0, 1, 1, 0, 1])

`turn_from_response` reads one turn out of an OpenAI-compatible response (a dict or an `openai`
client object); `pad_rollouts` right-pads several flattened rollouts into `[B, S]` arrays ready
for a forward-backward frame (`forward_backward_frame`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

__all__ = [
    "FlatRollout",
    "PaddedRollouts",
    "Turn",
    "TurnsDoNotConcatenateWarning",
    "flatten_turns",
    "forward_backward_frame",
    "from_generate",
    "pad_rollouts",
    "session_rows",
    "turn_from_response",
]


class TurnsDoNotConcatenateWarning(UserWarning):
    """A transcript's turns do not concatenate; only its last turn is trained."""


@dataclass(frozen=True)
class Turn:
    """One model call of an agent: the full prompt sent and the completion received."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    #: Sampler log-prob of each completion token (None when not requested).
    logprobs: list[float] | None = None
    #: The weights that sampled it (the reply's `weight_version`; None when not given).
    weight_version: int | None = None


@dataclass(frozen=True)
class FlatRollout:
    """One transcript as one sequence (all lists have the same length)."""

    input_ids: list[int]
    #: 1 on model-produced tokens, 0 on prompts, tool output and template glue.
    loss_mask: list[int]
    #: Sampler log-prob of each model-produced token, token-aligned (0.0 elsewhere); None when
    #: some turn came without log-probs.
    logprobs: list[float] | None
    num_turns: int
    #: Turns whose completions are trained (all of them, or 1 after a fallback).
    trained_turns: int
    #: True when the turns did not concatenate and only the last turn is trained.
    fell_back: bool
    #: Why the fallback happened ("" when it did not).
    reason: str = ""
    #: The `weight_version` of each trained turn, in order (None where a turn did not say).
    weight_versions: tuple[int | None, ...] = ()


def _ids(seq: Sequence[Any], what: str) -> list[int]:
    out = []
    for j, t in enumerate(seq):
        if isinstance(t, bool) or not isinstance(t, int | np.integer):
            raise TypeError(f"{what}[{j}] is {type(t).__name__}, expected an int token id")
        out.append(int(t))
    return out


def _turns(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float] | None] | None,
) -> list[Turn]:
    if len(prompts) != len(completions):
        raise ValueError(
            f"{len(prompts)} prompts but {len(completions)} completions: one of each per turn"
        )
    if logprobs is not None and len(logprobs) != len(prompts):
        raise ValueError(f"{len(logprobs)} log-prob lists for {len(prompts)} turns")
    turns = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        lp = None if logprobs is None else logprobs[i]
        comp = _ids(c, f"completion_token_ids[{i}]")
        if lp is not None and len(lp) != len(comp):
            raise ValueError(f"turn {i}: {len(lp)} log-probs for {len(comp)} completion tokens")
        turns.append(
            Turn(
                _ids(p, f"prompt_token_ids[{i}]"),
                comp,
                None if lp is None else [float(x) for x in lp],
            )
        )
    return turns


def _mismatch(turns: Sequence[Turn]) -> str:
    """Why the turns do not concatenate, or "" when they do."""
    for i in range(len(turns) - 1):
        head = turns[i].prompt_token_ids + turns[i].completion_token_ids
        nxt = turns[i + 1].prompt_token_ids
        if nxt[: len(head)] == head:
            continue
        if len(nxt) < len(head):
            return (
                f"prompt of turn {i + 1} has {len(nxt)} tokens, fewer than prompt + completion "
                f"of turn {i} ({len(head)})"
            )
        pos = next(j for j, (a, b) in enumerate(zip(head, nxt, strict=False)) if a != b)
        where = "prompt" if pos < len(turns[i].prompt_token_ids) else "completion"
        return (
            f"prompt of turn {i + 1} differs from prompt + completion of turn {i} at position "
            f"{pos} (inside turn {i}'s {where}: {head[pos]} != {nxt[pos]})"
        )
    return ""


def flatten_turns(
    prompt_token_ids: Sequence[Sequence[int]] | Sequence[Turn],
    completion_token_ids: Sequence[Sequence[int]] | None = None,
    logprobs: Sequence[Sequence[float] | None] | None = None,
    *,
    warn: bool = True,
) -> FlatRollout:
    """Join an agent's turns into `(input_ids, loss_mask)` (see the module docstring).

    Pass either a list of `Turn`s, or the per-turn lists as Harbor's `RolloutDetail` holds them
    (`prompt_token_ids`, `completion_token_ids`, optional `logprobs`). When the turns do not
    concatenate, the result holds the last turn only (`fell_back=True`, `reason` says why) and a
    `TurnsDoNotConcatenateWarning` is issued unless `warn=False`.
    """
    turns: list[Turn]
    if completion_token_ids is None:
        given = list(prompt_token_ids)
        if not all(isinstance(t, Turn) for t in given):
            raise TypeError("pass a list of Turn, or prompt and completion token-id lists")
        turns = [t for t in given if isinstance(t, Turn)]
    else:
        prompts = cast("Sequence[Sequence[int]]", prompt_token_ids)
        turns = _turns(prompts, completion_token_ids, logprobs)
    if not turns:
        raise ValueError("a transcript needs at least one turn")
    have_lp = all(t.logprobs is not None for t in turns)
    reason = _mismatch(turns)
    kept = [turns[-1]] if reason else turns
    last = kept[-1]
    ids = last.prompt_token_ids + last.completion_token_ids
    mask = [0] * len(ids)
    lps = [0.0] * len(ids) if have_lp else None
    for t in kept:
        start = len(t.prompt_token_ids)
        for j in range(len(t.completion_token_ids)):
            mask[start + j] = 1
            if lps is not None and t.logprobs is not None:
                lps[start + j] = t.logprobs[j]
    if reason and warn:
        warnings.warn(
            f"the transcript's {len(turns)} turns do not concatenate ({reason}); training its "
            f"last turn only",
            TurnsDoNotConcatenateWarning,
            stacklevel=2,
        )
    return FlatRollout(
        input_ids=ids,
        loss_mask=mask,
        logprobs=lps,
        num_turns=len(turns),
        trained_turns=len(kept),
        fell_back=bool(reason),
        reason=reason,
        weight_versions=tuple(t.weight_version for t in kept),
    )


def _get(obj: Any, name: str) -> Any:
    """A field of a dict, or of an `openai` object (declared or in its `model_extra`)."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None:
        extra = getattr(obj, "model_extra", None) or {}
        value = extra.get(name)
    return value


def turn_from_response(response: Any, choice: int = 0) -> Turn:
    """The `Turn` of one OpenAI-compatible chat or text completion response.

    Reads vLLM's extensions: top-level `prompt_token_ids` (or the choice's, as `/v1/completions`
    also returns it), the choice's `token_ids`, and `logprobs.content[].logprob` (chat) or
    `logprobs.token_logprobs` (completions) when present. Works on the JSON dict and on the
    `openai` client's response objects.
    """
    choices = _get(response, "choices") or []
    if not 0 <= choice < len(choices):
        raise ValueError(f"the response has {len(choices)} choices; choice {choice} asked for")
    ch = choices[choice]
    prompt = _get(response, "prompt_token_ids") or _get(ch, "prompt_token_ids")
    completion = _get(ch, "token_ids")
    if prompt is None or completion is None:
        raise ValueError(
            "the response carries no token ids: ask for them with return_token_ids=True (the "
            "server must be vLLM-compatible: top-level prompt_token_ids, per-choice token_ids)"
        )
    lp_obj = _get(ch, "logprobs")
    lps: list[float] | None = None
    if lp_obj is not None:
        content = _get(lp_obj, "content")
        if content is not None:
            lps = [float(_get(c, "logprob")) for c in content]
        elif _get(lp_obj, "token_logprobs") is not None:
            lps = [float(x) for x in _get(lp_obj, "token_logprobs")]
        if lps is not None and len(lps) != len(completion):
            lps = None
    version = _get(response, "weight_version")
    return Turn(
        _ids(prompt, "prompt_token_ids"),
        _ids(completion, "token_ids"),
        lps,
        None if version is None else int(version),
    )


def session_rows(record: Mapping[str, Any]) -> list[FlatRollout]:
    """Training rows of a server-side session (`GET /v1/sessions/{id}` of the OpenAI-compatible
    endpoint): one per segment (a session whose conversation was never edited has one), its
    `input_ids` the segment's token history — every prompt and the ids each turn *sampled*,
    verbatim — `loss_mask` 1 exactly on the sampled ids, the sampler's log-probs there, and the
    `weight_version` of each turn."""
    rows = []
    turns = list(record.get("turns") or [])
    for k, seg in enumerate(record.get("segments") or []):
        ids = _ids(seg["input_ids"], f"segments[{k}].input_ids")
        mine = [t for t in turns if int(t["segment"]) == k]
        mask = [0] * len(ids)
        have_lp = all(t.get("logprobs") is not None for t in mine)
        lps = [0.0] * len(ids) if have_lp else None
        for t in mine:
            start, comp = int(t["start"]), _ids(t["completion_token_ids"], "completion_token_ids")
            if ids[start : start + len(comp)] != comp:
                raise ValueError(f"segment {k}: a turn's sampled ids are not at its offset {start}")
            for j in range(len(comp)):
                mask[start + j] = 1
                if lps is not None:
                    lps[start + j] = float(t["logprobs"][j])
        rows.append(
            FlatRollout(
                input_ids=ids,
                loss_mask=mask,
                logprobs=lps,
                num_turns=len(mine),
                trained_turns=len(mine),
                fell_back=False,
                weight_versions=tuple(int(t["weight_version"]) for t in mine),
            )
        )
    return rows


def from_generate(result: Mapping[str, Any]) -> list[FlatRollout]:
    """One single-turn rollout per sample of a `generate` result (`GenerateResult`), in prompt
    order and, within a prompt, sample order: its ids are the prompt's then the completion's,
    `loss_mask` is 1 on the completion, and `logprobs` are the sampler's (None when the call
    did not ask for `logprobs`)."""
    out = []
    for c in result["results"]:
        prompt = _ids(c["prompt_token_ids"], "prompt_token_ids")
        for s in c["samples"]:
            turn = Turn(prompt, _ids(s["token_ids"], "token_ids"), s.get("logprobs"))
            out.append(flatten_turns([turn]))
    return out


@dataclass(frozen=True)
class PaddedRollouts:
    """Flattened rollouts right-padded into `[B, S]` arrays."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    loss_mask: np.ndarray
    #: Token-aligned sampler log-probs (0 on prompts and padding), or None.
    logprobs: np.ndarray | None

    @property
    def logprobs_shifted(self) -> np.ndarray | None:
        """The log-probs in the frame's `_shifted` alignment: column i predicts token i + 1."""
        if self.logprobs is None:
            return None
        out = np.zeros_like(self.logprobs)
        out[:, :-1] = self.logprobs[:, 1:]
        return out


def pad_rollouts(
    rollouts: Sequence[FlatRollout], *, pad_token_id: int = 0, width: int | None = None
) -> PaddedRollouts:
    """Right-pad rollouts to one width (the longest, or `width`)."""
    if not rollouts:
        raise ValueError("no rollouts to pad")
    longest = max(len(r.input_ids) for r in rollouts)
    s = longest if width is None else width
    if s < longest:
        raise ValueError(f"width {s} is shorter than the longest rollout ({longest} tokens)")
    b = len(rollouts)
    ids = np.full((b, s), pad_token_id, np.int64)
    attn = np.zeros((b, s), np.int64)
    mask = np.zeros((b, s), np.int64)
    have_lp = all(r.logprobs is not None for r in rollouts)
    lps = np.zeros((b, s), np.float32) if have_lp else None
    for i, r in enumerate(rollouts):
        n = len(r.input_ids)
        ids[i, :n] = r.input_ids
        attn[i, :n] = 1
        mask[i, :n] = r.loss_mask
        if lps is not None and r.logprobs is not None:
            lps[i, :n] = r.logprobs
    return PaddedRollouts(ids, attn, mask, lps)


def forward_backward_frame(
    rollouts: Sequence[FlatRollout] | PaddedRollouts,
    advantages: Sequence[float] | np.ndarray,
    *,
    loss_fn: str = "importance_sampling",
    pad_token_id: int = 0,
    use_sampler_logprobs: bool = True,
    config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A canonical forward-backward body (`training.proto`) for flattened rollouts.

    `advantages` holds one value per rollout (a sequence-level advantage, broadcast over its
    trained tokens) or a `[B, S]` token-aligned array. With `use_sampler_logprobs` and log-probs
    present they become `old_log_probs_shifted` (the behaviour policy of the importance ratio).
    """
    padded = (
        rollouts
        if isinstance(rollouts, PaddedRollouts)
        else pad_rollouts(rollouts, pad_token_id=pad_token_id)
    )
    shape = padded.input_ids.shape
    adv = np.asarray(advantages, np.float32)
    if adv.ndim == 1:
        if adv.shape[0] != shape[0]:
            raise ValueError(f"{adv.shape[0]} advantages for {shape[0]} rollouts")
        adv = np.repeat(adv[:, None], shape[1], axis=1)
    if adv.shape != shape:
        raise ValueError(f"advantages have shape {list(adv.shape)}, expected {list(shape)}")
    adv = adv * (padded.loss_mask != 0)
    context: dict[str, Any] = {"advantages": adv, "loss_mask": padded.loss_mask}
    old = padded.logprobs_shifted
    if use_sampler_logprobs and old is not None:
        context["old_log_probs_shifted"] = old
    processing: dict[str, Any] = {"post": ["compute_logprobs"], "loss_fn": loss_fn}
    if config:
        processing["config"] = dict(config)
    return {
        "kwargs": {"input_ids": padded.input_ids, "attention_mask": padded.attention_mask},
        "context": context,
        "processing": processing,
    }
