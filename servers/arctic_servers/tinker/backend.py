"""The protocol side of the Tinker surface: our own ops, called through `arctic_sdk.AsyncClient`
on the server's own protocol endpoint, with the caller's token.

So a Tinker call is served by the same jobs, engines and protocol core (auth, validation,
sequencing, the per-loss field rules) as a native call — on the on-prem server, the gateway or
the fake gateway alike; nothing of the protocol is re-implemented here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, cast

from arctic_sdk import AsyncClient, CallOptions

__all__ = ["Backend"]


class Backend:
    """Protocol calls for one server; `url()` answers its protocol base URL (known once the
    listener is bound)."""

    def __init__(self, url: Callable[[], str]) -> None:
        self._url = url
        self._clients: dict[str | None, AsyncClient] = {}

    def client(self, token: str | None) -> AsyncClient:
        c = self._clients.get(token)
        if c is None:
            c = AsyncClient(self._url(), token=token or "tinker-anonymous", timeout=600)
            self._clients[token] = c
        return c

    async def create_job(
        self, token: str | None, body: Mapping[str, Any], key: str | None = None
    ) -> str:
        """Create the job and wait for it to run; `key` its Idempotency-Key (a resent create
        answers the same job)."""
        c = self.client(token)
        res = await c.create_job(cast(Any, dict(body)), options=CallOptions(idempotency_key=key))
        job_id = str(res["job_id"])
        for _ in range(3600):
            job = (await c.get_job(job_id=job_id))["job"]
            state = str(job.get("state", "")).lower()
            if state.endswith("running"):
                return job_id
            if any(state.endswith(s) for s in ("failed", "cancelled", "terminated")):
                raise RuntimeError(f"job {job_id} is {state}: {job.get('reason', '')}")
            await asyncio.sleep(0.2)
        raise TimeoutError(f"job {job_id} did not start")

    async def forward_backward(
        self, token: str | None, job_id: str, body: Mapping[str, Any], *, forward_only: bool
    ) -> Any:
        c = self.client(token)
        if forward_only:
            return await c.forward(cast(Any, dict(body)), job_id=job_id)
        return await c.forward_backward(cast(Any, dict(body)), job_id=job_id)

    async def step(
        self,
        token: str | None,
        job_id: str,
        lr: float,
        adam: Mapping[str, float] | None = None,
        key: str | None = None,
    ) -> Any:
        return await self.client(token).step(
            learning_rate=lr,
            adam=cast(Any, dict(adam)) if adam else None,
            job_id=job_id,
            options=CallOptions(idempotency_key=key),
        )

    async def sync(self, token: str | None, job_id: str) -> int:
        res = await self.client(token).sync_weights(job_id=job_id)
        return int(res.get("weight_version") or 0)

    async def save(self, token: str | None, job_id: str, checkpoint_id: str) -> Any:
        return await self.client(token).save_checkpoint(
            checkpoint_id=checkpoint_id, checkpoint_type="resumable", job_id=job_id
        )

    async def load(
        self, token: str | None, job_id: str, checkpoint_id: str, source_job_id: str
    ) -> Any:
        kw: dict[str, Any] = {"checkpoint_id": checkpoint_id, "job_id": job_id}
        if source_job_id != job_id:
            kw["source_job_id"] = source_job_id
        return await self.client(token).load_checkpoint(**kw)

    async def generate(
        self, token: str | None, job_id: str, prompt: list[int], params: Mapping[str, Any]
    ) -> Any:
        return await self.client(token).generate(
            prompts=[prompt],
            sampling_params=cast(Any, dict(params)),
            job_id=job_id,
        )

    async def cancel(self, token: str | None, job_id: str) -> None:
        await self.client(token).cancel_job(job_id=job_id)

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()
        self._clients.clear()
