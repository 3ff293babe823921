"""arctic_servers: servers of the arctic.v1 protocol (on-prem and Cortex gateway)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
