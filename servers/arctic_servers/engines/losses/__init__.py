"""The loss table: every loss's declaration and options (`table.py`, torch-free, read by the
servers' request checks, the fake engine and the trainer) and its torch implementation
(`torch_losses.py`, run by the trainer and the vLLM scorer)."""
