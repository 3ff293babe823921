"""What the OpenAI-compatible routes need from a sampler, and the pieces samplers share.

A server plugs its sampling engine in through a `Resolver`: it lists the models a token may use
and hands out a `Sampler` per model. A `Sampler` tokenizes, renders chat templates, generates
(whole samples, several prompts × n) and streams (one sample, tokens as they are produced).

Sampling parameters use vLLM's names (`training.proto` `SamplingParams`): `n`, `temperature`,
`top_p`, `top_k`, `max_tokens`, `min_tokens`, `stop`, `stop_token_ids`, `seed`, `logprobs`
(0 = the sampled token's log-prob), `presence_penalty`, `frequency_penalty`,
`repetition_penalty`, `ignore_eos`, `min_p`, `include_stop_str_in_output`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "ModelCard",
    "NoChatTemplateError",
    "OpenAIError",
    "Resolver",
    "Sample",
    "Sampler",
    "StreamEvent",
    "hold_back",
]


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class NoChatTemplateError(OpenAIError):
    def __init__(self, model: str) -> None:
        super().__init__(
            400,
            f"model {model!r} has no chat template, so /v1/chat/completions cannot render "
            "messages; send a rendered prompt (text or token ids) to /v1/completions instead",
            param="messages",
            code="no_chat_template",
        )


@dataclass(frozen=True)
class ModelCard:
    id: str
    created: int
    owned_by: str = "arctic"
    root: str = ""
    max_model_len: int = 0


@dataclass
class Sample:
    """One finished sample."""

    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "abort"
    logprobs: list[float] | None = None
    stop_reason: str | int | None = None


@dataclass
class StreamEvent:
    """New tokens of a streamed sample; the last event has `finished` set.

    `text` is the sample's whole text so far (already cut before a matched stop string);
    `generated_at` is the server's `time.time()` when the newest token was produced;
    `weight_version` the weights that produced the tokens (None: the sampler does not say).
    """

    token_ids: list[int]
    logprobs: list[float] | None
    text: str
    generated_at: float
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    weight_version: int | None = None


def merge_events(events: Sequence[StreamEvent]) -> StreamEvent:
    """Consecutive events of one sample as one: all their tokens (and log-probs), the last one's
    text, time and finish (`stream_interval`: a chunk per k tokens, not per engine step)."""
    last = events[-1]
    if len(events) == 1:
        return last
    lps = [e.logprobs for e in events]
    return StreamEvent(
        [t for e in events for t in e.token_ids],
        None if any(lp is None for lp in lps) else [x for lp in lps for x in lp or []],
        last.text,
        last.generated_at,
        last.finished,
        last.finish_reason,
        last.stop_reason,
        last.weight_version,
    )


class Sampler(Protocol):
    """One model's sampling engine, as the routes use it."""

    model_id: str
    max_model_len: int

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; `add_special_tokens`: with the tokenizer's BOS and the like."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_text(self, token_id: int) -> str:
        """The text of one token (for log-prob entries)."""
        ...

    def decode_special(self, ids: Sequence[int]) -> str:
        """`ids` decoded with their special tokens (what a tool parser reads)."""
        ...

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool,
        tools: Any = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text of a conversation; raises `NoChatTemplateError` without a template."""
        ...

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: Mapping[str, Any],
    ) -> tuple[list[list[Sample]], int]:
        """`n` samples per prompt, and the weight version that produced them."""
        ...

    async def open_stream(
        self,
        prompt: Sequence[int],
        params: Mapping[str, Any],
        index: int = 0,
    ) -> AsyncIterator[StreamEvent]:
        """One sample (the `index`-th of the request), its tokens yielded as they are produced;
        its checks run now, when it is opened (the route opens every stream before it sends
        anything, so a refused stream is a plain error reply, not a broken event stream)."""
        ...

    def admit(self) -> AbstractContextManager[None]:
        """One sampling request of the job for the duration of a stream: the server's bound on
        queued sampling work (raises its 429 `rate_limited` past it, before anything is sent).
        A whole `generate` is admitted by the sampler's own call (a server's core)."""
        ...


class Resolver(Protocol):
    """The models a caller may use, and their samplers."""

    async def models(self, token: str | None) -> list[ModelCard]: ...

    async def sampler(self, model: str, token: str | None) -> Sampler:
        """Raises `OpenAIError(404)` for a model the token cannot use."""
        ...


def hold_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of `text` could start a stop string (not yet safe to send)."""
    keep = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), keep, -1):
            if s.startswith(text[-k:]):
                keep = k
                break
    return keep


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """(text before the first stop string that occurs, that string) or (text, None)."""
    hits = [(text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return text, None
    at, s = min(hits)
    return text[:at], s
