"""A pooled LoRA tenant's optimizer, learning-rate schedule, step count and checkpoint state.

A dedicated LoRA trainer hands its adapter's parameters to `deepspeed.initialize`, and the
DeepSpeed engine is then its optimizer, its schedule and its step counter. A LoRA pool's trainer
(`lora_pool_trainer.py`) holds many tenants' adapters over one base model in one process, each
with its own optimizer state: one DeepSpeed engine per tenant cannot do that (an engine owns its
module: its ZeRO-0 `zero_grad` clears every parameter's gradient, its ZeRO-3 partitions the shared
base), so each tenant gets `TenantOptimizer`, the optimizer DeepSpeed itself builds on a CPU host
(`torch_adam`: `torch.optim.AdamW` for "adamw" and "adam", whose DeepSpeed default is AdamW mode;
`torch.optim.SGD`), DeepSpeed's gradient clipping (`clip_grad_norm_` over the tenant's parameters
when `gradient_clipping` > 0) and the same `LambdaLR` schedule (`train_options.lr_factor`), over
that tenant's adapter parameters only.

It answers the calls `TrainingEngine` makes on its DeepSpeed engine (`backward`, `step`,
`get_lr`, `global_steps`, `optimizer`, `module`, `train` / `eval`, the forward through
`__call__`, `save_checkpoint` / `load_checkpoint`), so a tenant runs the dedicated trainer's own
forward-backward, micro-batching, loss and step code unchanged (`TenantTrainer`).

Resumable checkpoints of a tenant hold its PEFT adapter directory (`adapter/`, written by the
trainer as for a dedicated job) and `tenant_state.pt` (optimizer and schedule state, step
count). A weights-only LoRA checkpoint is the same on both kinds of trainer; a dedicated
trainer's resumable one (DeepSpeed's files) is refused by a tenant by name, as a tenant's is by
a dedicated trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import WorkerError
from .ds_setup import ds_config
from .lora_trainer import load_adapter_dir
from .train_options import lr_factor

STATE_FILE = "tenant_state.pt"
FORMAT = "arctic-lora-tenant/1"


def build_optimizer(
    params: Sequence[torch.nn.Parameter], conf: Mapping[str, Any], dtype: str, cuda: bool
) -> tuple[torch.optim.Optimizer, float]:
    """The optimizer DeepSpeed would build from the job's `training_config` (`ds_config`: the
    same defaults) and its gradient clipping."""
    cfg = ds_config(conf, dtype, cuda=cuda)
    kind, p = cfg["optimizer"]["type"], dict(cfg["optimizer"]["params"])
    if kind in ("AdamW", "Adam"):  # DeepSpeed's "Adam" defaults to adam_w_mode too
        opt: torch.optim.Optimizer = torch.optim.AdamW(
            params,
            lr=float(p["lr"]),
            betas=(float(p["betas"][0]), float(p["betas"][1])),
            eps=float(p["eps"]),
            weight_decay=float(p["weight_decay"]),
        )
    else:
        opt = torch.optim.SGD(
            params,
            lr=float(p["lr"]),
            momentum=float(p["momentum"]),
            weight_decay=float(p["weight_decay"]),
        )
    return opt, float(cfg["gradient_clipping"])


class TenantOptimizer:
    """What `TrainingEngine` reads of its DeepSpeed engine, for one tenant of a pool."""

    def __init__(
        self,
        model: Any,
        name: str,
        params: Sequence[torch.nn.Parameter],
        conf: Mapping[str, Any],
        *,
        dtype: str,
        cuda: bool,
        activate: Callable[[], None],
    ) -> None:
        self.module = model  # the shared PeftModel: its `name` adapter is this tenant's
        self.name = name
        self.params = list(params)
        self.optimizer, self.clip = build_optimizer(self.params, conf, dtype, cuda)
        self.kind = type(self.optimizer).__name__.lower()  # "adamw" or "sgd" (StepRequest.adam)
        schedule = conf.get("lr_scheduler")
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if schedule:
            sched = dict(schedule)
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda t: lr_factor(int(t), sched)
            )
        self.activate = activate
        self.global_steps = 0
        self._norm = 0.0

    # -- the forward and the accumulation boundary -------------------------------------------

    def __call__(self, **rows: Any) -> Any:
        self.activate()
        return self.module(**rows)

    def train(self) -> None:
        self.activate()
        self.module.train()

    def eval(self) -> None:
        self.activate()
        self.module.eval()

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = False) -> None:
        loss.backward()  # type: ignore[no-untyped-call]

    def grad_norm(self) -> float:
        """The L2 norm of this tenant's accumulated gradients (its parameters only)."""
        norms = [p.grad.detach().float().norm() for p in self.params if p.grad is not None]
        return float(torch.stack(norms).norm()) if norms else 0.0

    def step(self) -> None:
        """Clip, apply and clear this tenant's gradients; advance its schedule."""
        if self.clip > 0:
            grads = [p for p in self.params if p.grad is not None]
            self._norm = float(torch.nn.utils.clip_grad_norm_(grads, self.clip)) if grads else 0.0
        else:
            self._norm = self.grad_norm()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_steps += 1

    def get_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> float:
        return self._norm

    def zero_optimization_stage(self) -> int:
        return 0

    def state_numel(self) -> int:
        """Elements of the optimizer's state (Adam: 2 per trainable element after a step)."""
        return sum(
            int(v.numel())
            for st in self.optimizer.state.values()
            for v in st.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        )

    # -- checkpoints (DeepSpeed's signatures) -------------------------------------------------

    def save_checkpoint(
        self,
        save_dir: str,
        tag: str,
        client_state: Mapping[str, Any],
        exclude_frozen_parameters: bool = True,
    ) -> None:
        """The tenant's optimizer and schedule state beside its adapter directory (which the
        trainer writes: `TrainerWeights._save_lora`)."""
        out = Path(save_dir) / tag
        out.mkdir(parents=True, exist_ok=True)
        state = {
            "format": FORMAT,
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "global_steps": self.global_steps,
            "client_state": dict(client_state),
        }
        tmp = out / f"{STATE_FILE}.tmp"
        torch.save(state, tmp)
        tmp.replace(out / STATE_FILE)

    def load_checkpoint(
        self,
        load_dir: str,
        tag: str,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_strict: bool = False,
    ) -> tuple[str | None, dict[str, Any]]:
        """The adapter and the optimizer / schedule state of a tenant's resumable checkpoint."""
        src = Path(load_dir) / tag
        f = src / STATE_FILE
        if not f.is_file():
            if any(src.glob("mp_rank_*")) or any(src.glob("zero_pp_rank_*")):
                raise WorkerError(
                    "invalid_argument",
                    "field checkpoint_id: a resumable checkpoint of a job with its own DeepSpeed "
                    "trainer; this job trains in a LoRA pool, which resumes its own resumable "
                    "checkpoints, or loads the adapter of a weights-only one",
                    field="checkpoint_id",
                    expected="a weights-only LoRA checkpoint, or a pooled job's resumable one",
                )
            return None, {}
        state = torch.load(f, map_location="cpu", weights_only=False)
        if state.get("format") != FORMAT:
            raise WorkerError("invalid_argument", f"{f}: not a LoRA pool tenant's state")
        load_adapter_dir(self.module, 0, src / "adapter", self.name)
        if load_optimizer_states:
            self.optimizer.load_state_dict(state["optimizer"])
        if load_lr_scheduler_states and self.scheduler is not None and state["lr_scheduler"]:
            self.scheduler.load_state_dict(state["lr_scheduler"])
        self.global_steps = int(state["global_steps"])
        return str(src), dict(state.get("client_state") or {})
