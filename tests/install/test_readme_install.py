"""The README's install section and what tools/check_wheel.py takes from the README stay true to
pyproject.toml (the wheel check itself runs in tools/test.sh: it needs a fresh venv)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import check_wheel  # tools/ (tests/conftest.py puts it on the path)

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def install_section() -> str:
    return README.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]


def test_every_extra_the_install_section_names_exists() -> None:
    named = set()
    for group in re.findall(r'"\.\[([a-z,]+)\]"', install_section()):
        named.update(group.split(","))
    assert {"onprem", "gateway", "dev", "ray"} <= named
    assert named <= set(PYPROJECT["project"]["optional-dependencies"])


def test_the_base_install_is_what_the_readme_says() -> None:
    said = re.search(r"The base install \(`pip install \.`\) holds ([^:]+):", install_section())
    assert said is not None
    names = {n.strip() for n in re.split(r",| and ", said.group(1).replace("\n", " ")) if n.strip()}
    declared = {re.split(r"[<>=!;\[ ]", d)[0] for d in PYPROJECT["project"]["dependencies"]}
    declared.discard("urllib3")  # requests' own dependency, declared because the SDK imports it
    assert names == declared
    assert {"protobuf", "grpcio", "numpy", "aiohttp", "requests", "pydantic"} <= declared


def test_the_wheel_check_finds_the_quick_start_and_the_entry_points() -> None:
    code = check_wheel.quick_start(README)
    assert 'transport="http"' in code and "BackgroundFake" in code
    found = check_wheel.entry_points(README)
    for cmd in [
        ("conformance",),
        ("conformance", "serve"),
        ("arctic_servers.onprem", "serve"),
        ("arctic_servers.onprem", "check"),
        ("arctic_servers.gateway",),
        ("arctic_servers.gateway", "hash-token"),
    ]:
        assert cmd in found, (cmd, found)
    assert all(c[0].split(".")[0] in check_wheel.PACKAGES for c in found)


def test_the_wheel_carries_what_the_installed_runner_reads() -> None:
    """The golden vectors go into the wheel (hatch_build.py) where the runner looks first."""
    from conformance.runner import vectors

    assert vectors.PACKAGED_VECTORS.parent == ROOT / "conformance"
    assert (ROOT / "hatch_build.py").read_text().count('"conformance/vectors"') == 1
    assert '"tests/vectors"' in (ROOT / "hatch_build.py").read_text()
    assert vectors.DEFAULT_VECTORS == ROOT / "tests" / "vectors"  # a checkout reads its own
