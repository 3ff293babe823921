"""A sampler over the fake gateway's numerics (`engines/fake/NUMERICS.md` §1, §5), for tests.

Same tokens, text, stop handling and log-probs as the fake gateway's `generate` (weight version
and model step fixed per sampler, settable), a byte-level tokenizer, and a Qwen-style chat
template (`chat_template=False` makes a base model without one). Streaming releases one token
every `token_delay_s` seconds and records when each token was produced (`generated_at`), so a
test can prove the first chunk left before the last token existed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ..engines.fake import sampling as fake_sampling
from ..engines.fake import tokenizer
from ..engines.tiny_tokenizer import TOOLS_POSTAMBLE, TOOLS_PREAMBLE
from ..rules import token_budget
from ..rules.errors import ProtocolError
from .sampler import ModelCard, OpenAIError, Sample, StreamEvent
from .tokenized import FakeTokenizer, TokenizedSampler, content_text

__all__ = ["FakeResolver", "FakeSampler", "render_qwen_chat"]


def render_qwen_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: Sequence[Any] | None = None,
) -> str:
    """The tiny model's chat template (`engines/tiny_tokenizer.CHAT_TEMPLATE`: ChatML with hermes
    tool calls) in Python, for the fake engine (no jinja2 in the base install). Messages are as
    `render_chat` hands them to a template: `content` a string, tool-call `arguments` objects."""
    out = []
    first_system = bool(tools) and bool(messages) and messages[0].get("role") == "system"
    if tools:
        out.append("<|im_start|>system\n")
        if first_system:
            out.append(content_text(messages[0].get("content")) + "\n\n")
        out.append(TOOLS_PREAMBLE)
        out.extend(json.dumps(t, ensure_ascii=False) + "\n" for t in tools)
        out.append(TOOLS_POSTAMBLE + "<|im_end|>\n")
    for i, m in enumerate(messages):
        role, content = m.get("role"), content_text(m.get("content"))
        if i == 0 and first_system:
            continue
        if role == "assistant" and m.get("tool_calls"):
            out.append("<|im_start|>assistant" + ("\n" + content if content else ""))
            for call in m["tool_calls"]:
                fn = call.get("function", call)
                args = json.dumps(fn.get("arguments"), ensure_ascii=False)
                out.append(f'\n<tool_call>\n{{"name": "{fn.get("name")}", "arguments": {args}}}')
                out.append("\n</tool_call>")
            out.append("<|im_end|>\n")
        elif role == "tool":
            if i == 0 or messages[i - 1].get("role") != "tool":
                out.append("<|im_start|>user")
            out.append(f"\n<tool_response>\n{content}\n</tool_response>")
            if i == len(messages) - 1 or messages[i + 1].get("role") != "tool":
                out.append("<|im_end|>\n")
        else:
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


class FakeSampler(TokenizedSampler):
    """The text side is `TokenizedSampler`'s over `FakeTokenizer`; generation is the fake's."""

    def __init__(
        self,
        model_id: str = "fake-tiny",
        *,
        chat_template: bool = True,
        token_delay_s: float = 0.0,
        max_model_len: int = fake_sampling.CONTEXT_LENGTH,
        weight_version: int = 0,
        model_step: int = 0,
    ) -> None:
        super().__init__(model_id, FakeTokenizer(chat_template), max_model_len)
        self.token_delay_s = token_delay_s
        self.weight_version = weight_version
        self.model_step = model_step
        self.requests: list[dict[str, Any]] = []  # every (prompts, params) received, for tests

    def _params(self, params: Mapping[str, Any]) -> fake_sampling.Params:
        try:
            return fake_sampling.parse_params({"sampling_params": dict(params)})
        except Exception as exc:  # the fake's ProtocolError: a bad value
            raise OpenAIError(400, str(exc), code="invalid_argument") from None

    def _budget(self, prompt: Sequence[int], p: fake_sampling.Params) -> int:
        """The prompt's `max_tokens` under this model's context (`rules/token_budget.py`;
        the routes checked the caller's value against it already)."""
        try:
            return token_budget.budget(p.max_tokens, len(prompt), self.max_model_len).max_tokens
        except ProtocolError as exc:
            raise OpenAIError(400, exc.message, param="prompt") from None

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: Mapping[str, Any],
    ) -> tuple[list[list[Sample]], int]:
        p = self._params(params)
        self.requests.append({"prompts": [list(x) for x in prompts], "params": dict(params)})
        seed = p.seed if p.seed is not None else fake_sampling.draw_seed()
        out = []
        for prompt in prompts:
            budget = self._budget(prompt, p)
            samples = []
            for k in range(p.n):
                s = fake_sampling.sample(
                    prompt, k, p, seed, self.weight_version, self.model_step, budget
                )
                samples.append(
                    Sample(
                        list(s["token_ids"]),
                        s["text"],
                        s["finish_reason"],
                        s.get("logprobs"),
                        s.get("stop_reason") or None,
                    )
                )
            out.append(samples)
        return out, self.weight_version

    async def open_stream(
        self,
        prompt: Sequence[int],
        params: Mapping[str, Any],
        index: int = 0,
    ) -> AsyncIterator[StreamEvent]:
        """The parameters and the prompt's budget checked now; the tokens of
        `fake_sampling.sample` (the same sample `generate` answers), released one at a time."""
        p = self._params(params)
        budget = self._budget(prompt, p)
        self.requests.append({"prompts": [list(prompt)], "params": dict(params), "stream": True})
        return self._release(prompt, p, budget, index)

    async def _release(
        self, prompt: Sequence[int], p: fake_sampling.Params, budget: int, index: int
    ) -> AsyncIterator[StreamEvent]:
        seed = p.seed if p.seed is not None else fake_sampling.draw_seed()
        version = self.weight_version  # the weights this sample is drawn from, start to end
        s = fake_sampling.sample(prompt, index, p, seed, version, self.model_step, budget)
        tokens, lps = s["token_ids"], s.get("logprobs")
        for j, t in enumerate(tokens):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            last = j == len(tokens) - 1
            text = s["text"] if last else tokenizer.decode(tokens[: j + 1])
            ev = StreamEvent(
                [t], None if lps is None else [lps[j]], text, time.time(), weight_version=version
            )
            if last:
                ev.finished, ev.finish_reason = True, s["finish_reason"]
                ev.stop_reason = s.get("stop_reason") or None
            yield ev
        if not tokens:
            yield StreamEvent([], None, "", time.time(), True, "length")


class FakeResolver:
    """Serves a fixed set of fake samplers by model id."""

    def __init__(self, *samplers: FakeSampler) -> None:
        self.samplers = {s.model_id: s for s in (samplers or (FakeSampler(),))}
        self.created = int(time.time())

    async def models(self, token: str | None) -> list[ModelCard]:
        return [
            ModelCard(m, self.created, root=m, max_model_len=s.max_model_len)
            for m, s in self.samplers.items()
        ]

    async def sampler(self, model: str, token: str | None) -> FakeSampler:
        try:
            return self.samplers[model]
        except KeyError:
            raise OpenAIError(
                404,
                f"the model {model!r} does not exist; available: {sorted(self.samplers)}",
                param="model",
                code="model_not_found",
            ) from None
