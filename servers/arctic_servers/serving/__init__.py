"""What the servers share above the generated skeletons: the HTTP and gRPC bindings, the servicer
side of jobs, per-op forwarding, the collective sync, LoRA pools and syncs, checkpoint
directories, the shared command-line flags and entry points (servers/README.md).
"""
