"""The code blocks of the README and of the user docs it links, with what each needs to run.

A block's marker is an HTML comment on the line before its fence (the rendered docs hide it):

- `<!-- snippet: server -->`: a `python` block that needs a running server; the test starts the
  fake-engine gateway and replaces `127.0.0.1:8080` / `port=8080` by its address;
- `<!-- snippet: run -->`: a `bash` block that is cheap and safe to run as written;
- `<!-- snippet: not run: REASON -->`: a block that cannot run here (a GPU, the real engines,
  minutes of CPU); it is still compiled or syntax-checked, and reported with its reason.

A `python` block without a marker runs as written; a `bash` block must say `run` or `not run`.
Every `bash` block is syntax-checked (`bash -n`), each `python -m` command of this project in it
answers `--help`, and each script it names (`python tools/x.py`, `bash tools/x.sh`) exists. Other
fences (`text`, `yaml`, `promql`, bare) hold output and formats, not code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CODE = {"python": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
MARKER = re.compile(r"^<!-- snippet: (.*?) -->$")
KINDS = ("default", "server", "run", "not run")
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # the fence's line, 1-based
    lang: str  # "python" or "bash"
    code: str
    kind: str  # one of KINDS
    reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


class MarkerError(ValueError):
    pass


def _marker(text: str, where: str) -> tuple[str, str]:
    if text in ("server", "run"):
        return text, ""
    if text.startswith("not run:") and text[len("not run:") :].strip():
        return "not run", text[len("not run:") :].strip()
    raise MarkerError(f"{where}: unknown snippet marker {text!r} (server, run, not run: REASON)")


def blocks(doc: Path) -> list[Block]:
    """Every python and shell block of `doc`, with its marker."""
    lines = doc.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise MarkerError(f"{doc}:{i + 1}: unclosed code fence")
        lang = CODE.get(m.group(1))
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mk = MARKER.match(prev.strip())
        where = f"{doc.relative_to(ROOT)}:{i + 1}"
        if lang is not None:
            kind, reason = _marker(mk.group(1), where) if mk else ("default", "")
            if kind == "server" and lang != "python":
                raise MarkerError(f"{where}: `server` marks python blocks only")
            if kind == "run" and lang != "bash":
                raise MarkerError(f"{where}: python blocks run without a marker")
            if kind == "default" and lang == "bash":
                raise MarkerError(f"{where}: a bash block says `run` or `not run: REASON`")
            out.append(Block(doc, i + 1, lang, "\n".join(lines[i + 1 : end]) + "\n", kind, reason))
        elif mk:
            raise MarkerError(f"{where}: a snippet marker on a `{m.group(1)}` fence")
        i = end + 1
    return out


SCRIPT = re.compile(r"(?:^|\s)(?:python3?|bash)\s+((?:tools|bench|examples)/[\w/.-]+\.(?:py|sh))")


def scripts(code: str) -> list[str]:
    """The repository scripts a shell block runs (`python tools/x.py`, `bash tools/x.sh`)."""
    return SCRIPT.findall(code)


def links(doc: Path) -> list[Path]:
    """The local files `doc` links to (relative links; web addresses left out)."""
    out = []
    for target, _ in LINK.findall(doc.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        out.append((doc.parent / target).resolve())
    return out


def user_docs() -> list[Path]:
    """The README and every Markdown doc it links, and the docs those link in turn (within the
    repository; tests' own notes and the code's folders are not user docs)."""
    seen = [README]
    todo = [README]
    while todo:
        for path in links(todo.pop()):
            if path.suffix == ".md" and path.is_file() and path not in seen:
                rel = path.relative_to(ROOT).parts if ROOT in path.parents else ("..",)
                if rel[0] not in ("..", "tests") and rel[:2] != ("bench", "results"):
                    seen.append(path)
                    todo.append(path)
    return seen


def all_blocks() -> list[Block]:
    return [b for doc in user_docs() for b in blocks(doc)]
