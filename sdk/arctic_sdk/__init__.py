"""arctic_sdk: the client of the arctic.v1 protocol for remote LLM post-training.

The transports, `Client` and `AsyncClient` arrive with the SDK issue; the wire specification they
implement is `proto/` (see `proto/PROTOCOL.md`).
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
