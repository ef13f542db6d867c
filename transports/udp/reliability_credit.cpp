// PeerConnection's part in congestion=credit (congestion_credit.h), both roles: as the
// receiver it answers the peer's demand with the grants of the rank's CreditScheduler; as
// the sender (when its own policy is credit) it tells the peer its demand and sends DATA only
// against the peer's grants. Kept apart from reliability.cpp, which only calls in here.
#include <algorithm>

#include "transports/udp/congestion_credit.h"
#include "transports/udp/faults.h"
#include "transports/udp/reliability.h"

namespace ucxb::udp {
namespace {

// A grant that grew by more than this many batches since the last CREDIT to the peer is a
// catch-up (kCatchUp): a running scheduler sends one every batch, or two when a request and
// a batch meet.
constexpr uint64_t kCatchUpBatches = 2;

}  // namespace

void PeerConnection::onCredit(const CreditFrame& credit, TimeUs now) {
  // A grant is news only to a credit sender; a demand is served whatever our own policy (the
  // receiver decides), so that it never depends on both ends choosing the same one.
  if (credit_ != nullptr && credit.granted > 0) {
    credit_->onGrant(credit.granted, now, (credit.flags & credit_flags::kCatchUp) != 0);
  }
  if (credit.wanted > 0) creditScheduler_->onWanted(creditSlot_, credit.wanted, now);
  if (credit.flags & credit_flags::kRequest) creditAnswerDue_ = true;
}

CreditView PeerConnection::creditView() const {
  CreditView v;
  if (credit_ != nullptr) {
    v.granted = credit_->granted();
    v.spent = credit_->spent();
    v.wanted = credit_->reported();
  }
  // A peer that never asked is not being granted anything: its slot's unsolicited window is
  // only what it may send before asking.
  if (creditScheduler_->wants(creditSlot_)) {
    v.grantToPeer = creditScheduler_->granted(creditSlot_);
    v.peerWanted = creditScheduler_->wanted(creditSlot_);
  }
  return v;
}

bool PeerConnection::grantDue() const {
  const uint64_t grant = creditScheduler_->granted(creditSlot_);
  if (grant <= grantSent_) return false;
  // Batched, except the last grant of a demand, which nothing later would carry.
  return grant - grantSent_ >= creditScheduler_->grantBatch() ||
         creditScheduler_->satisfied(creditSlot_);
}

void PeerConnection::creditOtherArrival(size_t datagramBytes) {
  creditScheduler_->onOtherArrival(datagramBytes + kFramingOverheadBytes);
}

bool PeerConnection::creditBlocksData() const { return credit_ != nullptr && !credit_->maySend(); }

void PeerConnection::spendCredit(size_t datagramBytes) {
  if (credit_ != nullptr) credit_->onDataSent(datagramBytes + kFramingOverheadBytes);
}

bool PeerConnection::creditMayTimeOut() const {
  // Heard since we asked, and lately: an ACK it sent before it stopped running says nothing
  // of what it does now.
  return lastHeard_ > credit_->lastNews() &&
         lastNow_ - std::min(lastNow_, lastHeard_) < config_.ccCreditTimeoutUs;
}

std::optional<TimeUs> PeerConnection::creditDeadline() const {
  std::optional<TimeUs> next;
  const auto consider = [&next](std::optional<TimeUs> t) {
    if (t && (!next || *t < *next)) next = t;
  };
  if (creditScheduler_->wants(creditSlot_)) {
    // Another connection of the rank may have advanced the scheduler: a grant to send now.
    if (creditAnswerDue_ || grantDue()) consider(lastNow_);
    consider(creditScheduler_->nextGrantTime());
  }
  if (credit_ != nullptr) {
    // Asking again, or with nothing in flight probing first (creditMayTimeOut).
    if ((backlogChanged_ || credit_->wanted() > 0) &&
        (creditMayTimeOut() || sent_.inFlightCount() == 0)) {
      consider(credit_->nextRequestTime());
    }
    if (backlogChanged_) consider(lastNow_);
  }
  return next;
}

size_t PeerConnection::pollCredit(TimeUs now, std::span<uint8_t> out) {
  creditScheduler_->advance(now);
  const bool peerWants = creditScheduler_->wants(creditSlot_);
  const uint64_t grant = peerWants ? creditScheduler_->granted(creditSlot_) : 0;
  bool request = false, timedOut = false;
  if (credit_ != nullptr) {
    if (backlogChanged_) {
      credit_->setBacklog(sender_.backlogWireBytes(kFramingOverheadBytes));
      backlogChanged_ = false;
    }
    request = credit_->requestDue(now, creditMayTimeOut(), timedOut);
    // Silent since we asked, with nothing in flight that an ACK would answer: whether it
    // is descheduled, lost our request or gone, a PING tells (its ACK arms the timeout;
    // the RTO watches it). Nothing is asked again before that.
    const auto t = credit_->nextRequestTime();
    if (!request && t && *t <= now && sent_.inFlightCount() == 0) pingSoon();
  }
  if (!request && !(peerWants && (creditAnswerDue_ || grantDue()))) return 0;
  CreditFrame f;
  f.granted = grant;
  f.wanted = credit_ != nullptr ? credit_->wanted() : 0;
  f.flags = request ? credit_flags::kRequest : 0;
  // Grown by more than a running scheduler hands out between two CREDITs: this rank was
  // not running while it was earned (credit_scheduler.h), and the sender keeps it whole.
  if (grant > grantSent_ + kCatchUpBatches * creditScheduler_->grantBatch()) {
    f.flags |= credit_flags::kCatchUp;
  }
  const size_t n = encodeCredit(out, header(), f);
  grantSent_ = std::max(grantSent_, grant);
  creditAnswerDue_ = false;
  if (request) {
    credit_->onRequestSent(now);
    if (timedOut) ++stats_.creditTimeouts;
  }
  ++stats_.creditPacketsSent;
  return controlSent(n);
}

}  // namespace ucxb::udp
