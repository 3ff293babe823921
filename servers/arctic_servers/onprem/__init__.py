"""On-prem training server: DeepSpeed/vLLM workers behind the arctic.v1 protocol."""
