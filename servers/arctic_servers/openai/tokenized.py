"""What the servers' samplers share: a tokenizer with a chat template, generation through the
server's own `generate`, and streaming by continuation for workers that answer whole replies.

`TokenizedSampler` is the text side (encode, decode, token text, chat template) over a
Hugging Face-style tokenizer: the model directory's (`load_tokenizer`, once per directory in
the server process) or `FakeTokenizer` (the fake engine's byte-level tokenizer and the tiny
model's Qwen-style template). A subclass supplies `_generate` (the server's generate body ->
result) and `open_stream`; `ServicerSampler` supplies both through a server's protocol core in this
process (`protocol/inproc.py`, as the caller's token).

`continuation_stream` streams a sample through a worker that answers one reply per command:
each step asks for up to `chunk_tokens` more tokens of the same sample (prompt + tokens so far;
the prefix cache makes the re-read cheap) and yields them at once. Stop strings are applied on
the whole text; the EOS / stop tokens end the stream. Penalties, `min_tokens` and a
`structured_outputs` constraint (a forced tool call) depend on the whole completion, which a
continuation would reset, so such requests are generated in one call and then streamed in one
event (`NOT_INCREMENTAL`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from arctic_sdk.spec.tables import methods as M

from ..protocol.context import CallContext
from ..protocol.inproc import CoreCalls
from ..rules import token_budget
from .sampler import NoChatTemplateError, OpenAIError, Sample, StreamEvent, cut_at_stop

__all__ = [
    "NOT_INCREMENTAL",
    "SEED_STRIDE",
    "FakeTokenizer",
    "ServicerSampler",
    "TokenizedSampler",
    "content_text",
    "continuation_stream",
    "load_tokenizer",
    "samples_of",
    "stream_body",
    "stream_events",
    "template_messages",
]

SEED_STRIDE = 1_000_003  # the seed of a stream's index-th sample: seed + index * SEED_STRIDE
NOT_INCREMENTAL = (
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "structured_outputs",  # a constraint holds over the whole sample, not per continuation
)
_TOKENIZERS: dict[Path, Any] = {}
_TOKENIZERS_LOCK = threading.Lock()  # concurrent first requests: one import, one load


def load_tokenizer(model_dir: Path) -> Any:
    """The model directory's tokenizer (`transformers.AutoTokenizer`), loaded once (called in
    worker threads: the lock keeps two first requests from importing transformers at once)."""
    with _TOKENIZERS_LOCK:
        tok = _TOKENIZERS.get(model_dir)
        if tok is None:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(model_dir))
            _TOKENIZERS[model_dir] = tok
        return tok


class FakeTokenizer:
    """The fake engine's tokenizer (`engines/fake/tokenizer.py`: byte value + 3) with the
    tiny model's Qwen-style chat template (none: a base model's), in the shape of a Hugging Face
    tokenizer."""

    eos_token = "<|im_end|>"  # the template's end of a turn (as text: the byte tokenizer's eos
    # id 2 has none)

    def __init__(self, chat_template: bool = True) -> None:
        self.chat_template = (
            "qwen-style (arctic_servers.openai.fake.render_qwen_chat)" if chat_template else None
        )

    def __len__(self) -> int:
        from ..engines.fake import tokenizer

        return tokenizer.VOCAB_SIZE

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        from ..engines.fake import tokenizer

        return tokenizer.encode(text)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        from ..engines.fake import tokenizer

        return tokenizer.decode(ids)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        tools: Sequence[Any] | None = None,
        **_: Any,
    ) -> str:
        from .fake import render_qwen_chat

        return render_qwen_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools)


def content_text(content: Any) -> str:
    """A message's `content` as text: a string, or the text of its parts."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as a chat template reads them (vLLM's `_postprocess_messages`): `content` as text,
    and an assistant's tool-call `arguments` (a JSON string in OpenAI's format) as an object
    (400 naming the message when they are not JSON)."""
    out = []
    for i, m in enumerate(messages):
        msg = {**m, "content": content_text(m.get("content"))}
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and isinstance(calls, list):
            fixed = []
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    raise OpenAIError(
                        400,
                        f"messages[{i}].tool_calls[{j}]: expected "
                        '{"type": "function", "function": {"name", "arguments"}}',
                        param=f"messages[{i}].tool_calls[{j}]",
                        code="invalid_value",
                    )
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        raise OpenAIError(
                            400,
                            f"messages[{i}].tool_calls[{j}].function.arguments: not JSON",
                            param=f"messages[{i}].tool_calls[{j}].function.arguments",
                            code="invalid_value",
                        ) from None
                fixed.append({**call, "function": {**fn, "arguments": args}})
            msg["tool_calls"] = fixed
            if not fixed:
                msg.pop("tool_calls")
        out.append(msg)
    return out


def samples_of(res: Mapping[str, Any]) -> list[list[Sample]]:
    """The `Sample`s of a generate result (`results[i].samples[k]`)."""
    return [
        [
            Sample(
                [int(t) for t in s["token_ids"]],
                s.get("text", ""),
                s.get("finish_reason") or "length",
                s.get("logprobs"),
                s.get("stop_reason") or None,
            )
            for s in r["samples"]
        ]
        for r in res["results"]
    ]


class TokenizedSampler:
    """The text side of a sampler over a Hugging Face-style tokenizer; generation is the
    subclass's `_generate` (a generate body -> the server's generate result)."""

    model_id: str
    max_model_len: int

    def __init__(self, model_id: str, tokenizer: Any, max_model_len: int = 0) -> None:
        self.model_id = model_id
        self.tok = tokenizer
        self.max_model_len = max_model_len

    @property
    def vocab_size(self) -> int:
        """Token ids are in [0, vocab_size) (added tokens included); 0 = unknown."""
        try:
            return len(self.tok)
        except TypeError:
            return 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(t) for t in self.tok.encode(text, add_special_tokens=add_special_tokens)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=True))

    def token_text(self, token_id: int) -> str:
        return str(self.tok.decode([token_id], skip_special_tokens=False))

    def decode_special(self, ids: Sequence[int]) -> str:
        """`ids` decoded with their special tokens (what a tool parser reads)."""
        return str(self.tok.decode(list(ids), skip_special_tokens=False))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool,
        tools: Any = None,
        **template_kwargs: Any,
    ) -> str:
        if not getattr(self.tok, "chat_template", None):
            raise NoChatTemplateError(self.model_id)
        msgs = template_messages(messages)
        kw: dict[str, Any] = dict(template_kwargs)
        if tools:
            kw["tools"] = tools
        try:
            return str(
                self.tok.apply_chat_template(
                    msgs, tokenize=False, add_generation_prompt=add_generation_prompt, **kw
                )
            )
        except Exception as exc:
            raise OpenAIError(
                400,
                f"the chat template failed on these messages: {exc}",
                param="messages",
                code="chat_template_error",
            ) from None

    async def _generate(
        self, prompts: Sequence[Sequence[int]], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        raise NotImplementedError

    async def _stream_step(
        self, prompts: Sequence[Sequence[int]], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        """One generate of a continuation stream (run under the stream's sampling slot)."""
        return await self._generate(prompts, params)

    def admit(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    async def open_stream(
        self,
        prompt: Sequence[int],
        params: Mapping[str, Any],
        index: int = 0,
    ) -> AsyncIterator[StreamEvent]:
        raise NotImplementedError

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: Mapping[str, Any],
    ) -> tuple[list[list[Sample]], int]:
        res = await self._generate(prompts, params)
        return samples_of(res), int(res.get("weight_version") or 0)


class ServicerSampler(TokenizedSampler):
    """A sampler over a server's protocol core, as the caller's token: a generate is an
    arctic.v1 `generate` call of the core in this process (`protocol/inproc.py`: auth, the
    input limits, the job, the field rules, the servicer's `check_request`, the job's sampling
    bound and per-token limits, the request record and metrics). A streamed sample is not an
    arctic.v1 request: the core admits it (`CoreCalls.checked`, the same checks) and the
    servicer's `generate_stream` runs it, token by token where the worker streams
    (`token_streaming`), else `continuation_stream` (each step admitted the same way), under
    the sampling slot the route holds (`admit`)."""

    chunk_tokens = 4  # tokens a step of a continuation stream

    def __init__(
        self,
        calls: CoreCalls,
        job_id: str,
        sub: Any,
        token: str | None,
        tokenizer: Any,
        max_model_len: int = 0,
        *,
        sub_job_id: str | None = None,
    ) -> None:
        super().__init__(job_id, tokenizer, max_model_len)
        self.calls = calls
        self.servicer: Any = calls.core.servicer
        self.job_id = job_id
        self.sub = sub
        self.token = token
        self.sub_job_id = sub_job_id  # named in the call (the gateway's), else the job's

    def admit(self) -> AbstractContextManager[None]:
        """A slot of the server's bound on the job's queued sampling requests
        (`protocol/sampling_queue`), the one the core's `generate` calls count against."""
        return self.calls.core.sampling.hold(self.job_id)

    async def _generate(
        self, prompts: Sequence[Sequence[int]], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        body = {"prompts": [list(map(int, p)) for p in prompts], "sampling_params": dict(params)}
        res = await self.calls.call(
            M.GENERATE, self.token, body, job_id=self.job_id, sub_job_id=self.sub_job_id
        )
        return dict(res)

    async def _checked(self, body: Mapping[str, Any]) -> CallContext:
        ctx, _ = await self.calls.checked(
            M.GENERATE, self.token, body, job_id=self.job_id, sub_job_id=self.sub_job_id
        )
        return ctx

    async def _stream_step(
        self, prompts: Sequence[Sequence[int]], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        """One generate of a stream, under the stream's slot: admitted by the core, run by the
        servicer (not a request of its own, so not counted twice against the bound)."""
        body = {"prompts": [list(map(int, p)) for p in prompts], "sampling_params": dict(params)}
        ctx = await self._checked(body)
        res = dict(await self.servicer.generate(ctx, body))
        self.calls.core.metrics.sampled(self.job_id, res)  # off the request path: counted here
        return res

    @property
    def token_streaming(self) -> bool:
        """The sampling worker streams token by token (`generate_stream`)."""
        return True

    async def open_stream(
        self,
        prompt: Sequence[int],
        params: Mapping[str, Any],
        index: int = 0,
    ) -> AsyncIterator[StreamEvent]:
        """The stream admitted by the core now (its checks, before the route sends anything),
        then run: token by token, or by continuation (each step a generate admitted the same
        way)."""
        body = stream_body(prompt, params, index)
        ctx = await self._checked(body)
        if not self.token_streaming:
            return continuation_stream(self, prompt, params, index, chunk_tokens=self.chunk_tokens)
        return self._token_stream(ctx, body)

    async def _token_stream(
        self, ctx: CallContext, body: Mapping[str, Any]
    ) -> AsyncIterator[StreamEvent]:
        metrics = self.calls.core.metrics
        async for ev in stream_events(self.servicer.generate_stream(ctx, body)):
            if ev.token_ids:
                metrics.job(self.job_id).tokens_sampled += len(ev.token_ids)
            yield ev


def stream_body(prompt: Sequence[int], params: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The generate body of a streamed sample (one sample; the `index`-th of a request gets its
    own seed, so the n samples of a seeded request differ)."""
    sp = {**params, "n": 1}
    if index and params.get("seed") is not None:
        sp["seed"] = int(params["seed"]) + SEED_STRIDE * index
    return {"prompts": [[int(t) for t in prompt]], "sampling_params": sp}


async def stream_events(items: AsyncIterator[Mapping[str, Any]]) -> AsyncIterator[StreamEvent]:
    """A worker's stream messages (new `token_ids`, `logprobs`, `text` delta, `at`,
    `weight_version`; the last has `finished`) as `StreamEvent`s carrying the whole text so far."""
    text = ""
    async for item in items:
        text += str(item.get("text") or "")
        version = item.get("weight_version")
        ev = StreamEvent(
            [int(t) for t in item.get("token_ids") or []],
            item.get("logprobs"),
            text,
            float(item.get("at") or 0.0),
            weight_version=int(version) if version is not None else None,
        )
        if item.get("finished"):
            ev.finished = True
            ev.finish_reason = str(item.get("finish_reason") or "length")
            ev.stop_reason = item.get("stop_reason")
        yield ev


async def continuation_stream(
    sampler: TokenizedSampler,
    prompt: Sequence[int],
    params: Mapping[str, Any],
    index: int = 0,
    *,
    chunk_tokens: int = 4,
) -> AsyncIterator[StreamEvent]:
    """One sample streamed `chunk_tokens` at a time through whole-reply generates."""
    max_tokens = token_budget.budget(
        token_budget.requested(params.get("max_tokens")), len(prompt), sampler.max_model_len
    ).max_tokens
    chunk_tokens = max(1, chunk_tokens)
    if any(params.get(k) for k in NOT_INCREMENTAL):
        whole = await sampler._stream_step([prompt], {**params, "n": 1})
        s, whole_version = samples_of(whole)[0][0], int(whole.get("weight_version") or 0)
        yield StreamEvent(
            s.token_ids,
            s.logprobs,
            s.text,
            time.time(),
            True,
            s.finish_reason,
            s.stop_reason,
            weight_version=whole_version,
        )
        return
    stops = list(params.get("stop") or [])
    base = {k: v for k, v in params.items() if k not in ("stop", "n", "max_tokens")}
    seed = params.get("seed")
    ids: list[int] = []
    step = 0
    while True:
        want = min(chunk_tokens, max_tokens - len(ids))
        chunk_params = {**base, "max_tokens": want, "n": 1}
        if seed is not None:
            chunk_params["seed"] = int(seed) + SEED_STRIDE * index + step
        res = await sampler._stream_step([list(prompt) + ids], chunk_params)
        s = res["results"][0]["samples"][0]
        new = [int(t) for t in s["token_ids"]]
        ids += new
        step += 1
        text, hit = cut_at_stop(sampler.decode(ids), stops)
        reason = s.get("finish_reason") or "length"
        done = hit is not None or reason != "length" or len(ids) >= max_tokens or not new
        got = res.get("weight_version")
        ev = StreamEvent(new, s.get("logprobs"), text, time.time())
        ev.weight_version = int(got) if got is not None else None
        if done:
            ev.finished = True
            ev.finish_reason = "stop" if hit is not None or reason == "stop" else reason
            ev.stop_reason = hit if hit is not None else s.get("stop_reason") or None
        yield ev
        if done:
            return
        await asyncio.sleep(0)
