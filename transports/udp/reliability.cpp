#include "transports/udp/reliability.h"

#include <algorithm>
#include <array>
#include <stdexcept>

namespace ucxb::udp {
namespace {

// The RTO stops doubling after this many consecutive expiries (it is capped at rto_max_us
// long before anyway).
constexpr uint32_t kMaxBackoff = 20;

DropReason toDropReason(DecodeError e) {
  switch (e) {
    case DecodeError::kTruncated: return DropReason::kTruncated;
    case DecodeError::kBadVersion: return DropReason::kBadVersion;
    case DecodeError::kBadType: return DropReason::kBadType;
    case DecodeError::kBadChecksum: return DropReason::kBadChecksum;
    case DecodeError::kMalformed:
    case DecodeError::kNone: break;
  }
  return DropReason::kMalformed;
}

}  // namespace

PeerConnection::PeerConnection(const UdpConfig& config, const PeerIdentity& identity,
                               CreditScheduler* credits)
    : config_((validate(config), config)),
      identity_(identity),
      sender_(config_, stats_, events_),
      receiver_(config_, stats_, events_),
      acks_(config_),
      rtt_(config_.initialRttUs),
      congestion_(makeCongestionControl(config_)),
      lossRecovery_(makeLossRecovery(config_)),
      paths_(config_.paths, config_.pathPolicy),
      sendWindowBytes_(config_.sendWindowBytes) {
  sent_.setPerPathDetection(config_.paths > 1);
  if (credits == nullptr) {
    ownCredits_ = makeCreditScheduler(config_);
    credits = ownCredits_.get();
  }
  creditScheduler_ = credits;
  creditSlot_ = creditScheduler_->join();
  credit_ = congestion_->credits();
  pathWindows_ = congestion_->pathWindows();
  if (pathWindows_ != nullptr) paths_.setWindowPerPath();
}

MessageId PeerConnection::send(Tag tag, const void* data, size_t length) {
  const MessageId id = sender_.send(tag, data, length);
  backlogChanged_ = true;
  if (failed_) sender_.failAll(failure_);
  return id;
}

ReceiveId PeerConnection::postReceive(Tag tag, Tag mask, void* buffer, size_t capacity,
                                      ReceiveSink* sink) {
  const ReceiveId id =
      receiver_.postReceive(tag, mask, static_cast<uint8_t*>(buffer), capacity, lastNow_, sink);
  if (failed_) {
    receiver_.failAll(failure_);
  } else if (peerClosed_) {
    receiver_.failPosted(peerClosedReceive());  // unless a message already here took it
  }
  return id;
}

bool PeerConnection::cancelReceive(ReceiveId id) { return receiver_.cancelReceive(id); }

PacketHeader PeerConnection::header() const {
  PacketHeader h;  // the encoders set the type
  h.sourceRank = identity_.localRank;
  h.token = identity_.sessionToken;
  return h;
}

void PeerConnection::drop(DropReason reason) {
  ++stats_.datagramsDropped;
  ++stats_.droppedBy[static_cast<size_t>(reason)];
}

void PeerConnection::onDatagram(std::span<const uint8_t> datagram, TimeUs now, uint32_t path) {
  lastNow_ = std::max(lastNow_, now);
  ++stats_.datagramsReceived;
  stats_.bytesReceived += datagram.size();
  if (failed_) return drop(DropReason::kClosed);
  const DecodeError error = decodePacket(datagram, decoded_);
  if (error != DecodeError::kNone) {
    drop(toDropReason(error));
    // A peer of another release: each end drops every datagram of the other's, and each op
    // between them waited out its timeout with a message that named neither version.
    if (error != DecodeError::kBadVersion) return;
    if (const auto v = otherWireVersion(datagram, identity_.sessionToken, identity_.peerRank)) {
      fail("rank " + std::to_string(identity_.peerRank) + " speaks udp wire version " +
           std::to_string(*v) + " and this rank version " + std::to_string(kWireVersion) +
           ", so each drops the other's datagrams (bad_version): the ranks run different "
           "ucxbackend releases; run the same one on every rank");
    }
    return;
  }
  const DecodedPacket& p = decoded_;
  if (p.header.token != identity_.sessionToken) return drop(DropReason::kBadToken);
  if (p.header.sourceRank != identity_.peerRank) return drop(DropReason::kWrongPeer);
  lastHeard_ = std::max(lastHeard_, now);
  if (p.header.type != PacketType::kData) creditOtherArrival(datagram.size());

  if (p.header.type == PacketType::kAck) {
    if (!onAck(p.ack, now)) return drop(DropReason::kProtocol);
    ++stats_.ackPacketsReceived;
    ++stats_.datagramsAccepted;
    return;
  }
  if (p.header.type == PacketType::kNack) {
    if (!onNack(p.nack, now)) return drop(DropReason::kProtocol);
    ++stats_.nacksReceived;
    ++stats_.datagramsAccepted;
    return;
  }
  if (p.header.type == PacketType::kCredit) {
    onCredit(p.credit, now);
    ++stats_.creditPacketsReceived;
    ++stats_.datagramsAccepted;
    return;
  }
  if (p.header.type == PacketType::kClose) {
    ++stats_.closePacketsReceived;
    ++stats_.datagramsAccepted;
    if (!peerClosed_) {
      peerClosed_ = true;
      // Everything the peer sent is here (its CLOSE waits for our ACKs of all of it), and it
      // will send nothing new: a receive no message took will never get one. Failed now,
      // naming the close, where it waited until the peer's port refused a keepalive (then
      // blamed on a process that was gone) or for its op's timeout.
      receiver_.failPosted(peerClosedReceive());
    }
    return;
  }

  const PacketNumber pn = p.packetNumber;
  if (!acks_.plausible(pn)) return drop(DropReason::kProtocol);
  switch (acks_.classify(pn)) {
    case AckTracker::Arrival::kStale: return drop(DropReason::kStale);
    case AckTracker::Arrival::kDuplicate:
      // Seen before. Lost content comes back under a new number, so this is a copy made by
      // the network. Acknowledge again anyway: cheap, and it helps if our ACK went missing.
      ++stats_.duplicatePackets;
      acks_.ackSoon();
      ++stats_.datagramsAccepted;
      return;
    case AckTracker::Arrival::kNew: break;
  }
  if (p.header.type == PacketType::kData && (p.data.flags & data_flags::kCongestionExperienced)) {
    ++ceReceived_;
    ++stats_.ceReceived;
  }
  if (p.header.type == PacketType::kData && (p.data.flags & data_flags::kTrimmed)) {
    // The header of a packet whose payload a congested switch cut: never recorded (so never
    // acknowledged: to SACK it is a loss like any other), and with trim_nack reported at once,
    // so the sender resends it without waiting for later packets or a timer. A NACK list
    // that is full waits for the next pollTransmit; the rest are found by SACK.
    ++stats_.trimmedReceived;
    if (config_.trimNack && pendingNacks_.size() < kMaxNackNumbers) pendingNacks_.push_back(pn);
    ++stats_.datagramsAccepted;
    return;
  }
  if (p.header.type == PacketType::kData && !acceptInOrder(pn, p.data.flags)) {
    // Not recorded, so never acknowledged: the sender's timeout sends it again. Repeat the
    // ACK of what we kept, as a go-back-N receiver does: if our last ACK was lost, this one
    // saves the sender a timeout round, whose RTO would double while nothing is acknowledged.
    acks_.ackSoon();
    return drop(DropReason::kAfterGap);
  }
  switch (p.header.type) {
    case PacketType::kData:
      switch (receiver_.onData(p.data, p.payload, now)) {
        case MessageReceiver::Verdict::kViolation: return drop(DropReason::kProtocol);
        // The sender's send completes only when this packet is acknowledged, and a collective
        // waits for that: a delayed ACK would add up to max_ack_delay_us to every message
        // with an odd number of fragments. A duplicate (bytes we already have, resent after
        // a spurious loss or a timeout) is answered at once for the same reason.
        case MessageReceiver::Verdict::kCompleted:
        case MessageReceiver::Verdict::kDuplicate: acks_.ackSoon(); break;
        case MessageReceiver::Verdict::kAccepted: break;
      }
      break;
    case PacketType::kCts:
      for (uint16_t i = 0; i < p.cts.count; ++i) {
        if (!sender_.ctsPlausible(p.cts.ids[i])) return drop(DropReason::kProtocol);
      }
      for (uint16_t i = 0; i < p.cts.count; ++i) sender_.onClearToSend(p.cts.ids[i]);
      backlogChanged_ = true;  // the cleared messages' data may go now
      break;
    case PacketType::kPing:
      // A probe: the sender is waiting for news (a lost tail, credit, liveness), and its
      // probe timeout already counted our ACK delay once.
      acks_.ackSoon();
      break;
    case PacketType::kAck:
    case PacketType::kNack:
    case PacketType::kCredit:
    case PacketType::kClose: break;
  }
  if (acks_.record(pn, now, path)) ++stats_.outOfOrderPackets;
  ++stats_.datagramsAccepted;
}

bool PeerConnection::acceptInOrder(PacketNumber pn, uint8_t flags) {
  if (!(flags & data_flags::kInOrder)) return true;
  // The run reaches past everything received since it started, control packets included
  // (they are never discarded). Looked up here, not per packet: selective repeat's traffic
  // never asks.
  inOrderNext_ = acks_.firstMissingFrom(inOrderNext_);
  // A restart older than the run in progress is a straggler from an abandoned run.
  if ((flags & data_flags::kRestart) && pn >= inOrderNext_) {
    inOrderNext_ = pn;
    return true;
  }
  return pn == inOrderNext_;
}

bool PeerConnection::onAck(const AckFrame& ack, TimeUs now) {
  if (!sent_.onAck(ack, ackResult_)) return false;
  lastActivity_ = now;
  if (sender_.onCreditLimit(ack.creditLimit)) probeBackoff_ = 0;
  stats_.lateAcks += ackResult_.lateAcks;
  stats_.spuriousRetransmissions += ackResult_.lateDataAcks;
  if (ackResult_.lateDataAcks > 0) lossRecovery_->onSpuriousRetransmission();
  for (const uint32_t path : ackResult_.spuriousLossPaths) {
    paths_.onSpuriousLoss(path);
    if (pathWindows_ != nullptr) pathWindows_->onPathSpuriousLoss(path);
  }
  if (pathWindows_ != nullptr) {
    const OneWayDelays& delays = sent_.oneWayDelays();
    for (const uint32_t path : ackResult_.timestampedPaths) {
      const DurationUs limit = queueLimitUs(path);
      const DurationUs queue = delays.queueDelayUs(path);
      if (queue <= limit) continue;
      // A window that a path's bandwidth-delay product fills cannot keep a queue standing on
      // it: what waits is another's (the peer host's, when its receiving thread did not run
      // and the datagrams of every path waited in its socket alike). Cut below it, every
      // path's window fell to the floor on a loaded host while the links idled
      // (docs/udp-protocol.md, adaptive).
      const double bdp = bdpPackets(path);
      if (static_cast<double>(pathWindows_->pathWindowPackets(path)) <= bdp) {
        ++pathCuts_[path % kMaxPaths].queueAtBdp;
        continue;
      }
      if (pathWindows_->onPathQueue(path, delays.lastSentTime(path), now, bdp)) {
        ++pathCuts_[path % kMaxPaths].queue;
      }
    }
  }
  AckSignal signal;
  signal.now = now;
  if (ackResult_.rttSampleSentTime && now >= *ackResult_.rttSampleSentTime) {
    const DurationUs rtt = now - *ackResult_.rttSampleSentTime;
    rtt_.onSample(rtt, ack.ackDelayUs, config_.maxAckDelayUs);
    const DurationUs delay = std::min<DurationUs>(ack.ackDelayUs, config_.maxAckDelayUs);
    signal.rttSampleUs = std::max(rtt_.min(), rtt > delay ? rtt - delay : rtt);
  }
  // The echo counts up modulo 2^16; an older frame (reordered ACKs) shows a count behind the
  // one seen, a "difference" past half the range, and brings no news.
  const uint16_t newMarks = static_cast<uint16_t>(ack.ceCount - ceEchoSeen_);
  if (newMarks < 0x8000) {
    ceEchoSeen_ = ack.ceCount;
    signal.markedPackets = newMarks;
    stats_.ceEchoed += newMarks;
  }
  for (const SentPacket& p : ackResult_.newlyAcked) {
    paths_.onAcked(p.path, now >= p.sentTime ? now - p.sentTime : 0, p.sentTime);
    // RFC 9002's 9/8 of the RTT, of this path's own. Its latest RTT counts where a loss cuts
    // a window (congestion_->cutsOnLoss()): a spurious loss there costs the path half its
    // rate, and the latest RTT keeps up with its queue. Where it does not, a spurious loss
    // costs one resend, and the larger threshold only found real losses later (a host that
    // holds 1% of datagrams up to 3 ms, `multipath_op_time`: 1.10x round-robin instead of
    // 1.23x at 1 MiB).
    if (paths_.paths() > 1) {
      sent_.setPathLossDelay(p.path, paths_.lossDelay(p.path, congestion_->cutsOnLoss()));
    }
    if (pathWindows_ != nullptr) {
      pathWindows_->setPathRtt(p.path, paths_.stats(p.path).rttSmoothedUs);
      pathWindows_->onPathAcked(p.path, p.sentTime, now);
    } else {
      congestion_->onPacketAcked(p.sentTime, now);
    }
    if (p.content.kind == PacketContent::Kind::kData) sender_.onAcked(p.content);
  }
  signal.ackedPackets = ackResult_.newlyAcked.size();
  if (signal.ackedPackets > 0 || signal.markedPackets > 0) {
    signal.minRttUs = rtt_.hasSample() ? rtt_.min() : 0;
    signal.smoothedRttUs = rtt_.hasSample() ? rtt_.smoothed() : 0;
    congestion_->onAck(signal);
  }
  if (rtoVerdictPending_ && (!ackResult_.newlyAcked.empty() || ackResult_.lateAcks > 0)) {
    judgeTimeouts(now);
  }
  if (!ackResult_.newlyAcked.empty() || ackResult_.lateAcks > 0) {
    // The peer is alive and the path works: timeouts start from scratch. A late ACK (of a
    // packet already given up on) says so too: our timer was early, the path is not dead.
    // Without it, go-back-N at high loss, whose timeouts abandon packets the peer has just
    // acknowledged, backed off to rto_max and declared a live peer failed.
    consecutiveRtos_ = 0;
    rtoBackoff_ = 0;
    tailProbesSent_ = 0;
    lastAckProgress_ = now;
  }
  detectAndRecover(now);
  return true;
}

void PeerConnection::judgeTimeouts(TimeUs now) {
  rtoVerdictPending_ = false;
  // A packet sent before the first expiry and acknowledged after it, or one given up on and
  // acknowledged after all: the peer had it and only its ACK was late. Nothing more is
  // resent (a real loss among the rest is found by the time threshold, now that later
  // packets are acknowledged) and the window stays.
  const bool early = ackResult_.lateAcks > 0 ||
                     std::any_of(ackResult_.newlyAcked.begin(), ackResult_.newlyAcked.end(),
                                 [this](const SentPacket& p) { return p.number < rtoBoundary_; });
  if (early) {
    ++stats_.spuriousRtos;
    return;
  }
  // Only what the timeouts sent came back: the rest was lost, as a timeout assumes.
  congestion_->onRetransmissionTimeout(now);
  lost_.clear();
  sent_.expireSentAtOrBefore(rtoCutoff_, lost_);
  recover(lost_, now, LossCause::kTimeout);
}

bool PeerConnection::onNack(const NackFrame& nack, TimeUs now) {
  for (uint16_t i = 0; i < nack.count; ++i) {
    if (nack.numbers[i] >= sent_.nextNumber()) return false;
  }
  lost_.clear();
  sent_.declareLost(std::span<const PacketNumber>(nack.numbers.data(), nack.count), lost_);
  stats_.packetsNacked += lost_.size();
  recover(lost_, now, LossCause::kNacked);
  return true;
}

void PeerConnection::detectAndRecover(TimeUs now) {
  lost_.clear();
  sent_.detectLosses(now, lossDelay(), lossRecovery_->reorderThreshold(config_.reorderThreshold),
                     lost_);
  if (!lost_.empty()) recover(lost_, now, LossCause::kDetected);
}

void PeerConnection::recover(std::vector<SentPacket>& lost, TimeUs now, LossCause cause) {
  if (lost.empty()) return;
  lostNumbers_.clear();
  for (const SentPacket& p : lost) lostNumbers_.push_back(p.number);
  sent_.inFlightNumbers(inFlightNumbers_);
  alsoResend_.clear();
  lossRecovery_->chooseResends(lostNumbers_, inFlightNumbers_, alsoResend_);
  if (!alsoResend_.empty()) sent_.declareLost(alsoResend_, lost);
  stats_.packetsDeclaredLost += lost.size();
  // The peer discards everything after the gap: the next DATA starts a new in-order run.
  if (lossRecovery_->inOrderOnly()) restartPending_ = true;
  backlogChanged_ = true;  // lost content is backlog again
  TimeUs newestSent = 0;
  std::array<TimeUs, kMaxPaths> pathNewestSent{};
  std::array<uint64_t, kMaxPaths> pathLost{};
  for (SentPacket& p : lost) {
    newestSent = std::max(newestSent, p.sentTime);
    const uint32_t path = p.path % kMaxPaths;
    pathNewestSent[path] = std::max(pathNewestSent[path], p.sentTime);
    ++pathLost[path];
    paths_.onLost(p.path, cause == LossCause::kTimeout);
    switch (p.content.kind) {
      case PacketContent::Kind::kData: sender_.onLost(std::move(p.content)); break;
      case PacketContent::Kind::kCts: receiver_.onClearToSendLost(p.content.ctsIds); break;
      case PacketContent::Kind::kPing: break;  // a probe is not worth repeating as such
    }
  }
  lost.clear();
  if (cause == LossCause::kDetected) lossRecovery_->onLossDeclared();
  if (cause == LossCause::kTimeout) return;
  if (pathWindows_ != nullptr) {
    // Each path's window reacts to its own losses (a trim, like a loss, is congestion there).
    for (uint32_t path = 0; path < kMaxPaths; ++path) {
      if (pathLost[path] == 0) continue;
      // A loss on a path whose queue, by the peer's timestamps, is within the limit is not
      // congestion (that cuts the window through onPathQueue before the queue overflows) but
      // the path's own random loss: resent, and the window kept, so that a path losing 5% at
      // random still carries what its other 95% can.
      if (sent_.oneWayDelays().known(path) &&
          sent_.oneWayDelays().queueDelayUs(path) <= queueLimitUs(path)) {
        continue;
      }
      if (pathWindows_->onPathLost(path, pathNewestSent[path], now, pathLost[path])) {
        ++pathCuts_[path].loss;
      }
    }
  } else if (cause == LossCause::kDetected) {
    congestion_->onPacketsLost(newestSent, now);
  } else {
    congestion_->onPacketsTrimmed(newestSent, now);
  }
}

DurationUs PeerConnection::lossDelay() const { return lossRecovery_->lossDelay(rtt_); }

DurationUs PeerConnection::queueLimitUs(uint32_t path) const {
  const double drainUs = sent_.oneWayDelays().drainUsPerByte(path) *
                         static_cast<double>(config_.mtuPayload) * kQueueLimitPackets;
  return std::max<DurationUs>(rtt_.min(), static_cast<DurationUs>(drainUs));
}

double PeerConnection::bdpPackets(uint32_t path) const {
  const double usPerPacket =
      sent_.oneWayDelays().drainUsPerByte(path) * static_cast<double>(config_.mtuPayload);
  return usPerPacket > 0 ? static_cast<double>(rtt_.min()) / usPerPacket : 0.0;
}

DurationUs PeerConnection::currentRto() const {
  const DurationUs base =
      rtt_.retransmissionTimeout(config_.maxAckDelayUs, config_.rtoMinUs, config_.rtoMaxUs);
  return std::min(config_.rtoMaxUs, base << std::min(rtoBackoff_, kMaxBackoff));
}

std::optional<TimeUs> PeerConnection::rtoDeadline() const {
  const auto oldest = sent_.oldestInFlightSentTime();
  if (!oldest) return std::nullopt;
  // Restarted by every ACK that acknowledges something new (RFC 6298 5.3): while ACKs flow,
  // losses are found by the reordering and time thresholds, and a deep queue behind a burst
  // does not look like a dead path. When it fires, the oldest packet is at least one RTO old.
  // Restarted by every expiry too: the packets an expiry leaves in flight are older than it.
  return std::max({*oldest, lastAckProgress_, lastRtoAt_}) + currentRto();
}

std::optional<TimeUs> PeerConnection::probeDeadline() const {
  // Out of credit with nothing in flight, no ACK would ever bring news of more credit if the
  // last update was lost: probe (TCP's persist timer), backing off while nothing changes.
  if (probeDue_ || sent_.inFlightCount() > 0 || !sender_.blockedOnCredit()) return std::nullopt;
  const DurationUs delay =
      std::min(config_.rtoMaxUs, currentRto() << std::min(probeBackoff_, kMaxBackoff));
  return lastActivity_ + delay;
}

std::optional<TimeUs> PeerConnection::tailProbeDeadline() const {
  if (tailProbesSent_ >= config_.tailProbes || timeoutProbeDue_ || sent_.inFlightCount() == 0) {
    return std::nullopt;
  }
  // RFC 9002's probe timeout, without its 1 ms granularity floor: a probe is only a PING.
  const DurationUs pto = rtt_.smoothed() + std::max<DurationUs>(4 * rtt_.variation(), 20) +
                         (lastSentAckedAtOnce_ ? 0 : config_.maxAckDelayUs);
  return std::max(lastReliableSent_, lastAckProgress_) + (pto << tailProbesSent_);
}

std::optional<TimeUs> PeerConnection::keepaliveDeadline() const {
  // Anything in flight is already watched by the RTO; with nothing expected, silence is fine.
  if (config_.keepaliveUs == 0 || keepaliveDue_ || sent_.inFlightCount() > 0 ||
      !(receiver_.expecting() || anySourcePending_)) {
    return std::nullopt;
  }
  return std::max(lastHeard_, lastActivity_) + config_.keepaliveUs;
}

uint32_t PeerConnection::pathsWithRoom() const {
  if (pathWindows_ == nullptr) return kAllPaths;
  uint32_t room = 0;
  for (uint32_t p = 0; p < pathWindows_->paths(); ++p) {
    if (pathWindows_->pathHasRoom(p, sent_.pathInFlightCount(p))) room |= uint32_t{1} << p;
  }
  return room;
}

bool PeerConnection::windowFull() const {
  if (sent_.inFlightCount() >= packetLimit_) return true;
  if (pathWindows_ != nullptr ? pathsWithRoom() == 0
                              : sent_.inFlightCount() >= congestion_->windowPackets()) {
    return true;
  }
  // One datagram always fits an empty window.
  return sent_.inFlightBytes() > 0 &&
         sent_.inFlightBytes() + config_.mtuPayload > sendWindowBytes_;
}

std::optional<TimeUs> PeerConnection::nextTimeout() const {
  if (failed_) return std::nullopt;
  std::optional<TimeUs> next;
  const auto consider = [&next](std::optional<TimeUs> t) {
    if (t && (!next || *t < *next)) next = t;
  };
  consider(acks_.ackDeadline());
  consider(sent_.nextLossTime(lossDelay()));
  consider(rtoDeadline());
  consider(probeDeadline());
  consider(tailProbeDeadline());
  consider(keepaliveDeadline());
  consider(creditDeadline());
  if (receiver_.creditUpdateUrgent() || !pendingNacks_.empty()) consider(lastNow_);
  return next;
}

void PeerConnection::onTimeout(TimeUs now) {
  if (failed_) return;
  lastNow_ = std::max(lastNow_, now);
  if (const auto t = sent_.nextLossTime(lossDelay()); t && *t <= now) detectAndRecover(now);
  if (const auto t = rtoDeadline(); t && *t <= now) {
    ++stats_.rtoExpiries;
    const DurationUs rto = currentRto();
    if (consecutiveRtos_ == 0) rtoRunStart_ = *t - std::min(*t, rto);
    ++consecutiveRtos_;
    // Silence alone: nothing heard from the peer (not even an ACK of nothing new) since the
    // run of timeouts began waiting. A stopped process (SIGSTOP, a long GC pause, swapped
    // out) looks exactly like this, so the Endpoint never lets peer_timeout_us fall below the
    // op's timeout (EndpointOptions::opTimeoutUs): a dead process is told apart by its
    // closed port instead (Endpoint::handlePortUnreachable).
    const TimeUs silentSince = std::max(lastHeard_, rtoRunStart_);
    if (consecutiveRtos_ >= config_.maxRtoExpiries &&
        now - std::min(now, silentSince) >= config_.peerTimeoutUs) {
      fail("peer rank " + std::to_string(identity_.peerRank) + " acknowledged nothing through " +
           std::to_string(consecutiveRtos_) + " retransmission timeouts (last timeout " +
           std::to_string(rto) + " us; nothing heard from it for at least " +
           std::to_string(config_.peerTimeoutUs / 1000) + " ms)");
      return;
    }
    // A process that was descheduled (a loaded host's scheduler, the peer's or ours) looks
    // like a dead path until its ACKs arrive: resend only the oldest packet and let the next
    // ACK decide (judgeTimeouts). Expiring the whole window here resent up to
    // send_window_bytes for nothing each time a rank was descheduled for an RTO.
    if (!rtoVerdictPending_) {
      rtoVerdictPending_ = true;
      rtoBoundary_ = sent_.nextNumber();
    }
    rtoCutoff_ = now - std::min(now, rto);
    lastRtoAt_ = now;
    lost_.clear();
    sent_.expireOldest(lost_);
    rtoBackoff_ = std::min(rtoBackoff_ + 1, kMaxBackoff);
    recover(lost_, now, LossCause::kTimeout);
    // Two ack-eliciting packets per timeout, not one (RFC 9002 6.2.4): with a single packet
    // in flight, one loss either way costs a doubled timeout, and at 30% loss a run of those
    // backed a live peer off to rto_max and past peer_timeout_us.
    timeoutProbeDue_ = true;
  }
  if (const auto t = tailProbeDeadline(); t && *t <= now) {
    ++tailProbesSent_;
    ++stats_.tailLossProbes;
    timeoutProbeDue_ = true;
  }
  if (const auto t = probeDeadline(); t && *t <= now) probeDue_ = true;
  if (const auto t = keepaliveDeadline(); t && *t <= now) keepaliveDue_ = true;
}

size_t PeerConnection::recordAndCount(TimeUs now, PacketContent content, size_t bytes,
                                      bool retransmission, bool ackedAtOnce) {
  lastSentAckedAtOnce_ = ackedAtOnce;
  if (retransmission) {
    ++stats_.retransmittedPackets;
    stats_.retransmittedBytes += content.length;
  }
  // A probe goes out whatever the windows say: on a path with room if there is one.
  transmitPath_ = paths_.choose(retransmission, pathsWithRoom());
  paths_.onSent(transmitPath_, retransmission);
  sent_.record(now, static_cast<uint32_t>(bytes), std::move(content), transmitPath_);
  lastActivity_ = now;
  lastReliableSent_ = now;
  ++stats_.datagramsSent;
  stats_.bytesSent += bytes;
  return bytes;
}

size_t PeerConnection::controlSent(size_t bytes) {
  transmitPath_ = paths_.chooseControl();
  ++stats_.datagramsSent;
  stats_.bytesSent += bytes;
  return bytes;
}

size_t PeerConnection::sendAck(TimeUs now, std::span<uint8_t> out) {
  acks_.buildAck(now, maxAckRangesFor(config_.mtuPayload, acks_.timestampsPending()), ackFrame_);
  ackFrame_.creditLimit = receiver_.creditLimit();
  receiver_.noteCreditAdvertised(ackFrame_.creditLimit);
  ackFrame_.ceCount = static_cast<uint16_t>(ceReceived_);
  const size_t n = encodeAck(out, header(), ackFrame_);
  ++stats_.ackPacketsSent;
  return controlSent(n);
}

size_t PeerConnection::sendNack(std::span<uint8_t> out) {
  const size_t n = encodeNack(out, header(), pendingNacks_);
  pendingNacks_.clear();
  ++stats_.nacksSent;
  return controlSent(n);
}

size_t PeerConnection::pollTransmit(TimeUs now, std::span<uint8_t> out) {
  if (failed_) return 0;
  if (out.size() < config_.mtuPayload) {
    throw std::length_error("udp pollTransmit: buffer of " + std::to_string(out.size()) +
                            " bytes is smaller than mtu_payload=" +
                            std::to_string(config_.mtuPayload));
  }
  out = out.first(config_.mtuPayload);
  lastNow_ = std::max(lastNow_, now);
  // ACKs first: they are small, unlimited by any window, and what keeps the peer going.
  if (acks_.ackWanted(now) || receiver_.creditUpdateUrgent()) return sendAck(now, out);
  if (!pendingNacks_.empty()) return sendNack(out);
  if (closeDue_ && sendSettled()) {
    closeDue_ = false;
    ++stats_.closePacketsSent;
    return controlSent(encodeClose(out, header()));
  }
  if (const size_t n = pollCredit(now, out)) return n;
  if (probeDue_ || keepaliveDue_ || timeoutProbeDue_) {
    // A PING is reliable: if the peer never acknowledges it, the RTO path gives up on it.
    if (probeDue_) ++probeBackoff_;
    probeDue_ = false;
    keepaliveDue_ = false;
    timeoutProbeDue_ = false;
    const size_t n = encodePing(out, header(), sent_.nextNumber());
    ++stats_.pingPacketsSent;
    return recordAndCount(now, PacketContent{}, n, false, /*ackedAtOnce=*/true);
  }
  if (windowFull()) return 0;
  if (receiver_.hasClearToSend()) {
    // CTSs before our own data: each one unblocks a whole message on the peer's side.
    receiver_.takeClearToSend(maxCtsIdsFor(config_.mtuPayload), ctsIds_);
    const size_t n = encodeCts(out, header(), sent_.nextNumber(), ctsIds_);
    ++stats_.ctsPacketsSent;
    PacketContent c;
    c.kind = PacketContent::Kind::kCts;
    c.ctsIds = ctsIds_;
    return recordAndCount(now, std::move(c), n, false, /*ackedAtOnce=*/false);
  }
  if (creditBlocksData()) return 0;
  if (auto f = sender_.nextFragment()) {
    DataHeader d;
    d.tag = f->tag;
    d.messageId = f->content.messageId;
    d.messageLength = f->messageLength;
    d.offset = f->content.offset;
    d.fragmentLength = static_cast<uint16_t>(f->content.length);
    d.flags = f->content.flags;
    if (lossRecovery_->inOrderOnly()) {
      d.flags |= data_flags::kInOrder;
      if (restartPending_) d.flags |= data_flags::kRestart;
      restartPending_ = false;
    }
    const size_t n = encodeData(out, header(), sent_.nextNumber(), d, f->payload);
    ++stats_.dataPacketsSent;
    spendCredit(n);
    // The peer acknowledges at once the packet that completes a message, which this one
    // does unless an earlier packet of the message is still missing. Then its ACK may be
    // delayed and a tail probe may go out early: one PING, which the peer answers at once.
    const bool endsMessage = d.offset + d.fragmentLength == d.messageLength;
    return recordAndCount(now, std::move(f->content), n, f->retransmission, endsMessage);
  }
  return 0;
}

std::optional<Event> PeerConnection::pollEvent() {
  if (events_.empty()) return std::nullopt;
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void PeerConnection::fail(const std::string& why) {
  if (failed_) return;
  failed_ = true;
  failure_ = why;
  Event e;
  e.kind = EventKind::kPeerFailed;
  e.error = why;
  events_.push_back(std::move(e));
  sender_.failAll(why);
  receiver_.failAll(why);
}

std::string PeerConnection::peerClosedReceive() const {
  return "rank " + std::to_string(identity_.peerRank) +
         " closed the group (destroy_process_group, or its process exiting) with this receive "
         "from it pending: everything it sent has arrived, and it sends nothing more";
}

bool PeerConnection::sendSettled() const {
  // A PING in flight carries nothing the peer needs. Waiting for its ACK held a closing
  // rank's CLOSE back, and its linger until linger_max once the peer had gone: a tail probe
  // whose ACK was lost stays in flight, and each timeout sends the next (idle() alike).
  return sender_.idle() && sent_.inFlightCount() == sent_.inFlightProbes() &&
         !receiver_.hasClearToSend();
}

bool PeerConnection::idle() const {
  return sender_.idle() && sent_.inFlightCount() == sent_.inFlightProbes() &&
         !acks_.ackDeadline() && pendingNacks_.empty() &&
         !receiver_.receiving() && !receiver_.hasClearToSend();
}

Stats PeerConnection::stats() const {
  Stats s = stats_;
  if (rtt_.hasSample()) {
    s.rttSmoothedUs = rtt_.smoothed();
    s.rttMinUs = rtt_.min();
    s.rttLatestUs = rtt_.latest();
  }
  s.rttSamples = rtt_.samples();
  s.sendWindowBytes = sendWindowBytes_;
  if (paths_.paths() > 1) {
    for (uint32_t p = 0; p < paths_.paths(); ++p) {
      PathStats& ps = s.paths.emplace_back(paths_.stats(p));
      if (pathWindows_ == nullptr) continue;
      ps.windowPackets = pathWindows_->pathWindowPackets(p);
      ps.lossCuts = pathCuts_[p].loss;
      ps.queueCuts = pathCuts_[p].queue;
      ps.queueAtBdp = pathCuts_[p].queueAtBdp;
    }
  }
  return s;
}

}  // namespace ucxb::udp
