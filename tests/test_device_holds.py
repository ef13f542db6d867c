"""What keeps ``cuda_wait=stream`` from hanging (csrc/device_holds.hpp), without a GPU.

``tests/cpp/device_holds_test.cpp``: which ops a ``wait()`` may hold the caller's stream
behind (marks by the progress thread's order), and that what the progress thread held of an
op is let go on the pruning thread once nothing else holds it, its mark with it. The rest of
the mechanism needs a GPU: ``tests/gpu/test_cuda_stream_hold.py``.
"""

from __future__ import annotations

import cpp_build


def test_device_holds_unit() -> None:
    cpp_build.check_unit("device_holds_test", extra_sources=["csrc/device_holds.cpp"])
