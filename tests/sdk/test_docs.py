"""The runnable examples in the SDK's docstrings run."""

from __future__ import annotations

import doctest
import importlib
import importlib.resources

import pytest


@pytest.mark.parametrize(
    "module",
    ["arctic_sdk.errors", "arctic_sdk.config", "arctic_sdk._client_base", "arctic_sdk.rollouts"],
)
def test_docstring_examples(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ARCTIC_CORTEX_DATABASE", "ARCTIC_CORTEX_SCHEMA", "ARCTIC_CORTEX_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_py_typed_ships() -> None:
    import arctic_sdk

    assert (importlib.resources.files(arctic_sdk) / "py.typed").is_file()
