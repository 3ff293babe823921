"""Coverage of the spec by the cases: every RPC, every error code a server can emit, every golden
vector, every feature name; and the runner's independence from the SDK and the servers."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from arctic_sdk.spec.tables import methods as M
from arctic_sdk.spec.tables.error_codes import ERRORS
from conformance.runner import Case
from conformance.runner.vectors import DEFAULT_VECTORS, NOT_SENDABLE

ROOT = Path(__file__).resolve().parents[2]
# Codes no case can portably make a server answer. Keep this short: each needs a reason.
EXCLUDED = {
    "internal": "a server fault; a conforming server has no input that triggers it",
    "sub_job_failed": "an engine process dying; nothing a client sends triggers it",
    "deadline_exceeded": "the server giving up on a slow engine; no portable trigger",
    "not_executed": "a restart between accepting a request and running it (tests/gateway)",
    "unavailable": "a server starting or draining; no portable trigger",
    "dict_key_not_string": "a DSSST1 writer error (DSSST1.md §5.4): a reader never meets it",
    "unsupported_type": "a DSSST1 writer error (DSSST1.md §5.9): a reader never meets it",
}
KNOWN_FEATURES = {
    # LoRA support (capabilities `lora`; conformance/runner/session.py)
    "lora:training",
    "lora:sampling",
    "lora:no_sampler_embeddings",
    "lora:merged",
    "lora:merged_sync",
    "lora:none",
    "idempotency",
    "sequencing",
    "octet_results",
    "grpc",
    "openai",
    "chunk_checksum",
    "leases",
    "auth",
    "alt_token",
    "admin",
    "short_gap_timeout",
    "capacity",
    "unlisted_route",
}
LIMIT = re.compile(
    r"^limit:(max_\w+|retention_seconds|sequence_gap_timeout_seconds|body_read_timeout_seconds)"
    r"(<=|>=|==)\d+$"
)


def test_every_rpc_has_a_case(cases: list[Case]) -> None:
    used = set().union(*(c.ops() for c in cases))
    missing = sorted(set(M.BY_NAME) - used)
    assert not missing, f"RPCs of the method table without a case: {missing}"


def test_every_error_code_has_a_case(cases: list[Case]) -> None:
    used = set().union(*(c.codes() for c in cases))
    missing = sorted(set(ERRORS) - used - set(EXCLUDED))
    assert not missing, f"error codes without a case: {missing}"
    stale = sorted(set(EXCLUDED) & used)
    assert not stale, f"excluded codes that now have a case (drop the exclusion): {stale}"
    assert set(EXCLUDED) <= set(ERRORS)


def test_every_golden_vector_is_sent(cases: list[Case]) -> None:
    index = json.loads((DEFAULT_VECTORS / "index.json").read_text())["vectors"]
    ids = {c.id for c in cases}
    for v in index:
        if v["id"] in NOT_SENDABLE:
            assert v["kind"] == "envelope", v["id"]  # only server-side event lists are excluded
            continue
        assert f"codec/vector/{v['id']}" in ids, v["id"]
    assert len(NOT_SENDABLE) <= 3


def test_every_area_and_tier(cases: list[Case]) -> None:
    areas = {c.area for c in cases}
    assert areas == {
        "ops",
        "invalid",
        "codec",
        "chunking",
        "idempotency",
        "sequencing",
        "polling",
        "auth",
        "limits",
        "jobs",
        "errors",
        "hostile",
        "lora",
        "openai",
    }
    assert {c.tier for c in cases} == {"required", "recommended"}
    assert len({c.id for c in cases}) == len(cases)


def test_feature_names_are_known(cases: list[Case]) -> None:
    for c in cases:
        for f in c.features:
            if f.startswith("route:"):
                assert f[6:] in M.BY_NAME, (c.id, f)
            elif f.startswith("operation_type:"):
                assert f[15:] in (
                    "weight-sync",
                    "reset-prefix-cache",
                    "cancel-request",
                    "tail-logs",
                    "forward",
                ), (c.id, f)
            elif f.startswith("limit:"):
                assert LIMIT.match(f), (c.id, f)
            else:
                assert f in KNOWN_FEATURES, (c.id, f)


def test_runner_is_independent_of_the_sdk_and_the_servers() -> None:
    """The runner may import the codec and the public spec model (`arctic_sdk.spec`) only."""
    allowed_sdk = ("arctic_sdk.spec",)
    for path in sorted((ROOT / "conformance" / "runner").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert not name.startswith("arctic_servers"), (path.name, name)
                assert not name.startswith("conformance.fake"), (path.name, name)
                if name.startswith("arctic_sdk"):
                    assert name.startswith(allowed_sdk), (path.name, name)
