"""The training engine (DeepSpeed) of a worker process.

`TrainingEngine` wraps one `deepspeed.initialize`d Hugging Face causal LM:

- ZeRO stage, optimizer, gradient clipping, micro-batch size and the rest of the DeepSpeed config
  come from the sub-job's `training_config` (`deepspeed` is merged in last, verbatim).
- DeepSpeed runs with `managed_gradient_accumulation: false`: every `backward` only accumulates,
  and every `step` is the accumulation boundary. That is the protocol's contract — gradients of
  successive forward-backward calls add up until `step` — whatever number of calls the client
  makes. Losses are backpropagated as the losses module normalises them (never divided by a
  gradient-accumulation count or by data-parallel ranks).
- A call with more rows than `micro_batch_size` runs in micro-batches: one no-grad pass gives the
  whole call's log-probs, the loss of the whole call is differentiated with respect to them, and
  each micro-batch is then backpropagated with its slice of that gradient. The update equals the
  single-pass one for every loss (token-mean, seq-mean, KL, entropy) while only one micro-batch's
  activations are alive at a time.

The forward passes it shares with the scorer are `scoring._Forward`; the loss of a call and its
gradient, shared with the multi-rank trainer, are in `call_loss.py`; weights and checkpoints in
`training_weights.py`; the on-prem options (schedule, checkpointing, attention, determinism) in
`train_options.py`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

import torch

from arctic_sdk.spec.tables import methods as M

from ...rules.errors import ProtocolError
from ..losses import torch_losses as losses
from ..worker.commands import Command
from .batch import Batch
from .call_loss import batch_loss, fb_targets, loss_and_gradients

# ds_config, load_hf_model and set_ds_env are also imported from here by bench/server.py
from .ds_setup import _unlink_allreduce_buffers, device, ds_config, set_ds_env
from .hf_model import _read_vocab, enable_determinism, load_hf_model
from .scoring import _Forward
from .train_options import lr_factor
from .training_weights import TrainerWeights
from .weight_send import WeightSender

CPU_TRAINER_REASON = (
    "CPU trainer: nothing to offload (weights and optimizer already live in host memory)"
)


class TrainingEngine(WeightSender, TrainerWeights, _Forward):
    def __init__(self, spec: Mapping[str, Any]) -> None:
        t0 = time.perf_counter()
        set_ds_env()
        import deepspeed

        t_import = time.perf_counter()

        self.spec = dict(spec)
        self.conf: dict[str, Any] = dict(spec.get("config") or {})
        self.dtype = str(spec.get("dtype") or "float32")
        self.dev = device()
        self.cuda = self.dev.type == "cuda"
        seed = int(spec.get("seed") or 0)
        self.deterministic = enable_determinism(self.conf, seed)
        torch.manual_seed(seed)
        self.attn_requested = str(self.conf.get("attn_implementation") or "eager")
        model = load_hf_model(spec["model_dir"], self.dtype, self.attn_requested)
        self.lora: dict[str, Any] | None = self.conf.get("lora")
        if self.lora is not None:  # the adapter is the only trainable state (lora_trainer.py)
            from .lora_trainer import wrap

            model = wrap(model, self.lora)
        if self.conf.get("activation_checkpointing"):
            model.config.use_cache = False
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model.train()
        t_model = time.perf_counter()
        self.ds_config = ds_config(self.conf, self.dtype, cuda=self.cuda)
        self.schedule = self.conf.get("lr_scheduler")
        self.lr_override: float | None = None
        engine, _opt, _dl, _sched = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=self.ds_config,
            lr_scheduler=_lr_scheduler(self.schedule),
        )
        self.engine = engine
        _unlink_allreduce_buffers()
        t_init = time.perf_counter()
        self.timings = {
            "import_s": round(t_import - t0, 3),
            "model_s": round(t_model - t_import, 3),
            "deepspeed_initialize_s": round(t_init - t_model, 3),
        }
        self.model = engine  # _Forward calls go through DeepSpeed's hooks (ZeRO-3 gathers)
        self.stage = int(engine.zero_optimization_stage())
        self.micro_batch_size = int(self.conf.get("micro_batch_size") or 0)
        self.vocab_size = _read_vocab(spec["model_dir"])
        self.model_dir = spec["model_dir"]
        self._reset_accum()
        self.offloaded = False

    def info(self) -> dict[str, Any]:
        return {
            **self._trainer_info(),
            "attn_implementation": str(self.engine.module.config._attn_implementation),
            "activation_checkpointing": bool(
                getattr(self.engine.module, "is_gradient_checkpointing", False)
            ),
            **self._lora_info(),
            **self.timings,
        }

    def _trainer_info(self) -> dict[str, Any]:
        """What every trainer reports (a dedicated one and a LoRA pool's tenant)."""
        return {
            "engine": "deepspeed",
            "zero_stage": self.stage,
            "vocab_size": self.vocab_size,
            "device": str(self.dev),
            "optimizer": type(self.engine.optimizer).__name__,
            "lr": self._lr(),
            "lr_scheduler": self.schedule,
            "micro_batch_size": self.micro_batch_size,
            "threads": torch.get_num_threads(),
            "attn_requested": self.attn_requested,
            "full_determinism": self.deterministic,
        }

    def _lora_info(self) -> dict[str, Any]:
        """A LoRA trainer's adapter: its config, trainable and optimizer-state sizes."""
        if self.lora is None:
            return {}
        from .lora_trainer import trainable_numel

        return {"lora": self.lora, **trainable_numel(self.engine)}

    def _dummy_logits(self) -> torch.Tensor:
        """The logits of a one-token row: a pass that touches every parameter."""
        ids = torch.zeros((1, 1), dtype=torch.long, device=self.dev)
        return self._logits(
            {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": ids}
        )

    def _zero_backward(self) -> None:
        """A backward that adds nothing, for reductions / collectives that need one."""
        self.engine.backward(self._dummy_logits().float().sum() * 0.0, scale_wrt_gas=False)

    def _reset_accum(self) -> None:
        self.acc_loss, self.acc_tokens, self.acc_calls = 0.0, 0, 0

    def _lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.engine.destroy()

    # -- forward / backward ------------------------------------------------------------------

    def commands(self) -> dict[str, Command]:
        """The worker commands this engine runs (`engines/worker/commands.py`)."""
        return {
            M.FORWARD.python_name: self.op_forward,
            M.LOG_PROBS.python_name: self.op_log_probs,
            M.FORWARD_BACKWARD.python_name: self.op_forward_backward,
            M.STEP.python_name: self.op_step,
            "sleep": self.op_sleep,
            "wake": self.op_wake,
            "export_weights": self.op_export_weights,
            "save": self.op_save,  # not-an-op
            "load": self.op_load,  # not-an-op
            **self.send_commands(),  # the collective weight sync (weight_send.py)
        }

    def op_forward(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.engine.eval()
        try:
            return self.forward_result(body)
        finally:
            self.engine.train()

    def op_log_probs(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.engine.eval()
        try:
            return self.log_probs_result(body)
        finally:
            self.engine.train()

    def _fb_batch(
        self, body: Mapping[str, Any]
    ) -> tuple[Batch, dict[str, Any], losses.LossSettings]:
        """A ForwardBackwardRequest checked: its batch, its loss's processing and settings."""
        b, proc, st = self._checked_call(body)
        return b, proc, st

    def _scored(
        self, b: Batch, *, temperature: float, targets: torch.Tensor, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """forward's and log-probs' log-probs: forward-backward's passes on the same rows —
        one pass of the call when it fits `micro_batch_size`, else one per `micro_batch_size`
        rows (`_fb_passes`) — so the old log-probs a client takes from `forward` equal, bit for
        bit, the ones forward-backward computes for its first (on-policy) update. No graph is
        kept (autograd does not change the forward's kernels; `tests/onprem/test_on_policy.py`
        checks the equality)."""
        mbs = self.micro_batch_size or int(b.shape[0])
        return self._logprobs_no_grad(b, targets, temperature, mbs, entropy)

    def _logprobs_graph(
        self, b: Batch, targets: torch.Tensor, st: losses.LossSettings, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropy) of every row of `b` in one pass, keeping the graph (the
        entropy's only when the loss uses it)."""
        return self._logprobs(
            b,
            slice(None),
            targets,
            temperature=st.temperature,
            entropy=entropy,
            entropy_grad=st.needs_entropy,
        )

    def _logprobs_no_grad(
        self, b: Batch, targets: torch.Tensor, temperature: float, mbs: int, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """No-grad log-probs (and entropy) of every row of `b`, `mbs` rows a pass."""
        lps, ents = [], []
        with torch.no_grad():
            for r in range(0, int(b.shape[0]), mbs):
                lp_mb, ent_mb = self._logprobs(
                    b,
                    slice(r, r + mbs),
                    targets,
                    temperature=temperature,
                    entropy=entropy,
                    entropy_grad=False,
                )
                lps.append(lp_mb)
                if ent_mb is not None:
                    ents.append(ent_mb)
        return torch.cat(lps), torch.cat(ents) if ents else None

    def _backward_surrogate(
        self,
        lp: torch.Tensor,
        g_lp: torch.Tensor,
        ent: torch.Tensor | None,
        g_ent: torch.Tensor | None,
        scale: float = 1.0,
    ) -> None:
        """Backpropagate `scale * (<lp, g_lp> + <ent, g_ent>)`: with the loss's gradient with
        respect to the log-probs, the chain rule's inner half (`loss_and_gradients`)."""
        surrogate = (lp * g_lp).sum()
        if g_ent is not None and ent is not None and ent.requires_grad:
            surrogate = surrogate + (ent * g_ent).sum()
        if scale != 1.0:
            surrogate = surrogate * scale
        self.engine.backward(surrogate, scale_wrt_gas=False)

    def _backward_micro(
        self,
        b: Batch,
        targets: torch.Tensor,
        st: losses.LossSettings,
        mbs: int,
        g_lp: torch.Tensor,
        g_ent: torch.Tensor | None,
        scale: float = 1.0,
    ) -> int:
        """`_backward_surrogate` a micro-batch of `mbs` rows at a time; the number of passes."""
        passes = 0
        for r in range(0, int(b.shape[0]), mbs):
            sl = slice(r, r + mbs)
            lp_mb, ent_mb = self._logprobs(
                b,
                sl,
                targets,
                temperature=st.temperature,
                entropy=g_ent is not None,
                entropy_grad=True,
            )
            self._backward_surrogate(
                lp_mb, g_lp[sl], ent_mb, None if g_ent is None else g_ent[sl], scale
            )
            passes += 1
        return passes

    def _fb_result(
        self,
        b: Batch,
        res: losses.LossResult,
        lp: torch.Tensor,
        ent: torch.Tensor | None,
        rank_tokens: list[int] | None = None,
    ) -> dict[str, Any]:
        """Account a forward-backward call's loss and tokens until `step`; its result (with the
        real tokens each data-parallel rank ran: the whole call's on one rank)."""
        metrics = dict(res.metrics)
        per_rank = rank_tokens or [int(b.mask_np.sum())]
        metrics["rank_tokens_max"], metrics["rank_tokens_min"] = max(per_rank), min(per_rank)
        self.acc_loss += float(metrics["loss"])
        self.acc_tokens += int(metrics["num_tokens"])
        metrics["global_step"] = int(self.engine.global_steps)
        outputs: dict[str, Any] = {}
        if "compute_logprobs" in b.post:
            outputs["logprobs_shifted"] = b.out(lp)
        if "compute_entropy" in b.post and ent is not None:
            outputs["entropy"] = b.out(ent)
        return {"loss": float(metrics["loss"]), "metrics": metrics, "outputs": outputs}

    def op_forward_backward(self, body: Mapping[str, Any]) -> dict[str, Any]:
        b, proc, st = self._fb_batch(body)
        want_ent = st.needs_entropy or "compute_entropy" in b.post
        targets = fb_targets(b, st)
        n_rows = int(b.shape[0])
        mbs = self.micro_batch_size or n_rows
        self.engine.train()
        if n_rows <= mbs:
            lp, ent = self._logprobs_graph(b, targets, st, want_ent)
            res = batch_loss(b, proc, lp, ent)
            self.engine.backward(res.loss, scale_wrt_gas=False)
        else:
            # 1) no-grad log-probs of the whole call; 2) d loss / d log-probs; 3) per micro-batch
            # backward of <log-probs, that gradient> (exact chain rule, one micro-batch alive).
            lp, ent = self._logprobs_no_grad(b, targets, st.temperature, mbs, want_ent)
            res, g_lp, g_ent = loss_and_gradients(b, proc, st, lp, ent)
            self._backward_micro(b, targets, st, mbs, g_lp, g_ent)
        self.acc_calls += 1
        return self._fb_result(b, res, lp, ent)

    # -- step ------------------------------------------------------------------------------

    def _param_groups(self) -> list[dict[str, Any]]:
        groups = []
        opt = self.engine.optimizer
        for o in (opt, getattr(opt, "optimizer", None)):
            if o is not None and hasattr(o, "param_groups"):
                groups += list(o.param_groups)
        return groups

    def _set_lr(self, lr: float) -> None:
        for g in self._param_groups():
            g["lr"] = lr

    def _optimizer_type(self) -> str:
        """The job's optimizer as its DeepSpeed config names it, lower case."""
        return str(self.ds_config["optimizer"]["type"]).lower()

    def _set_clip(self, clip: float) -> None:
        """The gradient clip where DeepSpeed reads it (its config; a ZeRO optimizer's own copy)."""
        self.engine._config.gradient_clipping = clip
        if hasattr(self.engine.optimizer, "clip_grad"):
            self.engine.optimizer.clip_grad = clip

    def _set_adam(self, adam: Mapping[str, float]) -> None:
        """`StepRequest.adam`: Adam's betas, eps and weight decay where AdamW reads them each
        step (its param groups, saved with the optimizer state), and the gradient clip where
        the step reads it (`_set_clip`)."""
        name = self._optimizer_type()
        if name not in ("adam", "adamw"):
            raise ProtocolError(
                "unsupported_option",
                f"field adam: this job's optimizer is {name!r}, not Adam or AdamW",
                field="adam",
            )
        for g in self._param_groups():
            b1, b2 = g.get("betas", (0.9, 0.999))
            g["betas"] = (adam.get("beta1", b1), adam.get("beta2", b2))
            for k in ("eps", "weight_decay"):
                if k in adam:
                    g[k] = adam[k]
        clip = adam.get("gradient_clipping")
        if clip is not None:
            self._set_clip(float(clip))

    def _grad_norm_local(self) -> float:
        norms = [
            p.grad.detach().float().norm()
            for p in self.engine.module.parameters()
            if p.grad is not None
        ]
        return float(torch.stack(norms).norm()) if norms else 0.0

    def op_step(
        self, learning_rate: float | None = None, adam: Mapping[str, float] | None = None
    ) -> dict[str, Any]:
        if adam:  # for this and later steps
            self._set_adam(adam)
        if learning_rate is not None:  # replaces the schedule for this and later steps
            self.lr_override = float(learning_rate)
        if self.lr_override is not None:
            self._set_lr(self.lr_override)
        applied = self._lr()  # the rate this step uses (a schedule moves it after the step)
        local_norm = self._grad_norm_local() if self.stage == 0 else None
        if self.acc_calls == 0:
            # nothing accumulated: back-propagate a zero loss, so that every ZeRO stage's
            # reduction sees (zero) gradients; the optimizer still steps (momentum, lr schedule)
            self.engine.train()
            self._zero_backward()
        self.engine.step()
        gn = local_norm
        if gn is None:
            raw = self.engine.get_global_grad_norm()
            gn = float(raw) if raw is not None else 0.0
        metrics = {
            "loss": self.acc_loss,
            "num_tokens": self.acc_tokens,
            "grad_norm": float(gn),
            "lr": applied,
            "global_step": int(self.engine.global_steps),
        }
        self._reset_accum()
        return {"metrics": metrics}

    # -- colocation lifecycle ----------------------------------------------------------------

    def op_sleep(self, mode: str = "all") -> dict[str, Any]:
        if not self.cuda:
            return {
                "applied": False,
                "reason": CPU_TRAINER_REASON,
            }
        from .gpu_handoff import offload_trainer

        return offload_trainer(self, mode)

    def op_wake(self) -> dict[str, Any]:
        if not self.cuda:
            return {
                "applied": False,
                "reason": CPU_TRAINER_REASON,
            }
        from .gpu_handoff import reload_trainer

        return reload_trainer(self)


def _lr_scheduler(schedule: Mapping[str, Any] | None) -> Any:
    """DeepSpeed's client scheduler for `lr_scheduler` (train_options.py; stepped by each
    `engine.step()`, saved and loaded with resumable checkpoints), or None."""
    if not schedule:
        return None
    from torch.optim.lr_scheduler import LambdaLR

    sched = dict(schedule)
    return lambda optimizer: LambdaLR(optimizer, lambda t: lr_factor(int(t), sched))
