"""Issue 14's attack classes (`python -m conformance.hostile`) against the fake gateway (in this
process) and the Cortex gateway (fake workers, a subprocess): every hostile input is refused
with a 4xx and the spec's error body, no checkpoint escapes its job, and a burst of chunk groups
that declare 256 MiB each leaves the server's memory within the runner's bound
(groups x (3 x 64 KiB + 16 KiB) + 48 MiB).

One test per attack class and server, so a regression names its class; the hole list (attack,
transport, what was wrong) is the failure message. `test_runner_finds_holes` proves the runner
can fail: against a server with the checks switched off it reports each class of hole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from arctic_servers.protocol.config import MiB, ProtocolLimits
from conformance.fake.server import BackgroundFake
from conformance.hostile import ATTACKS, Target, run_all

from ..gateway.harness import Gateway

LIMITS = ProtocolLimits(
    header_read_timeout_seconds=2,
    body_read_timeout_seconds=2,
    max_open_chunk_bytes_per_job=64 * MiB,
    max_open_chunk_bytes=128 * MiB,
)
FAKE_JOB = {
    "sub_job_configs": [
        {"job_type": "training", "model_name": "m"},
        {"job_type": "sampling", "model_name": "m"},
    ]
}
GATEWAY_JOB = {
    "sub_job_configs": [
        {"job_type": "training", "model_name": "fake-model"},
        {"job_type": "sampling", "model_name": "fake-model"},
    ]
}


@pytest.fixture(scope="module")
def fake() -> Iterator[Target]:
    with BackgroundFake(tokens=("tok-a", "tok-b"), limits=LIMITS) as f:
        yield Target(f.prefix_url, "tok-a", "tok-b", FAKE_JOB, f.grpc_target, os.getpid())


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    g = Gateway(
        tmp_path_factory.mktemp("gw-hostile"),
        args=("--header-timeout", "2", "--body-timeout", "2", "--job-chunk-budget-mib", "64",
              "--chunk-budget-mib", "128"),
    )  # fmt: skip
    info = g.start()
    assert g.proc is not None
    try:
        yield Target(g.prefix_url, "pat-1", "pat-2", GATEWAY_JOB, info["grpc_target"],
                     g.proc.pid, g.base_url)  # fmt: skip
    finally:
        g.cleanup()


def _holes(target: Target, attack: str) -> list[str]:
    found = list(run_all(target, [attack]))
    assert found, f"attack class {attack} ran nothing"
    return [f"{f.transport} {f.attack}: {f.problem}" for f in found if not f.ok]


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_fake_holds(fake: Target, attack: str) -> None:
    holes = _holes(fake, attack)
    assert not holes, "\n".join(holes)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_gateway_holds(gateway: Target, attack: str) -> None:
    holes = _holes(gateway, attack)
    assert not holes, "\n".join(holes)


def test_runner_finds_holes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the shared input limits and the checkpoint rule switched off, the runner reports
    holes in each of those classes (it is not a test that cannot fail)."""
    from arctic_servers.rules import checkpoint_ids, limits
    from arctic_servers.serving import http_server

    monkeypatch.setattr(limits, "check_value", lambda *a, **k: None)
    monkeypatch.setattr(limits, "check_headers", lambda *a, **k: None)
    monkeypatch.setattr(checkpoint_ids, "_check", lambda rule, value, *a: str(value))
    monkeypatch.setattr(checkpoint_ids, "_inside", lambda root, name, field: root / name)
    monkeypatch.setattr(http_server.SpecRequestHandler, "handle_error",
                        http_server.web_protocol.RequestHandler.handle_error)  # fmt: skip
    import arctic_sdk.spec.value_rules as vr

    monkeypatch.setattr(vr, "string_rule_error", lambda opts, value: None)
    with BackgroundFake(tokens=("tok-a", "tok-b"), limits=LIMITS) as f:
        target = Target(f.prefix_url, "tok-a", "tok-b", FAKE_JOB, f.grpc_target)
        attacks = ["checkpoints", "ids", "json", "headers", "http"]
        holes = [x for x in run_all(target, attacks) if not x.ok]
    classes = {h.attack.split("/")[0] for h in holes}
    assert {"checkpoint", "id", "json", "header", "http"} <= classes, classes
