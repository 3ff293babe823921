"""The on-prem server's sampling sub-jobs behind the OpenAI-compatible routes.

Model ids: a running job with a sampling sub-job is served as the model `{job_id}`; its sub-job
id and its `model_name` (the newest running job of that name) resolve to it too. Jobs are
visible only to the token that created them. Generation is an arctic.v1 `generate` call of the
server's protocol core in this process (`protocol/inproc.py`: the core's auth, field rules,
per-op checks, limits and request record; a weight sync in progress pauses new requests, and
`weight_version` is exact); the tokenizer and chat template are the model directory's
(`transformers.AutoTokenizer`, loaded once per model in the server process).

Streaming is token by token: the core admits the sample (`CoreCalls.checked`: the same checks,
no request record; arctic.v1 has no streaming op) and `OnpremSampler.stream` iterates over the
servicer's `generate_stream`, which runs the sampling worker's `generate_stream` command (one
vLLM request with `RequestOutputKind.DELTA`; the worker sends the new tokens of every engine
step, see `engines/vllm/sampling.py`). Every sampling parameter applies as in a whole generate
(penalties and `min_tokens` included: the engine sees the whole completion). Stop strings are
vLLM's (it holds back text that could start one). When the consumer leaves early (the HTTP
client disconnected and the route cancelled the stream), the worker aborts the request in the
engine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ..protocol.core import ProtocolCore
from ..protocol.inproc import CoreCalls
from .sampler import ModelCard, OpenAIError
from .tokenized import ServicerSampler, load_tokenizer

__all__ = ["OnpremResolver", "OnpremSampler"]


class OnpremSampler(ServicerSampler):
    """A sampling sub-job of the on-prem server (its job's: the call names no sub-job)."""


def _max_len(sub: Any) -> int:
    info = sub.worker.info if sub.worker is not None else {}
    return int(info.get("max_model_len") or 0)


class OnpremResolver:
    """Models = running jobs with a sampling sub-job, visible to the caller's token."""

    def __init__(self, calls: CoreCalls) -> None:
        self.calls = calls
        self.servicer: Any = calls.core.servicer

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
            cards.append(
                ModelCard(
                    job.job_id,
                    int(job.created_at),
                    root=sub.spec.model_name or str(sub.model_dir),
                    max_model_len=_max_len(sub),
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
        tok = await asyncio.to_thread(load_tokenizer, Path(sub.model_dir))
        return OnpremSampler(self.calls, job.job_id, sub, token, tok, _max_len(sub))


def install(app: Any, core: ProtocolCore, tools: Any = None) -> None:
    """Mount the OpenAI-compatible routes of an on-prem server's sampling sub-jobs on `app`,
    served by its protocol core in this process (its auth: the server's tokens; `tools`: the
    server's `tool_calls.ToolSettings`)."""
    from .routes import add_openai_routes

    calls = CoreCalls(core)
    add_openai_routes(app, OnpremResolver(calls), authenticate=calls.authenticate, tools=tools)
