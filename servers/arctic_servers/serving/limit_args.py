"""The command-line flags of the input limits every server shares (PROTOCOL.md §13), so the
gateway and the on-prem server take the same names and defaults."""

from __future__ import annotations

import argparse
import dataclasses

from ..protocol.config import MiB, ProtocolLimits

__all__ = ["add_limit_arguments", "limits_from_args"]

_D = ProtocolLimits()


def add_limit_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("input limits (advertised in the capabilities' limits)")
    g.add_argument("--header-timeout", type=float, default=_D.header_read_timeout_seconds,
                   help="seconds a connection may take to send a request's headers (also idle "
                   "keep-alive); then it is closed")  # fmt: skip
    g.add_argument("--body-timeout", type=float, default=_D.body_read_timeout_seconds,
                   help="seconds a request body may take to arrive; then 408")  # fmt: skip
    g.add_argument("--job-chunk-budget-mib", type=int,
                   default=_D.max_open_chunk_bytes_per_job // MiB,
                   help="MiB incomplete chunk groups of one job may hold")  # fmt: skip
    g.add_argument("--chunk-budget-mib", type=int, default=_D.max_open_chunk_bytes // MiB,
                   help="MiB incomplete chunk groups of the whole server may hold")  # fmt: skip
    g.add_argument("--chunk-group-ttl", type=int, default=_D.chunk_group_ttl_seconds,
                   help="seconds an incomplete chunk group may go without a chunk")  # fmt: skip
    g.add_argument(
        "--max-inline-result-kib",
        type=int,
        default=_D.max_inline_result_bytes // 1024,
        help="KiB of a result answered inline; larger ones page as result_chunk events",
    )
    g.add_argument("--max-sub-jobs", type=int, default=_D.max_sub_jobs,
                   help="sub-jobs one CreateJob may configure")  # fmt: skip
    g.add_argument("--max-sampling-requests-per-job", type=int,
                   default=_D.max_sampling_requests_per_job,
                   help="sampling requests a job may have queued or running; past it 429 "
                   "(0 = no bound)")  # fmt: skip


def limits_from_args(
    args: argparse.Namespace, base: ProtocolLimits | None = None
) -> ProtocolLimits:
    """`base` (default limits) with the flags of `add_limit_arguments` applied."""
    return dataclasses.replace(
        base or ProtocolLimits(),
        header_read_timeout_seconds=args.header_timeout,
        body_read_timeout_seconds=args.body_timeout,
        max_open_chunk_bytes_per_job=args.job_chunk_budget_mib * MiB,
        max_open_chunk_bytes=args.chunk_budget_mib * MiB,
        chunk_group_ttl_seconds=args.chunk_group_ttl,
        max_sub_jobs=args.max_sub_jobs,
        max_sampling_requests_per_job=args.max_sampling_requests_per_job,
        max_inline_result_bytes=args.max_inline_result_kib * 1024,
        # result_chunk events smaller than the inline limit: a paged result has several
        result_chunk_bytes=min(_D.result_chunk_bytes, max(1024, args.max_inline_result_kib * 512)),
    )
