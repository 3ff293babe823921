"""A LoRA pool's sampler: one vLLM engine holding the base weights once, every tenant's adapter
versions served in its one continuous batch (vLLM multi-LoRA: a `LoRARequest` per request).

Each tenant (a pooled job, PROTOCOL.md §3.6) has its own adapter versions (`lora_sampler.
LoraAdapters`, with `lora_int_id`s unique in the pool) and its own `weight_version`; its
`generate` / stream / scoring requests join the engine's batch with its current version (or no
adapter: `adapter: "base"`), beside every other tenant's, as they arrive. A tenant's sync
(`load_weights`) registers its new version between two engine steps without waiting for the
batch to drain (`runs_while_busy`): the requests already in the engine keep the version they
started with, which stays registered until none of them is left (`LoraAdapters.retire`), so one
tenant's sync neither pauses nor changes another tenant's sampling. It does not reset the prefix
cache: vLLM keys cached blocks by adapter, so a new version never reuses an old one's KV.

vLLM's Qwen2 model declares no embedding modules for LoRA (its Llama and Qwen3 declare
`embed_tokens` and `lm_head`): the pool declares them the same way (`serve_embedding_adapters`),
so an adapter on the embedding or the lm_head (Tinker's default `train_unembed`) is served as an
adapter, not merged into full weights (ENGINE_NOTES.md §8). `attach` / `detach` add and remove a
tenant; `detach` aborts its requests still in the engine and unregisters its versions.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from arctic_sdk.spec.tables import methods as M

from ...rules.lora_config import vllm_max_rank
from ..errors import WorkerError
from ..worker.commands import Command
from ..worker.engine_base import WEIGHT_GROUP_CMDS, no_weight_group, tenant_in
from ..worker.messages import ATTACH_CMD, DETACH_CMD, POOL_STATS_CMD, TENANT_ARG
from . import lora_sampler
from .lora_sampler import EMBEDDING_ENV, serve_embedding_adapters
from .sampling import SamplingEngine

POOL_REASON = "a LoRA pool's sampler is shared with other jobs: it is not put to sleep for one"


@dataclass
class PoolTenant:
    name: str
    adapters: lora_sampler.LoraAdapters
    weight_version: int = 0


class LoraPoolSampler(SamplingEngine):
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.pool = dict(spec.get("pool") or {})
        self.max_adapters = int(self.pool.get("max_adapters") or 1)
        self.max_rank = vllm_max_rank(int(self.pool.get("max_rank") or 64))
        self.embeddings = bool(self.pool.get("embeddings", True))
        if self.embeddings:
            os.environ[EMBEDDING_ENV] = "1"
            serve_embedding_adapters()
        self.tenants: dict[str, PoolTenant] = {}
        self._ids = itertools.count(1)  # lora_int_id of every tenant's versions
        self._owner: dict[int, str] = {}  # batched message id -> its tenant
        self._aborted: list[dict[str, Any]] = []  # messages of a detached tenant's requests
        super().__init__({k: v for k, v in spec.items() if k != "lora"})

    def _lora_engine_args(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "enable_lora": True,
            "max_lora_rank": self.max_rank,
            "max_loras": self.max_adapters,  # every tenant's current version in one batch
            "max_cpu_loras": 2 * self.max_adapters + 2,  # and the versions being replaced
        }

    def info(self) -> dict[str, Any]:
        return {
            **super().info(),
            "pool": True,
            "max_adapters": self.max_adapters,
            "max_lora_rank": self.max_rank,
            "embedding_adapters": self.embeddings,
            "adapters": len(self.tenants),
        }

    # -- tenants -----------------------------------------------------------------------------

    def op_attach(self, tenant: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """A job joins: an adapter slot, no version yet (its requests run on the base model,
        which is what its trainer's fresh adapter computes: B = 0)."""
        if tenant not in self.tenants:
            if len(self.tenants) >= self.max_adapters:
                raise WorkerError(
                    "rate_limited",
                    f"the LoRA pool holds {len(self.tenants)} adapters, its limit",
                    limit=self.max_adapters,
                    retry_after_s=30,
                )
            lora = dict(spec.get("lora") or {})
            adapters = lora_sampler.LoraAdapters(
                self.llm, lora, tenant, next_id=lambda: next(self._ids), keep_old=True
            )
            self.tenants[tenant] = PoolTenant(tenant, adapters)
        t = self.tenants[tenant]
        return {**SamplingEngine.info(self), "pooled": True, "tenant": tenant,
                "weight_version": t.weight_version}  # fmt: skip

    def op_detach(self, tenant: str) -> dict[str, Any]:
        """A job leaves: its requests still in the engine end (cancelled), its versions go."""
        t = self.tenants.pop(tenant, None)
        if t is None:
            return {"detached": False, "adapters": len(self.tenants)}
        for mid in [m for m, who in self._owner.items() if who == tenant]:
            self._aborted += self.batch.abort(mid)
            self._owner.pop(mid, None)
        t.adapters.close()
        return {"detached": True, "adapters": len(self.tenants)}

    def op_pool_stats(self) -> dict[str, Any]:
        return {
            "adapters": len(self.tenants),
            "peak_adapters": self.batch.peak_adapters,
            "tenants": {
                n: {"weight_version": t.weight_version, "adapter_version": t.adapters.version}
                for n, t in self.tenants.items()
            },
        }

    def tenant(self, name: str) -> PoolTenant:
        return tenant_in(self.tenants, name, "sampler")

    @contextlib.contextmanager
    def _as(self, t: PoolTenant) -> Iterator[None]:
        """The sampler's per-job state (`adapters`, `weight_version`) is tenant `t`'s."""
        self.adapters, self.weight_version = t.adapters, t.weight_version
        try:
            yield
        finally:
            t.weight_version = self.weight_version
            self.adapters, self.weight_version = None, 0

    # -- the continuous batch: every tenant's requests ---------------------------------------

    def submit(self, msg_id: int, cmd: str, args: Mapping[str, Any]) -> dict[str, Any] | None:
        rest = dict(args)
        t = self.tenant(str(rest.pop(TENANT_ARG, "") or ""))
        with self._as(t):
            done = super().submit(msg_id, cmd, rest)
        if done is None:
            self._owner[msg_id] = t.name
        return done

    def busy(self) -> bool:
        return bool(self._aborted) or super().busy()

    def pump(self, send: Callable[[dict[str, Any]], None]) -> None:
        out, self._aborted = self._aborted, []
        for msg in out:
            send(msg)
        if self.batch.busy():
            super().pump(lambda m: self._sent(m, send))
        in_use = self.batch.loras_in_use()
        for t in self.tenants.values():
            if t.adapters.retired:
                t.adapters.retire(in_use)

    def _sent(self, msg: dict[str, Any], send: Callable[[dict[str, Any]], None]) -> None:
        if "partial" not in msg:
            self._owner.pop(int(msg.get("id") or 0), None)
        send(msg)

    def abort(self, msg_id: int) -> list[dict[str, Any]]:
        self._owner.pop(int(msg_id), None)
        return super().abort(msg_id)

    def runs_while_busy(self, cmd: str) -> bool:
        return True  # adapter loads, attach / detach: between two engine steps

    # -- commands ----------------------------------------------------------------------------

    def commands(self) -> dict[str, Command]:
        return {
            ATTACH_CMD: self.op_attach,
            DETACH_CMD: self.op_detach,
            POOL_STATS_CMD: self.op_pool_stats,
            "stream_stats": self.op_stream_stats,
            "load_weights": self.op_tenant_load_weights,
            M.RESET_PREFIX_CACHE.python_name: self.op_tenant_reset_prefix_cache,
            "sleep": self.op_tenant_lifecycle,
            "wake": self.op_tenant_lifecycle,
            # its tenants sync by file or blob (serving/lora_sync.py)
            **{cmd: no_weight_group("sampler") for cmd in WEIGHT_GROUP_CMDS},
        }

    def op_tenant_load_weights(
        self,
        tenant: str = "",
        path: str | None = None,
        blob: bytes | None = None,
        weight_version: int | None = None,
        adapter_config: Mapping[str, Any] | None = None,
        method: str = "shm",
        **_: Any,
    ) -> dict[str, Any]:
        """A new adapter version of `tenant` (its sync, or a LoRA checkpoint loaded): from a file
        or a blob (a weight group's receive would hold every tenant's batch: lora_sync.py)."""
        t = self.tenant(tenant)
        if method in ("collective", "nccl"):
            no_weight_group("sampler")()
        if adapter_config is None:
            raise WorkerError(
                "invalid_argument",
                "a pooled LoRA job's sampler loads its adapter only (PROTOCOL.md §3.6)",
            )
        res = t.adapters.load(adapter_config, path, blob)
        if weight_version is not None:
            t.weight_version = int(weight_version)
        return {
            "num_tensors": res["n"],
            "seconds": res["seconds"],
            "reset": False,  # a new adapter version never reuses an old one's cached KV
            "adapter_version": res["adapter_version"],
        }

    def op_tenant_reset_prefix_cache(self, tenant: str = "") -> dict[str, Any]:
        self.tenant(tenant)
        return {"reset": bool(self.llm.reset_prefix_cache())}

    def op_tenant_lifecycle(self, tenant: str = "", **_: Any) -> dict[str, Any]:
        self.tenant(tenant)
        return {"applied": False, "reason": POOL_REASON}

    def stats(self) -> dict[str, Any]:
        return self.op_pool_stats()

    def close(self) -> None:
        self.batch.abort_all()
        for t in self.tenants.values():
            t.adapters.close()
        self.tenants.clear()
