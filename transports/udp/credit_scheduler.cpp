#include "transports/udp/credit_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "transports/udp/faults.h"

namespace ucxb::udp {

// Credit earned while the rank could not hand it out is kept so that a late wake-up still
// grants what the port could have carried meanwhile (credit_scheduler.h). Behind the
// emulated bottleneck, tried on the incast bench on a loaded 2-core host
// (docs/bench.md): with only one unsolicited window kept, a receiver woken every millisecond
// granted 32 KiB per wake-up (0.26 Gbit/s whatever its rate); with 1 ms kept, the bursts a
// late wake-up released overflowed the emulated queue (100-600 drops per op); with 300 us,
// 6-95. Without it, 300 us was the whole of credit's slowness on a loaded host (the
// "duplication" weakness of docs/udp-protocol.md): a receiver descheduled 3 ms in every 4
// granted a quarter of its rate plus 300 us per wake-up, 4.5x slower than undisturbed, with
// hundreds of credit timeouts per op (udp_endpoint_test credit_receiver_stall); 4 ms keeps
// such a stall whole, within the 6 MB socket buffers udp_transport asks for (5 MB at 10
// Gbit/s).

CreditScheduler::CreditScheduler(uint64_t rateMbps, uint64_t initialBytes, uint64_t quantumBytes)
    : rateMbps_(std::max<uint64_t>(1, rateMbps)),
      catchUpUs_(kPortCatchUpUs),
      initialBytes_(initialBytes),
      quantumBytes_(std::max<uint64_t>(1, quantumBytes)) {}

void CreditScheduler::setEmulatedDownlinkMbps(uint64_t rateMbps) {
  rateMbps_ = std::max<uint64_t>(1, rateMbps);
  catchUpUs_ = kEmulatedCatchUpUs;
}

size_t CreditScheduler::join() {
  slots_.push_back(Slot{0, initialBytes_});
  return slots_.size() - 1;
}

bool CreditScheduler::anyActive() const {
  return std::any_of(slots_.begin(), slots_.end(), [this](const Slot& s) { return active(s); });
}

void CreditScheduler::onWanted(size_t slot, uint64_t wanted, TimeUs now) {
  advance(now);  // credit earned so far belongs to the senders that wanted it until now
  Slot& s = slots_[slot];
  // A demand is cumulative bytes, far below 2^64 in any real connection; one near it (a
  // corrupt or hostile CREDIT) would wrap `wanted + initialBytes` and leave the slot without
  // grants for good, so it is held to the largest target that does not wrap.
  wanted = std::min(wanted, std::numeric_limits<uint64_t>::max() - initialBytes_);
  if (wanted <= s.wanted) return;
  const bool wasIdle = !anyActive();
  s.wanted = wanted;
  if (wasIdle) {
    // Nothing was earned while nobody wanted anything: the pacing starts now.
    tokens_ = 0;
    last_ = now;
  }
}

double CreditScheduler::keptCredit() const {
  return std::max(static_cast<double>(std::max(initialBytes_, quantumBytes_)),
                  static_cast<double>(catchUpUs_ * rateMbps_) / 8);
}

void CreditScheduler::onOtherArrival(uint64_t wireBytes) {
  if (!anyActive()) return;  // nothing is being paced: nothing to make room in
  // A debt of at most one catch-up's worth: a flood of control packets (a burst read after a
  // stall) delays the grants, it does not stop them for long.
  tokens_ = std::max(-keptCredit(), tokens_ - static_cast<double>(wireBytes));
}

void CreditScheduler::advance(TimeUs now) {
  if (now <= last_) return;
  if (!anyActive()) {
    tokens_ = 0;
    last_ = now;
    return;
  }
  // Mbit/s are bits per microsecond.
  const double earned = static_cast<double>(now - last_) * static_cast<double>(rateMbps_) / 8;
  tokens_ = std::min(keptCredit(), tokens_ + earned);
  last_ = now;
  share();
}

void CreditScheduler::share() {
  const double quantum = static_cast<double>(quantumBytes_);
  while (tokens_ >= quantum) {
    bool gave = false;
    for (size_t i = 0; i < slots_.size() && !gave; ++i) {
      Slot& s = slots_[turn_];
      turn_ = (turn_ + 1) % slots_.size();
      if (!active(s)) continue;
      const uint64_t give = std::min(quantumBytes_, s.wanted + initialBytes_ - s.granted);
      s.granted += give;
      tokens_ -= static_cast<double>(give);
      gave = true;
    }
    if (!gave) {
      tokens_ = 0;  // everyone has what they want
      return;
    }
  }
}

std::optional<TimeUs> CreditScheduler::nextGrantTime() const {
  if (!anyActive()) return std::nullopt;
  const double missing = std::max(0.0, static_cast<double>(quantumBytes_) - tokens_);
  const auto wait = static_cast<DurationUs>(std::ceil(missing * 8 / static_cast<double>(rateMbps_)));
  return last_ + std::max<DurationUs>(1, wait);
}

std::unique_ptr<CreditScheduler> makeCreditScheduler(const UdpConfig& config) {
  return std::make_unique<CreditScheduler>(config.ccLinkMbps, config.ccCreditInitialBytes,
                                           config.mtuPayload + kFramingOverheadBytes);
}

}  // namespace ucxb::udp
