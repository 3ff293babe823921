"""The DeepSpeed training engine: the trainer, its multi-rank group, and the HF log-prob scorer.

`training.TrainingEngine` (one rank) and `dp_training` (W ranks, `ranks.py` launches and watches
them) run forward / backward / step on a Hugging Face model under DeepSpeed; `scoring.py` is the
log-prob forward the trainer and the `log_prob` sub-job's default engine share. Imported only in a
worker process: torch, DeepSpeed and transformers load here, never in a server.
"""
