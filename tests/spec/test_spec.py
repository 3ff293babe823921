"""The specification is complete: every RPC is bound, every code has a status, docs are current."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import spec_loader

ROOT = spec_loader.ROOT
GRPC_CODES = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
}  # fmt: skip

METHODS = spec_loader.methods()
ERRORS = spec_loader.errors()


@pytest.mark.parametrize("m", METHODS, ids=lambda m: m.rpc)
def test_every_rpc_has_route_and_idempotency_class(m: spec_loader.Method) -> None:
    assert m.name, f"{m.rpc}: no op name"
    assert m.http_method in {"GET", "POST", "DELETE"}, f"{m.rpc}: verb {m.http_method!r}"
    assert m.http_path.startswith("/"), f"{m.rpc}: route {m.http_path!r}"
    assert m.idempotency in {"SAFE", "KEYED", "CHUNK_GROUP"}, f"{m.rpc}: {m.idempotency}"
    assert m.body in {"NONE", "JSON", "DSSST1"}, f"{m.rpc}: body {m.body}"
    assert m.role != "UNSPECIFIED", f"{m.rpc}: no role"
    assert m.fallback != "UNSPECIFIED", f"{m.rpc}: no fallback"
    if m.fallback == "OPERATION":
        assert m.operation_type, f"{m.rpc}: operation fallback without operation_type"
    # DSSST1 bodies are always chunk groups; GETs change nothing.
    assert (m.body == "DSSST1") == (m.idempotency == "CHUNK_GROUP"), m.rpc
    if m.http_method == "GET":
        assert m.idempotency == "SAFE", m.rpc


@pytest.mark.parametrize("m", METHODS, ids=lambda m: m.rpc)
def test_types_resolve_and_path_params_are_fields(m: spec_loader.Method) -> None:
    mods = spec_loader.load_modules()
    pool = mods["options_pb2"].DESCRIPTOR.pool
    req = pool.FindMessageTypeByName(m.request_type)
    if m.response_type:
        pool.FindMessageTypeByName(m.response_type)
    for param in re.findall(r"{(\w+)}", m.http_path):
        if param == "job_id" and m.service.endswith("TrainingService"):
            continue  # data-plane bodies are job-scoped by the route, not a body field
        assert param in req.fields_by_name, f"{m.rpc}: path param {param} not in {req.full_name}"


def test_op_names_routes_and_aliases_are_unique() -> None:
    names = [m.name for m in METHODS]
    assert len(names) == len(set(names))
    routes = [(m.http_method, m.http_path) for m in METHODS]
    assert len(routes) == len(set(routes))
    aliases = [a for m in METHODS for a in m.aliases]
    assert len(aliases) == len(set(aliases))
    assert not set(aliases) & set(names)


def test_design_op_set_is_covered() -> None:
    """DESIGN.md §3: canonical ops, legacy aliases and the operation fallback types."""
    names = {m.name for m in METHODS}
    for op in [
        "forward-backward", "forward", "step", "save", "load-checkpoint", "generate",
        "log-probs", "operation", "sleep-inference", "wake-inference", "sleep-training",
        "wake-training", "sync-weights", "reset-prefix-cache", "list-checkpoints",
        "export-checkpoint", "delete-checkpoint", "create-job", "get-job", "list-jobs",
        "cancel-job", "get-capacity", "get-request", "cancel-request", "get-capabilities",
    ]:  # fmt: skip
        assert op in names, op
    aliases = {a for m in METHODS for a in m.aliases}
    for legacy in [
        "fwd-bwd", "fwd-no-grad", "save-checkpoint", "empty-training-cache",
        "save-weights", "sleep-log-prob", "wake-log-prob",
    ]:  # fmt: skip
        assert legacy in aliases, legacy
    optypes = {m.operation_type for m in METHODS if m.operation_type}
    assert {"forward", "reset-prefix-cache", "cancel-request", "weight-sync"} <= optypes


@pytest.mark.parametrize("e", ERRORS, ids=lambda e: e.code)
def test_every_error_code_has_a_status(e: spec_loader.ErrorEntry) -> None:
    assert 400 <= e.http_status <= 599, e
    assert e.grpc_status in GRPC_CODES, e
    assert e.doc, f"{e.code}: undocumented"
    # A 5xx is never the caller's fault; 4xx is, except backpressure (429 rate_limited).
    if e.http_status >= 500 or e.http_status == 429:
        assert not e.user_fault, e.code
    else:
        assert e.user_fault, e.code


def test_error_codes_are_unique_and_snake_case() -> None:
    codes = [e.code for e in ERRORS]
    assert len(codes) == len(set(codes))
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", c) for c in codes)
    for required in [
        "chunk_group_restart_required", "chunk_group_conflict", "chunk_group_missing_chunks",
        "idempotency_key_conflict",
    ]:  # fmt: skip
        assert required in codes


def _dssst1_codes() -> set[str]:
    """Every code named in a table row of DSSST1.md §6 (reader checks) and §8 (chunking)."""
    text = (ROOT / "proto" / "DSSST1.md").read_text()
    codes: set[str] = set()
    for section in re.split(r"\n## ", text):
        if not section.startswith(("6.", "8.")):
            continue
        column = None
        for line in section.splitlines():
            if not line.startswith("|"):
                column = None
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if column is None:
                column = cells.index("code") if "code" in cells else -1
            elif column >= 0 and re.fullmatch(r"`[a-z_0-9]+`", cells[column]):
                codes.add(cells[column].strip("`"))
    return codes


def test_every_codec_check_is_an_error_code() -> None:
    codec = _dssst1_codes()
    assert len(codec) >= 30, sorted(codec)
    missing = codec - {e.code for e in ERRORS}
    assert not missing, f"DSSST1.md codes absent from errors.proto: {sorted(missing)}"


def test_protocol_error_table_is_current() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "render_error_table.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_protocol_doc_names_every_route_option_decision() -> None:
    text = (ROOT / "proto" / "PROTOCOL.md").read_text()
    for needle in [
        "Idempotency-Key", "X-Arctic-Seq", "application/octet-stream", "capabilities",
        "snake_case", "chunk_group_restart_required", "x-arctic-job-id", "4 MiB", "60 MiB",
        "global_num_tokens", "FALLBACK_OPERATION", "Bearer",
    ]:  # fmt: skip
        assert needle in text, needle
