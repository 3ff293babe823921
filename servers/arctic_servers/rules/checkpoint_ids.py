"""The checkpoint-id rule and the one resolver from an id to a directory (PROTOCOL.md §13).

A checkpoint id and an exported file name are names, never paths: the rule is the spec's own
(`(arctic.v1.field)` `pattern` / `max_length` on `checkpoint_id` and `filename` in
training.proto), which the body check applies to every route and transport of every server. A
server that keeps checkpoints as files maps an id to a path only through `resolve`, which applies
the rule again and refuses any path that is not a direct child of the job's own checkpoint root
(after symlinks), so a body that escaped the check still cannot leave the job's folder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from arctic_sdk.spec import value_rules
from arctic_sdk.spec.pb.arctic.v1 import options_pb2, training_pb2

from .errors import ProtocolError

__all__ = ["check_filename", "check_id", "check_source_job", "resolve", "resolve_file"]


def _rule(message: Any, name: str) -> options_pb2.FieldOptions:
    fd = message.DESCRIPTOR.fields_by_name[name]
    opts: options_pb2.FieldOptions = fd.GetOptions().Extensions[options_pb2.field]
    assert opts.pattern, f"{message.DESCRIPTOR.name}.{name} has no pattern in training.proto"
    return opts


ID_RULE = _rule(training_pb2.SaveCheckpointRequest, "checkpoint_id")
FILENAME_RULE = _rule(training_pb2.DownloadCheckpointFileRequest, "filename")


def _check(rule: options_pb2.FieldOptions, value: Any, field: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ProtocolError(
            "missing_field" if value in (None, "") else "invalid_argument",
            f"field {field}: {value!r} is not {what}",
            field=field,
            expected=rule.pattern,
        )
    bad = value_rules.string_rule_error(rule, value)
    if bad is not None:
        raise ProtocolError(
            "invalid_argument",
            f"field {field}: {bad} ({what})",
            field=field,
            expected=rule.pattern,
        )
    return value


def check_id(value: Any, field: str = "checkpoint_id") -> str:
    """`value` if it is a checkpoint id under the spec's rule, else a 4xx naming `field`."""
    return _check(ID_RULE, value, field, "a checkpoint id")


def check_filename(value: Any, field: str = "filename") -> str:
    """`value` if it is a plain exported file name under the spec's rule, else a 4xx."""
    return _check(FILENAME_RULE, value, field, "a plain file name")


def _inside(root: Path, name: str, field: str) -> Path:
    base = root.resolve()
    path = (base / name).resolve()
    if path.parent != base or path.name != name:
        raise ProtocolError(
            "invalid_argument",
            f"field {field}: {name!r} does not name an entry of its own folder",
            field=field,
            expected="a name inside the job's checkpoint folder",
        )
    return path


def resolve(root: Path, checkpoint_id: Any, field: str = "checkpoint_id") -> Path:
    """The directory of checkpoint `checkpoint_id` under a job's checkpoint `root`: the id
    passes the rule and the path (symlinks followed) is a direct child of `root`."""
    return _inside(root, check_id(checkpoint_id, field), field)


def resolve_file(directory: Path, filename: Any, field: str = "filename") -> Path:
    """A file directly inside `directory` (an export), by a name that passes the rule."""
    return _inside(directory, check_filename(filename, field), field)


def check_source_job(body: Mapping[str, Any], job_id: str, visible: Callable[[str], object]) -> str:
    """`LoadCheckpointRequest.source_job_id` (default: the job itself). Another job must be
    visible to the caller's token (`visible` raises `job_not_found` otherwise); checked when the
    call is accepted, so a request taken up after a restart was checked with its token."""
    source = body.get("source_job_id") or job_id
    if not isinstance(source, str):
        raise ProtocolError(
            "invalid_argument",
            f"field source_job_id: {source!r} is not a job id",
            field="source_job_id",
        )
    if source != job_id:
        visible(source)
    return source
