"""Render the spec's tables in proto/PROTOCOL.md: the error table of §6 from errors.proto, and
the per-loss field table of §9 from the `(arctic.v1.field)` options of training.proto.

python tools/render_error_table.py          # rewrite the tables in place
python tools/render_error_table.py --check  # exit 1 when a committed table is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import spec_loader

BEGIN = "<!-- BEGIN ERROR TABLE (generated from errors.proto; do not edit) -->"
END = "<!-- END ERROR TABLE -->"
LOSS_BEGIN = "<!-- BEGIN LOSS TABLE (generated from training.proto; do not edit) -->"
LOSS_END = "<!-- END LOSS TABLE -->"
LOSS_REQUEST = "arctic.v1.ForwardBackwardRequest"
LOSS_SELECTOR = "processing.loss_fn"
DOC = spec_loader.ROOT / "proto" / "PROTOCOL.md"


def render() -> str:
    rows = [
        "| code | HTTP | gRPC | fault | retry | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for e in spec_loader.errors():
        fault = "user" if e.user_fault else "server"
        retry = "yes" if e.retryable else "no"
        doc = e.doc.replace("|", "\\|")
        rows.append(
            f"| `{e.code}` | {e.http_status} | {e.grpc_status} | {fault} | {retry} | {doc} |"
        )
    return "\n".join(rows)


def _loss_fields() -> tuple[list[str], list[tuple[str, list[str], str]]]:
    """(the values of `processing.loss_fn`, [(path, losses, requires)] of every leaf field)."""
    mods = spec_loader.load_modules()
    ext = mods["options_pb2"].field
    desc = mods["training_pb2"].DESCRIPTOR.message_types_by_name[LOSS_REQUEST.split(".")[-1]]
    out: list[tuple[str, list[str], str]] = []
    values: list[str] = []

    def walk(d, prefix: str) -> None:  # type: ignore[no-untyped-def]
        for f in d.fields:
            path = prefix + f.name
            opts = f.GetOptions().Extensions[ext]
            if path == LOSS_SELECTOR:
                values.extend(opts.values)
            nested = f.message_type
            if (
                nested is not None
                and not opts.tensor
                and nested.name
                in (
                    "ModelInputs",
                    "LossContext",
                    "Processing",
                    "LossConfig",
                )
            ):
                walk(nested, path + ".")
            elif path.split(".")[0] in ("kwargs", "context", "processing"):
                out.append((path, list(opts.losses), opts.requires))

    walk(desc, "")
    return values, out


def render_losses() -> str:
    values, fields = _loss_fields()
    common = [p for p, losses, req in fields if not losses and p != LOSS_SELECTOR]
    rows = ["| `loss_fn` | reads, beyond the fields every loss reads |", "|---|---|"]
    for v in values:
        own = [p for p, losses, _ in fields if v in losses]
        rows.append(f"| `{v}` | {', '.join(f'`{p}`' for p in own) or '—'} |")
    needs = [f"`{p}` needs `{req}`" for p, _, req in fields if req]
    rows += [
        "",
        "Every loss reads " + ", ".join(f"`{p}`" for p in common) + "; " + "; ".join(needs) + ".",
    ]
    return "\n".join(rows)


def _replace(text: str, begin: str, end: str, body: str) -> str:
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def updated(text: str) -> str:
    text = _replace(text, BEGIN, END, render())
    return _replace(text, LOSS_BEGIN, LOSS_END, render_losses())


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    new = updated(text)
    if "--check" in argv:
        if new != text:
            print("proto/PROTOCOL.md tables are stale: run python tools/render_error_table.py")
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
