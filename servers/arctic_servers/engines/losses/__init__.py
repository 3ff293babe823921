"""The loss table: every loss's declaration and options (`table.py`, torch-free, read by the
servers' request checks, the fake engine and the trainer), its torch implementation
(`torch_losses.py`, run by the trainer and the vLLM scorer) and its NumPy reference
(`reference.py`, run by the fake engine), side by side."""
