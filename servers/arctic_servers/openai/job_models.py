"""Which model ids a caller of the OpenAI routes may use: one rule for the three servers.

A running job with a sampling sub-job is served as the model `{job_id}`; its sub-job id and its
model's names (the newest running job of that name) resolve to it too. A job is visible only to
the token that created it: another token's job answers 404 `model_not_found`, as if it did not
exist. Each server says which of its sub-jobs can sample now, their context length, their names
and how to build the sampler (`JobResolver`'s hooks); calls go to its protocol core in process.
"""

from __future__ import annotations

from typing import Any

from ..protocol.inproc import CoreCalls
from .sampler import ModelCard, OpenAIError

__all__ = ["JobResolver"]


class JobResolver:
    """Models = the caller's running jobs with a sampling sub-job that can sample now."""

    def __init__(self, calls: CoreCalls) -> None:
        self.calls = calls
        self.servicer: Any = calls.core.servicer

    # ------------------------------------------------------------------ a server's hooks

    def _owner(self, token: str | None) -> str | None:
        """The owner a job of this caller records (None on a server without tokens)."""
        return token if getattr(self.servicer, "auth", False) else None

    def _serves(self, sub: Any) -> bool:
        """The sampling sub-job can sample now (its worker is up)."""
        return True

    def _max_len(self, sub: Any) -> int:
        raise NotImplementedError

    def _names(self, sub: Any) -> list[str]:
        """The names the sub-job's model answers to besides the ids (the first is its root)."""
        return [str(sub.model_name)] if sub.model_name else []

    # ------------------------------------------------------------------ the rule

    def _jobs(self, token: str | None) -> list[tuple[Any, Any]]:
        owner = self._owner(token)
        out = []
        for job in list(self.servicer.jobs.jobs.values()):
            if job.state != "running" or (job.owner is not None and job.owner != owner):
                continue
            sub = job.sub_job("sampling")
            if sub is not None and self._serves(sub):
                out.append((job, sub))
        return out

    async def models(self, token: str | None) -> list[ModelCard]:
        return [
            ModelCard(
                job.job_id,
                int(job.created_at),
                root=(self._names(sub) or [job.job_id])[0],
                max_model_len=self._max_len(sub),
            )
            for job, sub in self._jobs(token)
        ]

    def _match(self, model: str, token: str | None) -> tuple[Any, Any]:
        """The (job, sampling sub-job) `model` names, or 404 `model_not_found`."""
        jobs = self._jobs(token)
        match = [(j, s) for j, s in jobs if model in (j.job_id, s.sub_job_id)]
        if not match:
            named = [(j, s) for j, s in jobs if model and model in self._names(s)]
            match = sorted(named, key=lambda js: js[0].created_at)[-1:]
        if not match:
            raise OpenAIError(
                404,
                f"the model {model!r} does not exist: no running job with a sampling sub-job "
                f"visible to this caller answers to it (available: {[j.job_id for j, _ in jobs]})",
                param="model",
                code="model_not_found",
            )
        return match[0]
