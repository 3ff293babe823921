"""Issue 14's attack classes (`python -m conformance.hostile`) against the on-prem server (real
DeepSpeed trainers, two tokens): no checkpoint escape (the victim is a real DeepSpeed checkpoint
of the first token's job), no 500, and a burst of chunk groups that declare 256 MiB each leaves
the server's memory within the runner's bound. One test per attack class; the jobs are
training-only (the sampling-parameter attacks are refused before any sub-job is looked up)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conformance.hostile import ATTACKS, Target, run_all

from .conftest import ServerInfo, start_server, stop_server

pytestmark = pytest.mark.slow
JOB = {"sub_job_configs": [{"job_type": "training", "model_name": ""}]}


@pytest.fixture(scope="module")
def hostile_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    srv = start_server(
        tmp_path_factory.mktemp("hostile"),
        "--prewarm", "deepspeed", "--token", "tok-a", "--token", "tok-b",
        "--header-timeout", "2", "--body-timeout", "2", "--job-chunk-budget-mib", "64",
        name="hostile",
    )  # fmt: skip
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_onprem_holds(hostile_srv: ServerInfo, attack: str) -> None:
    target = Target(hostile_srv.prefix_url, "tok-a", "tok-b", JOB, hostile_srv.grpc_target,
                    hostile_srv.proc.pid, hostile_srv.base_url)  # fmt: skip
    found = list(run_all(target, [attack]))
    assert found, f"attack class {attack} ran nothing"
    holes = [f"{f.transport} {f.attack}: {f.problem}" for f in found if not f.ok]
    assert not holes, "\n".join(holes)
