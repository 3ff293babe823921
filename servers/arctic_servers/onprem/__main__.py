"""`python -m arctic_servers.onprem serve`: the on-prem arctic.v1 server.

    python -m arctic_servers.onprem serve [--host 127.0.0.1] [--port 8080] [--grpc-port 50051]
        [--model DIR] [--job training,sampling] [--lr 1e-5] [--data-dir DIR] [--token T ...]
        [--threads N | training=N,sampling=N,log_prob=N[,pin]] [--worker-python PY]
        [--max-slots 16] [--prewarm deepspeed,vllm] [--admin] [--verbose-workers]
        [--lora-pool MODEL[=N] ...] [--no-engine-check]
    python -m arctic_servers.onprem check [--worker-python PY]

`serve` first checks that the engines' Python can run the engines (`check` does only that) and,
when it cannot, names the command that repairs it (arctic_servers.engines.install_check).

With no `--model`, sub-jobs run the embedded tiny Qwen2 model (built once, deterministically, in
`~/.cache/arctic/`). `--job` pre-creates one job (its id is printed); more jobs come through
`POST {prefix}/` (CreateJob). The server answers every call inline (200), over HTTP and gRPC.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..engines.install_check import check
from ..openai.tool_calls import ToolSettings, add_tool_args
from ..serving.collective_sync import add_sync_arguments, sync_settings_from_args
from ..serving.entrypoints import stop_signal, write_ready_file
from ..serving.limit_args import add_limit_arguments, limits_from_args
from ..serving.lora_pools import add_pool_arguments, policy_from_args
from ..serving.observability_args import add_observability_arguments, observability_from_args
from ..tinker.cli import add_tinker_arguments, tinker_settings_from_args


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m arctic_servers.onprem",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command")
    p = sub.add_parser("serve", help="run the server (HTTP and gRPC)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="HTTP port (0 = a free port)")
    p.add_argument("--grpc-port", type=int, default=0, help="gRPC port (0 = a free port)")
    p.add_argument("--no-grpc", action="store_true", help="serve HTTP only")
    p.add_argument(
        "--model", default="", help="default model directory (default: the embedded tiny model)"
    )
    p.add_argument(
        "--job", default="", help='pre-create a job: "training,sampling" or a CreateJob JSON body'
    )
    p.add_argument(
        "--lr", type=float, default=None, help="learning rate of the pre-created job's trainer"
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="checkpoints and exports (default ~/.cache/arctic/onprem)",
    )
    p.add_argument(
        "--token", action="append", default=[], help="accepted PAT (repeatable; none = no auth)"
    )
    p.add_argument(
        "--threads",
        default="",
        help="threads per worker: N, or training=N,sampling=N,log_prob=N[,pin]",
    )
    p.add_argument(
        "--worker-python", default=sys.executable, help="interpreter of the engine workers"
    )
    p.add_argument("--max-slots", type=int, default=16, help="sub-jobs running at once")
    p.add_argument(
        "--prewarm",
        default="deepspeed,vllm",
        help="engines with an idle pre-imported worker kept ready ('' = none)",
    )
    p.add_argument("--admin", action="store_true", help="serve /_admin/jobs (worker pids, logs)")
    p.add_argument("--verbose-workers", action="store_true", help="echo worker output to stderr")
    p.add_argument(
        "--ready-file", type=Path, default=None, help="write the URLs as JSON here once serving"
    )
    p.add_argument(
        "--no-engine-check",
        action="store_true",
        help="start without checking the engines' Python first",
    )
    add_limit_arguments(p)
    add_sync_arguments(p)
    add_pool_arguments(p)
    add_tinker_arguments(p)
    add_observability_arguments(p)
    add_tool_args(p)
    c = sub.add_parser("check", help="check that the engines' Python can run the engines")
    c.add_argument(
        "--worker-python", default=sys.executable, help="interpreter of the engine workers"
    )
    return ap


async def _serve(args: argparse.Namespace) -> int:
    from ..engines.config import default_cache_dir
    from ..serving.http_app import DEFAULT_PATH
    from .server import job_body, start_onprem
    from .settings import ServerSettings, ThreadPlan

    settings = ServerSettings(
        data_dir=args.data_dir or default_cache_dir() / "onprem",
        model=args.model,
        worker_python=args.worker_python,
        threads=ThreadPlan.parse(args.threads),
        max_slots=args.max_slots,
        verbose_workers=args.verbose_workers,
        prewarm=tuple(x.strip() for x in args.prewarm.split(",") if x.strip()),
        sync=sync_settings_from_args(args),
        lora_pools=policy_from_args(args),
    )
    create = []
    if args.job:
        tc = {"optimizer": {"name": "adamw", "lr": args.lr}} if args.lr is not None else None
        create.append(job_body(args.job, training_config=tc))
    srv, job_ids = await start_onprem(
        settings,
        host=args.host,
        port=args.port,
        grpc_port=None if args.no_grpc else args.grpc_port,
        tokens=args.token,
        admin=args.admin,
        create_jobs=create,
        limits=limits_from_args(args),
        tinker=tinker_settings_from_args(args),
        **observability_from_args(args, "arctic-onprem"),
        tools=ToolSettings.from_args(args),
    )
    info = {
        "base_url": srv.base_url,
        "prefix_url": srv.base_url + DEFAULT_PATH,
        "grpc_target": srv.grpc_target if srv.server.grpc_port else "",
        "admin_url": srv.admin_url if args.admin else "",
        "job_ids": job_ids,
    }
    print(f"onprem server: http {srv.base_url}", flush=True)
    print(f"  prefix  {info['prefix_url']}", flush=True)
    if info["grpc_target"]:
        print(f"  grpc    {info['grpc_target']}", flush=True)
    if srv.server.metrics is not None:
        print(f"  metrics {srv.server.metrics.url}", flush=True)
    if args.admin:
        print(f"  admin   {srv.admin_url}", flush=True)
    for j in job_ids:
        print(f"  job     {j}", flush=True)
    write_ready_file(args.ready_file, info)
    try:
        await stop_signal()
    finally:
        await srv.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    # the server process runs no engine: one thread for any numeric library it loads (workers
    # get their own counts, see settings.ThreadPlan)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    args = parser().parse_args(argv)
    if args.command == "check":
        return check(args.worker_python)
    if args.command != "serve":
        parser().print_help(sys.stderr)
        return 2
    if not args.no_engine_check and check(args.worker_python) != 0:
        print("(--no-engine-check starts the server anyway)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(_serve(args))


if __name__ == "__main__":
    sys.exit(main())
