"""`python -m arctic_servers.gateway`: the Cortex gateway (servers/GATEWAY.md).

    python -m arctic_servers.gateway --db PATH --tokens-file FILE [--host 127.0.0.1]
        [--port 8080] [--grpc-port 50051] [--engine fake|onprem] [--worker-python PY]
        [--gpus 8] [--ray-address HOST:PORT] [--admin] [--ready-file F] [--no-engine-check]
    python -m arctic_servers.gateway hash-token TOKEN   # the line to put in a tokens file

With `--engine onprem` (and no Ray) it first checks that `--worker-python` can run the engines,
as `python -m arctic_servers.onprem check` does, and names the fix when it cannot (and
`--engine fake`, which needs only `.[gateway]`, for a first try).

State (jobs, requests, idempotency keys, chunk groups, results) is in the SQLite file `--db`;
worker logs, specs and checkpoints in `--data-dir` (default: `{db}-data` beside it). Restart on
the same `--db` to re-attach to the running workers. SIGTERM drains before exit.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from ..openai.tool_calls import ToolSettings, add_tool_args
from ..protocol.config import ProtocolLimits
from ..serving.collective_sync import add_sync_arguments, sync_settings_from_args
from ..serving.entrypoints import stop_signal, write_ready_file
from ..serving.limit_args import add_limit_arguments, limits_from_args
from ..serving.lora_pools import add_pool_arguments, policy_from_args
from ..serving.observability_args import add_observability_arguments, observability_from_args
from ..tinker.cli import add_tinker_arguments, tinker_settings_from_args

MiB = 1024 * 1024


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m arctic_servers.gateway",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--db", type=Path, help="the SQLite state file (created if missing)")
    ap.add_argument(
        "--data-dir", type=Path, default=None, help="logs, checkpoints (default: beside --db)"
    )
    ap.add_argument("--tokens-file", type=Path, default=None,
                    help="accepted PATs, one a line: a token or sha256:<hex>; also "
                         "$ARCTIC_GATEWAY_TOKENS; none = no auth")  # fmt: skip
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080, help="HTTP port (0 = a free port)")
    ap.add_argument("--grpc-port", type=int, default=0, help="gRPC port (0 = a free port)")
    ap.add_argument("--no-grpc", action="store_true", help="serve HTTP only")
    ap.add_argument("--engine", choices=("fake", "onprem"), default="onprem",
                    help="sub-job workers: on-prem DeepSpeed/vLLM, or fake numerics")  # fmt: skip
    ap.add_argument("--worker-python", default=sys.executable, help="interpreter of the workers")
    ap.add_argument(
        "--worker-threads", type=int, default=0, help="threads per worker (0 = default)"
    )
    ap.add_argument("--gpus", type=int, default=8, help="capacity: GPUs (on CPU: slots) in all")
    ap.add_argument(
        "--ray-address", default="", help="place sub-jobs as Ray actors on this cluster"
    )
    ap.add_argument(
        "--lease-default", type=int, default=0, help="lease seconds when CreateJob gives none"
    )
    ap.add_argument("--max-inflight-per-token", type=int, default=64)
    ap.add_argument("--max-body-mib", type=int, default=60, help="HTTP body / chunk limit (MiB)")
    ap.add_argument("--retention-seconds", type=int, default=24 * 3600,
                    help="results are kept this long after they were first fetched")  # fmt: skip
    ap.add_argument("--sweep-interval", type=float, default=60.0, help="seconds between sweeps")
    ap.add_argument("--sequence-gap-timeout", type=float, default=60.0)
    ap.add_argument("--drain-timeout", type=float, default=30.0, help="SIGTERM: seconds to finish")
    ap.add_argument("--answer-mode", choices=("async", "auto", "inline"), default="async")
    ap.add_argument("--fake-latency", default="", help='fake workers: "step=0.5,generate=1"')
    ap.add_argument("--admin", action="store_true", help="serve /_admin/jobs/{job}[/stats]")
    ap.add_argument("--ready-file", type=Path, default=None, help="write the URLs as JSON here")
    ap.add_argument(
        "--no-engine-check", action="store_true", help="--engine onprem: skip the engine check"
    )
    ap.add_argument(
        "--ray-resources",
        action="append",
        default=[],
        metavar="ROLE=NAME:N[,NAME:N]",
        help="Ray custom resources a role's actors need (repeatable), e.g. "
        "training=trainer_node:1: places the trainer and the samplers on the nodes that have them",
    )
    add_limit_arguments(ap)
    add_sync_arguments(ap)
    add_pool_arguments(ap)
    add_tinker_arguments(ap)
    add_observability_arguments(ap)
    add_tool_args(ap)
    ap.add_argument("command", nargs="*", help="hash-token TOKEN")
    return ap


async def _serve(args: argparse.Namespace) -> int:
    from .server import start_gateway
    from .settings import GatewaySettings, load_tokens, parse_ray_resources

    try:
        ray_resources = parse_ray_resources(args.ray_resources)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    latency = {}
    for part in (p for p in args.fake_latency.split(",") if p.strip()):
        k, _, v = part.partition("=")
        latency[k.strip()] = float(v)
    settings = GatewaySettings(
        db=args.db.resolve(),
        data_dir=args.data_dir.resolve() if args.data_dir else None,
        engine=args.engine,
        worker_python=args.worker_python,
        worker_threads=args.worker_threads,
        max_total_gpus=args.gpus,
        ray_address=args.ray_address,
        ray_resources=ray_resources,
        sync=sync_settings_from_args(args),
        lease_default_seconds=args.lease_default,
        max_inflight_per_token=args.max_inflight_per_token,
        drain_timeout_s=args.drain_timeout,
        sweep_interval_s=args.sweep_interval,
        fake_latency_s=latency,
        lora_pools=policy_from_args(args),
    )
    if settings.lora_pools.enabled and settings.engine != "onprem":
        raise SystemExit("--lora-pool: LoRA pools run on the on-prem engines (--engine onprem)")
    limits = ProtocolLimits(
        max_body_bytes=args.max_body_mib * MiB,
        max_chunk_bytes=args.max_body_mib * MiB,
        retention_seconds=args.retention_seconds,
        sequence_gap_timeout_seconds=args.sequence_gap_timeout,
    )
    limits = limits_from_args(args, limits)
    tokens = load_tokens(args.tokens_file)
    gw = await start_gateway(
        settings,
        host=args.host,
        port=args.port,
        grpc_port=None if args.no_grpc else args.grpc_port,
        token_sha256=tokens,
        limits=limits,
        answer_mode=args.answer_mode,
        admin=args.admin,
        tinker=tinker_settings_from_args(args),
        **observability_from_args(args, "arctic-gateway"),
        tools=ToolSettings.from_args(args),
    )
    info = {
        "base_url": gw.base_url,
        "prefix_url": gw.prefix_url,
        "grpc_target": gw.grpc_target if gw.grpc_port else "",
        "restored": gw.restored,
    }
    print(f"gateway: http {gw.base_url}  ({len(tokens)} tokens, engine {settings.engine})")
    print(f"  prefix  {gw.prefix_url}")
    if gw.grpc_port:
        print(f"  grpc    {gw.grpc_target}")
    if gw.metrics is not None:
        print(f"  metrics {gw.metrics.url}")
        info["metrics_url"] = gw.metrics.url
    print(f"  state   {settings.db}  restored {gw.restored}", flush=True)
    write_ready_file(args.ready_file, info)
    await stop_signal()
    print("gateway: draining", flush=True)
    handed = await gw.close()
    print(f"gateway: stopped ({handed} unfinished requests handed to the next start)", flush=True)
    return 0


def engines_usable(args: argparse.Namespace) -> bool:
    """--engine onprem: the workers' Python can run the engines (else the fix is printed)."""
    import importlib.util

    from ..engines.install_check import check

    if importlib.util.find_spec("transformers") is None:
        print(
            "warning: transformers is not installed in the gateway's Python: the OpenAI-compatible "
            'routes cannot load a model\'s tokenizer (pip install "arctic-sdk[gateway]")',
            file=sys.stderr,
        )
    if args.ray_address:
        print("engine check skipped: the workers run on the Ray cluster's nodes", file=sys.stderr)
        return True
    if check(args.worker_python) == 0:
        return True
    print(
        "(--no-engine-check starts the gateway anyway; for a first try without the engines, "
        "--engine fake runs fake numerics in place of DeepSpeed/vLLM)",
        file=sys.stderr,
    )
    return False


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command:
        if args.command[0] == "hash-token" and len(args.command) == 2:
            from ..protocol.config import token_digest

            print(f"sha256:{token_digest(args.command[1])}")
            return 0
        parser().print_help(sys.stderr)
        return 2
    if args.db is None:
        parser().error("--db is required")
    if args.engine == "onprem" and not args.no_engine_check and not engines_usable(args):
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(_serve(args))


if __name__ == "__main__":
    sys.exit(main())
