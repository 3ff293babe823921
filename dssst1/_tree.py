"""Reader checks R19-R23: from a validated header to the decoded value (`proto/DSSST1.md` §3, §6).

`build_value` walks the structure tree once and asks an adapter (NumPy, torch, raw) for each
tensor view. When anything is wrong it reports nothing itself: `diagnose` re-walks the tree in the
spec's order — R19 over the whole tree (``j`` leaves included: each JSON array or object inside
one is one level deeper), then R20-R22 node by node in a depth-first walk, then R23 — and returns
the first failure with its path. Keeping the ordered checks out of the hot path keeps decoding at
about a microsecond per node.

Depth: the root node is at depth 1 and each ``d``/``l``/``u`` child one deeper; the value of a
``j`` leaf at depth ``k``, when it is an array or object, is at depth ``k + 1``, and so on inward.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

from ._errors import DSSError, ErrorCode, got_type, got_value
from ._format import PLACEHOLDER_NAME
from ._header import Entry, Header

__all__ = ["MakeTensor", "build_value", "diagnose"]

#: An adapter's tensor factory: an `Entry` (dtype name, shape, absolute byte offset, byte length)
#: -> a tensor viewing those bytes.
MakeTensor = Callable[[Entry], Any]

_SCALAR_SHAPE = (1,)
_CONTAINERS = ("d", "l", "u")
_unpack_f64 = struct.Struct("<d").unpack_from


class _Bad(Exception):
    """Internal: the fast walk met something wrong; `diagnose` finds out what."""


def _json_too_deep(value: Any, depth: int, max_depth: int) -> bool:
    """Whether a JSON array / object at ``depth`` holds a container deeper than ``max_depth``."""
    if depth > max_depth:
        return True
    children = value if type(value) is list else value.values()
    if len(children) > 8:  # long lists of scalars (token ids): look at the types at C speed
        kinds = set(map(type, children))
        if list not in kinds and dict not in kinds:
            return False
    for child in children:
        kind = type(child)
        if (kind is list or kind is dict) and _json_too_deep(child, depth + 1, max_depth):
            return True
    return False


class _Builder:
    """The fast walk: builds the value, raises `_Bad` at the first thing that is not right."""

    __slots__ = ("buffer", "entries", "make", "max_depth", "used")

    def __init__(self, header: Header, make: MakeTensor, max_depth: int) -> None:
        self.entries = header.entries
        self.buffer = header.buffer
        self.make = make
        self.max_depth = max_depth
        self.used: set[str] = set()

    def flagged(self, entry: Entry, flags: Any) -> Any:
        if type(flags) is not dict:
            raise _Bad
        scalar = flags.get("scalar", False)
        if type(scalar) is not bool:
            raise _Bad
        dtype, shape, offset, nbytes = entry
        if "py" not in flags:
            if scalar:
                if shape != _SCALAR_SHAPE:
                    raise _Bad
                return self.make((dtype, (), offset, nbytes))
            return self.make(entry)
        py = flags["py"]
        if py == "float":
            if not scalar or dtype != "F64" or shape != _SCALAR_SHAPE:
                raise _Bad
            return _unpack_f64(self.buffer, offset)[0]
        if py == "bytes":
            if scalar or dtype != "U8" or len(shape) != 1:
                raise _Bad
            return bytes(self.buffer[offset : offset + nbytes])
        raise _Bad

    def walk(self, node: Any, depth: int) -> Any:
        if type(node) is not list or depth > self.max_depth:
            raise _Bad
        arity = len(node)
        tag = node[0] if arity else None
        if tag == "t":
            name: Any = node[1] if arity == 2 or arity == 3 else None
            entry = self.entries.get(name) if type(name) is str else None
            if entry is None:
                raise _Bad
            self.used.add(name)
            return self.make(entry) if arity == 2 else self.flagged(entry, node[2])
        if arity != 2:
            raise _Bad
        items = node[1]
        if tag == "j":
            if (type(items) is list or type(items) is dict) and _json_too_deep(
                items, depth + 1, self.max_depth
            ):
                raise _Bad
            return items
        if type(items) is not list:
            raise _Bad
        depth += 1
        if depth > self.max_depth and items:  # the children would be too deep
            raise _Bad
        # Children that are plain ["t", name] leaves (most leaves) are made here, not by a call.
        walk, make, entries, use = self.walk, self.make, self.entries, self.used.add
        if tag == "d":
            out: dict[str, Any] = {}
            for item in items:
                if type(item) is not list or len(item) != 2 or type(item[0]) is not str:
                    raise _Bad
                child = item[1]
                if type(child) is list and len(child) == 2 and child[0] == "t":
                    name = child[1]
                    entry = entries.get(name) if type(name) is str else None
                    if entry is None:
                        raise _Bad
                    use(name)
                    out[item[0]] = make(entry)
                else:
                    out[item[0]] = walk(child, depth)
            if len(out) != len(items):
                raise _Bad
            return out
        if tag != "l" and tag != "u":
            raise _Bad
        values = []
        for child in items:
            if type(child) is list and len(child) == 2 and child[0] == "t":
                name = child[1]
                entry = entries.get(name) if type(name) is str else None
                if entry is None:
                    raise _Bad
                use(name)
                values.append(make(entry))
            else:
                values.append(walk(child, depth))
        return values if tag == "l" else tuple(values)


def build_value(header: Header, make: MakeTensor, max_depth: int) -> Any:
    """Decode ``header.tree`` into a value, or raise the first failing R19-R23 check."""
    builder = _Builder(header, make, max_depth)
    try:
        value = builder.walk(header.tree, 1)
    except (_Bad, RecursionError):
        raise diagnose(header, max_depth) from None
    used, entries = builder.used, header.entries
    if len(used) != len(entries) and any(
        name not in used and name != PLACEHOLDER_NAME for name in entries
    ):
        raise diagnose(header, max_depth)
    return value


# --------------------------------------------------------------------------- ordered checks


def _children(node: Any, path: str) -> Iterator[tuple[Any, str]]:
    """The child nodes of a well-enough formed container node."""
    if type(node) is not list or len(node) != 2 or node[0] not in _CONTAINERS:
        return
    items = node[1]
    if type(items) is not list:
        return
    if node[0] == "d":
        for item in items:
            if type(item) is list and len(item) == 2:
                yield item[1], f"{path}[{item[0]!r}]"
    else:
        for index, child in enumerate(items):
            yield child, f"{path}[{index}]"


def _nodes(tree: Any) -> Iterator[tuple[Any, str, int]]:
    """Every node in depth-first pre-order with its path and depth, without recursion."""
    stack: list[tuple[Any, str, int]] = [(tree, "tree", 1)]
    while stack:
        node, path, depth = stack.pop()
        yield node, path, depth
        children = list(_children(node, path))
        stack.extend((child, child_path, depth + 1) for child, child_path in reversed(children))


def _json_depth_error(value: Any, path: str, depth: int, max_depth: int) -> DSSError | None:
    """R19 inside a ``j`` leaf whose value sits at ``depth``, without recursion."""
    stack: list[tuple[Any, str, int]] = [(value, path, depth)]
    while stack:
        item, where, level = stack.pop()
        if type(item) is not list and type(item) is not dict:
            continue
        if level > max_depth:
            return DSSError(
                ErrorCode.TREE_TOO_DEEP, where, f"nesting of at most {max_depth}", f"depth {level}"
            )
        pairs = enumerate(item) if isinstance(item, list) else item.items()
        stack.extend((child, f"{where}[{key!r}]", level + 1) for key, child in pairs)
    return None


def _depth_error(tree: Any, max_depth: int) -> DSSError | None:
    for node, path, depth in _nodes(tree):
        if depth > max_depth:
            return DSSError(
                ErrorCode.TREE_TOO_DEEP, path, f"nesting of at most {max_depth}", f"depth {depth}"
            )
        if type(node) is list and len(node) == 2 and node[0] == "j":
            found = _json_depth_error(node[1], f"{path}.j", depth + 1, max_depth)
            if found is not None:
                return found
    return None


def _form_error(node: Any, path: str) -> DSSError | None:
    """R20 for one node, as far as it does not depend on the named tensor."""

    def bad(expected: str, got: str | None = None) -> DSSError:
        return DSSError(ErrorCode.TREE_INVALID, path, expected, got)

    if type(node) is not list or not node:
        return bad("a node [tag, ...]", got_value(node))
    tag, arity = node[0], len(node)
    if tag == "t":
        if arity not in (2, 3):
            return bad('["t", name] or ["t", name, flags]', f"{arity} elements")
        if type(node[1]) is not str:
            return bad("a tensor name (a string)", got_type(node[1]))
        return None if arity == 2 else _flags_error(node[2], f"{path}.flags")
    if tag not in ("j", *_CONTAINERS):
        return bad('a tag of "t", "j", "d", "l", "u"', got_value(tag))
    if arity != 2:
        return bad(f'["{tag}", ...] with 2 elements', f"{arity} elements")
    if tag == "j":
        return None
    items = node[1]
    if type(items) is not list:
        return bad(f'["{tag}", [...]]', got_type(items))
    if tag == "d":
        seen: set[str] = set()
        for item in items:
            if type(item) is not list or len(item) != 2:
                return bad("[key, node] pairs", got_value(item))
            if type(item[0]) is not str:
                return bad("a string dict key", got_type(item[0]))
            if item[0] in seen:
                return bad("unique dict keys", f"{item[0]!r} twice")
            seen.add(item[0])
    return None


def _flags_error(flags: Any, where: str) -> DSSError | None:
    if type(flags) is not dict:
        return DSSError(ErrorCode.TREE_INVALID, where, "a flags object", got_type(flags))
    scalar = flags.get("scalar", False)
    if type(scalar) is not bool:
        return DSSError(
            ErrorCode.TREE_INVALID, f"{where}.scalar", "true or false", got_value(scalar)
        )
    if "py" not in flags:
        return None
    py = flags["py"]
    if py == "float" and not scalar:
        return DSSError(ErrorCode.TREE_INVALID, where, '"py": "float" with "scalar": true')
    if py == "bytes" and scalar:
        return DSSError(ErrorCode.TREE_INVALID, where, '"py": "bytes" without "scalar": true')
    if py not in ("float", "bytes"):
        return DSSError(ErrorCode.TREE_INVALID, f"{where}.py", '"float" or "bytes"', got_value(py))
    return None


def _tensor_error(node: list[Any], path: str, entries: dict[str, Entry]) -> DSSError | None:
    """R21, then the tensor-dependent parts of R20 and R22, for a well-formed ``t`` node."""
    entry = entries.get(node[1])
    if entry is None:
        return DSSError(
            ErrorCode.TENSOR_MISSING, path, "a tensor named in the header", got_value(node[1])
        )
    flags = node[2] if len(node) == 3 else {}
    dtype, shape = entry[0], entry[1]
    where = f"{path}.flags"
    if flags.get("py") == "float" and dtype != "F64":
        return DSSError(ErrorCode.TREE_INVALID, where, '"py": "float" on an F64 tensor', dtype)
    if flags.get("py") == "bytes" and (dtype != "U8" or len(shape) != 1):
        got = f"{dtype} with {len(shape)} dimensions"
        return DSSError(ErrorCode.TREE_INVALID, where, '"py": "bytes" on a 1-D U8 tensor', got)
    if flags.get("scalar") is True and shape != _SCALAR_SHAPE:
        return DSSError(
            ErrorCode.SCALAR_SHAPE_INVALID, path, "stored shape [1] for a scalar", str(list(shape))
        )
    return None


def diagnose(header: Header, max_depth: int) -> DSSError:
    """The first failing check of R19-R23, in the spec's order."""
    tree, entries = header.tree, header.entries
    found = _depth_error(tree, max_depth)
    if found is not None:
        return found
    used: set[str] = set()
    for node, path, _ in _nodes(tree):
        found = _form_error(node, path)
        if found is None and node[0] == "t":
            found = _tensor_error(node, path, entries)
            used.add(node[1])
        if found is not None:
            return found
    for name in entries:
        if name not in used and name != PLACEHOLDER_NAME:
            return DSSError(
                ErrorCode.TENSOR_UNREFERENCED, f"header[{name!r}]", "a tensor named by the tree"
            )
    # The fast walk fails without a finding only past the interpreter's recursion limit.
    return DSSError(
        ErrorCode.TREE_TOO_DEEP, "tree", "nesting within the interpreter's recursion limit"
    )
