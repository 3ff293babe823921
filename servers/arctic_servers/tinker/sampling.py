"""What Tinker's sampling does on our protocol: `asample` -> generate on the sampling session's
sampler, checked against the model's context window at submit.

- A snapshot session samples the weight version it was made with and is refused (409) once its
  sampler moved on; an inflight one (`kind="inflight"`) samples whatever the sampler holds
  (the model's newest saved weights), and every sampled sequence's version is recorded
  (`GET /api/v1/sequences/{sequence_id}`, our extension: Tinker's responses do not say it).
- Greedy sampling (temperature 0) of n > 1 samples is one greedy sample repeated n times, as
  Tinker does (vLLM refuses n > 1 without randomness).
- `topk_sample_logprobs` / `topk_prompt_logprobs` are generate's `logprobs` /
  `prompt_logprobs` = k (at most 20, the protocol's limit); `prompt_logprobs_last_n` scores the
  whole prompt and answers only the last n (NaN before them, as Tinker does).
- `stop=[]` is Tinker's "no stop at all, EOS included": generate's `ignore_eos`.
- Refused by name: `target_prompt_logprobs` and `prompt_alt_tokens_k` (our generate scores
  only the prompt's own tokens and its top k, never chosen ids or draws from the whole
  distribution at prompt positions) and `record_stability_info` (stable_reinforce's, whose
  content Tinker does not publish: `losses.py`).
"""

from __future__ import annotations

import math
from typing import Any

from ..rules import token_budget
from ..rules.errors import ProtocolError
from .backend import Backend
from .errors import TinkerError
from .ops import context_error
from .state import SamplerRef, State

__all__ = ["MAX_TOPK", "Sampler", "prompt_tokens", "sampling_params"]

MAX_TOPK = 20  # the protocol's logprobs / prompt_logprobs bound

REFUSED_SAMPLE = {
    "target_prompt_logprobs": (
        "our generate scores a prompt's own tokens and its top k only, not chosen token ids"
    ),
    "prompt_alt_tokens_k": (
        "our generate draws no tokens at prompt positions (prompt_logprobs gives the top k)"
    ),
    "record_stability_info": (
        "stability information is stable_reinforce's, whose content Tinker does not publish "
        "(the loss is refused by name; use ppo or cispo)"
    ),
}


def _version_error(ref: SamplerRef, now: int) -> TinkerError:
    return TinkerError(
        409,
        f"the weights of this sampling session (weight version {ref.weight_version}) are no "
        f"longer loaded: model {ref.model_id!r}'s sampler holds version {now}; create a new "
        "sampling client with save_weights_for_sampler (or one with kind='inflight', which "
        "follows the newest weights)",
        "failed_precondition",
        field="sampling_session_id",
    )


def prompt_tokens(prompt: Any) -> list[int]:
    out: list[int] = []
    for i, c in enumerate(prompt.chunks):
        if getattr(c, "type", "") != "encoded_text":
            raise TinkerError(
                400,
                f"prompt.chunks[{i}] is a {getattr(c, 'type', '?')} chunk; "
                "this server samples text (encoded_text) only",
                "unsupported_option",
                field=f"prompt.chunks[{i}]",
            )
        out.extend(int(t) for t in c.tokens)
    if not out:
        raise TinkerError(400, "prompt is empty", "invalid_argument", field="prompt")
    return out


def _topk(req: Any, name: str) -> int:
    k = int(getattr(req, name, 0) or 0)
    if k < 0 or k > MAX_TOPK:
        raise TinkerError(
            400, f"{name} = {k}; expected 0..{MAX_TOPK}", "invalid_argument", field=name
        )
    return k


def _max_tokens(value: Any, prompt_len: int, window: int) -> int:
    """The tinker SDK's `SamplingParams.max_tokens` (None: the room left, as vLLM's chat route)
    against the room the prompt leaves in the window (`rules/token_budget.py`): 0, a negative
    or a non-integer is `invalid_argument`; past the room, Tinker's context-window 400."""
    field = "sampling_params.max_tokens"
    try:
        asked = token_budget.requested(value, field)
    except ProtocolError as exc:
        raise TinkerError(400, exc.message, "invalid_argument", field=field) from None
    if prompt_len >= window:
        raise context_error("prompt", prompt_len, window, 1)
    if asked is not None and prompt_len + asked > window:
        raise context_error("prompt", prompt_len, window, asked)
    return token_budget.budget(asked, prompt_len, window, default=None).max_tokens


