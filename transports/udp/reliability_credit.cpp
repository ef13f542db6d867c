// PeerConnection's part in congestion=credit (congestion_credit.h), both roles: as the
// receiver it answers the peer's demand with the grants of the rank's CreditScheduler; as
// the sender (when its own policy is credit) it tells the peer its demand and sends DATA only
// against the peer's grants. Kept apart from reliability.cpp, which only calls in here.
#include <algorithm>

#include "transports/udp/congestion_credit.h"
#include "transports/udp/faults.h"
#include "transports/udp/reliability.h"

namespace ucxb::udp {

void PeerConnection::onCredit(const CreditFrame& credit, TimeUs now) {
  // A grant is news only to a credit sender; a demand is served whatever our own policy (the
  // receiver decides), so that it never depends on both ends choosing the same one.
  if (credit_ != nullptr && credit.granted > 0) credit_->onGrant(credit.granted, now);
  if (credit.wanted > 0) creditScheduler_->onWanted(creditSlot_, credit.wanted, now);
  if (credit.flags & credit_flags::kRequest) creditAnswerDue_ = true;
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
    if (backlogChanged_ || credit_->wanted() > 0) consider(credit_->nextRequestTime());
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
    request = credit_->requestDue(now, timedOut);
  }
  if (!request && !(peerWants && (creditAnswerDue_ || grantDue()))) return 0;
  CreditFrame f;
  f.granted = grant;
  f.wanted = credit_ != nullptr ? credit_->wanted() : 0;
  f.flags = request ? credit_flags::kRequest : 0;
  const size_t n = encodeCredit(out, header(), f);
  grantSent_ = std::max(grantSent_, grant);
  creditAnswerDue_ = false;
  if (request) {
    credit_->onRequestSent(now);
    if (timedOut) {
      ++stats_.creditTimeouts;
      // Nothing in flight means no timer watches the peer: a PING, which the RTO repeats
      // and gives up on, tells a dead receiver from one whose grants were lost.
      if (sent_.inFlightCount() == 0) pingSoon();
    }
  }
  ++stats_.creditPacketsSent;
  transmitPath_ = paths_.chooseControl();
  ++stats_.datagramsSent;
  stats_.bytesSent += n;
  return n;
}

}  // namespace ucxb::udp
