"""The vLLM sampling engine: generate, prompt scoring, the continuous batch, weight sync, LoRA.

`sampling.SamplingEngine` runs in a worker process (torch and vLLM load here, never in a
server); `weight_sync.py` moves the trainer's weights into it, `lora_sampler.py` its adapters.
"""
