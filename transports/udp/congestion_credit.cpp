#include "transports/udp/congestion_credit.h"

#include <algorithm>

namespace ucxb::udp {

CreditCongestionControl::CreditCongestionControl(uint64_t initialBytes, DurationUs timeoutUs,
                                                 uint64_t maxUnusedBytes)
    : timeoutUs_(timeoutUs), maxUnused_(maxUnusedBytes), granted_(initialBytes) {}

void CreditCongestionControl::onDataSent(uint64_t wireBytes) {
  spent_ += wireBytes;
  catchUpLeft_ -= std::min(catchUpLeft_, wireBytes);
  // What was sent came out of the backlog: the demand stays what it was.
  backlog_ -= std::min(backlog_, wireBytes);
}

void CreditCongestionControl::onGrant(uint64_t granted, TimeUs now, bool catchUp) {
  if (granted <= granted_) return;
  granted_ = granted;
  lastNews_ = now;
  // Forfeited credit counts as spent: the demand (spent + backlog) grows by it, and the
  // next request asks for it again.
  const uint64_t unused = granted_ - std::min(granted_, spent_);
  // A catch-up is kept whole, and stays kept until spent: the paced grants that follow it
  // are cut to maxUnused on top of what is left of it.
  if (catchUp) catchUpLeft_ = unused > maxUnused_ ? unused - maxUnused_ : 0;
  if (unused > maxUnused_ + catchUpLeft_) spent_ = granted_ - maxUnused_ - catchUpLeft_;
}

bool CreditCongestionControl::requestDue(TimeUs now, bool mayTimeOut, bool& timedOut) const {
  timedOut = false;
  if (wanted() > reported_) return true;
  if (const auto t = nextRequestTime(); mayTimeOut && t && *t <= now) {
    timedOut = true;
    return true;
  }
  return false;
}

void CreditCongestionControl::onRequestSent(TimeUs now) {
  reported_ = std::max(reported_, wanted());
  lastNews_ = now;
}

std::optional<TimeUs> CreditCongestionControl::nextRequestTime() const {
  if (!blocked()) return std::nullopt;
  return lastNews_ + timeoutUs_;
}

}  // namespace ucxb::udp
