"""The protocol's JSON mapping of control-plane messages, written for the runner (PROTOCOL.md §2).

Field names are the proto names (snake_case); enum values travel as the value name without its
type prefix, lowercased (`JOB_STATE_RUNNING` <-> "running"); int64 fields are JSON numbers. This
is deliberately not protobuf's JSON mapping (camelCase names, full enum names, int64 as strings),
and not the SDK's converter: the suite checks what a server does with its own reading of the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

import arctic_sdk.spec.pb.arctic.v1 as _pb  # noqa: F401  (registers the spec's messages)

_WELL_KNOWN = frozenset(
    {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}
)
_SYNONYMS = {
    "succeeded": "completed",
    "done": "completed",
    "canceled": "cancelled",
    "log_probability": "log_prob",
}


def message_class(full_name: str) -> type[Message]:
    desc = descriptor_pool.Default().FindMessageTypeByName(full_name)
    cls: type[Message] = message_factory.GetMessageClass(desc)
    return cls


def _enum_prefix(enum: EnumDescriptor) -> str:
    name = enum.name
    return "".join("_" + c if c.isupper() else c for c in name).lstrip("_").upper() + "_"


def enum_to_json(enum: EnumDescriptor, number: int) -> str:
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    return value.name.removeprefix(_enum_prefix(enum)).lower()


def enum_from_json(enum: EnumDescriptor, text: Any) -> int:
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    raw = str(text)
    if raw in enum.values_by_name:
        return int(enum.values_by_name[raw].number)
    short = _SYNONYMS.get(raw.lower(), raw.lower())
    full = _enum_prefix(enum) + short.upper()
    if full in enum.values_by_name:
        return int(enum.values_by_name[full].number)
    raise ValueError(f"{text!r} is not a value of {enum.full_name}")


# ---------------------------------------------------------------------------- JSON -> message


def to_message(value: Mapping[str, Any], cls: type[Message]) -> Message:
    """Build a message from the protocol's JSON form (unknown fields raise ValueError)."""
    msg = cls()
    _fill(msg, value)
    return msg


def _fill(msg: Message, value: Any) -> None:
    desc: Any = msg.DESCRIPTOR
    if desc.full_name in _WELL_KNOWN:
        json_format.ParseDict(value, msg)
        return
    for key, item in value.items():
        fd = desc.fields_by_name.get(key)
        if fd is None:
            raise ValueError(f"{desc.full_name} has no field {key!r}")
        if item is None:
            continue
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            target = getattr(msg, key)
            vfd = fd.message_type.fields_by_name["value"]
            for k, v in item.items():
                if vfd.message_type is not None:
                    _fill(target[k], v)
                else:
                    target[k] = _scalar_in(vfd, v)
        elif fd.is_repeated:
            target = getattr(msg, key)
            for v in [item] if isinstance(item, str | Mapping) else item:
                if fd.message_type is not None:
                    _fill(target.add(), v)
                else:
                    target.append(_scalar_in(fd, v))
        elif fd.message_type is not None:
            sub = getattr(msg, key)
            if fd.message_type.full_name in _WELL_KNOWN:
                json_format.ParseDict(item, sub)
            else:
                _fill(sub, item)
        else:
            setattr(msg, key, _scalar_in(fd, item))


def _scalar_in(fd: FieldDescriptor, value: Any) -> Any:
    if fd.enum_type is not None:
        return enum_from_json(fd.enum_type, value)
    return value


# ---------------------------------------------------------------------------- message -> JSON


def to_json(msg: Message) -> dict[str, Any]:
    """The protocol's JSON form of a message (unset scalars included, as servers send them)."""
    out = _message(msg)
    assert isinstance(out, dict)
    return out


def _message(msg: Message) -> Any:
    desc: Any = msg.DESCRIPTOR
    if desc.full_name in _WELL_KNOWN:
        return json_format.MessageToDict(msg)
    out: dict[str, Any] = {}
    for fd in desc.fields:
        value = getattr(msg, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            vfd = fd.message_type.fields_by_name["value"]
            out[fd.name] = {
                k: (_message(v) if vfd.message_type is not None else _scalar_out(vfd, v))
                for k, v in value.items()
            }
        elif fd.is_repeated:
            out[fd.name] = [
                _message(v) if fd.message_type is not None else _scalar_out(fd, v) for v in value
            ]
        elif fd.message_type is not None:
            if msg.HasField(fd.name):
                out[fd.name] = _message(value)
        elif fd.has_presence and not msg.HasField(fd.name):
            continue
        else:
            out[fd.name] = _scalar_out(fd, value)
    return out


def _scalar_out(fd: FieldDescriptor, value: Any) -> Any:
    if fd.enum_type is not None:
        return enum_to_json(fd.enum_type, int(value))
    return value
