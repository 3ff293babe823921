"""`python -m conformance.hostile`: the hostile inputs of issue 14, re-run against a server.

Checkpoint ids that are paths (another token's checkpoint, a directory outside the data dir),
JSON and DSSST1 bodies no field can hold, hostile headers, malformed HTTP, slow clients and chunk
groups that declare more than they send. Every input must be refused with a 4xx and the spec's
error body; nothing may escape, 500 or grow the server's memory by what was declared.
"""

from .attacks import ATTACKS, Finding, Target, run_all

__all__ = ["ATTACKS", "Finding", "Target", "run_all"]
