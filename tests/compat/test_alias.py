"""The opt-in import alias (`compat-alias/`, its own distribution): the integrations' imports
resolve to `arctic_sdk.compat` unchanged, and a real Arctic-Platform install is never shadowed
unless the alias is put first. Each case runs in a fresh interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALIAS = ROOT / "compat-alias"

IMPORTS = """
from arctic_platform.rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_platform.rl.ray_server import ArcticRLRayServerState
from arctic_platform.client import (
    ArcticRLClientConfig as PluginConfig, OnPremConfig, SamplingConfig, TrainingConfig,
    create_arctic_rl_client as plugin_create,
)
import arctic_sdk.compat as compat, arctic_sdk.compat.unified as unified
assert ArcticRLClientConfig is compat.ArcticRLClientConfig
assert create_arctic_rl_client is compat.create_arctic_rl_client
assert ArcticRLRayServerState is compat.ArcticServerState
assert PluginConfig is unified.UnifiedClientConfig
assert plugin_create is unified.create_unified_client
assert OnPremConfig is unified.OnPremConfig and TrainingConfig is unified.TrainingConfig
cfg = PluginConfig(model_name="m", training_gpus=1, backend=OnPremConfig(port=1),
                   training=TrainingConfig(), sampling=SamplingConfig())
assert cfg.to_flat().port == 1
print("ALIAS OK")
"""


def _python(code: str, *path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in path), env.get("PYTHONPATH", "")])
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_arctic_sdk_alone_provides_no_arctic_platform() -> None:
    out = _python("import importlib.util; print(importlib.util.find_spec('arctic_platform'))")
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stderr


def test_the_alias_on_the_path_resolves_every_import() -> None:
    out = _python(IMPORTS, ALIAS / "src")
    assert out.returncode == 0 and "ALIAS OK" in out.stdout, out.stderr


def test_the_alias_installs_as_its_own_distribution(tmp_path: Path) -> None:
    src = tmp_path / "compat-alias"
    shutil.copytree(ALIAS, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = tmp_path / "site"
    argv = ["install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target)]
    pip = subprocess.run(
        [sys.executable, "-m", "pip", *argv, str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr
    assert (target / "arctic_platform" / "client" / "__init__.py").is_file()
    assert list(target.glob("arctic_sdk_platform_alias-*.dist-info"))
    out = _python(IMPORTS, target)
    assert out.returncode == 0 and "ALIAS OK" in out.stdout, out.stderr


@pytest.fixture
def real_platform(tmp_path: Path) -> Path:
    """A stand-in for a real Arctic-Platform install: its own `client` module and the verl
    plugin's import lines (`arctic_platform/integrations/verl/adapter.py`)."""
    root = tmp_path / "real"
    pkg = root / "arctic_platform"
    (pkg / "client").mkdir(parents=True)
    (pkg / "rl").mkdir()
    (pkg / "integrations" / "verl").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "client" / "__init__.py").write_text("REAL = True\nOnPremConfig = 'real'\n")
    (pkg / "rl" / "__init__.py").write_text("REAL = True\n")
    (pkg / "rl" / "ray_server.py").write_text("ArcticRLRayServerState = 'real'\n")
    (pkg / "integrations" / "__init__.py").write_text("")
    (pkg / "integrations" / "verl" / "__init__.py").write_text("")
    (pkg / "integrations" / "verl" / "adapter.py").write_text(
        "from arctic_platform.client import ArcticRLClientConfig, OnPremConfig, "
        "SamplingConfig, TrainingConfig, create_arctic_rl_client\n"
        "from arctic_platform.rl.ray_server import ArcticRLRayServerState\n"
    )
    return root


def test_a_real_install_is_not_shadowed(real_platform: Path) -> None:
    code = "import arctic_platform.client as c; print(getattr(c, 'REAL', False))"
    alone = _python(code, real_platform)
    assert alone.stdout.strip() == "True", alone.stderr
    first = _python(code, real_platform, ALIAS / "src")  # the real one first: it wins
    assert first.stdout.strip() == "True", first.stderr


def test_the_alias_first_runs_the_real_plugin_on_arctic_sdk(real_platform: Path) -> None:
    code = """
    import arctic_platform
    from arctic_platform.integrations.verl import adapter   # the plugin, from the real install
    import arctic_sdk.compat.unified as unified
    assert arctic_platform.ARCTIC_SDK_ALIAS
    assert adapter.OnPremConfig is unified.OnPremConfig      # its imports: arctic-sdk's
    assert adapter.create_arctic_rl_client is unified.create_unified_client
    assert adapter.__file__.startswith(%r)
    print("MIXED OK")
    """.replace("%r", repr(str(real_platform)))
    out = _python(code, ALIAS / "src", real_platform)
    assert out.returncode == 0 and "MIXED OK" in out.stdout, out.stderr
