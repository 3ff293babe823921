"""A LoRA pool's trainer: many jobs' adapters over ONE copy of a base model, in one process.

The base model is loaded once and frozen; each tenant (a pooled job, PROTOCOL.md §3.6) is one
named PEFT adapter on it (`PeftModel.add_adapter`, removed with `delete_adapter`), made active
for that tenant's calls only (`set_adapter`: PEFT then computes that adapter alone, and only its
parameters require gradients). Each tenant has its own `TenantTrainer`: the dedicated trainer's
code (`training.TrainingEngine`: forward-backward with micro-batches, losses, step, checkpoints,
weight export) over its own `TenantOptimizer` (optimizer state, learning-rate schedule, step
count, gradient accumulation over its own parameters).

What one tenant does cannot change what another observes:

- parameters: a tenant's forward runs the frozen base and its own adapter; its backward reaches
  only its own adapter's parameters; its step, clipping and gradient norm read its own;
- gradients accumulate per parameter, so another tenant's forward-backward between a tenant's
  forward-backward and its step adds nothing to it;
- random numbers: each tenant has its own CPU (and CUDA) generator state, swapped in around its
  calls (`torch.random.fork_rng`), so adapter dropout draws the same masks whatever ran between;
  an adapter is initialised from the tenant's seed;
- mode: every call sets train / eval and the active adapter itself.

Commands name their tenant (`tenant`, added by the server's tenant handle; `tenant_queue.py`
serves tenants in turn). `attach` builds a tenant from its sub-job spec, `detach` frees its
adapter and optimizer state; the pool's own commands are `pool_stats`. Shared settings (model,
dtype, attention, activation checkpointing, determinism, threads) are the pool's (its key,
`serving/lora_pools.py`); per-job ones (optimizer, schedule, clipping, micro-batch size, LoRA
rank / alpha / modules / dropout, seed) are the tenant's.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from arctic_sdk.spec.tables import methods as M

from ..errors import WorkerError
from ..worker.commands import Command
from ..worker.engine_base import WEIGHT_GROUP_CMDS, EngineBase, no_weight_group, tenant_in
from ..worker.messages import ATTACH_CMD, DETACH_CMD, POOL_STATS_CMD
from .ds_setup import device
from .hf_model import _read_vocab, enable_determinism, load_hf_model
from .lora_trainer import is_adapter_param, peft_config
from .tenant_optim import TenantOptimizer
from .training import TrainingEngine

POOL_REASON = "a LoRA pool's trainer is shared with other jobs: it is not offloaded for one"


class TenantTrainer(TrainingEngine):
    """One tenant of a pool: `TrainingEngine`'s commands over its own adapter and optimizer
    (built without DeepSpeed: the pool holds the model; `TenantOptimizer` is its engine)."""

    engine: TenantOptimizer

    def __init__(self, pool: LoraPoolTrainer, name: str, spec: Mapping[str, Any]) -> None:
        t0 = time.perf_counter()
        self.spec = dict(spec)
        self.conf = dict(spec.get("config") or {})
        self.dtype, self.dev, self.cuda = pool.dtype, pool.dev, pool.cuda
        self.deterministic = pool.deterministic
        self.attn_requested = pool.attn_requested
        self.lora = dict(self.conf["lora"])
        self.adapter_name = name
        self.seed = int(spec.get("seed") or 0)
        params = pool.add_adapter(name, self.lora, self.seed)
        self.schedule = self.conf.get("lr_scheduler")
        self.lr_override = None
        self.ds_config = {}
        self.engine = TenantOptimizer(
            pool.model,
            name,
            params,
            self.conf,
            dtype=self.dtype,
            cuda=self.cuda,
            activate=lambda: pool.activate(name),
        )
        self.model = self.engine  # _Forward's forward: activates this adapter first
        self.stage = 0
        self.micro_batch_size = int(self.conf.get("micro_batch_size") or 0)
        self.vocab_size, self.model_dir = pool.vocab_size, pool.model_dir
        self._reset_accum()
        self.offloaded = False
        self.rng = _rng_state(self.seed, self.cuda)  # its dropout draws, whatever ran between
        self.table = dict(self.commands())
        self.timings = {"attach_s": round(time.perf_counter() - t0, 3)}

    def info(self) -> dict[str, Any]:
        trainable = sum(int(p.numel()) for p in self.engine.params)
        return {
            **self._trainer_info(),
            "pooled": True,
            "tenant": self.adapter_name,
            "lora": self.lora,
            "trainable_numel": trainable,
            "optimizer_param_numel": trainable,
            "optimizer_state_numel": self.engine.state_numel(),
            **self.timings,
        }

    def syncs_adapter(self) -> bool:
        return True  # the pool's sampler serves every adapter this pool trains

    def check_resumable(self, tag_dir: Path) -> None:
        """A tenant resumes its own kind (`TenantOptimizer.load_checkpoint` refuses the other)."""

    def _grad_norm_local(self) -> float:
        return float(self.engine.grad_norm())  # this tenant's parameters, not the pool's

    # a step's `adam` (StepRequest.adam) changes this tenant's optimizer and clip only
    def _optimizer_type(self) -> str:
        return self.engine.kind

    def _set_clip(self, clip: float) -> None:
        self.engine.clip = clip

    def op_sleep(self, mode: str = "all") -> dict[str, Any]:
        return {"applied": False, "reason": POOL_REASON}

    def op_wake(self) -> dict[str, Any]:
        return {"applied": False, "reason": POOL_REASON}

    def close(self) -> None:
        """Nothing: the pool owns the model (`LoraPoolTrainer.detach`)."""


def _rng_state(seed: int, cuda: bool) -> list[torch.Tensor]:
    """A fresh generator state seeded with `seed` (CPU, and the GPU's on a CUDA host)."""
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if cuda else []):
        torch.manual_seed(seed)
        out = [torch.get_rng_state()]
        if cuda:
            out.append(torch.cuda.get_rng_state())
        return out


