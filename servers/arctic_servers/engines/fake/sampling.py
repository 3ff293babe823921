"""The fake sampler: `generate` bodies checked and answered with NUMERICS.md §5 samples.

The sampling parameters get the servers' shared checks (`arctic_servers.engines.checks`) first,
so the fake refuses what the on-prem server refuses; the fake adds its own resource limits. Like
a real engine it has a context: `max_seq_len` when the sub-job sets it, else its model's
`CONTEXT_LENGTH`; `max_tokens` is checked against the room each prompt leaves in it
(`rules.token_budget`).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...rules import fields, token_budget
from ...rules.errors import ProtocolError
from .. import checks
from .. import structured as structured_outputs
from ..structured import Constraint
from . import structured, tokenizer
from .numerics import (
    PRINTABLE_IDS,
    draws,
    generation_seed,
    min_p_candidates,
    splitmix64,
    token_logprob,
    top_logprobs,
)

#: The fake model's context window (prompt + sampled tokens) when a sub-job sets no
#: `max_seq_len`: the fake model has no positions, so it is given one, as vLLM's `max_model_len`
#: defaults to a real model's `max_position_embeddings`.
CONTEXT_LENGTH = 4096
MAX_N = 1024
# Tokens one request may ask for (prompts x n x max_tokens): the fake stays fast.
MAX_REQUEST_TOKENS = 1 << 20
# Sampling params the fake accepts but whose value does not change its output; with
# `strict: true` a non-default value of one of them is refused (`unsupported_option`).
_IGNORED_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "top_p": (None, 1.0),
    "top_k": (None, 0, -1),
    "presence_penalty": (None, 0.0),
    "frequency_penalty": (None, 0.0),
    "repetition_penalty": (None, 0.0, 1.0),
}


@dataclass
class Params:
    """Sampling params with defaults applied."""

    n: int = 1
    max_tokens: int | None = None  # None: absent (the default, capped by each prompt's room)
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    greedy: bool = False
    min_p: float = 0.0
    include_stop_str: bool = False
    structured: Constraint | None = None  # constrained decoding (NUMERICS.md §5.1)


def _bad(path: str, message: str, **details: Any) -> ProtocolError:
    return ProtocolError("invalid_argument", f"field {path}: {message}", field=path, **details)


def _int(sp: Mapping[str, Any], name: str) -> int | None:
    v = sp.get(name)
    return None if v is None else int(v)


def parse_params(body: Mapping[str, Any]) -> Params:
    """Sampling params: the servers' shared checks, the fake's limits, the defaults applied."""
    checks.sampling_params(body)
    sp: Mapping[str, Any] = body.get("sampling_params") or {}
    p = Params()
    n = _int(sp, "n")
    if n is not None:
        if n > MAX_N:
            raise _bad("sampling_params.n", f"{n} is not in [1, {MAX_N}]", expected=f"1..{MAX_N}")
        p.n = n
    p.max_tokens = token_budget.requested(sp.get("max_tokens"))
    p.min_tokens = _int(sp, "min_tokens") or 0
    p.stop = [str(s) for s in sp.get("stop") or []]
    p.stop_token_ids = [int(t) for t in sp.get("stop_token_ids") or []]
    p.seed = _int(sp, "seed")
    p.logprobs = _int(sp, "logprobs")
    p.prompt_logprobs = _int(sp, "prompt_logprobs")
    temp = sp.get("temperature")
    p.greedy = temp is not None and float(temp) == 0.0
    p.min_p = fields.min_p(sp) or 0.0
    p.include_stop_str = bool(sp.get("include_stop_str_in_output"))
    p.structured = structured_outputs.parse(sp)
    if p.structured is not None:  # refuse what the fake cannot write before anything runs
        structured.write(p.structured, itertools.count(), 1)
    if p.structured is not None and (p.min_tokens or p.min_p):
        name = "min_tokens" if p.min_tokens else "min_p"
        raise ProtocolError(
            "unsupported_option",
            f"field sampling_params.{name}: the fake engine's constrained decoding writes the "
            f"constraint's text as it is; it does not combine with {name}",
            field=f"sampling_params.{name}",
        )
    if body.get("strict"):
        bad = [
            f"sampling_params.{k}={sp.get(k)!r}"
            for k, ok in _IGNORED_DEFAULTS.items()
            if sp.get(k) not in ok
        ]
        if bad:
            raise ProtocolError(
                "unsupported_option",
                f"the fake gateway cannot honour {', '.join(bad)} (strict: true)",
                options=bad,
            )
    return p


def context_length(max_seq_len: int) -> int:
    """The sampler's context: the sub-job's `max_seq_len`, else the fake model's."""
    return max_seq_len or CONTEXT_LENGTH


