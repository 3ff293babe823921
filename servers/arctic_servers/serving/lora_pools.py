"""LoRA pools (PROTOCOL.md §3.6): which LoRA jobs share one trainer and one sampler over one copy
of their base model, and the book of pools a server keeps — the rules the on-prem server and the
Cortex gateway share; each runs its pools' engines its own way (`onprem/lora_pools.py`,
`gateway/lora_pools.py`).

A job is *poolable* when its engines would be the pool's: one training sub-job with
`training_config.lora` whose adapter the pool's sampler serves, at most one sampling sub-job, no
reference (log-prob) sub-job, one GPU each, and no setting a shared engine cannot honour for one
job alone (`deepspeed`, `checkpoint_path`, ZeRO-3, `vllm_config`). Its *pool key* is what its
engines must share: the base model, dtype, attention, activation checkpointing, determinism and
threads of the trainer, the sampler's sequence length, threads and seed. Everything else is the
tenant's own: optimizer, learning rate and schedule, clipping, micro-batch size, the LoRA rank,
alpha, dropout and modules, the trainer's seed (its adapter's initialisation and dropout).

A server pools the base models its operator lists (`PoolPolicy.models`, "*" = any), up to
`max_adapters` jobs a pool; a poolable job past that is refused at CreateJob with `rate_limited`
(429, retryable: `details.pool`, `details.limit`, `details.adapters`, `Retry-After`). Jobs that
are not poolable, or whose model is not pooled, get their own engines as before.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ..rules.errors import ProtocolError
from ..rules.lora_config import adapter_sync

ANY_MODEL = "*"
DEFAULT_MAX_ADAPTERS = 16
DEFAULT_MAX_RANK = 64
# trainer settings the pool's engine has once for all its tenants (part of the key)
SHARED_TRAINING = ("attn_implementation", "activation_checkpointing", "full_determinism")
# trainer settings each tenant has for itself
TENANT_TRAINING = frozenset(
    {
        "optimizer",
        "lr_scheduler",
        "gradient_clipping",
        "micro_batch_size",
        "train_batch_size",
        "max_seq_len",
        "zero_stage",
        "n_gpus",
        "num_threads",
        "lora",
        *SHARED_TRAINING,
    }
)
SAMPLING_KEYS = frozenset({"max_seq_len", "n_gpus", "num_threads"})


@dataclass(frozen=True)
class PoolPolicy:
    """Which base models a server pools and how: `models` maps a model name as CreateJob names
    it ("*": any other) to the adapters one pool holds (0: not pooled)."""

    models: Mapping[str, int] = field(default_factory=dict)
    max_rank: int = DEFAULT_MAX_RANK
    idle_seconds: float = 300.0  # an empty pool's engines stay warm this long
    # the pool's sampler serves adapters on the embedding and the lm_head (vLLM's LoRA
    # embedding and logits layers), so such a job pools and syncs its adapter, not merged weights
    embeddings: bool = True
    threads: int = 0  # the pool engines' threads (0: the server's default for the role)

    def adapters_for(self, model: str, canonical: Callable[[str], str] = str.strip) -> int:
        """Adapters a pool of `model` (a canonical name) holds: its own entry's (named by any
        of its names), else "*"'s."""
        for name, n in self.models.items():
            if name != ANY_MODEL and canonical(name) == model:
                return int(n)
        return int(self.models.get(ANY_MODEL, 0))

    @property
    def enabled(self) -> bool:
        return any(int(n) > 0 for n in self.models.values())


def parse_pool_option(text: str) -> tuple[str, int]:
    """`--lora-pool MODEL[=N]`: a base model (or "*") and its adapters per pool."""
    model, _, n = text.partition("=")
    if not model:
        raise ValueError(f"--lora-pool {text!r}: name a base model (or '*')")
    try:
        adapters = int(n) if n else DEFAULT_MAX_ADAPTERS
    except ValueError:
        raise ValueError(f"--lora-pool {text!r}: {n!r} is not a number of adapters") from None
    if adapters < 0:
        raise ValueError(f"--lora-pool {text!r}: adapters must be >= 0")
    return model, adapters


class SubJobLike(Protocol):
    """What the rules read of a sub-job (the on-prem `SubJobSpec`, the gateway's `SubJob`)."""

    @property
    def role(self) -> str: ...

    @property
    def model_name(self) -> str: ...

    @property
    def dtype(self) -> str: ...

    @property
    def seed(self) -> int: ...

    @property
    def config(self) -> dict[str, Any]: ...

    @property
    def n_gpus(self) -> int: ...