class LoraPoolTrainer(EngineBase):
    def __init__(self, spec: Mapping[str, Any]) -> None:
        t0 = time.perf_counter()
        self.spec = dict(spec)
        conf: dict[str, Any] = dict(spec.get("config") or {})
        self.pool = dict(spec.get("pool") or {})
        self.dtype = str(spec.get("dtype") or "float32")
        self.dev = device()
        self.cuda = self.dev.type == "cuda"
        self.deterministic = enable_determinism(conf, int(spec.get("seed") or 0))
        self.attn_requested = str(conf.get("attn_implementation") or "eager")
        base = load_hf_model(spec["model_dir"], self.dtype, self.attn_requested)
        base.requires_grad_(False)
        if conf.get("activation_checkpointing"):
            base.config.use_cache = False
            base.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self.model: Any = base.to(self.dev)  # a PeftModel once the first adapter is added
        self.peft = False
        self.active = ""
        self.vocab_size = _read_vocab(spec["model_dir"])
        self.model_dir = str(spec["model_dir"])
        self.tenants: dict[str, TenantTrainer] = {}
        self.max_adapters = int(self.pool.get("max_adapters") or 0)
        # "{tenant}/executed" -> request id -> runs, "{tenant}/keys" -> idempotency key -> runs
        self.executed: dict[str, dict[str, int]] = {}
        # the last commands run: (start time, tenant, command), the scheduling a test reads
        self.recent: collections.deque[tuple[float, str, str]] = collections.deque(maxlen=256)
        self._meta: Mapping[str, Any] = {}
        self.load_s = round(time.perf_counter() - t0, 3)

    def info(self) -> dict[str, Any]:
        return {
            "engine": "deepspeed",
            "pool": True,
            "max_adapters": self.max_adapters,
            "adapters": len(self.tenants),
            "vocab_size": self.vocab_size,
            "device": str(self.dev),
            "threads": torch.get_num_threads(),
            "base_numel": sum(int(p.numel()) for p in self.model.parameters()),
            "model_s": self.load_s,
        }

    # -- adapters ----------------------------------------------------------------------------

    def add_adapter(self, name: str, lora: Mapping[str, Any], seed: int) -> list[Any]:
        """Add tenant `name`'s adapter, initialised from its seed; its parameters."""
        from peft import get_peft_model

        cfg = peft_config(lora)
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(seed)
            try:
                if not self.peft:
                    self.model = get_peft_model(self.model, cfg, adapter_name=name)
                    self.peft = True
                else:
                    self.model.add_adapter(name, cfg)
            except ValueError as exc:  # PEFT names a module the model lacks
                raise WorkerError(
                    "invalid_argument", f"training_config.lora.target_modules: {exc}"
                ) from None
        self.model.to(self.dev)
        self.active = ""  # PEFT re-activated its own choice
        params = [p for n, p in self.model.named_parameters() if is_adapter_param(n, name)]
        if not params:
            raise WorkerError("internal", f"LoRA pool: adapter {name} has no parameters")
        return params

    def activate(self, name: str) -> None:
        """Make `name` the one adapter the model computes (and the only one that trains)."""
        if self.active != name:
            self.model.set_adapter(name)
            self.active = name

    # -- tenants -----------------------------------------------------------------------------

    def op_attach(self, tenant: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """A job joins the pool: its adapter and optimizer (idempotent for a tenant present)."""
        t = self.tenants.get(tenant)
        if t is None:
            if self.max_adapters and len(self.tenants) >= self.max_adapters:
                raise WorkerError(
                    "rate_limited",
                    f"the LoRA pool holds {len(self.tenants)} adapters, its limit",
                    limit=self.max_adapters,
                    retry_after_s=30,
                )
            t = self.tenants[tenant] = TenantTrainer(self, tenant, spec)
        return t.info()

    def op_detach(self, tenant: str) -> dict[str, Any]:
        """A job leaves the pool: its adapter, optimizer state and gradients are freed."""
        t = self.tenants.pop(tenant, None)
        for what in ("executed", "keys"):
            self.executed.pop(f"{tenant}/{what}", None)
        if t is None:
            return {"detached": False, "adapters": len(self.tenants)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT: "Adapter ... was active which is now deleted"
            self.model.delete_adapter(tenant)
        self.active = ""
        del t
        gc.collect()
        return {"detached": True, "adapters": len(self.tenants)}

    def op_pool_stats(self) -> dict[str, Any]:
        return {
            "adapters": len(self.tenants),
            "recent": [list(x) for x in self.recent],
            "tenants": {
                name: {
                    "global_step": int(t.engine.global_steps),
                    "applied_steps": int(t.engine.global_steps),
                    "executed": dict(self.executed.get(f"{name}/executed") or {}),
                    "keys": dict(self.executed.get(f"{name}/keys") or {}),
                }
                for name, t in self.tenants.items()
            },
        }

    def tenant(self, name: str) -> TenantTrainer:
        return tenant_in(self.tenants, name, "trainer")

    @contextlib.contextmanager
    def _turn(self, t: TenantTrainer) -> Iterator[None]:
        """A tenant's call: its adapter active, its generator state in place."""
        cuda = [torch.cuda.current_device()] if self.cuda else []
        with torch.random.fork_rng(devices=cuda):
            torch.set_rng_state(t.rng[0])
            if self.cuda:
                torch.cuda.set_rng_state(t.rng[1])
            self.activate(t.adapter_name)
            yield
            t.rng = [torch.get_rng_state()] + ([torch.cuda.get_rng_state()] if self.cuda else [])

    def _run(self, cmd: str, tenant: str, **args: Any) -> Any:
        t = self.tenant(tenant)
        fn = t.table.get(cmd)
        if fn is None:
            raise WorkerError("unimplemented", f"a pooled trainer has no op {cmd!r}")
        self.recent.append((time.time(), tenant, cmd))
        with self._turn(t):
            out = fn(**args)
        for what, value in (("executed", "request_id"), ("keys", "idempotency_key")):
            v = str(self._meta.get(value) or "")
            if v:  # what ran, for a test's at-most-once checks (the gateway names it: `note`)
                runs = self.executed.setdefault(f"{tenant}/{what}", {})
                runs[v] = runs.get(v, 0) + 1
        return out

    def note(self, meta: Mapping[str, Any], cancel: Any) -> None:
        self._meta = meta

    def commands(self) -> dict[str, Command]:
        table: dict[str, Command] = {
            ATTACH_CMD: self.op_attach,
            DETACH_CMD: self.op_detach,
            POOL_STATS_CMD: self.op_pool_stats,
        }
        for cmd in _TENANT_COMMANDS:
            table[cmd] = _bind(self._run, cmd)
        for cmd in WEIGHT_GROUP_CMDS:  # its tenants sync by file (serving/lora_sync.py)
            table[cmd] = no_weight_group("trainer")
        return table

    def stats(self) -> dict[str, Any]:
        return self.op_pool_stats()

    def close(self) -> None:
        self.tenants.clear()


# the commands a tenant runs (TrainingEngine.commands)
_TENANT_COMMANDS = (
    M.FORWARD.python_name,
    M.LOG_PROBS.python_name,
    M.FORWARD_BACKWARD.python_name,
    M.STEP.python_name,
    "sleep",
    "wake",
    "export_weights",
    "save",  # not-an-op
    "load",  # not-an-op
)


def _bind(run: Any, cmd: str) -> Command:
    def call(tenant: str = "", **args: Any) -> Any:
        return run(cmd, tenant, **args)

    return call
