"""Weight sync over torch.distributed: the trainer broadcasts its weights, in buckets, to every
process that takes them (vLLM samplers, HF scorers), over a process group of their own.

`group.py` builds the group (gloo on CPU, NCCL on CUDA, the same code) with a timeout on every
collective; `buckets.py` is what one sync sends (a header, then whole layers packed into buckets
of a bounded size); `receivers.py` loads what arrives into a torch module. The trainer's side is
`engines/deepspeed/weight_send.py`, vLLM's `engines/vllm/collective.py` (a vLLM weight transfer
engine). The servers only coordinate (`serving/collective_sync.py`): no weight byte goes
through them.
"""
