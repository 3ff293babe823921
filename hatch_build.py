"""Wheel build hook: the golden vectors (tests/vectors) ship in the wheel as conformance/vectors.

The conformance runner sends every vector as a request body (conformance/runner/vectors.py); an
installed runner has no checkout, so the wheel carries them. Editable installs read them from the
checkout instead, so nothing is copied there.
"""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version == "standard":
            build_data["force_include"]["tests/vectors"] = "conformance/vectors"
