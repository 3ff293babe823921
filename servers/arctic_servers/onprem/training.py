"""The training engine (DeepSpeed) and the Hugging Face scoring engine of a worker process.

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

`ScoringEngine` is the `log_prob` sub-job's default engine: the same forward without an optimizer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import losses
from .worker import WorkerError

MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
CPU_TRAINER_REASON = (
    "CPU trainer: nothing to offload (weights and optimizer already live in host memory)"
)
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_ds_env() -> None:
    """Single-process torch.distributed rendezvous for DeepSpeed (no launcher, no MPI)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _unlink_allreduce_buffers() -> None:
    """Unlink DeepSpeed's CPU all-reduce buffers (`/dev/shm`, ~70 MB a rank) as soon as every
    rank has mapped them: the mappings stay valid, and a worker killed with SIGKILL then leaves
    nothing behind. The barrier proves every rank is past DeepSpeed's init (where each rank maps
    all the others' buffers)."""
    from .ranks import remove_shm_buffers

    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()
    remove_shm_buffers(os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT") or 0))


def device() -> torch.device:
    """This rank's device: GPU `LOCAL_RANK` (0 for a single-rank sub-job), or the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK") or 0) % torch.cuda.device_count())


def load_hf_model(model_dir: str, dtype: str, attn: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=_TORCH_DTYPES[dtype], attn_implementation=attn
    )


# ---------------------------------------------------------------------------- batches


class Batch:
    """A forward / forward-backward / log-probs body as tensors (training.proto alignment)."""

    def __init__(self, body: Mapping[str, Any], dev: torch.device) -> None:
        kw: Mapping[str, Any] = body.get("kwargs") or body  # LogProbsRequest is flat
        ids = np.asarray(kw["input_ids"])
        if ids.ndim != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
            raise WorkerError(
                "shape_mismatch",
                f"field input_ids: shape {list(ids.shape)} is not [B >= 1, S >= 1]",
                field="input_ids",
            )
        self.shape = ids.shape
        self.ids = torch.as_tensor(ids.astype(np.int64), device=dev)
        mask = kw.get("attention_mask")
        self.mask_np = (
            np.ones(ids.shape, np.int64)
            if mask is None
            else (np.asarray(mask) != 0).astype(np.int64)
        )
        self.mask = torch.as_tensor(self.mask_np, device=dev)
        pos = kw.get("position_ids")
        if pos is None:
            pos_np = np.clip(np.cumsum(self.mask_np, axis=1) - 1, 0, None)
        else:
            pos_np = np.asarray(pos).astype(np.int64)
        self.pos = torch.as_tensor(pos_np, device=dev)
        labels = kw.get("labels")
        self.labels = (
            None
            if labels is None
            else torch.as_tensor(np.asarray(labels).astype(np.int64), device=dev)
        )
        self.context: dict[str, torch.Tensor | None] = {}
        for k, v in (body.get("context") or {}).items():
            if v is None:
                continue
            arr = np.asarray(v)
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float64 if arr.dtype == np.float64 else np.float32)
            elif arr.dtype.kind in "biu":
                arr = arr.astype(np.int64 if k == "input_ids" else np.float32)
            self.context[k] = torch.as_tensor(arr, device=dev)
        self.processing: dict[str, Any] = dict(body.get("processing") or {})
        self.post = frozenset(str(p) for p in self.processing.get("post") or [])
        # prediction i is valid when columns i and i + 1 are real
        pair = np.zeros(ids.shape, bool)
        pair[:, :-1] = (self.mask_np[:, :-1] != 0) & (self.mask_np[:, 1:] != 0)
        self.pair = pair

    def rows(self, sl: slice) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.ids[sl],
            "attention_mask": self.mask[sl],
            "position_ids": self.pos[sl],
        }

    def out(self, t: torch.Tensor) -> np.ndarray:
        """A shifted [B, S] result as F32, 0 outside real prediction positions."""
        a = t.detach().float().cpu().numpy().astype(np.float32)
        a[~self.pair] = 0.0
        return a


def _loss_processing(body_processing: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body_processing.items() if k != "post"}


class _Forward:
    """Forward passes shared by the trainer and the scorer."""

    model: Any  # called with input_ids / attention_mask / position_ids
    dev: torch.device
    vocab_size: int

    def _logits(self, rows: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.model(**rows, use_cache=False).logits

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

    def _scored(
        self, b: Batch, *, temperature: float, targets: torch.Tensor, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """No-grad shifted log-probs (and entropy) of the whole batch."""
        with torch.no_grad():
            logits = self._logits(b.rows(slice(None)))
            return losses.shifted_logprobs(
                logits, targets, temperature=temperature, with_entropy=entropy, entropy_grad=False
            )

    def forward_result(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """ForwardRequest -> ForwardBackwardResult (log-probs always; loss when asked)."""
        b = Batch(body, self.dev)
        self._check_ids(b)
        proc = b.processing
        with_loss = bool(proc.get("loss_fn"))
        st = losses.parse_processing(_loss_processing(proc)) if with_loss else None
        temp = (
            st.temperature
            if st is not None
            else float((proc.get("config") or {}).get("temperature") or 1.0)
        )
        want_ent = "compute_entropy" in b.post or (st is not None and st.needs_entropy)
        targets = b.ids
        if st is not None and st.loss_fn == "cross_entropy":
            targets = losses.cross_entropy_targets(b.ids, b.labels)
        lp, ent = self._scored(b, temperature=temp, targets=targets, entropy=want_ent)
        metrics: dict[str, Any]
        if st is not None:
            losses.check_context(st, b.context)
            res = losses.compute_loss(
                lp,
                input_ids=b.ids,
                attention_mask=b.mask,
                context=b.context,
                processing=_loss_processing(proc),
                entropy_shifted=ent,
                labels=b.labels,
            )
            metrics = dict(res.metrics)
            loss = float(res.metrics["loss"])
        else:
            loss = 0.0
            metrics = {
                "loss": 0.0,
                "num_tokens": int(b.pair.sum()),
                "num_sequences": int(b.shape[0]),
            }
            if ent is not None:
                metrics["entropy"] = (
                    float(ent[torch.as_tensor(b.pair)].mean()) if b.pair.any() else 0.0
                )
        outputs: dict[str, Any] = {"logprobs_shifted": b.out(lp)}
        if ent is not None and "compute_entropy" in b.post:
            outputs["entropy"] = b.out(ent)
        return {"loss": loss, "metrics": metrics, "outputs": outputs}

    def log_probs_result(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """LogProbsRequest -> ForwardBackwardResult."""
        b = Batch(body, self.dev)
        self._check_ids(b)
        want_ent = bool(body.get("entropy"))
        lp, ent = self._scored(b, temperature=1.0, targets=b.ids, entropy=want_ent)
        outputs: dict[str, Any] = {"logprobs_shifted": b.out(lp)}
        if ent is not None:
            outputs["entropy"] = b.out(ent)
        metrics = {"loss": 0.0, "num_tokens": int(b.pair.sum()), "num_sequences": int(b.shape[0])}
        return {"loss": 0.0, "metrics": metrics, "outputs": outputs}


def _read_vocab(model_dir: str) -> int:
    with open(Path(model_dir) / "config.json") as f:
        return int(json.load(f)["vocab_size"])


def load_state_file(model: Any, *, path: str | None = None, blob: bytes | None = None) -> int:
    """Copy safetensors weights (HF names) into a plain module's parameters."""
    from safetensors.torch import load, load_file

    sd = load_file(path) if path else load(blob or b"")
    params = dict(model.named_parameters())
    missing = [n for n in params if n not in sd]
    if missing:
        raise WorkerError(
            "invalid_argument", f"weights lack {len(missing)} tensors, e.g. {missing[:3]}"
        )
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(sd[n].to(p.dtype))
    return len(sd)


# ---------------------------------------------------------------------------- scorer


class ScoringEngine(_Forward):
    """`log_prob` sub-job: a Hugging Face forward in eval mode (the reference model)."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.manual_seed(int(spec.get("seed") or 0))
        self.spec = dict(spec)
        self.dev = device()
        cfg = spec.get("config") or {}
        self.model = load_hf_model(
            spec["model_dir"],
            spec.get("dtype") or "float32",
            cfg.get("attn_implementation", "eager"),
        )
        self.model.to(self.dev).eval()
        self.vocab_size = _read_vocab(spec["model_dir"])

    def info(self) -> dict[str, Any]:
        return {"engine": "hf", "vocab_size": self.vocab_size, "device": str(self.dev)}

    def op_forward(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.forward_result(body)

    def op_log_probs(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.log_probs_result(body)

    def op_load_weights(
        self, path: str | None = None, blob: bytes | None = None, method: str = "shm", **_: Any
    ) -> dict[str, Any]:
        if method in ("cuda_ipc", "nccl"):
            raise WorkerError(
                "unsupported_option",
                f"the HF log-prob engine takes weights by shm or safetensors, not {method}",
                options=["method"],
            )
        t = time.perf_counter()
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


# ---------------------------------------------------------------------------- trainer


def ds_config(conf: Mapping[str, Any], dtype: str, *, cuda: bool) -> dict[str, Any]:
    """The DeepSpeed config of a training sub-job (training_config keys, then `deepspeed`)."""
    opt = dict(conf.get("optimizer") or {})
    name = str(opt.pop("name", None) or opt.pop("type", None) or "adamw").lower()
    opt.pop("type", None)
    params: dict[str, Any] = {"lr": float(opt.get("lr", 1e-5))}
    if name in ("adamw", "adam"):
        params["betas"] = list(opt.get("betas", (0.9, 0.999)))
        params["eps"] = float(opt.get("eps", 1e-8))
        params["weight_decay"] = float(opt.get("weight_decay", 0.0 if name == "adam" else 0.01))
        if not cuda:
            params["torch_adam"] = True  # DeepSpeed's fused CPU Adam is a 40 s JIT build
    else:
        params["momentum"] = float(opt.get("momentum", 0.0))
        params["weight_decay"] = float(opt.get("weight_decay", 0.0))
    micro = int(conf.get("micro_batch_size") or 1)
    train_batch = conf.get("train_batch_size")
    gas = max(1, int(train_batch) // micro) if train_batch else 1
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": float(conf.get("gradient_clipping", 1.0)),
        "steps_per_print": 10**12,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16"},
        "optimizer": {
            "type": {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}[name],
            "params": params,
        },
        "zero_optimization": {"stage": int(conf.get("zero_stage", 1))},
    }
    if cfg["zero_optimization"]["stage"] == 3:
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    _merge(cfg, dict(conf.get("deepspeed") or {}))
    # The protocol's accumulation contract (module docstring); not overridable.
    cfg["managed_gradient_accumulation"] = False
    return cfg


def _merge(dst: dict[str, Any], src: Mapping[str, Any]) -> None:
    for k, v in src.items():
        if isinstance(v, Mapping) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


class TrainingEngine(_Forward):
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
        torch.manual_seed(int(spec.get("seed") or 0))
        model = load_hf_model(
            spec["model_dir"], self.dtype, self.conf.get("attn_implementation", "eager")
        )
        model.train()
        t_model = time.perf_counter()
        self.ds_config = ds_config(self.conf, self.dtype, cuda=self.cuda)
        engine, _opt, _dl, _sched = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=self.ds_config,
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
            "engine": "deepspeed",
            "zero_stage": self.stage,
            "vocab_size": self.vocab_size,
            "device": str(self.dev),
            "optimizer": type(self.engine.optimizer).__name__,
            "lr": self._lr(),
            "micro_batch_size": self.micro_batch_size,
            "threads": torch.get_num_threads(),
            **self.timings,
        }

    def _reset_accum(self) -> None:
        self.acc_loss, self.acc_tokens, self.acc_calls = 0.0, 0, 0

    def _lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.engine.destroy()

    # -- forward / backward ------------------------------------------------------------------

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

    def op_forward_backward(self, body: Mapping[str, Any]) -> dict[str, Any]:
        b = Batch(body, self.dev)
        self._check_ids(b)
        proc = _loss_processing(b.processing)
        st = losses.parse_processing(proc)
        losses.check_context(st, b.context)
        want_ent = st.needs_entropy or "compute_entropy" in b.post
        targets = b.ids
        if st.loss_fn == "cross_entropy":
            targets = losses.cross_entropy_targets(b.ids, b.labels)
        n_rows = int(b.shape[0])
        mbs = self.micro_batch_size or n_rows
        self.engine.train()

        def loss_of(lp: torch.Tensor, ent: torch.Tensor | None) -> losses.LossResult:
            return losses.compute_loss(
                lp,
                input_ids=b.ids,
                attention_mask=b.mask,
                context=b.context,
                processing=proc,
                entropy_shifted=ent,
                labels=b.labels,
            )

        if n_rows <= mbs:
            logits = self._logits(b.rows(slice(None)))
            lp, ent = losses.shifted_logprobs(
                logits,
                targets,
                temperature=st.temperature,
                with_entropy=want_ent,
                entropy_grad=st.needs_entropy,
            )
            res = loss_of(lp, ent)
            self.engine.backward(res.loss, scale_wrt_gas=False)
            del logits
        else:
            # 1) no-grad log-probs of the whole call; 2) d loss / d log-probs; 3) per micro-batch
            # backward of <log-probs, that gradient> (exact chain rule, one micro-batch alive).
            lps, ents = [], []
            with torch.no_grad():
                for r in range(0, n_rows, mbs):
                    sl = slice(r, r + mbs)
                    lp_mb, ent_mb = losses.shifted_logprobs(
                        self._logits(b.rows(sl)),
                        targets[sl],
                        temperature=st.temperature,
                        with_entropy=want_ent,
                        entropy_grad=False,
                    )
                    lps.append(lp_mb)
                    if ent_mb is not None:
                        ents.append(ent_mb)
            lp = torch.cat(lps).requires_grad_(True)
            ent = torch.cat(ents) if ents else None
            leaves = [lp]
            if ent is not None and st.needs_entropy:
                ent.requires_grad_(True)
                leaves.append(ent)
            res = loss_of(lp, ent)
            grads = torch.autograd.grad(res.loss, leaves, allow_unused=True)
            g_lp = grads[0] if grads[0] is not None else torch.zeros_like(lp)
            g_ent = grads[1] if len(grads) > 1 and grads[1] is not None else None
            for r in range(0, n_rows, mbs):
                sl = slice(r, r + mbs)
                lp_mb, ent_mb = losses.shifted_logprobs(
                    self._logits(b.rows(sl)),
                    targets[sl],
                    temperature=st.temperature,
                    with_entropy=g_ent is not None,
                    entropy_grad=True,
                )
                surrogate = (lp_mb * g_lp[sl]).sum()
                if g_ent is not None and ent_mb is not None:
                    surrogate = surrogate + (ent_mb * g_ent[sl]).sum()
                self.engine.backward(surrogate, scale_wrt_gas=False)
        metrics = dict(res.metrics)
        self.acc_loss += float(metrics["loss"])
        self.acc_tokens += int(metrics["num_tokens"])
        self.acc_calls += 1
        metrics["global_step"] = int(self.engine.global_steps)
        outputs: dict[str, Any] = {}
        if "compute_logprobs" in b.post:
            outputs["logprobs_shifted"] = b.out(lp)
        if "compute_entropy" in b.post and ent is not None:
            outputs["entropy"] = b.out(ent)
        return {"loss": float(metrics["loss"]), "metrics": metrics, "outputs": outputs}

    # -- step ------------------------------------------------------------------------------

    def _set_lr(self, lr: float) -> None:
        groups = []
        opt = self.engine.optimizer
        for o in (opt, getattr(opt, "optimizer", None)):
            if o is not None and hasattr(o, "param_groups"):
                groups += list(o.param_groups)
        for g in groups:
            g["lr"] = lr

    def _grad_norm_local(self) -> float:
        norms = [
            p.grad.detach().float().norm()
            for p in self.engine.module.parameters()
            if p.grad is not None
        ]
        return float(torch.stack(norms).norm()) if norms else 0.0

    def op_step(self, learning_rate: float | None = None) -> dict[str, Any]:
        if learning_rate is not None:
            self._set_lr(float(learning_rate))
        local_norm = self._grad_norm_local() if self.stage == 0 else None
        if self.acc_calls == 0:
            # nothing accumulated: back-propagate a zero loss, so that every ZeRO stage's
            # reduction sees (zero) gradients; the optimizer still steps (momentum, lr schedule)
            self.engine.train()
            ids = torch.zeros((1, 1), dtype=torch.long, device=self.dev)
            logits = self._logits(
                {
                    "input_ids": ids,
                    "attention_mask": torch.ones_like(ids),
                    "position_ids": torch.zeros_like(ids),
                }
            )
            self.engine.backward(logits.float().sum() * 0.0, scale_wrt_gas=False)
        self.engine.step()
        gn = local_norm
        if gn is None:
            raw = self.engine.get_global_grad_norm()
            gn = float(raw) if raw is not None else 0.0
        metrics = {
            "loss": self.acc_loss,
            "num_tokens": self.acc_tokens,
            "grad_norm": float(gn),
            "lr": self._lr(),
            "global_step": int(self.engine.global_steps),
        }
        self._reset_accum()
        return {"metrics": metrics}

    # -- weights -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights in HF names, on CPU (ZeRO-3 parameters gathered first)."""
        import deepspeed

        module = self.engine.module
        if self.stage == 3:
            params = list(module.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                return {
                    n: p.detach().clone().cpu().contiguous() for n, p in module.named_parameters()
                }
        return {n: p.detach().cpu().contiguous() for n, p in module.named_parameters()}

    def op_export_weights(self, path: str | None = None, method: str = "shm") -> dict[str, Any]:
        from safetensors.torch import save, save_file

        t = time.perf_counter()
        if method in ("cuda_ipc", "nccl"):
            from .weight_sync import trainer_export_gpu

            return trainer_export_gpu(self, method)
        sd = self.state_dict()
        nbytes = sum(v.numel() * v.element_size() for v in sd.values())
        out: dict[str, Any] = {"num_tensors": len(sd), "num_bytes": nbytes}
        if path:
            tmp = path + ".tmp"
            save_file(sd, tmp)
            os.replace(tmp, path)
            out["path"] = path
        else:
            out["blob"] = save(sd)
        out["seconds"] = time.perf_counter() - t
        return out

    def op_nccl_broadcast(self, host: str, port: int) -> dict[str, Any]:  # pragma: no cover - GPU
        from .weight_sync import trainer_nccl_broadcast

        return trainer_nccl_broadcast(self, host, port)

    # -- checkpoints -------------------------------------------------------------------------

    def op_save(
        self, directory: str, tag: str, checkpoint_type: str, client_state: dict[str, Any]
    ) -> dict[str, Any]:
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        client_state = dict(client_state, global_steps=int(self.engine.global_steps))
        if checkpoint_type == "weights-only":
            write_hf_dir(self.state_dict(), self.model_dir, root / tag / "hf")
            (root / tag / "client_state.json").write_text(json.dumps(client_state))
        else:
            self.engine.save_checkpoint(str(root), tag=tag, client_state=client_state)
        size = sum(f.stat().st_size for f in (root / tag).rglob("*") if f.is_file())
        return {"size_bytes": size, "global_steps": int(self.engine.global_steps)}

    def op_load(self, directory: str, tag: str, checkpoint_type: str) -> dict[str, Any]:
        root = Path(directory)
        if checkpoint_type == "weights-only":
            self._load_weights_only(root / tag / "hf" / "model.safetensors")
            cs = json.loads((root / tag / "client_state.json").read_text())
        else:
            path, cs = self.engine.load_checkpoint(
                str(root), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
            )
            if path is None:
                raise WorkerError(
                    "checkpoint_not_found", f"DeepSpeed found no checkpoint {tag!r} in {root}"
                )
        self.engine.optimizer.zero_grad()
        self._reset_accum()
        return {"global_steps": int(self.engine.global_steps), "client_state": cs or {}}

    def _load_weights_only(self, path: Path) -> None:
        import deepspeed
        from safetensors.torch import load_file

        sd = load_file(str(path))
        module = self.engine.module
        params = list(module.parameters())
        ctx = (
            deepspeed.zero.GatheredParameters(params, modifier_rank=0)
            if self.stage == 3
            else _Null()
        )
        with ctx, torch.no_grad():
            for n, p in module.named_parameters():
                p.copy_(sd[n].to(p.dtype))
        # ZeRO 1/2 keep fp32 master copies in the optimizer; refresh them from the module
        opt = self.engine.optimizer
        refresh = getattr(opt, "refresh_fp32_params", None)
        if callable(refresh):
            refresh()

    # -- colocation lifecycle ----------------------------------------------------------------

    def op_sleep(self, mode: str = "all") -> dict[str, Any]:
        if not self.cuda:
            return {
                "applied": False,
                "reason": CPU_TRAINER_REASON,
            }
        from .weight_sync import offload_trainer

        return offload_trainer(self, mode)

    def op_wake(self) -> dict[str, Any]:
        if not self.cuda:
            return {
                "applied": False,
                "reason": CPU_TRAINER_REASON,
            }
        from .weight_sync import reload_trainer

        return reload_trainer(self)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def write_hf_dir(sd: Mapping[str, torch.Tensor], model_dir: str, out: Path) -> list[Path]:
    """A Hugging Face directory: model.safetensors + the source model's config and tokenizer."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in sd.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    files = [out / "model.safetensors"]
    for name in MODEL_FILES:
        src = Path(model_dir) / name
        if src.is_file():
            shutil.copyfile(src, out / name)
            files.append(out / name)
    return files
