"""The fake engine: the on-prem engines' command set over the fake gateway's numerics.

A gateway worker runs it in place of DeepSpeed / vLLM for tests, the kill matrix, the load test
and the Ray test: pure, fast and deterministic (`engines/fake/NUMERICS.md`). One engine is one
sub-job: the trainer keeps the model step, the gradients and the optimizer counters; a sampler
keeps the model step and weight version it was last synced to. `stats()` exposes the counters a
crash test checks: optimizer steps applied and how often each request id and idempotency key ran.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from arctic_sdk.spec.tables import methods as M

from ...rules.errors import ProtocolError
from ...rules.lora_config import adapter_sync
from ..losses.table import LossSettings
from ..worker.commands import Command
from ..worker.engine_base import EngineBase
from . import checkpoints as fake_ckpt
from . import numerics as nx
from . import sampling, training
from .state import Checkpoint

DEFAULT_VOCAB = 151_936
NOTHING = {"applied": False, "reason": "fake engine: nothing to offload"}


def adam_defaults(opt: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, float]:
    """The Adam hyper-parameters a training sub-job starts with (`training_config.optimizer`,
    `gradient_clipping`; the DeepSpeed trainer's defaults), as `StepRequest.adam` names them."""
    betas = opt.get("betas") or (0.9, 0.999)
    return {
        "beta1": float(betas[0]),
        "beta2": float(betas[1]),
        "eps": float(opt.get("eps", 1e-8)),
        "weight_decay": float(opt.get("weight_decay", 0.01)),
        "gradient_clipping": float(config.get("gradient_clipping", 1.0)),
    }


class FakeEngine(EngineBase):
    def __init__(self, spec: Mapping[str, Any]) -> None:
        es: Mapping[str, Any] = spec.get("engine_spec") or {}
        self.role = str(spec.get("role") or "training")
        self.sub_job_id = str(spec.get("sub_job_id") or "")
        self.config: dict[str, Any] = dict(es.get("config") or {})
        self.model_name = str(es.get("model_name") or "")
        self.vocab = int(es.get("vocab_size") or DEFAULT_VOCAB)
        # the sampler's context: the sub-job's max_seq_len, else the fake model's
        self.max_seq_len = sampling.context_length(int(self.config.get("max_seq_len") or 0))
        self.latency: dict[str, float] = {
            str(k): float(v) for k, v in (es.get("latency_s") or {}).items()
        }
        raw = self.config.get("optimizer")
        opt: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        lr = opt.get("lr")
        self.lr = float(lr) if isinstance(lr, int | float) else 1e-5
        self.optimizer = str(opt.get("name") or opt.get("type") or "adamw").lower()
        self.adam = adam_defaults(opt, self.config)
        self.model_step = 0
        self.global_step = 0
        self.weight_version = 0
        self.grad: dict[int, float] = {}
        self.accum_loss, self.accum_tokens, self.last_loss = 0.0, 0, 0.0
        self.applied_steps = 0
        self.executed: collections.Counter[str] = collections.Counter()
        self.keys: collections.Counter[str] = collections.Counter()
        self.ops: collections.Counter[str] = collections.Counter()
        self._cancel: threading.Event | None = None

    def info(self) -> dict[str, Any]:
        return {
            "engine": "fake",
            "role": self.role,
            "vocab_size": self.vocab,
            "max_model_len": self.max_seq_len,
        }

    def note(self, meta: Mapping[str, Any], cancel: threading.Event) -> None:
        """Called by the worker host before each command: who asked, and its cancel flag."""
        self._cancel = cancel
        rid, key = meta.get("request_id"), meta.get("idempotency_key")
        if rid:
            self.executed[str(rid)] += 1
        if key:
            self.keys[f"{meta.get('op')}:{key}"] += 1
        self.ops[str(meta.get("op") or "")] += 1

    def _begin(self, cmd: str) -> None:
        """The command's test latency, in slices: a cancel is honoured between them."""
        delay = self.latency.get(cmd, 0.0)
        end = time.monotonic() + delay
        while time.monotonic() < end:
            if self._cancel is not None and self._cancel.is_set():
                raise ProtocolError("request_cancelled", f"{cmd} was cancelled while it ran")
            time.sleep(min(0.02, max(0.0, end - time.monotonic())))

    def stats(self) -> dict[str, Any]:
        return {
            "applied_steps": self.applied_steps,
            "global_step": self.global_step,
            "model_step": self.model_step,
            "weight_version": self.weight_version,
            "adam": dict(self.adam),
            "executed": dict(self.executed),
            "keys": dict(self.keys),
            "ops": dict(self.ops),
        }

    # ------------------------------------------------------------------ training

    def commands(self) -> dict[str, Command]:
        """The worker commands this engine runs (`engines/worker/commands.py`)."""
        return {
            M.FORWARD_BACKWARD.python_name: self.op_forward_backward,
            M.FORWARD.python_name: self.op_forward,
            M.LOG_PROBS.python_name: self.op_log_probs,
            M.STEP.python_name: self.op_step,
            M.GENERATE.python_name: self.op_generate,
            "export_weights": self.op_export_weights,
            "load_weights": self.op_load_weights,
            M.RESET_PREFIX_CACHE.python_name: self.op_reset_prefix_cache,
            "sleep": self.op_sleep,
            "wake": self.op_wake,
            "save": self.op_save,  # not-an-op
            "load": self.op_load,  # not-an-op
        }

    def _train_call(self, body: Mapping[str, Any], loss: LossSettings | None) -> training.TrainCall:
        """The call of a training body: checked here, unless its server's check (the per-op
        table, `engines/op_checks.py`) already did, in this process, and hands its `loss`."""
        if loss is None:
            return training.parse_train(body, self.vocab)
        return training.to_call(body, loss)

    def op_forward_backward(
        self, body: Mapping[str, Any], loss: LossSettings | None = None
    ) -> dict[str, Any]:
        self._begin(M.FORWARD_BACKWARD.python_name)
        call = self._train_call(body, loss)
        result, lr = training.run(call, self.model_step, forward=False)
        assert lr is not None
        for t, g in lr.grad.items():
            self.grad[t] = self.grad.get(t, 0.0) + g
        self.accum_loss += lr.loss
        self.accum_tokens += int(lr.metrics["num_tokens"])
        result["metrics"]["global_step"] = self.global_step
        return result

    def op_forward(
        self, body: Mapping[str, Any], loss: LossSettings | None = None
    ) -> dict[str, Any]:
        self._begin(M.FORWARD.python_name)
        call = self._train_call(body, loss)
        result, _ = training.run(call, self.model_step, forward=True)
        result["metrics"]["global_step"] = self.global_step
        return result

    def op_log_probs(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self._begin(M.LOG_PROBS.python_name)
        result = training.log_probs(body, self.vocab, self.model_step)
        result["metrics"]["global_step"] = self.global_step
        return result

    def op_step(
        self, learning_rate: float | None = None, adam: Mapping[str, float] | None = None
    ) -> dict[str, Any]:
        self._begin(M.STEP.python_name)
        if adam and self.optimizer not in ("adam", "adamw"):
            raise ProtocolError(
                "unsupported_option",
                f"field adam: this job's optimizer is {self.optimizer!r}, not Adam or AdamW",
                field="adam",
            )
        if learning_rate is not None:
            self.lr = float(learning_rate)
        self.adam.update(adam or {})  # recorded (NUMERICS.md §4): the fake has no moments
        norm = nx.grad_norm(self.grad)
        self.applied_steps += 1
        self.global_step += 1
        self.model_step = self.global_step
        metrics = {
            "loss": self.accum_loss,
            "num_tokens": self.accum_tokens,
            "grad_norm": norm,
            "lr": self.lr,
            "global_step": self.global_step,
        }
        self.last_loss = self.accum_loss
        self.grad.clear()
        self.accum_loss, self.accum_tokens = 0.0, 0
        return {"metrics": metrics}

    # ------------------------------------------------------------------ sampling

    def op_generate(
        self,
        prompts: Sequence[Any],
        sampling_params: Mapping[str, Any],
        strict: bool = False,
        weight_version: int = 0,
        adapter: str = "",
        clamp_max_tokens: bool = False,
    ) -> dict[str, Any]:
        self._begin(M.GENERATE.python_name)
        body = {
            "prompts": list(prompts),
            "sampling_params": dict(sampling_params or {}),
            "clamp_max_tokens": clamp_max_tokens,
        }
        p = sampling.parse_params(body)
        ids_list = sampling.prompt_ids(body, self.vocab, self.max_seq_len)
        budgets = sampling.budgets(body, ids_list, p, self.max_seq_len)
        seed = p.seed if p.seed is not None else sampling.draw_seed()
        if adapter:  # "base": a LoRA job's base model, version 0 (NUMERICS.md §6)
            results = sampling.completions(ids_list, p, seed, 0, 0, budgets)
            return {"results": results, "weight_version": 0}
        self.weight_version = int(weight_version)
        results = sampling.completions(
            ids_list, p, seed, self.weight_version, self.model_step, budgets
        )
        return {"results": results, "weight_version": self.weight_version}

    # ------------------------------------------------------------------ weights

    def op_export_weights(self, path: str | None = None, method: str = "") -> dict[str, Any]:
        blob = json.dumps({"model_step": self.model_step}).encode()
        out: dict[str, Any] = {"num_tensors": 1, "num_bytes": 4 * 259}
        lora = self.config.get("lora")
        if isinstance(lora, Mapping) and adapter_sync(lora):  # the adapter: A and B (NUMERICS §6)
            out.update(num_tensors=2, num_bytes=2 * 4 * 259 * int(lora["rank"]))
        if path:
            Path(path).write_bytes(blob)
            out["path"] = path
        else:
            out["blob"] = blob
        return out

    def op_load_weights(
        self, path: str | None = None, blob: bytes | None = None, **_: Any
    ) -> dict[str, Any]:
        data = Path(path).read_bytes() if path else (blob or b"{}")
        self.model_step = int(json.loads(data).get("model_step", 0))
        return {"num_tensors": 1, "model_step": self.model_step}

    def op_reset_prefix_cache(self) -> dict[str, Any]:
        return {"reset": True}

    def op_sleep(self, **_: Any) -> dict[str, Any]:
        return dict(NOTHING)

    def op_wake(self, **_: Any) -> dict[str, Any]:
        return dict(NOTHING)

    # ------------------------------------------------------------------ checkpoints

    def _state_file(self, directory: str, tag: str) -> Path:
        return Path(directory) / tag / "fake_state.json"

    def op_save(
        self, directory: str, tag: str, checkpoint_type: str, client_state: Mapping[str, Any]
    ) -> dict[str, Any]:
        self._begin("save")  # not-an-op
        f = self._state_file(directory, tag)
        f.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "checkpoint_type": checkpoint_type,
            "global_step": self.global_step,
            "model_step": self.model_step,
            "lr": self.lr,
            "avg_loss": self.last_loss,
            "model_name": self.model_name,
            "client_state": dict(client_state),
        }
        f.write_text(json.dumps(state))
        return {"global_steps": self.global_step, "size_bytes": f.stat().st_size}

    def op_load(self, directory: str, tag: str, checkpoint_type: str) -> dict[str, Any]:
        state = json.loads(self._state_file(directory, tag).read_text())
        resumable = state.get("checkpoint_type") == "resumable"
        self.restore(
            int(state["model_step"]), int(state["global_step"]), float(state["lr"]), resumable
        )
        return {"global_steps": self.global_step, "model_step": self.model_step}

    def restore(self, model_step: int, global_step: int, lr: float, resumable: bool) -> None:
        """Load a checkpoint's state: the weights (model step) always; a trainer loading a
        resumable checkpoint also takes its step and learning rate and drops the gradients it
        had accumulated (NUMERICS.md §6)."""
        self.model_step = model_step
        if self.role == "training" and resumable:
            self.global_step, self.lr = global_step, lr
            self.grad.clear()
            self.accum_loss, self.accum_tokens = 0.0, 0


def export_checkpoint(directory: Path, tag: str, out: Path) -> list[str]:
    """Write a saved checkpoint's exported files (NUMERICS.md: three small real files)."""
    ckpt = _checkpoint(directory, tag)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in fake_ckpt.files(ckpt).items():
        (out / name).write_bytes(data)
    return sorted(fake_ckpt.FILES)


def export_peft(directory: Path, tag: str, out: Path, lora: Mapping[str, Any]) -> list[str]:
    """A LoRA checkpoint's PEFT export (NUMERICS.md §6), as the fake server writes it."""
    out.mkdir(parents=True, exist_ok=True)
    files = fake_ckpt.peft_files(_checkpoint(directory, tag), lora)
    for name, data in files.items():
        (out / name).write_bytes(data)
    return sorted(files)


def _checkpoint(directory: Path, tag: str) -> Checkpoint:
    state = json.loads((directory / tag / "fake_state.json").read_text())
    return Checkpoint(
        checkpoint_id=directory.name,
        checkpoint_type=str(state["checkpoint_type"]),
        global_step=int(state["global_step"]),
        model_step=int(state["model_step"]),
        lr=float(state["lr"]),
        avg_loss=float(state["avg_loss"]),
        created_at=time.time(),
        model_name=str(state.get("model_name") or ""),
    )
