"""The trainer's weights and checkpoints (a mixin of `TrainingEngine`): full weights in HF names
(ZeRO-3 gathered), their export for weight sync, and resumable / weights-only checkpoints."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from ...rules.lora_config import adapter_sync
from ..errors import WorkerError
from .hf_model import write_hf_dir
from .lora_trainer import ADAPTER
from .tenant_optim import STATE_FILE


class TrainerWeights:
    engine: Any
    stage: int
    model_dir: str
    lora: dict[str, Any] | None  # a LoRA trainer's adapter config (lora_trainer.py)
    adapter_name = ADAPTER  # its PEFT adapter (a LoRA pool's tenant trainer: the tenant's)

    # -- weights -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights in HF names, on CPU (ZeRO-3 parameters gathered first); a LoRA trainer's
        with the adapter merged in."""
        import deepspeed

        module = self.engine.module
        if self.lora is not None:
            from .lora_trainer import merged_state_dict

            return merged_state_dict(module, self.stage, self.adapter_name)
        if self.stage == 3:
            params = list(module.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                return {
                    n: p.detach().clone().cpu().contiguous() for n, p in module.named_parameters()
                }
        return {n: p.detach().cpu().contiguous() for n, p in module.named_parameters()}

    def op_export_weights(self, path: str | None = None, method: str = "shm") -> dict[str, Any]:
        from safetensors.torch import save

        from ..safetensors_stream import write_torch

        t = time.perf_counter()
        if method == "cuda_ipc":
            from .gpu_handoff import trainer_export_gpu

            return trainer_export_gpu(self, method)
        out: dict[str, Any] = {}
        if self.syncs_adapter():  # the adapter only (PROTOCOL.md §3.6)
            from .lora_trainer import adapter_config_json, adapter_tensors

            sd = adapter_tensors(self.engine.module, self.stage, self.adapter_name)
            out["adapter_config"] = adapter_config_json(self.engine.module, self.adapter_name)
        else:  # full weights; an lm_head / embedding adapter merged in (merge-and-push)
            sd = self.state_dict()
        nbytes = sum(v.numel() * v.element_size() for v in sd.values())
        out.update(num_tensors=len(sd), num_bytes=nbytes)
        if path:  # tensor by tensor: no second copy of the weights (safetensors_stream.py)
            tmp = path + ".tmp"
            write_torch(Path(tmp), sd)
            os.replace(tmp, path)
            out["path"] = path
        else:
            out["blob"] = save(sd)
        out["seconds"] = time.perf_counter() - t
        return out

    def syncs_adapter(self) -> bool:
        """A sync sends the adapter (its samplers load adapter versions), not full weights."""
        return adapter_sync(self.lora)

    # -- checkpoints -------------------------------------------------------------------------

    def op_save(
        self, directory: str, tag: str, checkpoint_type: str, client_state: dict[str, Any]
    ) -> dict[str, Any]:
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        client_state = dict(client_state, global_steps=int(self.engine.global_steps))
        if self.lora is not None:
            self._save_lora(root / tag, checkpoint_type, client_state)
        elif checkpoint_type == "weights-only":
            write_hf_dir(self.state_dict(), self.model_dir, root / tag / "hf")
            (root / tag / "client_state.json").write_text(json.dumps(client_state))
        else:
            self.engine.save_checkpoint(str(root), tag=tag, client_state=client_state)
        size = sum(f.stat().st_size for f in (root / tag).rglob("*") if f.is_file())
        return {"size_bytes": size, "global_steps": int(self.engine.global_steps)}

    def _save_lora(self, tag_dir: Path, checkpoint_type: str, cs: dict[str, Any]) -> None:
        """A LoRA checkpoint: the PEFT adapter dir (`adapter/`) and, weights-only, the merged HF
        weights (`hf/`); resumable adds DeepSpeed's state without the frozen base weights."""
        import torch.distributed as dist

        from .lora_trainer import save_adapter_dir, snapshot

        weights_only = checkpoint_type == "weights-only"
        module, name = self.engine.module, self.adapter_name
        adapter, merged = snapshot(module, self.stage, merged=weights_only, adapter=name)
        if not weights_only:
            self.engine.save_checkpoint(
                str(tag_dir.parent),
                tag=tag_dir.name,
                client_state=cs,
                exclude_frozen_parameters=True,
            )
        if dist.is_initialized() and dist.get_rank() != 0:
            return  # rank 0 writes the files (every rank joined the gathers)
        save_adapter_dir(module, adapter, tag_dir / "adapter", name)
        if merged is not None:
            write_hf_dir(merged, self.model_dir, tag_dir / "hf")
            (tag_dir / "client_state.json").write_text(json.dumps(cs))

    def op_load(self, directory: str, tag: str, checkpoint_type: str) -> dict[str, Any]:
        root = Path(directory)
        if self.lora is not None and checkpoint_type == "weights-only":
            from .lora_trainer import load_adapter_dir

            load_adapter_dir(
                self.engine.module, self.stage, root / tag / "adapter", self.adapter_name
            )
            self._refresh_master()
            cs = json.loads((root / tag / "client_state.json").read_text())
        elif checkpoint_type == "weights-only":
            self._load_weights_only(root / tag / "hf" / "model.safetensors")
            cs = json.loads((root / tag / "client_state.json").read_text())
        else:
            self.check_resumable(root / tag)
            path, cs = self.engine.load_checkpoint(
                str(root),
                tag=tag,
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
                # a LoRA checkpoint holds the adapter only: the frozen base stays as loaded
                load_module_strict=self.lora is None,
            )
            if path is None:
                raise WorkerError(
                    "checkpoint_not_found", f"DeepSpeed found no checkpoint {tag!r} in {root}"
                )
        self.engine.optimizer.zero_grad()
        self._reset_accum()  # type: ignore[attr-defined]  # TrainingEngine's
        return {"global_steps": int(self.engine.global_steps), "client_state": cs or {}}

    def check_resumable(self, tag_dir: Path) -> None:
        """Refuse a resumable checkpoint this trainer cannot resume (a LoRA pool tenant's)."""
        if (tag_dir / STATE_FILE).is_file():
            raise WorkerError(
                "invalid_argument",
                "field checkpoint_id: a resumable checkpoint of a job that trained in a LoRA "
                "pool; a job with its own trainer resumes DeepSpeed checkpoints, or loads the "
                "adapter of a weights-only one",
                field="checkpoint_id",
                expected="a resumable checkpoint of a job with its own trainer",
            )

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
        self._refresh_master()

    def _refresh_master(self) -> None:
        # ZeRO 1/2 keep fp32 master copies in the optimizer; refresh them from the module
        opt = self.engine.optimizer
        refresh = getattr(opt, "refresh_fp32_params", None)
        if callable(refresh):
            refresh()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
