"""The checkpoint-id rule and the one resolver (rules/checkpoint_ids.py) that the gateway and
the on-prem server map ids to directories with (issue 14 §1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from arctic_servers.rules import checkpoint_ids
from arctic_servers.rules.errors import ProtocolError
from arctic_servers.serving import checkpoint_files as cf

BAD = ["../job-a/victim", "..", ".", "/tmp/x", "a/b", "a\\b", "victim\x00", "a" * 129, "",
       ".hidden", "-x", "é", "vic tim", "%2e%2e"]  # fmt: skip


@pytest.mark.parametrize("bad", BAD)
def test_resolve_refuses(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ProtocolError) as info:
        checkpoint_ids.resolve(tmp_path / "job-b", bad)
    assert info.value.code in ("invalid_argument", "missing_field")
    assert info.value.details["field"] == "checkpoint_id"


def test_resolve_stays_inside_the_job(tmp_path: Path) -> None:
    root = tmp_path / "job-b"
    root.mkdir()
    assert checkpoint_ids.resolve(root, "step-3.final_v2") == (root / "step-3.final_v2").resolve()
    (root / "link").symlink_to(tmp_path / "job-a")  # a symlink out of the folder is refused too
    with pytest.raises(ProtocolError):
        checkpoint_ids.resolve(root, "link")


def test_checkpoint_dirs_never_leave_the_root(tmp_path: Path) -> None:
    """DELETE of ../job-a/victim through CheckpointDirs (both servers) leaves job A's checkpoint
    and a directory outside the data dir in place."""
    dirs = cf.CheckpointDirs(lambda job: tmp_path / "ckpts" / job)
    dirs.write_meta("job-a", "victim", {"checkpoint_id": "victim"})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "meta.json").write_text("{}")
    import asyncio

    for bad in ("../job-a/victim", "../../outside", str(outside)):
        with pytest.raises(ProtocolError):
            asyncio.run(dirs.delete("job-b", bad))
        with pytest.raises(ProtocolError):
            asyncio.run(dirs.read_exported("job-b", bad, "config.json"))
    with pytest.raises(ProtocolError):
        asyncio.run(dirs.read_exported("job-a", "victim", "../meta.json"))
    assert dirs.meta("job-a", "victim") == {"checkpoint_id": "victim"}
    assert (outside / "meta.json").is_file()


def test_source_job_is_the_callers() -> None:
    seen: list[str] = []

    def visible(job: str) -> None:
        seen.append(job)
        raise ProtocolError("job_not_found", f"no job {job}")

    assert checkpoint_ids.check_source_job({}, "job-b", visible) == "job-b"
    with pytest.raises(ProtocolError) as info:
        checkpoint_ids.check_source_job({"source_job_id": "job-a"}, "job-b", visible)
    assert info.value.code == "job_not_found" and seen == ["job-a"]
