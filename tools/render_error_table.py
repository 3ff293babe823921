"""Render the error table of proto/PROTOCOL.md §6 from errors.proto.

python tools/render_error_table.py          # rewrite the table in place
python tools/render_error_table.py --check  # exit 1 when the committed table is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import spec_loader

BEGIN = "<!-- BEGIN ERROR TABLE (generated from errors.proto; do not edit) -->"
END = "<!-- END ERROR TABLE -->"
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


def updated(text: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{render()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    new = updated(text)
    if "--check" in argv:
        if new != text:
            print("proto/PROTOCOL.md error table is stale: run python tools/render_error_table.py")
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
