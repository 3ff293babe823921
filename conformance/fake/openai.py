"""The fake gateway's sampling sub-jobs behind the OpenAI-compatible routes
(`servers/OPENAI.md`), so that the conformance suite's `openai/*` cases have a reference server.

Model ids: a running job with a sampling sub-job is served as the model `{job_id}` (its sub-job
id and its `model_name`, the caller's newest running job of that name, resolve to it too); a job
is visible only to the token that created it. Generation is an arctic.v1 `generate` call of the
fake's protocol core in process (`protocol/inproc.py`) as the caller's token, so the OpenAI
routes sample exactly what the protocol's `generate` samples (`engines/fake/NUMERICS.md`) under
the same auth, field rules, checks, job state, visibility and `weight_version`. The tokenizer is
the fake engine's byte-level one with the tiny model's Qwen-style template. Fake engines answer
whole replies: streams go by continuation (`tokenized.continuation_stream`), as the gateway's fake
workers do.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from arctic_servers.engines.fake import sampling as fake_sampling
from arctic_servers.openai.routes import add_openai_routes
from arctic_servers.openai.sampler import ModelCard, OpenAIError
from arctic_servers.openai.tokenized import FakeTokenizer, ServicerSampler
from arctic_servers.protocol.core import ProtocolCore
from arctic_servers.protocol.inproc import CoreCalls

__all__ = ["FakeJobResolver", "FakeJobSampler", "install"]


class FakeJobSampler(ServicerSampler):
    """A fake job's sampling sub-job, called as the caller's token."""

    @property
    def token_streaming(self) -> bool:
        return False  # the fake engine answers whole replies: streams go by continuation


class FakeJobResolver:
    """Models = the caller's running jobs with a sampling sub-job."""

    def __init__(self, calls: CoreCalls) -> None:
        self.calls = calls
        self.servicer: Any = calls.core.servicer

    def _jobs(self, token: str | None) -> list[tuple[Any, Any]]:
        owner = token if self.servicer.auth else None
        out = []
        for job in list(self.servicer.jobs.jobs.values()):
            if job.state != "running" or (job.owner is not None and job.owner != owner):
                continue
            sub = job.sub_job("sampling")
            if sub is not None:
                out.append((job, sub))
        return out

    @staticmethod
    def _max_len(sub: Any) -> int:
        return fake_sampling.context_length(int(sub.max_seq_len or 0))

    async def models(self, token: str | None) -> list[ModelCard]:
        return [
            ModelCard(
                job.job_id,
                int(job.created_at),
                root=sub.model_name or job.job_id,
                max_model_len=self._max_len(sub),
            )
            for job, sub in self._jobs(token)
        ]

    async def sampler(self, model: str, token: str | None) -> FakeJobSampler:
        jobs = self._jobs(token)
        match = [(j, s) for j, s in jobs if model in (j.job_id, s.sub_job_id)]
        if not match:
            named = [(j, s) for j, s in jobs if model and model == s.model_name]
            match = sorted(named, key=lambda js: js[0].created_at)[-1:]
        if not match:
            raise OpenAIError(
                404,
                f"the model {model!r} does not exist: none of this token's running jobs with a "
                f"sampling sub-job answers to it (available: {[j.job_id for j, _ in jobs]})",
                param="model",
                code="model_not_found",
            )
        job, sub = match[0]
        return FakeJobSampler(
            self.calls, job.job_id, sub, token, FakeTokenizer(), self._max_len(sub)
        )


def install(app: web.Application, core: ProtocolCore) -> None:
    """Mount `/v1/...`, `/tokenize`, `/detokenize` over the fake's jobs on `app`, served by
    its protocol core in process (callers authenticated by the core's rule)."""
    calls = CoreCalls(core)
    add_openai_routes(app, FakeJobResolver(calls), authenticate=calls.authenticate)
