"""Log-prob forward passes (`_Forward`, shared with the trainer) and the Hugging Face scoring
engine.

`ScoringEngine` is the `log_prob` sub-job's default engine: the same forward without an optimizer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch

from arctic_sdk.spec.tables import methods as M

from ..errors import WorkerError
from ..losses import torch_losses as losses
from ..weight_transfer.member import GroupMember, receive_into_module
from ..worker.commands import Command
from ..worker.engine_base import EngineBase
from .batch import Batch
from .call_loss import _loss_processing, batch_loss, fb_targets
from .ds_setup import device
from .hf_model import _read_vocab, enable_determinism, load_hf_model, load_state_file

#: `_Forward._scored`'s signature: (batch, temperature, targets, entropy) -> (log-probs, entropy)
Scored = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


class _Forward(EngineBase):
    """Forward passes shared by the trainer and the scorer."""

    model: Any  # called with input_ids / attention_mask / position_ids
    dev: torch.device
    vocab_size: int

    def _logits(self, rows: Mapping[str, torch.Tensor]) -> torch.Tensor:
        # a Hugging Face causal LM (or a LoRA tenant forwarding to one): its logits are a tensor
        return cast(torch.Tensor, self.model(**rows, use_cache=False).logits)

    def _logprobs(
        self,
        b: Batch,
        sl: slice,
        targets: torch.Tensor,
        *,
        temperature: float,
        entropy: bool,
        entropy_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Shifted log-probs (and entropy) of the rows `sl` of `b`."""
        return losses.shifted_logprobs(
            self._logits(b.rows(sl)),
            targets[sl],
            temperature=temperature,
            with_entropy=entropy,
            entropy_grad=entropy_grad,
        )

    def _check_ids(self, b: Batch) -> None:
        real = b.ids[b.mask != 0]
        if real.numel() and (int(real.min()) < 0 or int(real.max()) >= self.vocab_size):
            bad = int(real[(real < 0) | (real >= self.vocab_size)][0])
            raise WorkerError(
                "invalid_argument",
                f"field input_ids: token id {bad} is outside [0, {self.vocab_size})",
                field="input_ids",
                expected=f"ids in [0, {self.vocab_size})",
            )

    def _checked_call(self, body: Mapping[str, Any]) -> tuple[Batch, dict[str, Any], Any]:
        """A forward / forward-backward body checked: its batch, its loss's processing and
        settings (`loss_fn` defaults to cross_entropy)."""
        b = Batch(body, self.dev)
        self._check_ids(b)
        proc = _loss_processing(b.processing)
        st = losses.parse_processing(proc)
        losses.check_context(st, b.context)
        return b, proc, st

    def _scored(
        self, b: Batch, *, temperature: float, targets: torch.Tensor, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """No-grad shifted log-probs (and entropy) of the whole batch: the scorer's passes (the
        trainer overrides this with forward-backward's passes, `TrainingEngine._scored`)."""
        with torch.no_grad():
            return self._logprobs(
                b,
                slice(None),
                targets,
                temperature=temperature,
                entropy=entropy,
                entropy_grad=False,
            )

    def forward_result(
        self, body: Mapping[str, Any], scored: Scored | None = None
    ) -> dict[str, Any]:
        """ForwardRequest -> ForwardBackwardResult: log-probs always, and the loss and metrics
        forward-backward would report (`loss_fn` defaults to cross_entropy in both). `scored`
        computes the log-probs (default: `_scored`; the multi-rank trainer's runs on its ranks)."""
        b, proc, st = self._checked_call(body)
        want_ent = "compute_entropy" in b.post or st.needs_entropy
        lp, ent = (scored or self._scored)(
            b, temperature=st.temperature, targets=fb_targets(b, st), entropy=want_ent
        )
        res = batch_loss(b, proc, lp, ent)
        metrics: dict[str, Any] = dict(res.metrics)
        loss = float(res.metrics["loss"])
        outputs: dict[str, Any] = {"logprobs_shifted": b.out(lp)}
        if ent is not None and "compute_entropy" in b.post:
            outputs["entropy"] = b.out(ent)
        return {"loss": loss, "metrics": metrics, "outputs": outputs}

    def log_probs_result(
        self, body: Mapping[str, Any], scored: Scored | None = None
    ) -> dict[str, Any]:
        """LogProbsRequest -> ForwardBackwardResult."""
        b = Batch(body, self.dev)
        self._check_ids(b)
        want_ent = bool(body.get("entropy"))
        lp, ent = (scored or self._scored)(b, temperature=1.0, targets=b.ids, entropy=want_ent)
        outputs: dict[str, Any] = {"logprobs_shifted": b.out(lp)}
        if ent is not None:
            outputs["entropy"] = b.out(ent)
        metrics = {"loss": 0.0, "num_tokens": int(b.pair.sum()), "num_sequences": int(b.shape[0])}
        return {"loss": 0.0, "metrics": metrics, "outputs": outputs}


class ScoringEngine(GroupMember, _Forward):
    """`log_prob` sub-job: a Hugging Face forward in eval mode (the reference model)."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        seed = int(spec.get("seed") or 0)
        self.spec = dict(spec)
        cfg = spec.get("config") or {}
        self.deterministic = enable_determinism(cfg, seed)
        torch.manual_seed(seed)
        self.dev = device()
        self.attn_requested = str(cfg.get("attn_implementation") or "eager")
        self.model = load_hf_model(
            spec["model_dir"], spec.get("dtype") or "float32", self.attn_requested
        )
        self.model.to(self.dev).eval()
        self.vocab_size = _read_vocab(spec["model_dir"])

    def info(self) -> dict[str, Any]:
        module = getattr(self.model, "module", self.model)
        return {
            "engine": "hf",
            "vocab_size": self.vocab_size,
            "device": str(self.dev),
            "attn_implementation": str(module.config._attn_implementation),
            "attn_requested": self.attn_requested,
            "full_determinism": self.deterministic,
        }

    def commands(self) -> dict[str, Command]:
        """The worker commands this engine runs (`engines/worker/commands.py`)."""
        return {
            M.FORWARD.python_name: self.op_forward,
            M.LOG_PROBS.python_name: self.op_log_probs,
            "load_weights": self.op_load_weights,
            M.RESET_PREFIX_CACHE.python_name: self.op_reset_prefix_cache,
            "sleep": self.op_sleep,
            "wake": self.op_wake,
            **self.group_commands(),
        }

    def op_forward(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.forward_result(body)

    def op_log_probs(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.log_probs_result(body)

    ENGINE_NAME = "HF"

    def refuse_gpu_method(self, method: str) -> None:
        """A log-prob engine takes weights by file, bytes or the weight group (the server sends
        `nccl` as `collective`; cuda_ipc is the sampler's)."""
        if method not in ("shm", "safetensors", "collective"):
            raise WorkerError(
                "unsupported_option",
                f"the {self.ENGINE_NAME} log-prob engine takes weights by shm, safetensors or "
                f"the collective weight group, not {method}",
                options=["method"],
            )

    def op_load_weights(
        self,
        path: str | None = None,
        blob: bytes | None = None,
        method: str = "shm",
        group_id: str = "",
        weight_version: int = 0,
        **_: Any,
    ) -> dict[str, Any]:
        self.refuse_gpu_method(method)
        t = time.perf_counter()
        if method == "collective":
            params = dict(self.model.named_parameters())
            return receive_into_module(self, params, group_id, int(weight_version))
        n = load_state_file(self.model, path=path, blob=blob)
        return {"num_tensors": n, "seconds": time.perf_counter() - t}

    def op_reset_prefix_cache(self) -> dict[str, Any]:
        return {"reset": True}

    def op_sleep(self, **_: Any) -> dict[str, Any]:
        return {"applied": False, "reason": "the HF log-prob engine has nothing to offload"}

    def op_wake(self, **_: Any) -> dict[str, Any]:
        return {"applied": False, "reason": "the HF log-prob engine has nothing to offload"}

    def close(self) -> None:
        pass
