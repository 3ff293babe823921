"""The protocol's JSON mapping of protobuf messages (PROTOCOL.md §2).

protobuf's own JSON mapping differs from the deployed wire in two ways this module fixes: enum
values travel as the lowercase name without the type prefix ("running", not "JOB_STATE_RUNNING"),
and 64-bit integers travel as JSON numbers, not strings. Field names stay snake_case.
"""

from __future__ import annotations

from typing import Any, cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

# Deployed synonyms readers accept (PROTOCOL.md §2).
SYNONYMS = {
    "succeeded": "completed",
    "done": "completed",
    "canceled": "cancelled",
    "log_probability": "log_prob",
}
_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _prefix(enum: EnumDescriptor) -> str:
    return "".join("_" + c if c.isupper() else c for c in enum.name).lstrip("_").upper() + "_"


def enum_to_json(enum: EnumDescriptor, full_name: str) -> str:
    """`JOB_STATE_RUNNING` -> "running"."""
    return full_name.removeprefix(_prefix(enum)).lower()


def enum_from_json(enum: EnumDescriptor, value: str) -> str:
    """ "running" (or "JOB_STATE_RUNNING", or a deployed synonym) -> `JOB_STATE_RUNNING`."""
    if value in enum.values_by_name:
        return value
    short = SYNONYMS.get(value.lower(), value.lower())
    full = _prefix(enum) + short.upper()
    if full not in enum.values_by_name:
        raise ValueError(f"{value!r} is not a value of {enum.full_name}")
    return full


def _walk_out(desc: Descriptor, obj: dict[str, Any]) -> dict[str, Any]:
    for fd in desc.fields:
        if fd.name not in obj:
            continue
        obj[fd.name] = _convert(fd, obj[fd.name], out=True)
    return obj


def _walk_in(desc: Descriptor, obj: dict[str, Any]) -> dict[str, Any]:
    out = dict(obj)
    for fd in desc.fields:
        if fd.name in out and out[fd.name] is not None:
            out[fd.name] = _convert(fd, out[fd.name], out=False)
        elif fd.name in out:
            del out[fd.name]
    return out


def _convert(fd: FieldDescriptor, value: Any, *, out: bool) -> Any:
    mt = fd.message_type
    if mt is not None and mt.GetOptions().map_entry:
        vfd = mt.fields_by_name["value"]
        return {k: _convert_one(vfd, v, out=out) for k, v in value.items()}
    if fd.is_repeated:
        return [_convert_one(fd, v, out=out) for v in value]
    return _convert_one(fd, value, out=out)


def _convert_one(fd: FieldDescriptor, value: Any, *, out: bool) -> Any:
    mt = fd.message_type
    if mt is not None:
        if mt.full_name.startswith("google.protobuf.") or not isinstance(value, dict):
            return value
        return _walk_out(mt, value) if out else _walk_in(mt, value)
    if fd.enum_type is not None and isinstance(value, str):
        return enum_to_json(fd.enum_type, value) if out else enum_from_json(fd.enum_type, value)
    if out and fd.type in _INT64 and isinstance(value, str):
        return int(value)
    return value


def message_to_json(msg: Message) -> dict[str, Any]:
    """A message as the protocol's JSON object."""
    obj = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    return _walk_out(cast(Descriptor, msg.DESCRIPTOR), obj)


def json_to_message(obj: dict[str, Any], cls: type[Message], *, strict: bool = False) -> Message:
    """The protocol's JSON object as a message; fields the message lacks are dropped unless
    `strict`."""
    msg = cls()
    desc = cast(Descriptor, msg.DESCRIPTOR)
    json_format.ParseDict(_walk_in(desc, obj), msg, ignore_unknown_fields=not strict)
    return msg