def sampling_params(req: Any, prompt_len: int, window: int) -> dict[str, Any]:
    """Our generate's sampling params for a Tinker `SampleRequest` (checked: refusals, the
    context window), with `n` the number of samples to request."""
    for k, why in REFUSED_SAMPLE.items():
        v = getattr(req, k, None)
        if v not in (None, 0, False):
            raise TinkerError(
                400, f"{k} = {v!r} is not served: {why}", "unsupported_option", field=k
            )
    sp = req.sampling_params
    temperature = float(sp.temperature)
    if temperature < 0 or not math.isfinite(temperature):
        raise TinkerError(
            400,
            f"sampling_params.temperature = {temperature}; expected >= 0",
            "invalid_argument",
            field="sampling_params.temperature",
        )
    max_tokens = _max_tokens(sp.max_tokens, prompt_len, window)
    n = int(req.num_samples)
    if n < 1:
        raise TinkerError(
            400, f"num_samples = {n}; expected >= 1", "invalid_argument", field="num_samples"
        )
    out: dict[str, Any] = {
        "n": 1 if temperature == 0 else n,  # greedy: one sample, repeated (Sampler.sample)
        "logprobs": _topk(req, "topk_sample_logprobs"),
        "temperature": temperature,
        "top_p": float(sp.top_p),
        "max_tokens": max_tokens,
    }
    if sp.seed is not None:
        out["seed"] = int(sp.seed)
    if sp.top_k is not None and int(sp.top_k) > 0:
        out["top_k"] = int(sp.top_k)
    stop = sp.stop
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and len(stop) == 0:
        out["ignore_eos"] = True  # Tinker: [] disables every stop, EOS included
    elif stop:
        if all(isinstance(s, int) for s in stop):
            out["stop_token_ids"] = [int(s) for s in stop]
        else:
            out["stop"] = [str(s) for s in stop]
    topk_prompt = _topk(req, "topk_prompt_logprobs")
    last_n = req.prompt_logprobs_last_n
    if last_n is not None and not 1 <= int(last_n) <= prompt_len - 1:
        raise TinkerError(
            400,
            f"prompt_logprobs_last_n = {last_n}; expected 1..{prompt_len - 1} (the prompt's "
            "scored positions)",
            "invalid_argument",
            field="prompt_logprobs_last_n",
        )
    if req.prompt_logprobs or topk_prompt:
        out["prompt_logprobs"] = topk_prompt
    return out


class Sampler:
    """Runs a checked sample request on its session's sampler (the routes queue it)."""

    def __init__(self, state: State, backend: Backend) -> None:
        self.state, self.backend = state, backend

    def current_version(self, ref: SamplerRef) -> int:
        m = self.state.models.get(ref.model_id or "")
        return m.weight_version if m is not None else 0

    async def sample(
        self,
        ref: SamplerRef,
        token: str | None,
        prompt: list[int],
        params: dict[str, Any],
        req: Any,
        sequence_ids: list[str],
        sampling_session_id: str,
    ) -> tuple[list[tuple[list[int], list[float] | None, str, Any]], dict[str, Any]]:
        """The sampled sequences (tokens, log-probs, stop reason, top-k rows) and the prompt
        parts (`prompt_logprobs`, `topk_prompt`)."""
        now = self.current_version(ref)
        if not ref.inflight and now != ref.weight_version:
            raise _version_error(ref, now)
        res = await self.backend.generate(token, ref.job_id, prompt, params)
        version = int(res.get("weight_version") or 0)
        if not ref.inflight and ref.model_id is not None and version != ref.weight_version:
            raise _version_error(ref, version)
        comp = res["results"][0]
        seqs = []
        for s in comp.get("samples") or []:
            reason = s.get("finish_reason") or "stop"
            if reason == "abort":
                raise TinkerError(503, "the sampler aborted the request", "unavailable")
            top = s.get("top_logprobs") if params["logprobs"] else None
            lps = s.get("logprobs")
            lps = lps.tolist() if hasattr(lps, "tolist") else lps  # an array: its values
            seqs.append(([int(t) for t in _seq(s.get("token_ids"))], lps, reason, top))
        n = int(req.num_samples)
        if len(seqs) == 1 and n > 1:  # greedy: the one sample, n times
            seqs = seqs * n
        self.state.record_sequences(
            sequence_ids,
            {
                "owner": ref.owner,
                "sampling_session_id": sampling_session_id,
                "model_id": ref.model_id,
                "weight_version": version,
            },
        )
        extra: dict[str, Any] = {}
        if "prompt_logprobs" in params:
            last_n = req.prompt_logprobs_last_n
            keep = len(prompt) - int(last_n) if last_n is not None else 1
            raw = list(_seq(comp.get("prompt_logprobs")))
            if req.prompt_logprobs:
                extra["prompt_logprobs"] = [None if i < keep else v for i, v in enumerate(raw)]
            if params["prompt_logprobs"]:
                tops = list(_seq(comp.get("prompt_top_logprobs")))
                extra["topk_prompt"] = [None if i < keep else t for i, t in enumerate(tops)]
                extra["k"] = params["prompt_logprobs"]
        return seqs, extra


def _seq(v: Any) -> Any:
    """A result's list as the servicer answered it (a list, or an array: results reach the
    surface as the servicer's values, `backend.py`); none: empty."""
    return () if v is None else v
