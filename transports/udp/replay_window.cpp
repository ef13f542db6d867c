#include "transports/udp/replay_window.h"

namespace ucxb::udp {

bool ReplayWindow::fresh(uint64_t counter) const {
  if (!any_ || counter > highest_) return true;
  if (highest_ - counter >= kBits) return false;  // older than the window: cannot tell
  return !test(counter);
}

void ReplayWindow::mark(uint64_t counter) {
  if (!any_ || counter > highest_) {
    // The counters between the old highest and this one become part of the window, unseen.
    // Each is cleared once over the life of the window (amortised O(1) per datagram), or the
    // whole window at once after a jump past it.
    const uint64_t from = any_ ? highest_ + 1 : 0;
    if (!any_ || counter - from >= kBits) {
      bits_.fill(0);
    } else {
      for (uint64_t c = from; c < counter; ++c) bits_[word(c)] &= ~(uint64_t{1} << (c % 64));
    }
    highest_ = counter;
    any_ = true;
  }
  bits_[word(counter)] |= uint64_t{1} << (counter % 64);
}

}  // namespace ucxb::udp
