"""The runner as a command: progress while it runs, --fail-fast, --help, HTTP without grpc."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.fake import BackgroundFake
from conformance.runner import cli

from .conftest import ALT_TOKEN, TOKEN, set_behaviour

ROOT = Path(__file__).resolve().parents[2]
# `python -c` with grpc made unimportable (as on an install without grpcio), then the module entry
NO_GRPC = (
    "import sys; sys.modules['grpc'] = None\n"
    "from conformance.__main__ import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def argv(fake: BackgroundFake, *args: str) -> list[str]:
    return ["--target", fake.prefix_url, "--token", TOKEN, "--alt-token", ALT_TOKEN, *args]


@pytest.fixture
def seed_fault(fake: BackgroundFake) -> Iterator[None]:
    set_behaviour(fake, {"seed_ignored": True})
    yield
    set_behaviour(fake, {"seed_ignored": None})


@pytest.fixture
def slow_generate(fake: BackgroundFake) -> Iterator[None]:
    set_behaviour(fake, {"latency_s": {"generate": 3.0}})
    yield
    set_behaviour(fake, {"latency_s": None})


def test_each_case_is_printed_as_it_finishes(fake: BackgroundFake, slow_generate: None) -> None:
    """The first case's line arrives while a later (3 s) case is still running."""
    only = ["--only", "jobs/capabilities", "--only", "ops/generate/max-tokens"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "conformance", *argv(fake, *only)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        running_after_first = proc.poll() is None
        started = time.monotonic()
        out, rest = proc.communicate(timeout=120)
        waited = time.monotonic() - started
    finally:
        proc.kill()
    assert first.startswith("[") and " pass  jobs/capabilities" in first, first
    assert running_after_first, "the runner had already exited when its first case was printed"
    assert waited > 1.0, "the first line came only at the end of the run"
    assert proc.returncode == 0, out + rest
    lines = [first, *rest.splitlines()]
    assert any("pass  ops/generate/max-tokens" in line for line in lines), lines
    assert "ops/generate/max-tokens" in out  # the table still follows at the end


def test_progress_lines_name_the_difference_of_a_failure(
    fake: BackgroundFake, seed_fault: None
) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv(fake, "--only", "ops/generate/seed-determinism"), out=out, err=err)
    assert code == 1
    (line,) = err.getvalue().splitlines()
    assert line.startswith("[1/1] fail  ops/generate/seed-determinism (")
    assert line.split("): ", 1)[1], "a failing case's line carries its first difference"


def test_fail_fast_stops_at_the_first_failure(fake: BackgroundFake, seed_fault: None) -> None:
    ids = [c.id for c in cli.select(cli.load_cases(), ["ops/generate"], [])]
    stop_at = ids.index("ops/generate/seed-determinism")
    assert stop_at < len(ids) - 1, "the failing case must not be the last one selected"

    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv(fake, "--only", "ops/generate", "--fail-fast"), out=out, err=err)
    assert code == 1
    last = err.getvalue().splitlines()[-1]
    assert last.startswith(f"[{stop_at + 1}/{len(ids)}] fail  ops/generate/seed-determinism"), last
    left = len(ids) - stop_at - 1
    assert f"stopped at the first failure (--fail-fast): {left} cases not run" in out.getvalue()
    assert f"\n{stop_at + 1} cases: " in out.getvalue()

    # without it, the run goes on past the failure
    out = io.StringIO()
    assert cli.main(argv(fake, "--only", "ops/generate"), out=out, err=io.StringIO()) == 1
    assert "cases not run" not in out.getvalue()
    assert f"\n{len(ids)} cases: " in out.getvalue()


def test_help_names_serve_and_fail_fast() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "conformance", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "python -m conformance serve" in done.stdout
    assert "--fail-fast" in done.stdout and "--target" in done.stdout


def test_list_needs_no_target() -> None:
    out = io.StringIO()
    assert cli.main(["--list", "--only", "ops/generate"], out=out) == 0
    assert out.getvalue().startswith("ops/generate/")
    with pytest.raises(SystemExit) as exc:
        cli.main(["--only", "ops/generate"], out=io.StringIO())
    assert exc.value.code == 2


def test_http_runs_without_grpc_and_grpc_names_the_extra(fake: BackgroundFake) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", NO_GRPC, *argv(fake, *args)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )

    http = run("--only", "ops/generate", "--only", "jobs/capabilities")
    assert http.returncode == 0, http.stdout + http.stderr
    assert " pass " in http.stdout and "not yet implemented" not in http.stdout + http.stderr

    grpc = run("--transport", "grpc", "--only", "ops/generate")
    assert grpc.returncode == 2, grpc.stdout + grpc.stderr
    assert "SETUP ERROR: --transport grpc needs the grpc package (grpcio)" in grpc.stdout
    assert 'pip install "arctic-sdk[grpc]"' in grpc.stdout


def test_missing_vectors_are_an_error_not_a_smaller_suite(tmp_path: Path) -> None:
    out = io.StringIO()
    assert cli.main(["--list", "--vectors", str(tmp_path)], out=out) == 2
    text = out.getvalue()
    assert "case data error" in text and "golden vectors are not at" in text
    assert "--vectors DIR" in text
