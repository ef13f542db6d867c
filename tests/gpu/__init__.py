"""CUDA tests of the ucx and udp backends (skipped where torch sees no CUDA device).

A package, so that its modules are importable as ``gpu.<name>`` by the ranks the harness forks
(``tests/`` is on every rank's ``sys.path``).
"""
