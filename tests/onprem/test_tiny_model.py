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
from arctic_servers.rules.errors import ProtocolError

# The default model's content hash (builder version 2: the chat template renders tools); its
# weights and vocabulary are the bytes every earlier build had (builder version 1, the hash
# a552b53e...), so every figure measured on them holds.
DEFAULT_CONTENT_HASH = "ad05af2a14211fd055f147b3e34d619d96b1560a7afb36a1bcc7102b34a0fe7e"
DEFAULT_WEIGHTS_SHA256 = "a2a9e566db4830ad866df0f7d79c812e0e1001032d7b75bbd17fa3b3f3047d75"
UNCHANGED_SINCE_V1 = {  # sha256 of the files builder version 2 left as version 1 wrote them
    "model.safetensors": DEFAULT_WEIGHTS_SHA256,
    "tokenizer.json": "3c43d8a2c3784405e3fc6eaf3fc36ee019b1621384c821781b21db84c1c0833d",
    "vocab.json": "cb7a60e5bd8a28f9117e8a6fc8d8988cade0485ece9030fe43c46ef65630dbd7",
    "merges.txt": "8d16e76c9705ca2a72cb6a5d30fdce8a5b97e6b04c5865a63833b57295e8e44b",
    "config.json": "b64a97d5d9291b050a316eddef1d17c476e006c4a7ee75ae38e7eeaccf1459cf",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {name: tm.build_tiny_model(root / name, config=name) for name in ("tiny", "tiny-4l")}


def test_default_model_is_byte_identical(built: dict[str, Path]) -> None:
    assert tm.tiny_model_content_hash(built["tiny"]) == DEFAULT_CONTENT_HASH
    assert tm.cache_dir_name() == "tiny-qwen2-seed0"
    files = json.loads((built["tiny"] / tm.MARKER_NAME).read_text())["files"]
    assert {k: files[k] for k in UNCHANGED_SINCE_V1} == UNCHANGED_SINCE_V1


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


def test_long_context_variant_is_the_default_model(built: dict[str, Path], tmp_path: Path) -> None:
    """`tiny-8k`: the default model's weights and tokenizer vocabulary, 8,192 positions (for
    agents such as Harbor's terminus-2, whose first prompt is ~1.9k tokens of this tokenizer)."""
    d = tm.build_tiny_model(tmp_path / "8k", config="tiny-8k")
    assert (d / "model.safetensors").read_bytes() == (
        built["tiny"] / "model.safetensors"
    ).read_bytes()
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["max_position_embeddings"] == 8192
    assert json.loads((d / "tokenizer_config.json").read_text())["model_max_length"] == 8192
    assert (d / "tokenizer.json").read_bytes() == (built["tiny"] / "tokenizer.json").read_bytes()
    assert tm.check_tiny_model(d, config="tiny-8k") and not tm.check_tiny_model(d)


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