def pool_key(
    subs: Sequence[SubJobLike],
    policy: PoolPolicy,
    canonical: Callable[[str], str] = str.strip,
) -> tuple[dict[str, Any] | None, str]:
    """The job's pool key, or None and why it gets its own engines."""
    train = [s for s in subs if s.role == "training"]
    samplers = [s for s in subs if s.role == "sampling"]
    if len(train) != 1 or not isinstance(train[0].config.get("lora"), Mapping):
        return None, "not a LoRA job"
    if len(samplers) > 1 or len(train) + len(samplers) != len(subs):
        return None, "a pool serves one trainer and at most one sampler (no log-prob sub-job)"
    t = train[0]
    model = canonical(t.model_name)
    if policy.adapters_for(model, canonical) <= 0:
        return None, f"base model {model!r} is not pooled on this server"
    conf, lora = t.config, dict(t.config["lora"])
    why = _unshared(conf, TENANT_TRAINING, "training_config")
    if why:
        return None, why
    if int(conf.get("zero_stage") or 0) == 3 or t.n_gpus > 1:
        return None, "ZeRO-3 and several ranks partition the base model: own engines"
    if int(lora.get("rank") or 0) > policy.max_rank:
        return None, f"LoRA rank {lora.get('rank')} > the pools' largest, {policy.max_rank}"
    if (lora.get("train_embeddings") or lora.get("train_lm_head")) and not policy.embeddings:
        return None, "the pools' samplers serve no adapter on the embedding or the lm_head"
    sampler: dict[str, Any] = {"max_seq_len": 0, "num_threads": 0, "seed": 0}
    for s in samplers:
        if canonical(s.model_name) != model or s.dtype != t.dtype or s.n_gpus > 1:
            return None, "the sampling sub-job's model, dtype or GPUs differ from the trainer's"
        why = _unshared(s.config, SAMPLING_KEYS, "inference_config")
        if why:
            return None, why
        sampler = {
            "max_seq_len": int(s.config.get("max_seq_len") or 0),
            "num_threads": int(s.config.get("num_threads") or 0),
            "seed": int(s.seed or 0),
        }
    key = {
        "model": model,
        "dtype": t.dtype,
        "training": {k: conf.get(k) for k in SHARED_TRAINING}
        | {"num_threads": int(conf.get("num_threads") or 0)},
        "sampling": sampler,
    }
    return key, ""


def _unshared(conf: Mapping[str, Any], allowed: Iterable[str], where: str) -> str:
    extra = sorted(set(conf) - set(allowed))
    return f"{where} sets {extra}: a shared engine cannot honour it for one job" if extra else ""


def key_id(key: Mapping[str, Any]) -> str:
    """A pool's id: a digest of its key (the same key, the same id, across restarts)."""
    doc = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return "pool-" + hashlib.sha256(doc.encode()).hexdigest()[:12]


@dataclass
class PoolRecord:
    """A pool as every server books it; each server adds its engines."""

    pool_id: str
    key: dict[str, Any]
    max_adapters: int
    max_rank: int
    tenants: list[str] = field(default_factory=list)  # job ids, in the order they joined
    state: str = "new"  # new -> starting -> ready; failed / stopped end it
    idle_since: float = 0.0  # when its last tenant left (0: it has tenants)

    @property
    def base_model(self) -> str:
        return str(self.key["model"])

    @property
    def live(self) -> bool:
        return self.state in ("new", "starting", "ready")

    def doc(self) -> dict[str, Any]:
        return asdict(self)


P = TypeVar("P", bound=PoolRecord)


