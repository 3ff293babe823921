"""The embedded tiny models (arctic_servers.engines.tiny_model): named configs, no engines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from arctic_servers.engines import tiny_model as tm
from arctic_servers.engines.config import embedded_model_names, resolve_model
from arctic_servers.onprem.settings import ServerSettings
from arctic_servers.protocol.errors import ProtocolError

# The default model's content hash before named configs existed: every test and cache built on
# it keeps the same bytes.
DEFAULT_CONTENT_HASH = "a552b53e164008d525fdd8c264f50bb212a426549a2e3546e13f2f4e0f07d1a7"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {name: tm.build_tiny_model(root / name, config=name) for name in ("tiny", "tiny-4l")}


def test_default_model_is_byte_identical(built: dict[str, Path]) -> None:
    assert tm.tiny_model_content_hash(built["tiny"]) == DEFAULT_CONTENT_HASH
    assert tm.cache_dir_name() == "tiny-qwen2-seed0"


def test_named_config_architecture_and_init(built: dict[str, Path]) -> None:
    d = built["tiny-4l"]
    cfg = json.loads((d / "config.json").read_text())
    c = tm.CONFIGS["tiny-4l"]
    assert cfg["num_hidden_layers"] == c.num_layers == 4
    assert cfg["hidden_size"] == c.hidden_size and cfg["head_dim"] >= 64  # vLLM CPU attention
    w = load_file(str(d / "model.safetensors"))
    assert len([k for k in w if k.endswith("mlp.up_proj.weight")]) == 4
    assert abs(float(w["model.layers.3.mlp.up_proj.weight"].std()) - c.init_std) < 0.005
    assert abs(float(w["lm_head.weight"].std()) - c.init_std) < 0.005
    assert cfg["initializer_range"] == c.init_std
    assert not np.any(w["model.layers.0.self_attn.q_proj.bias"])
    # same tokenizer files as the default model
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        assert (d / name).read_bytes() == (built["tiny"] / name).read_bytes()
    assert tm.tiny_model_content_hash(d) != DEFAULT_CONTENT_HASH
    # a cache of one config is never taken for another
    assert tm.check_tiny_model(d, config="tiny-4l")
    assert not tm.check_tiny_model(d, config="tiny")
    assert not tm.check_tiny_model(built["tiny"], config="tiny-4l")


def test_build_is_deterministic(built: dict[str, Path], tmp_path: Path) -> None:
    again = tm.build_tiny_model(tmp_path / "again", config="tiny-4l")
    assert tm.tiny_model_content_hash(again) == tm.tiny_model_content_hash(built["tiny-4l"])
    with pytest.raises(KeyError, match="tiny-4l"):
        tm.get_config("tiny-9l")


def test_server_resolves_named_configs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built: dict[str, Path]
) -> None:
    monkeypatch.setenv("ARCTIC_CACHE_DIR", str(tmp_path))
    s = ServerSettings(data_dir=tmp_path)
    got = resolve_model("tiny-4l", s)
    assert got == tmp_path / "tiny-qwen2-tiny-4l-seed0"
    assert tm.tiny_model_content_hash(got) == tm.tiny_model_content_hash(built["tiny-4l"])
    assert "tiny-4l" in embedded_model_names() and "tiny" in embedded_model_names()
    with pytest.raises(ProtocolError) as err:
        resolve_model("tiny-9l", s)
    assert err.value.code == "invalid_argument" and "tiny-4l" in str(err.value)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"num_heads": 4}, "num_heads x head_dim = 256 must equal hidden_size 128"),
        ({"num_kv_heads": 3, "num_heads": 2}, "multiple of num_kv_heads"),
        ({"init": "xavier"}, "init 'xavier'"),
    ],
)
def test_refuses_configs_vllm_would_compute_differently(
    monkeypatch: pytest.MonkeyPatch, bad: dict[str, object], match: str
) -> None:
    monkeypatch.setitem(tm.CONFIGS, "bad", tm.TinyConfig("bad", **bad))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=match):
        tm.build_files(config="bad")
