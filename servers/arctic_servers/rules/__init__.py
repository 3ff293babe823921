"""What a request and a job are, and the checks every server and engine applies to them: the
error type, state tables, job records and configs, LoRA, checkpoint ids, token budgets, input
limits, the operation envelope and the weight-sync vocabulary. No I/O, no servicer; imports no
other room (servers/README.md).
"""
