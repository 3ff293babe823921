"""What the main job (`examples/sft_rl.py`) needs around the SDK: model, tokenizer, server, plot.

- `resolve_local_model`: the model name the server is sent and the directory the client reads
  the tokenizer from — an embedded tiny-model configuration (`arctic_servers.engines.tiny_model`,
  built here exactly as the server builds it) or any local Hugging Face directory.
- `Tokenizer`: the directory's `tokenizer.json` (the `tokenizers` library), its stop and padding
  token ids.
- `local_server`: `python -m arctic_servers.onprem serve` on free ports (as `grpo_tiny.py`).
- `plot`: held-out accuracy over steps, SFT then the two RL arms, on one figure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_tiny import local_server

if TYPE_CHECKING:
    from sft_rl import Curve

__all__ = ["Tokenizer", "local_server", "plot", "resolve_local_model"]


def resolve_local_model(name: str) -> tuple[str, Path]:
    """(model_name for the server, local directory with the same tokenizer)."""
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return str(path.resolve()), path.resolve()
    from arctic_servers.engines.tiny_model import CONFIGS, build_tiny_model, cache_dir_name
    from arctic_servers.onprem.settings import default_cache_dir

    if name not in CONFIGS:
        raise SystemExit(
            f"--model {name!r}: neither a local Hugging Face directory (with a config.json) nor "
            f"an embedded configuration ({', '.join(sorted(CONFIGS))})"
        )
    return name, build_tiny_model(default_cache_dir() / cache_dir_name(name), config=name)


class Tokenizer:
    """The model directory's fast tokenizer, as the sampler tokenizes text prompts."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise SystemExit(f"{model_dir} has no tokenizer.json (a fast tokenizer is needed)")
        self._tok = HfTokenizer.from_file(str(path))
        cfg: dict[str, Any] = {}
        for name in ("config.json", "generation_config.json"):  # the latter wins, as in vLLM
            with_name = model_dir / name
            if with_name.is_file():
                cfg.update(json.loads(with_name.read_text()))
        eos = cfg.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        if not isinstance(eos, int):
            raise SystemExit(f"{model_dir}: no eos_token_id in config.json/generation_config.json")
        self.eos_id = eos
        pad = cfg.get("pad_token_id")
        self.pad_id = pad if isinstance(pad, int) else eos

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)


def plot(curves: dict[str, Curve], out: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sft = curves["sft"]
    end = sft.steps[-1]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(sft.steps, sft.accuracy, marker="o", ms=3, label="SFT (cross-entropy)")
    for key, label in (("rl", "RL arm (GRPO)"), ("control", "control (RL, lr 0)")):
        c = curves[key]
        ax.plot([end + s for s in c.steps], c.accuracy, marker="o", ms=3, label=label)
    ax.axvline(end, color="grey", lw=0.8, ls="--")
    ax.text(end, 1.01, " SFT checkpoint", fontsize=8, va="bottom")
    ax.set_xlabel("step (SFT steps, then RL steps from the SFT checkpoint)")
    ax.set_ylabel("held-out accuracy (greedy, exact match)")
    ax.set_title(f"Addition on {model}: SFT, then RL (on-prem server: DeepSpeed + vLLM)")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
