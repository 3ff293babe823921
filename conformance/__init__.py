"""conformance: the fake Cortex gateway and the arctic.v1 conformance suite."""

__all__ = ["__version__"]

__version__ = "0.1.0"
