"""The `--tinker-*` flags of `python -m arctic_servers.onprem serve` and
`python -m arctic_servers.gateway`: one definition of the `TinkerSettings` on the command line
(servers/TINKER.md). Torch- and tinker-free, so `--help` works without the extra."""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

__all__ = ["add_tinker_arguments", "tinker_settings_from_args"]

LORA_CHOICES = ("lora", "refuse", "full_finetune")
ADAM_KEYS = ("beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")


def add_tinker_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group(
        "Tinker surface (/api/v1/..., the tinker SDK 0.38; needs the [tinker] extra)"
    )
    g.add_argument(
        "--tinker-models",
        default="",
        help="base models get_server_capabilities lists, comma-separated (default: every "
        "model the server's engines serve)",
    )
    g.add_argument(
        "--tinker-only-listed",
        action="store_true",
        help="refuse create_model for a base model not in --tinker-models",
    )
    g.add_argument(
        "--tinker-lora",
        choices=LORA_CHOICES,
        default="lora",
        help="a LoRA client's job: a LoRA adapter (default), refused naming lora_config.rank, "
        "or (operator opt-in) full fine-tuning answered is_lora false",
    )
    g.add_argument(
        "--tinker-adam",
        default="",
        help='Adam\'s parameters at create_model, e.g. "eps=1e-8,beta2=0.999" '
        f"(keys {', '.join(ADAM_KEYS)}; default Tinker's AdamParams defaults); each "
        "optim_step then applies its own AdamParams",
    )
    g.add_argument(
        "--tinker-max-context",
        type=int,
        default=0,
        help="cap the models' context windows at this many tokens (default 0: each model's "
        "own, its max_position_embeddings); advertised and enforced on every route",
    )
    g.add_argument(
        "--tinker-session-timeout",
        type=float,
        default=180.0,
        help="seconds without a heartbeat after which a session expires and its jobs are "
        "cancelled (the SDK sends one every 10 s)",
    )


def _adam(text: str) -> dict[str, float] | None:
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        k, sep, v = part.partition("=")
        k = k.strip()
        if not sep or k not in ADAM_KEYS:
            raise SystemExit(
                f"--tinker-adam: {part!r}; expected KEY=VALUE with KEY one of {ADAM_KEYS}"
            )
        try:
            out[k] = float(v)
        except ValueError:
            raise SystemExit(f"--tinker-adam: {k} = {v!r} is not a number") from None
    return out or None


def tinker_settings_from_args(args: argparse.Namespace) -> Any:
    """The `TinkerSettings` the flags say; None without the tinker package (the routes then
    answer 501 saying how to install it, `mount`)."""
    if importlib.util.find_spec("tinker") is None:
        return None
    from .settings import TinkerSettings

    if args.tinker_max_context < 0:
        raise SystemExit(f"--tinker-max-context {args.tinker_max_context}: expected >= 0")
    if args.tinker_session_timeout <= 10:
        raise SystemExit(
            f"--tinker-session-timeout {args.tinker_session_timeout}: expected > 10 "
            "(the SDK heartbeats every 10 s)"
        )
    return TinkerSettings(
        models=tuple(m.strip() for m in args.tinker_models.split(",") if m.strip()),
        only_listed=bool(args.tinker_only_listed),
        lora=args.tinker_lora,
        adam=_adam(args.tinker_adam),
        max_context_length=int(args.tinker_max_context),
        session_timeout_s=float(args.tinker_session_timeout),
    )
