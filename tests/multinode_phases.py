"""The lines that bound each backend's phase in a multi-node worker's output: written by
tests/multinode_worker.py (which runs under torchrun, without pytest), read by
tests/multinode_harness.py."""

PHASE_BEGIN = "MULTINODE_BEGIN backend="
PHASE_END = "MULTINODE_END backend="  # then "<backend> rc=<status>"
