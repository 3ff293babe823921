"""The engine wing: what runs a sub-job's model, for the on-prem server and the gateway alike.

Rooms (engines/README.md): `deepspeed/` (trainer), `vllm/` (sampler), `worker/` (the worker
process and the reply side of its clients), `losses/` (the loss table), `fake/` (the fake engine),
`config.py` / `checks.py` (sub-job configs, request checks), the tiny model and smoke scripts.
Nothing here imports torch, vLLM or DeepSpeed at package import time; the heavy libraries are
imported inside the worker processes that need them.
"""