class PoolBook(Generic[P]):
    """A server's pools: the job -> pool assignment and the adapter limit."""

    def __init__(
        self,
        policy: PoolPolicy,
        make: Callable[[str, dict[str, Any], int], P],
        canonical: Callable[[str], str] = str.strip,
    ) -> None:
        self.policy = policy
        self.make = make  # (pool id, key, max adapters) -> a new record of the server's type
        self.canonical = canonical  # one name a model (the server's aliases of its default)
        self.pools: dict[str, P] = {}

    def of(self, job_id: str) -> P | None:
        """The live pool that holds (or will hold) the job's adapter."""
        return next((p for p in self.pools.values() if p.live and job_id in p.tenants), None)

    def reserve(self, job_id: str, key: dict[str, Any]) -> P:
        """The job's place in its key's pool (made when there is none); `rate_limited` when
        that pool holds its adapter limit."""
        pid = key_id(key)
        pool = self.pools.get(pid)
        if pool is None or not pool.live:
            n = self.policy.adapters_for(key["model"], self.canonical)
            pool = self.pools[pid] = self.make(pid, key, n)
        if job_id in pool.tenants:
            return pool
        if len(pool.tenants) >= pool.max_adapters:
            raise ProtocolError(
                "rate_limited",
                f"the LoRA pool of base model {pool.base_model!r} ({pid}) holds "
                f"{len(pool.tenants)} adapters, its limit: retry when a job in it ends",
                pool=pid,
                base_model=pool.base_model,
                adapters=len(pool.tenants),
                limit=pool.max_adapters,
                retry_after_s=30,
            )
        pool.tenants.append(job_id)
        pool.idle_since = 0.0
        return pool

    def release(self, job_id: str) -> P | None:
        """The job's adapter leaves its pool (the pool is idle from now when it was the last)."""
        pool = self.of(job_id)
        if pool is not None:
            pool.tenants.remove(job_id)
            if not pool.tenants:
                pool.idle_since = time.time()
        return pool

    def idle(self, now: float | None = None) -> list[P]:
        """Live pools without tenants for longer than the policy's idle time."""
        t = time.time() if now is None else now
        return [
            p
            for p in self.pools.values()
            if p.live and not p.tenants and p.idle_since
            if t - p.idle_since >= self.policy.idle_seconds
        ]

    def capabilities(self) -> list[dict[str, Any]]:
        """The capabilities' `lora.pools` (jobs.proto `LoraPool`): each pooled base model (the
        policy's, "*" included) with its limit, and the pools running now."""
        out: dict[str, dict[str, Any]] = {}
        named: dict[str, str] = {}  # a pool's (canonical) model -> the policy's name of it
        for model, n in self.policy.models.items():
            if int(n) > 0:
                out[model] = _pool_row(model, int(n), self.policy.max_rank)
                if model != ANY_MODEL:
                    named[self.canonical(model)] = model
        for p in self.pools.values():
            if not p.live:
                continue
            name = named.get(p.base_model, p.base_model)
            row = out.setdefault(name, _pool_row(name, p.max_adapters, p.max_rank))
            row["adapters"] = int(row["adapters"]) + len(p.tenants)
            row["warm"] = bool(row["warm"]) or p.state == "ready"
        return list(out.values())


def _pool_row(model: str, max_adapters: int, max_rank: int) -> dict[str, Any]:
    return {"base_model": model, "max_adapters": max_adapters, "adapters": 0,
            "max_rank": max_rank, "warm": False}  # fmt: skip


def add_pool_arguments(ap: argparse.ArgumentParser) -> None:
    """The LoRA pool flags the on-prem server and the gateway share."""
    g = ap.add_argument_group(
        "LoRA pools (PROTOCOL.md §3.6; advertised in capabilities lora.pools)"
    )
    g.add_argument(
        "--lora-pool",
        action="append",
        default=[],
        metavar="MODEL[=N]",
        help="LoRA jobs on base model MODEL ('*': any model) share one trainer and one sampler, "
        f"N adapters a pool (default {DEFAULT_MAX_ADAPTERS}); repeatable; none: no pools",
    )
    g.add_argument("--lora-pool-max-rank", type=int, default=DEFAULT_MAX_RANK,
                   help="largest LoRA rank a pooled job may have (a larger one gets its own "
                   "engines)")  # fmt: skip
    g.add_argument("--lora-pool-idle-s", type=float, default=300.0,
                   help="seconds an empty pool's engines stay warm for the next job")  # fmt: skip


def policy_from_args(args: argparse.Namespace) -> PoolPolicy:
    try:
        models = dict(parse_pool_option(x) for x in args.lora_pool)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return PoolPolicy(
        models=models, max_rank=int(args.lora_pool_max_rank), idle_seconds=args.lora_pool_idle_s
    )


def syncs_adapter(lora: Mapping[str, Any] | None, pooled: bool) -> bool:
    """Whether a job's syncs send its adapter to samplers that load it as adapter versions: a
    pooled LoRA job always (its pool's sampler serves embedding / lm_head adapters too), another
    LoRA job unless its adapter is merged and pushed (`lora_config.adapter_sync`)."""
    return lora is not None and (pooled or adapter_sync(lora))


def lora_support_json(support: Mapping[str, Any], book: PoolBook[Any]) -> dict[str, Any]:
    """The capabilities' `lora` with the server's pools (`shared_sampler`, `pools`)."""
    pools = book.capabilities()
    return {**support, "shared_sampler": bool(pools), "pools": pools}
