"""The engine worker process and the servers' client of it.

`worker.py` is the process a sub-job's engine runs in (`python -m
arctic_servers.engines.worker.worker`); `procs.py` is the on-prem server's handle on it (spawn,
call, stream, watch, stop). The gateway's worker host (`gateway/worker_host.py`) serves the same
engines behind its own reconnecting connection (`gateway/workers.py`).
"""
