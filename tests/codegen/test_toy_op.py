"""Adding an op is a spec change only: a toy op goes into a temporary copy of the proto, the
generator regenerates, and the op is served and callable without hand-written per-op code.

The toy op `toy-sum` is mutating, with a DSSST1 octet body (idempotency class CHUNK_GROUP). The
copy of the repository (proto/, the SDK, the servers, the codec) is regenerated with
`generate.py --root`, then `toy_op_drive.py` runs in a subprocess against that copy (its
`training_service.proto` differs from the committed one, so its modules cannot share a process
with them).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import generate
import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVE = Path(__file__).with_name("toy_op_drive.py")
COPIED = ("proto", "sdk", "servers", "dssst1")

TOY_RPC = """
  // Toy: sums a tensor and scales the sum (codegen test op; never part of the real spec).
  rpc ToySum(stream Frame) returns (stream Frame) {
    option (arctic.v1.op) = {
      name: "toy-sum"
      http_method: "POST"
      http_path: "/{job_id}/toy-sum"
      body: BODY_KIND_DSSST1
      role: ROLE_TRAINING
      idempotency: IDEMPOTENCY_CLASS_CHUNK_GROUP
      fallback: FALLBACK_NONE
      aliases: "toy_sum"
      request_type: "arctic.v1.ToySumRequest"
      response_type: "arctic.v1.ToySumResult"
    };
  }
"""
TOY_MESSAGES = """
// DSSST1 body of toy-sum.
message ToySumRequest {
  Tensor values = 1 [(arctic.v1.field) = {
    required: true, tensor: true, dtypes: ["F32", "F64"], shape: "B,S"
  }];
  // Multiplies the sum (default 1).
  double scale = 2;
}

message ToySumResult {
  double total = 1;
  int64 count = 2;
}
"""


def add_toy_op(proto_root: Path) -> None:
    service = proto_root / "arctic" / "v1" / "training_service.proto"
    text = service.read_text()
    head, sep, tail = text.rpartition("}")  # the service's closing brace is the file's last
    service.write_text(head + TOY_RPC.lstrip("\n") + sep + tail)
    messages = proto_root / "arctic" / "v1" / "training.proto"
    messages.write_text(messages.read_text() + TOY_MESSAGES)


def _snapshot(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


@dataclass(frozen=True)
class ToyRepo:
    root: Path
    regenerated: list[str]  # files that regenerating from the toy spec added, changed or removed


@pytest.fixture(scope="module")
def toy_repo(tmp_path_factory: pytest.TempPathFactory) -> ToyRepo:
    root = tmp_path_factory.mktemp("toy") / "repo"
    for d in COPIED:
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    add_toy_op(root / "proto")
    before = _snapshot(root)
    gen = ROOT / "tools" / "codegen" / "generate.py"
    proc = subprocess.run(
        [sys.executable, str(gen), "--root", str(root)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    after = _snapshot(root)
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    return ToyRepo(root, changed)


def _drive(toy: ToyRepo, mode: str) -> subprocess.CompletedProcess[str]:
    root = toy.root
    paths = [root / "sdk", root / "servers", root]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, paths)))
    return subprocess.run(
        [sys.executable, str(DRIVE), mode],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_adding_an_op_regenerates_only_generated_files(toy_repo: ToyRepo) -> None:
    """Hand-written code needs no change: the only files that regenerating touches are generated."""
    assert "sdk/arctic_sdk/spec/tables/methods.py" in toy_repo.regenerated
    assert "servers/arctic_servers/_generated/servicer.py" in toy_repo.regenerated
    generated = generate.managed_dirs(generate.Layout())
    for path in toy_repo.regenerated:
        assert any(path.startswith(d + "/") for d in generated), path


def test_toy_op_is_in_every_generated_module(toy_repo: ToyRepo) -> None:
    proc = _drive(toy_repo, "static")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_toy_op_is_served_live_by_the_generated_adapters(toy_repo: ToyRepo) -> None:
    proc = _drive(toy_repo, "adapters")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_toy_op_end_to_end_through_the_runtime_retry_runs_once(toy_repo: ToyRepo) -> None:
    proc = _drive(toy_repo, "runtime")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_toy_op_end_to_end_through_the_sdk_clients(toy_repo: ToyRepo) -> None:
    proc = _drive(toy_repo, "sdk")
    if proc.returncode == 77:
        pytest.skip("toy_op_drive.sdk() is not written yet (needs the SDK's transports)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