def budgets(
    body: Mapping[str, Any], prompts: Sequence[Sequence[int]], p: Params, max_seq_len: int
) -> list[token_budget.Budget]:
    """Each prompt's `max_tokens` against the room it leaves in the context (refused past it
    unless `clamp_max_tokens`), and the fake's bound on the tokens of one request."""
    ctx = context_length(max_seq_len)
    clamp = bool(body.get("clamp_max_tokens"))
    out = [
        token_budget.budget(p.max_tokens, len(ids), ctx, clamp=clamp, prompt_field=f"prompts[{i}]")
        for i, ids in enumerate(prompts)
    ]
    total = sum(b.max_tokens for b in out) * p.n
    if total > MAX_REQUEST_TOKENS:
        raise _bad(
            "sampling_params.max_tokens",
            f"{len(prompts)} prompts x n {p.n} x max_tokens ask for {total} tokens, more than "
            f"the fake gateway's {MAX_REQUEST_TOKENS} tokens per request",
            expected=f"prompts x n x max_tokens <= {MAX_REQUEST_TOKENS}",
        )
    return out


def prompt_ids(body: Mapping[str, Any], vocab_size: int, max_seq_len: int) -> list[list[int]]:
    """Token ids of every prompt (text goes through the byte-level tokenizer), each checked
    against the context with its `max_tokens` (`budgets`)."""
    prompts = body.get("prompts")
    if not isinstance(prompts, list | tuple) or not prompts:
        raise _bad("prompts", "must be a non-empty list", expected="at least one prompt")
    p = parse_params(body)
    out: list[list[int]] = []
    for i, pr in enumerate(prompts):
        path = f"prompts[{i}]"
        if isinstance(pr, Mapping):  # the message form {"text": ...} / {"token_ids": {"ids"}}
            pr = pr.get("text", pr.get("token_ids"))
            if isinstance(pr, Mapping):
                pr = pr.get("ids")
        if isinstance(pr, str):
            ids = tokenizer.encode(pr)
        elif isinstance(pr, np.ndarray) and pr.ndim == 1 and pr.dtype.kind in "iu":
            ids = [int(t) for t in pr.tolist()]
        elif isinstance(pr, list | tuple) and all(
            isinstance(t, int | np.integer) and not isinstance(t, bool) for t in pr
        ):
            ids = [int(t) for t in pr]
        else:
            raise _bad(path, "expected a string or a list of token ids")
        if not ids:
            raise _bad(path, "is empty", expected="at least one token")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise _bad(
                path,
                f"token id {bad[0]} is outside [0, {vocab_size})",
                expected=f"ids in [0, {vocab_size})",
            )
        out.append(ids)
    budgets(body, out, p, max_seq_len)
    return out


def draw_seed() -> int:
    """The seed of a request that did not give one (logged in the execution log)."""
    return secrets.randbits(63)


def next_token(
    z: int, prompt: Sequence[int], tokens: Sequence[int], p: Params, model_step: int
) -> int:
    """NUMERICS.md §5: the token draw `z` picks after `prompt + tokens`: a printable id, among
    those at least `min_p` times as likely as the best one when `min_p` is set."""
    cands = PRINTABLE_IDS
    if p.min_p > 0:
        prev = tokens[-1] if tokens else prompt[-1]
        cands = min_p_candidates(prev, len(prompt) + len(tokens), model_step, p.min_p)
    return cands[z % len(cands)]


def _z_stream(seed: int, idx: int, weight_version: int, prompt: Sequence[int]) -> Iterator[int]:
    """The sample's SplitMix64 outputs z_1, z_2, ... without end (`draws` takes a count)."""
    state = generation_seed(seed, idx, weight_version, prompt)
    while True:
        state, z = splitmix64(state)
        yield z


