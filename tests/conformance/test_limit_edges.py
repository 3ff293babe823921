"""Issue 37, "capabilities that lie": every limit the capabilities advertise is the one enforced.

Each field of `Limits` (jobs.proto) is walked just inside and just past its edge: the size and
count limits by conformance cases, which run against every server (this package: the fake;
tests/gateway/test_conformance.py: the gateway; tests/onprem/test_conformance.py: the on-prem
server on real engines), the rest by the tests named below on the protocol core all three
share. A new field of `Limits` fails `test_every_advertised_limit_is_walked` until it is walked.
"""

from __future__ import annotations

import importlib

import aiohttp

from arctic_sdk.spec.pb.arctic.v1 import jobs_pb2
from arctic_servers.protocol.config import MiB, ProtocolLimits
from conformance.fake import start_fake
from conformance.runner import Case

# limit -> (case just inside, case just past): conformance cases, every server
EDGE_CASES: dict[str, tuple[str, str]] = {
    "max_body_bytes": ("limits/edge/max-body-bytes", "limits/body-too-large/http"),
    "max_chunk_bytes": ("limits/edge/max-body-bytes", "limits/body-too-large/http"),
    "max_header_bytes": ("limits/edge/max-header-bytes", "limits/header-too-large"),
    "max_frame_bytes": ("limits/edge/max-frame-bytes", "limits/frame-too-large"),
    "max_chunks": ("limits/edge/max-chunks", "limits/too-many-chunks"),
    "max_tensors": ("limits/edge/max-tensors", "limits/too-many-tensors"),
    "max_depth": ("limits/edge/max-depth", "limits/tree-too-deep"),
    "max_grpc_message_bytes": (
        "limits/edge/max-grpc-message-bytes",
        "limits/message-too-large/grpc",
    ),
    "max_inline_result_bytes": ("polling/cursor-pages", "polling/cursor-pages"),
    "max_open_chunk_bytes_per_job": (
        "hostile/chunks/job-budget-is-retryable",
        "hostile/chunks/declared-over-job-budget",
    ),
    "sequence_gap_timeout_seconds": ("sequencing/gap-timeout", "sequencing/gap-timeout"),
    "body_read_timeout_seconds": ("hostile/slow/body-timeout", "hostile/slow/body-timeout"),
}
# limit -> "module::test" walking both sides on the protocol core (too slow or too costly for
# a conformance run against a real server: hours, GiB, or a dozen engines)
WALKED_BY_TESTS: dict[str, str] = {
    "max_sub_jobs": "tests.conformance.test_limit_edges::test_max_sub_jobs_at_and_past_the_edge",
    "max_frame_bytes": (
        "tests.conformance.test_limit_edges::test_max_frame_bytes_is_what_the_budgets_let_through"
    ),
    "max_sampling_requests_per_job": (
        "tests.protocol.test_concurrent_ops::"
        "test_sampling_requests_past_the_bound_are_refused_with_429"
    ),
    "max_open_chunk_bytes": "tests.protocol.test_chunk_budget::test_budgets_refuse_retryably",
    "chunk_group_ttl_seconds": "tests.protocol.test_chunk_budget::test_idle_groups_expire",
    # conformance.hostile's slow_clients: half-sent headers held no longer than advertised
    "header_read_timeout_seconds": "tests.hostile.test_hostile::test_fake_holds",
    "retention_seconds": (
        "tests.gateway.test_requests::test_results_expire_after_the_retention_window"
    ),
}


# limits advertised outside `Limits`: the capabilities' `features` and `lora`
OTHER_EDGES: dict[str, str] = {
    "features.lease_max_seconds": "jobs/lease/renew",  # exactly it accepted, one more refused
    "lora.max_rank": "lora/create-job/rank-too-large",  # one past it refused
}


def test_every_advertised_limit_is_walked(cases: list[Case]) -> None:
    advertised = {f.name for f in jobs_pb2.Limits.DESCRIPTOR.fields}
    walked = set(EDGE_CASES) | set(WALKED_BY_TESTS)
    assert advertised <= walked, f"advertised limits nobody walks: {sorted(advertised - walked)}"
    ids = {c.id for c in cases}
    for limit, pair in EDGE_CASES.items():
        missing = [i for i in pair if i not in ids]
        assert not missing, f"{limit}: no conformance case {missing}"
    for limit, case in OTHER_EDGES.items():
        assert case in ids, f"{limit}: no conformance case {case}"
    for limit, where in WALKED_BY_TESTS.items():
        module, name = where.split("::")
        assert hasattr(importlib.import_module(module), name), f"{limit}: {where} is gone"


async def test_max_frame_bytes_is_what_the_budgets_let_through() -> None:
    """A frame larger than the chunk budgets can never arrive (its group is refused at the first
    chunk), so the capabilities advertise the smaller number (they said 4 GiB over a 2 MiB
    per-job budget); limits/edge/max-frame-bytes checks it on every server."""
    for per_job, total, want in ((2 * MiB, 8 * MiB, 2 * MiB), (64 * MiB, 16 * MiB, 16 * MiB)):
        lim = ProtocolLimits(max_open_chunk_bytes_per_job=per_job, max_open_chunk_bytes=total)
        fake = await start_fake(limits=lim, grpc=False)
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.get(fake.prefix_url + "/capabilities") as r,
            ):
                caps = await r.json()
        finally:
            await fake.close()
        assert caps["limits"]["max_frame_bytes"] == want
    assert ProtocolLimits().frame_bytes == ProtocolLimits().max_frame_bytes


async def test_max_sub_jobs_at_and_past_the_edge() -> None:
    """max_sub_jobs sub-jobs are accepted, one more is refused naming the limit."""
    fake = await start_fake(limits=ProtocolLimits(max_sub_jobs=3), grpc=False)
    one = {"job_type": "sampling", "model_name": "m"}
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(fake.prefix_url + "/capabilities") as r:
                assert (await r.json())["limits"]["max_sub_jobs"] == 3
            async with s.post(fake.prefix_url + "/", json={"sub_job_configs": [one] * 3}) as r:
                assert r.status == 200, await r.text()
            async with s.post(fake.prefix_url + "/", json={"sub_job_configs": [one] * 4}) as r:
                err = (await r.json())["error"]
                assert r.status == 400 and err["code"] == "invalid_argument"
                assert err["details"]["limit"] == 3 and err["details"]["field"] == "sub_job_configs"
    finally:
        await fake.close()
