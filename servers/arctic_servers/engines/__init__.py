"""Engine groundwork for the on-prem server: a locally built tiny model and CPU smoke scripts.

Nothing here imports torch, vLLM or DeepSpeed at package import time; the heavy libraries are
imported inside the functions and scripts that need them (they live in the on-prem venv, not in
the SDK's own environment).
"""