def _candidates(
    prompt: Sequence[int],
    p: Params,
    seed: int,
    idx: int,
    weight_version: int,
    model_step: int,
    budget: int,
) -> list[int]:
    """The tokens a sample may run through (its stop rules cut them): the draws' printable ids,
    or with `structured_outputs` the constraint's text written from the draws (§5.1) and eos."""
    if p.structured is None:
        tokens: list[int] = []
        for z in draws(seed, idx, weight_version, prompt, budget):
            tokens.append(next_token(z, prompt, tokens, p, model_step))
        return tokens
    text = structured.write(p.structured, _z_stream(seed, idx, weight_version, prompt), budget)
    return [*tokenizer.encode(text), tokenizer.EOS_ID][:budget]


def sample(
    prompt: Sequence[int],
    idx: int,
    p: Params,
    seed: int,
    weight_version: int,
    model_step: int,
    budget: int,
) -> dict[str, Any]:
    """One sample (NUMERICS.md §5) of at most `budget` tokens (its prompt's `max_tokens`,
    `budgets`): tokens, text, finish and stop reasons, log-probs."""
    s_seed, s_idx = (0, 0) if p.greedy else (seed, idx)
    tokens: list[int] = []
    text_end: int | None = None
    finish, stop_reason = "length", ""
    for t in _candidates(prompt, p, s_seed, s_idx, weight_version, model_step, budget):
        tokens.append(t)
        if t == tokenizer.EOS_ID and p.structured is not None:  # the constraint is complete
            finish = "stop"
            break
        if len(tokens) < p.min_tokens:
            continue
        if t in p.stop_token_ids:
            finish = "stop"
            if not p.include_stop_str:
                text_end = len(tokenizer.decode(tokens[:-1]))
            break
        text = tokenizer.decode(tokens)
        hits = [(text.find(s), s) for s in p.stop if s in text]
        if hits:
            at, stop_reason = min(hits)
            finish = "stop"
            text_end = at + len(stop_reason) if p.include_stop_str else at
            break
    text = tokenizer.decode(tokens)
    out: dict[str, Any] = {
        "token_ids": tokens,
        "text": text if text_end is None else text[:text_end],
        "finish_reason": finish,
    }
    if stop_reason:
        out["stop_reason"] = stop_reason
    if p.logprobs is not None:
        full = [*prompt, *tokens]
        n0 = len(prompt)
        out["logprobs"] = [
            float(token_logprob(full[n0 + j], n0 + j, full[n0 + j - 1], model_step))
            for j in range(len(tokens))
        ]
        if p.logprobs > 0:
            out["top_logprobs"] = [
                top_logprobs(full[n0 + j - 1], n0 + j, model_step, p.logprobs)
                for j in range(len(tokens))
            ]
    return out


def completions(
    prompts: Sequence[Sequence[int]],
    p: Params,
    seed: int,
    weight_version: int,
    model_step: int,
    budgets: Sequence[token_budget.Budget],
) -> list[dict[str, Any]]:
    """`GenerateResult.results`: per prompt its ids, `n` samples of at most its budget's
    `max_tokens` (`clamped_max_tokens` when it was lowered on request) and, when asked, the
    prompt's log-probs (NUMERICS.md §5)."""
    out = []
    for ids, b in zip(prompts, budgets, strict=True):
        samples = [
            sample(ids, k, p, seed, weight_version, model_step, b.max_tokens) for k in range(p.n)
        ]
        c: dict[str, Any] = {"prompt_token_ids": list(ids), "samples": samples}
        if b.clamped:
            c["clamped_max_tokens"] = b.max_tokens
        if p.prompt_logprobs is not None:
            c["prompt_logprobs"] = [0.0] + [
                float(token_logprob(ids[i], i, ids[i - 1], model_step)) for i in range(1, len(ids))
            ]
            if p.prompt_logprobs > 0:
                empty: dict[str, Any] = {"token_ids": [], "logprobs": []}
                c["prompt_top_logprobs"] = [empty] + [
                    top_logprobs(ids[i - 1], i, model_step, p.prompt_logprobs)
                    for i in range(1, len(ids))
                ]
        out.append(c)
    return out
