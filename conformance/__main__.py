"""`python -m conformance`: the conformance runner (default) and `serve` (the fake gateway).

Usage::

    python -m conformance serve [--host H] [--port 0] [--grpc-port P] [--no-grpc] [--token T]
                                [--admin] [--answer-mode auto|inline|async] [--delays P,I,R]
                                [--max-total-gpus N]
    python -m conformance --target URL [runner options]     (the conformance runner)

Everything but `serve` goes to the runner (`conformance.runner.cli`; `--help` for its options).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence


def serve_parser() -> argparse.ArgumentParser:
    from arctic_servers.serving.observability_args import add_observability_arguments

    p = argparse.ArgumentParser(
        prog="python -m conformance serve",
        description="Run the fake gateway (HTTP and gRPC) until interrupted.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="HTTP port (0 = a free port)")
    p.add_argument("--grpc-port", type=int, default=0, help="gRPC port (0 = a free port)")
    p.add_argument("--no-grpc", action="store_true", help="serve HTTP only")
    p.add_argument("--token", action="append", default=[], help="accepted PAT (repeatable)")
    p.add_argument("--admin", action="store_true", help="serve the /_admin/ API")
    p.add_argument("--answer-mode", choices=("auto", "inline", "async"), default="auto")
    p.add_argument(
        "--delays",
        default="0,0,0",
        metavar="P,I,R",
        help="seconds before placing, initializing, running (default 0,0,0)",
    )
    p.add_argument("--max-total-gpus", type=int, default=64)
    add_observability_arguments(p)
    return p


async def _serve(args: argparse.Namespace) -> int:
    from arctic_servers.serving.entrypoints import stop_signal
    from arctic_servers.serving.observability_args import observability_from_args

    from .fake import JobDelays, start_fake
    from .fake.server import DEFAULT_PATH

    try:
        placing, init, running = (float(x) for x in args.delays.split(","))
    except ValueError:
        print(f"--delays: {args.delays!r} is not three comma-separated numbers", file=sys.stderr)
        return 2
    fake = await start_fake(
        tokens=tuple(args.token),
        admin=args.admin,
        grpc=not args.no_grpc,
        host=args.host,
        port=args.port,
        grpc_port=args.grpc_port,
        answer_mode=args.answer_mode,
        delays=JobDelays(placing, init, running),
        max_total_gpus=args.max_total_gpus,
        **observability_from_args(args, "arctic-fake"),
    )
    print(f"fake gateway: http {fake.base_url}", flush=True)
    if fake.server.metrics is not None:
        print(f"  metrics {fake.server.metrics.url}", flush=True)
    print(f"  prefix  {fake.base_url}{DEFAULT_PATH}", flush=True)
    if fake.server.grpc_port:
        print(f"  grpc    {fake.grpc_target}", flush=True)
    if args.admin:
        print(f"  admin   {fake.admin_url}", flush=True)
    try:
        await stop_signal()
    finally:
        await fake.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        return asyncio.run(_serve(serve_parser().parse_args(args[1:])))
    from .runner.cli import main as run  # an ImportError here is a broken install: let it show

    return int(run(args))


if __name__ == "__main__":
    sys.exit(main())
