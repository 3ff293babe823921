"""The fake engine: deterministic numerics (NUMERICS.md), a byte-level tokenizer, checkpoints.

Pure Python and NumPy, no torch. The fake gateway (`conformance/fake`) serves the protocol over it
in-process; the Cortex gateway's fake workers run `engine.FakeEngine` in place of DeepSpeed / vLLM
(`--engine fake`). Nothing here imports `conformance`.
"""
