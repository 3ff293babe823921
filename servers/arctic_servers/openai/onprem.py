"""The on-prem server's sampling sub-jobs behind the OpenAI-compatible routes.

Model ids: a running job with a sampling sub-job is served as the model `{job_id}`; its sub-job
id and its `model_name` (the newest running job of that name) resolve to it too. Jobs are
visible only to the token that created them. Generation goes through the servicer's own
`generate` (so a weight sync in progress pauses new requests, and `weight_version` is exact);
the tokenizer and chat template are the model directory's (`transformers.AutoTokenizer`,
loaded once per model in the server process).

Streaming: the sampler worker answers one reply per command, so a stream is produced by
continuation: each step asks the worker for up to `chunk_tokens` more tokens of the same sample
(prompt + tokens so far; the prefix cache makes the re-read cheap) and sends them at once.
Stop strings are applied on the whole text; the EOS / stop tokens end the stream. Penalties and
`min_tokens` depend on the whole completion, which a continuation would reset, so such requests
are generated in one call and then streamed (not incremental). True token-by-token streaming
needs a streaming reply on the worker pipe (a `generate_stream` op answering one message per
step of vLLM's engine).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from arctic_sdk._generated import methods as M

from ..protocol.context import CallContext
from .sampler import ModelCard, NoChatTemplateError, OpenAIError, Sample, StreamEvent, cut_at_stop

__all__ = ["OnpremResolver", "OnpremSampler"]

NOT_INCREMENTAL = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens")
_TOKENIZERS: dict[Path, Any] = {}


def _load_tokenizer(model_dir: Path) -> Any:
    tok = _TOKENIZERS.get(model_dir)
    if tok is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        _TOKENIZERS[model_dir] = tok
    return tok


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))


class OnpremSampler:
    def __init__(
        self,
        servicer: Any,
        job_id: str,
        sub: Any,
        token: str | None,
        tokenizer: Any,
        *,
        chunk_tokens: int = 4,
    ) -> None:
        self.servicer = servicer
        self.job_id = job_id
        self.sub = sub
        self.token = token
        self.tok = tokenizer
        self.model_id = job_id
        self.chunk_tokens = max(1, chunk_tokens)
        info = sub.worker.info if sub.worker is not None else {}
        self.max_model_len = int(info.get("max_model_len") or 0)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tok.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=True))

    def token_text(self, token_id: int) -> str:
        return str(self.tok.decode([token_id], skip_special_tokens=False))

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
        msgs = [{**m, "content": _text(m.get("content"))} for m in messages]
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
        self,
        prompts: Sequence[Sequence[int]],
        params: Mapping[str, Any],
    ) -> dict[str, Any]:
        ctx = CallContext(method=M.GENERATE, job_id=self.job_id, token=self.token)
        body = {"prompts": [list(map(int, p)) for p in prompts], "sampling_params": dict(params)}
        self.servicer.check_request(ctx, body)
        return dict(await self.servicer.generate(ctx, body))

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: Mapping[str, Any],
    ) -> tuple[list[list[Sample]], int]:
        res = await self._generate(prompts, params)
        out = [
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
        return out, int(res.get("weight_version") or 0)

    async def stream(
        self,
        prompt: Sequence[int],
        params: Mapping[str, Any],
        index: int = 0,
    ) -> AsyncIterator[StreamEvent]:
        max_tokens = int(params.get("max_tokens") or 16)
        if any(params.get(k) for k in NOT_INCREMENTAL):
            samples, _ = await self.generate([prompt], {**params, "n": 1})
            s = samples[0][0]
            yield StreamEvent(
                s.token_ids, s.logprobs, s.text, time.time(), True, s.finish_reason, s.stop_reason
            )
            return
        stops = list(params.get("stop") or [])
        base = {k: v for k, v in params.items() if k not in ("stop", "n", "max_tokens")}
        seed = params.get("seed")
        ids: list[int] = []
        step = 0
        while True:
            want = min(self.chunk_tokens, max_tokens - len(ids))
            chunk_params = {**base, "max_tokens": want, "n": 1}
            if seed is not None:
                chunk_params["seed"] = int(seed) + 1_000_003 * index + step
            res = await self._generate([list(prompt) + ids], chunk_params)
            s = res["results"][0]["samples"][0]
            new = [int(t) for t in s["token_ids"]]
            ids += new
            step += 1
            text, hit = cut_at_stop(self.decode(ids), stops)
            reason = s.get("finish_reason") or "length"
            done = hit is not None or reason != "length" or len(ids) >= max_tokens or not new
            ev = StreamEvent(new, s.get("logprobs"), text, time.time())
            if done:
                ev.finished = True
                ev.finish_reason = "stop" if hit is not None or reason == "stop" else reason
                ev.stop_reason = hit if hit is not None else s.get("stop_reason") or None
            yield ev
            if done:
                return
            await asyncio.sleep(0)


class OnpremResolver:
    """Models = running jobs with a sampling sub-job, visible to the caller's token."""

    def __init__(self, servicer: Any, *, chunk_tokens: int = 4) -> None:
        self.servicer = servicer
        self.chunk_tokens = chunk_tokens

    def _owner(self, token: str | None) -> str | None:
        return token if getattr(self.servicer, "auth", False) else None

    def _jobs(self, token: str | None) -> list[tuple[Any, Any]]:
        owner = self._owner(token)
        out = []
        for job in list(self.servicer.jobs.jobs.values()):
            if job.state != "running" or (job.owner is not None and job.owner != owner):
                continue
            sub = job.sub_job("sampling")
            if sub is not None and sub.worker is not None and sub.model_dir is not None:
                out.append((job, sub))
        return out

    async def models(self, token: str | None) -> list[ModelCard]:
        cards = []
        for job, sub in self._jobs(token):
            info = sub.worker.info if sub.worker is not None else {}
            cards.append(
                ModelCard(
                    job.job_id,
                    int(job.created_at),
                    root=sub.spec.model_name or str(sub.model_dir),
                    max_model_len=int(info.get("max_model_len") or 0),
                )
            )
        return cards

    async def sampler(self, model: str, token: str | None) -> OnpremSampler:
        jobs = self._jobs(token)
        match = [(j, s) for j, s in jobs if model in (j.job_id, s.sub_job_id)]
        if not match:
            named = [
                (j, s) for j, s in jobs if model and model in (s.spec.model_name, str(s.model_dir))
            ]
            match = sorted(named, key=lambda js: js[0].created_at)[-1:]
        if not match:
            raise OpenAIError(
                404,
                f"the model {model!r} does not exist: no running job with a "
                f"sampling sub-job answers to it (available: "
                f"{[j.job_id for j, _ in jobs]})",
                param="model",
                code="model_not_found",
            )
        job, sub = match[0]
        tok = await asyncio.to_thread(_load_tokenizer, Path(sub.model_dir))
        return OnpremSampler(
            self.servicer, job.job_id, sub, token, tok, chunk_tokens=self.chunk_tokens
        )


def install(app: Any, servicer: Any, tokens: Any = ()) -> None:
    """Mount the OpenAI-compatible routes of an on-prem server's sampling sub-jobs on `app`."""
    from .routes import add_openai_routes

    add_openai_routes(app, OnpremResolver(servicer), tokens=tokens)
