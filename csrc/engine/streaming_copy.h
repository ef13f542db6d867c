// A copy whose stores go around the writer's cache, for bytes that another core reads next.
// Torch-free.
#pragma once

#include <cstddef>

namespace ucxb {

// Copies `n` bytes from `src` to `dst` (which must not overlap), as memcpy does, but with
// non-temporal stores on x86-64: the bytes go to memory instead of staying dirty in this
// core's cache, where the reading core would have to pull them across, a hand-off that some
// hosts make slow (see scripts/cross_core_copy.cpp). Fenced before it returns, so that the
// bytes are visible before any later store, such as the notice that announces them.
// Elsewhere it is memcpy.
void streamingCopy(void* dst, const void* src, size_t n);

}  // namespace ucxb
