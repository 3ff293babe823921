"""The command line: selection, exit codes, known-failing entries, reports, cleanup."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from conformance.__main__ import main as module_main
from conformance.fake import BackgroundFake
from conformance.runner import cli

from .conftest import ALT_TOKEN, TOKEN, set_behaviour


def run_cli(fake: BackgroundFake, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    argv = ["--target", fake.prefix_url, "--token", TOKEN, "--alt-token", ALT_TOKEN, *args]
    return cli.main(argv, out=out), out.getvalue()


@pytest.fixture
def seed_fault(fake: BackgroundFake) -> Iterator[None]:
    set_behaviour(fake, {"seed_ignored": True})
    yield
    set_behaviour(fake, {"seed_ignored": None})


def test_list_through_the_module_entry(
    fake: BackgroundFake, capsys: pytest.CaptureFixture[str]
) -> None:
    assert module_main(["--target", fake.prefix_url, "--list", "--only", "ops/generate"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed and all(line.startswith("ops/generate/") for line in listed)


def test_passing_run_exits_0_and_prints_the_table(fake: BackgroundFake) -> None:
    code, out = run_cli(fake, "--only", "ops/generate", "--only", "jobs/capabilities")
    assert code == 0, out
    assert "ops/generate/max-tokens" in out and " pass " in out
    assert "case" in out.splitlines()[1] and "first difference" in out.splitlines()[1]


def test_zero_cases_exit_2(fake: BackgroundFake) -> None:
    code, out = run_cli(fake, "--only", "no-such-area/")
    assert code == 2
    assert "no case ran" in out
    code, out = run_cli(fake, "--transport", "grpc", "--only", "polling/octet-results")
    assert code == 2, "a selection of cases that all skip ran nothing"


def test_required_failure_exits_1_and_shows_the_exchange(
    fake: BackgroundFake, seed_fault: None
) -> None:
    code, out = run_cli(fake, "--only", "ops/generate")
    assert code == 1
    assert "FAIL ops/generate/seed-determinism [required] (step 2)" in out
    assert "  request:  POST " in out and "/generate" in out
    assert "  response: HTTP 200" in out and "differs:" in out
    assert "Bearer ***" in out and TOKEN not in out  # the token is never printed


def test_known_failing_case_that_fails_is_expected(
    fake: BackgroundFake, seed_fault: None, tmp_path: Path
) -> None:
    known = tmp_path / "known.txt"
    known.write_text("# our sampler ignores seeds (bug 123)\nops/generate/seed-determinism\n")
    code, out = run_cli(fake, "--only", "ops/generate", "--known-failing", str(known))
    assert code == 0, out
    assert "xfail" in out


def test_stale_known_failing_entries_fail_the_run(fake: BackgroundFake, tmp_path: Path) -> None:
    known = tmp_path / "known.txt"
    known.write_text("ops/generate/seed-determinism  # fixed since\n")
    code, out = run_cli(fake, "--only", "ops/generate", "--known-failing", str(known))
    assert code == 1
    assert "xpass" in out and "stale" in out
    known.write_text("ops/no-such-case\n")
    code, out = run_cli(fake, "--only", "ops/generate", "--known-failing", str(known))
    assert code == 1
    assert "STALE known-failing entry 'ops/no-such-case'" in out


def test_recommended_failure_is_reported_but_exits_0(fake: BackgroundFake) -> None:
    set_behaviour(fake, {"internal_error_on_bad_dtype": True})
    try:
        code, out = run_cli(fake, "--only", "errors/body/names-the-field")
    finally:
        set_behaviour(fake, {"internal_error_on_bad_dtype": None})
    assert code == 0, out
    assert "errors/body/names-the-field" in out and "recommended  fail" in out


def test_junit_and_json_reports(fake: BackgroundFake, seed_fault: None, tmp_path: Path) -> None:
    junit, report = tmp_path / "out.xml", tmp_path / "out.json"
    code, _ = run_cli(
        fake,
        "--transport",
        "grpc",
        "--only",
        "ops/generate",
        "--only",
        "errors/route",
        "--junit",
        str(junit),
        "--json",
        str(report),
    )
    assert code == 1
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    outcomes: dict[str, str] = {}
    for suite in root.findall("testsuite"):
        cases = suite.findall("testcase")
        assert int(suite.get("tests", "-1")) == len(cases)
        assert int(suite.get("failures", "-1")) == sum(c.find("failure") is not None for c in cases)
        assert int(suite.get("errors", "-1")) == sum(c.find("error") is not None for c in cases)
        assert int(suite.get("skipped", "-1")) == sum(c.find("skipped") is not None for c in cases)
        float(suite.get("time", "x"))
        for c in cases:
            assert c.get("classname", "").startswith("conformance.grpc.")
            float(c.get("time", "x"))
            kids = [k.tag for k in c if k.tag != "properties"]
            outcomes[c.get("name", "")] = kids[0] if kids else "pass"
    assert outcomes["ops/generate/seed-determinism"] == "failure"
    assert outcomes["ops/generate/max-tokens"] == "pass"
    assert outcomes["errors/route/method-not-allowed"] == "skipped"  # HTTP only
    failure = root.find(".//testcase[@name='ops/generate/seed-determinism']/failure")
    assert failure is not None and "request:" in (failure.text or "")
    data = json.loads(report.read_text())
    assert data["exit_code"] == 1 and data["transport"] == "grpc"
    by_id = {c["id"]: c for c in data["cases"]}
    assert by_id["ops/generate/seed-determinism"]["outcome"] == "fail"
    assert by_id["errors/route/unknown-rpc"]["outcome"] == "pass"


def test_created_jobs_are_cancelled(fake: BackgroundFake) -> None:
    code, out = run_cli(fake, "--only", "jobs/", "--only", "sequencing/")
    assert code == 0, out
    jobs = requests.get(
        fake.admin_url + "/jobs", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    ).json()["jobs"]
    assert jobs and all(j["state"] in ("cancelled", "terminated", "failed") for j in jobs), jobs


def test_existing_job_is_reused_and_kept(fake: BackgroundFake) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = {
        "sub_job_configs": [
            {"job_type": "training", "model_name": "m"},
            {"job_type": "sampling", "model_name": "m"},
        ]
    }
    job_id = requests.post(fake.prefix_url + "/", json=body, headers=headers, timeout=10).json()[
        "job_id"
    ]
    code, out = run_cli(fake, "--job-id", job_id, "--only", "ops/reset-prefix-cache")
    assert code == 0, out
    job = requests.get(f"{fake.prefix_url}/{job_id}", headers=headers, timeout=10).json()["job"]
    assert job["state"] == "running"


def test_unreachable_target_is_a_setup_error() -> None:
    out = io.StringIO()
    code = cli.main(["--target", "http://127.0.0.1:9", "--timeout", "2"], out=out)
    assert code == 2
    assert "SETUP ERROR" in out.getvalue()


def test_job_config_file(fake: BackgroundFake, tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        "sub_job_configs:\n  - {job_type: training, model_name: tiny}\n"
        "  - {job_type: sampling, model_name: tiny}\nlabels: {team: conf}\n"
    )
    code, out = run_cli(fake, "--job-config", str(config), "--only", "ops/generate/max-tokens")
    assert code == 0, out
