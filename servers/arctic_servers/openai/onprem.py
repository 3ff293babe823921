"""The on-prem server's sampling sub-jobs behind the OpenAI-compatible routes.

Model ids (`job_models.py`): a running job with a sampling sub-job is served as the model
`{job_id}`; its sub-job id, its `model_name` and its model directory (the newest running job of that
name) resolve to it too. Jobs are visible only to the token that created them. Generation is an
arctic.v1 `generate` call of the server's protocol core in this process (`protocol/inproc.py`: the
core's auth, field rules, per-op checks, limits and request record; a weight sync in progress pauses
new requests, and `weight_version` is exact); the tokenizer and chat template are the model
directory's (`transformers.AutoTokenizer`, loaded once per model in the server process).

Streaming is token by token: the core admits the sample (`CoreCalls.checked`: the same checks,
no request record; arctic.v1 has no streaming op) and `OnpremSampler.open_stream` iterates over the
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
from .job_models import JobResolver
from .tokenized import ServicerSampler, load_tokenizer

__all__ = ["OnpremResolver", "OnpremSampler"]


class OnpremSampler(ServicerSampler):
    """A sampling sub-job of the on-prem server (its job's: the call names no sub-job)."""


class OnpremResolver(JobResolver):
    """Models = running jobs with a sampling sub-job whose worker is up (`job_models.py`)."""

    def _serves(self, sub: Any) -> bool:
        return sub.worker is not None and sub.model_dir is not None

    def _max_len(self, sub: Any) -> int:
        info = sub.worker.info if sub.worker is not None else {}
        return int(info.get("max_model_len") or 0)

    def _names(self, sub: Any) -> list[str]:
        return [n for n in (sub.spec.model_name, str(sub.model_dir)) if n]

    async def sampler(self, model: str, token: str | None) -> OnpremSampler:
        job, sub = self._match(model, token)
        tok = await asyncio.to_thread(load_tokenizer, Path(sub.model_dir))
        return OnpremSampler(self.calls, job.job_id, sub, token, tok, self._max_len(sub))


def install(app: Any, core: ProtocolCore, tools: Any = None) -> None:
    """Mount the OpenAI-compatible routes of an on-prem server's sampling sub-jobs on `app`,
    served by its protocol core in this process (its auth: the server's tokens; `tools`: the
    server's `tool_calls.ToolSettings`)."""
    from .routes import add_openai_routes

    calls = CoreCalls(core)
    add_openai_routes(app, OnpremResolver(calls), authenticate=calls.authenticate, tools=tools)
