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
from arctic_servers.openai.job_models import JobResolver
from arctic_servers.openai.routes import add_openai_routes
from arctic_servers.openai.tokenized import FakeTokenizer, ServicerSampler
from arctic_servers.protocol.core import ProtocolCore
from arctic_servers.protocol.inproc import CoreCalls

__all__ = ["FakeJobResolver", "FakeJobSampler", "install"]


class FakeJobSampler(ServicerSampler):
    """A fake job's sampling sub-job, called as the caller's token."""

    @property
    def token_streaming(self) -> bool:
        return False  # the fake engine answers whole replies: streams go by continuation


class FakeJobResolver(JobResolver):
    """Models = the caller's running jobs with a sampling sub-job (`job_models.py`)."""

    def _max_len(self, sub: Any) -> int:
        return fake_sampling.context_length(int(sub.max_seq_len or 0))

    async def sampler(self, model: str, token: str | None) -> FakeJobSampler:
        job, sub = self._match(model, token)
        return FakeJobSampler(
            self.calls, job.job_id, sub, token, FakeTokenizer(), self._max_len(sub)
        )


def install(app: web.Application, core: ProtocolCore) -> None:
    """Mount `/v1/...`, `/tokenize`, `/detokenize` over the fake's jobs on `app`, served by
    its protocol core in process (callers authenticated by the core's rule)."""
    calls = CoreCalls(core)
    add_openai_routes(app, FakeJobResolver(calls), authenticate=calls.authenticate)
