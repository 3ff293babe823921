"""Every code block of the README and of the user docs it links runs as written (issue 37): a
snippet that breaks fails here. What runs how is `snippets.py`'s docstring (and docs/TESTING.md);
blocks marked `not run` are compiled or syntax-checked and listed in the session's summary."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import check_wheel  # tools/ (tests/conftest.py puts it on the path)
import pytest

from . import snippets as S
from .conftest import NOT_RUN, DocServer, scratch, snippet_env

BLOCKS = S.all_blocks()
TIMEOUT_S = 180


def _run(argv: list[str], cwd: Path, what: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, cwd=cwd, env=snippet_env(), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, f"{what} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def _for_server(code: str, server: DocServer) -> str:
    """The snippet, pointed at the test's gateway instead of the docs' 127.0.0.1:8080."""
    assert "127.0.0.1:8080" in code or "port=8080" in code, "a `server` snippet names 8080"
    port = server.host_port.rsplit(":", 1)[1]
    return code.replace("127.0.0.1:8080", server.host_port).replace("port=8080", f"port={port}")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "python"], ids=lambda b: b.id)
def test_python_block(block: S.Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    code = block.code
    compile(code, block.id, "exec")
    if block.kind == "not run":
        NOT_RUN[block.id] = block.reason
        return
    if block.kind == "server":
        code = _for_server(code, request.getfixturevalue("doc_server"))
    cwd = scratch(tmp_path)
    (cwd / "snippet.py").write_text(code)
    _run([sys.executable, "snippet.py"], cwd, block.id)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "bash"], ids=lambda b: b.id)
def test_shell_block(block: S.Block, tmp_path: Path) -> None:
    cwd = scratch(tmp_path)
    (cwd / "snippet.sh").write_text(block.code)
    _run(["bash", "-n", "snippet.sh"], cwd, f"bash -n of {block.id}")
    missing = [p for p in S.scripts(block.code) if not (S.ROOT / p).is_file()]
    assert not missing, f"{block.id} runs scripts that do not exist: {missing}"
    if block.kind == "not run":
        NOT_RUN[block.id] = block.reason
    elif block.kind == "run":
        bindir = Path(sys.executable).parent  # `python` is this interpreter, as in an active venv
        code = f'export PATH="{bindir}:$PATH"\nset -e\n{block.code}'
        (cwd / "snippet.sh").write_text(code)
        _run(["bash", "snippet.sh"], cwd, block.id)


COMMANDS = sorted({c for b in BLOCKS if b.lang == "bash" for c in check_wheel.entry_points(b.code)})


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_python_m_commands_in_the_docs_answer_help(cmd: tuple[str, ...], tmp_path: Path) -> None:
    _run([sys.executable, "-m", *cmd, "--help"], scratch(tmp_path), f"python -m {' '.join(cmd)}")


def test_every_block_is_found_and_classified() -> None:
    """The doc set is what the README links (nothing a user reads is left out), and the blocks
    the issue named are among those run."""
    docs = {str(d.relative_to(S.ROOT)) for d in S.user_docs()}
    for need in (
        "proto/PROTOCOL.md",
        "conformance/README.md",
        "servers/README.md",
        "servers/arctic_servers/tinker/ROUTES.md",
        "bench/README.md",
        "docs/SDK.md",
        "docs/FRAMEWORKS.md",
        "servers/OPENAI.md",
        "servers/TINKER.md",
        "servers/GATEWAY.md",
    ):
        assert need in docs, need
    run = [b for b in BLOCKS if b.lang == "python" and b.kind != "not run"]
    assert len(run) >= 8, [b.id for b in run]
    for doc in ("servers/OPENAI.md", "servers/TINKER.md", "docs/FRAMEWORKS.md"):
        assert any(b.id.startswith(doc) and b.kind == "server" for b in run), doc


def test_markers_are_refused_when_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt marker, or `not run` without its reason, fails the docs' test: no block is left
    out silently."""
    monkeypatch.setattr(S, "ROOT", tmp_path)
    for marker, match in (("skip", "unknown snippet marker"), ("not run:", "REASON")):
        doc = tmp_path / "probe.md"
        doc.write_text(f"<!-- snippet: {marker} -->\n```python\nprint(1)\n```\n")
        with pytest.raises(S.MarkerError, match=match):
            S.blocks(doc)
    doc.write_text("<!-- snippet: not run: needs a GPU -->\n```bash\nnvidia-smi\n```\n")
    (block,) = S.blocks(doc)
    assert (block.kind, block.reason, block.code) == ("not run", "needs a GPU", "nvidia-smi\n")
    doc.write_text("<!-- snippet: server -->\n```text\noutput\n```\n")
    with pytest.raises(S.MarkerError, match="`text` fence"):
        S.blocks(doc)
    doc.write_text("```bash\nbash tools/test.sh\n```\n")
    with pytest.raises(S.MarkerError, match="says `run` or `not run"):
        S.blocks(doc)
    assert S.scripts("bash tools/test.sh -k x\npython bench/codec.py --smoke") == [
        "tools/test.sh",
        "bench/codec.py",
    ]


def test_every_local_link_of_the_docs_resolves() -> None:
    broken = []
    for doc in S.user_docs():
        for target in S.links(doc):
            if not target.exists():
                broken.append(f"{doc.relative_to(S.ROOT)} -> {target}")
    assert not broken, broken


def test_readme_links_every_doc_a_user_needs() -> None:
    text = S.README.read_text()
    for need in (
        "proto/PROTOCOL.md",
        "conformance/README.md",
        "servers/README.md",
        "servers/arctic_servers/tinker/ROUTES.md",
        "bench/README.md",
    ):
        assert f"]({need})" in text, need
    # the things a newcomer asked for, said in the README itself
    for said in ("base URL", "prefix URL", "grpc_target=", "AsyncClient", "model id is the job id"):
        assert said in text, said
    assert re.search(r"compat client\s+is async", text)
