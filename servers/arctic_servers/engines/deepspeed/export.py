"""Export a checkpoint as a Hugging Face directory (runs as its own process).

    python -m arctic_servers.engines.deepspeed.export --checkpoint CKPT/ds --type resumable \
        --model-dir MODEL --dtype float32 --out OUT

A resumable checkpoint is consolidated from DeepSpeed's files with `zero_to_fp32` (ZeRO 1-3; the
module state of a ZeRO-0 checkpoint is read directly), cast to the training dtype, and written as
`model.safetensors` next to the source model's config and tokenizer files: a directory that
`transformers` and vLLM load as they are. A weights-only checkpoint already is one; it is copied.
A LoRA checkpoint (an `adapter/` PEFT directory beside DeepSpeed's adapter-only state) exports
the base model with the adapter merged in.
The server runs this in a subprocess so that an export neither needs a live training worker nor
competes with one for its memory.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

from .ds_setup import set_ds_env
from .hf_model import MODEL_FILES, write_hf_dir

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def consolidate(ckpt: Path) -> dict[str, torch.Tensor]:
    """Full weights (HF names) of a DeepSpeed checkpoint tag directory."""
    if any(ckpt.glob("zero_pp_rank_*")):  # ZeRO 1-3: partitioned fp32 master weights
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        sd = get_fp32_state_dict_from_zero_checkpoint(str(ckpt.parent), tag=ckpt.name)
        return {k: v for k, v in sd.items()}
    states = sorted(ckpt.glob("mp_rank_*_model_states.pt"))
    if not states:
        raise SystemExit(f"no DeepSpeed model states under {ckpt}")
    obj = torch.load(states[0], map_location="cpu", weights_only=False)
    return dict(obj["module"])


def merge_adapter(model_dir: Path, adapter: Path) -> dict[str, torch.Tensor]:
    """The full HF weights of the base model with a PEFT adapter directory merged in."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    return {k: v.detach().contiguous() for k, v in merged.state_dict().items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m arctic_servers.engines.deepspeed.export")
    ap.add_argument(
        "--checkpoint", type=Path, required=True, help="the checkpoint's DeepSpeed tag dir"
    )
    ap.add_argument("--type", default="resumable", choices=("resumable", "weights-only"))
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--dtype", default="float32", choices=sorted(_DTYPES))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.type == "weights-only":
        src = args.checkpoint / "hf"
        args.out.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.is_file():
                shutil.copyfile(f, args.out / f.name)
        return 0
    set_ds_env()
    adapter = args.checkpoint / "adapter"
    if (adapter / "adapter_config.json").is_file():  # a LoRA checkpoint: base + its adapter
        sd = merge_adapter(args.model_dir, adapter)
    else:
        sd = consolidate(args.checkpoint)
    dt = _DTYPES[args.dtype]
    sd = {k: v.to(dt) if v.is_floating_point() else v for k, v in sd.items()}
    files = write_hf_dir(sd, str(args.model_dir), args.out)
    missing = [n for n in ("config.json",) if not (args.out / n).is_file()]
    if missing:
        raise SystemExit(
            f"the source model {args.model_dir} has no {missing}: cannot write an HF directory"
        )
    print(f"exported {len(sd)} tensors: {[f.name for f in files]} (known names {MODEL_FILES})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
