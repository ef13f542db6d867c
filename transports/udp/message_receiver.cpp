#include "transports/udp/message_receiver.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace ucxb::udp {

MessageReceiver::MessageReceiver(const UdpConfig& config, Stats& stats, std::deque<Event>& events)
    : capacity_(config.unexpectedBytes),
      eagerMax_(config.eagerMaxBytes),
      maxMessage_(config.maxMessageBytes),
      stats_(stats),
      events_(events),
      advertised_(config.unexpectedBytes) {}

ReceiveId MessageReceiver::postReceive(Tag tag, Tag mask, uint8_t* buffer, uint64_t capacity,
                                       TimeUs now, ReceiveSink* sink) {
  if (buffer == nullptr && sink == nullptr && capacity > 0) {
    throw std::invalid_argument("udp receive: null buffer");
  }
  const Posted r{nextReceiveId_++, tag, mask, buffer, capacity, sink};
  // The earliest matchable message that fits takes it.
  for (auto it = unmatched_.begin(); it != unmatched_.end() && *it < orderedUpTo_; ++it) {
    Incoming& m = active_.at(*it);
    if (tagMatches(m.tag, r)) {
      attach(*it, m, r, now);
      return r.id;
    }
  }
  posted_.push_back(r);
  return r.id;
}

bool MessageReceiver::hasMatchable(Tag tag, Tag mask) const {
  const Posted probe{0, tag, mask, nullptr, 0};
  for (auto it = unmatched_.begin(); it != unmatched_.end() && *it < orderedUpTo_; ++it) {
    if (tagMatches(active_.at(*it).tag, probe)) return true;
  }
  return false;
}

bool MessageReceiver::cancelReceive(ReceiveId id) {
  Event e;
  e.kind = EventKind::kReceiveCancelled;
  e.id = id;
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (it->id == id) {
      e.tag = it->tag;
      posted_.erase(it);
      events_.push_back(std::move(e));
      return true;
    }
  }
  // Matched and partly written: not withdrawn. Dropping the rest would complete the sender's
  // send for a message nobody received, and a retried receive would take the next message in
  // its place: the same message lost on one side and delivered on the other, without an error.
  // It stays pending; its owner fails the group and cuts the peer off (csrc/p2p_withdraw.hpp),
  // as for a send that cannot be withdrawn and as ucx does for a matched receive.
  return false;
}

MessageReceiver::Verdict MessageReceiver::onData(const DataHeader& h,
                                                 std::span<const uint8_t> payload, TimeUs now) {
  const MessageId id = h.messageId;
  if (finished_.contains(id)) {
    ++stats_.duplicateFragments;
    return Verdict::kDuplicate;
  }
  const bool isRequest = h.flags & data_flags::kRendezvousRequest;
  const bool rendezvous = isRequest || (h.flags & data_flags::kRendezvousData);
  auto it = active_.find(id);
  if (it == active_.end()) {
    // A new message. Rendezvous data before its request was ever seen cannot happen (we
    // would not have sent CTS); an eager message longer than eager_max_bytes, or one that
    // overruns the credit we granted, would make us buffer more than we promised.
    if (!isRequest && rendezvous) return Verdict::kViolation;
    if (h.messageLength > maxMessage_) return Verdict::kViolation;
    if (!rendezvous && h.messageLength > eagerMax_) return Verdict::kViolation;
    const uint64_t charge = kMessageChargeBytes + (rendezvous ? 0 : h.messageLength);
    if (used_ + charge > capacity_) return Verdict::kViolation;
    Incoming m;
    m.tag = h.tag;
    m.length = h.messageLength;
    m.rendezvous = rendezvous;
    m.chargeHeld = charge;
    used_ += charge;
    stats_.unexpectedBytesHighWater = std::max(stats_.unexpectedBytesHighWater, used_);
    if (stats_.firstDataReceivedUs == 0) stats_.firstDataReceivedUs = std::max<TimeUs>(now, 1);
    it = active_.emplace(id, std::move(m)).first;
    unmatched_.insert(id);
    seen_.insert(id);
    // Matching before writing, so that the bytes of a message whose receive is posted go
    // straight into it.
    matchNewlyOrdered(now);
    it = active_.find(id);
    if (it == active_.end()) return Verdict::kAccepted;  // (not reachable: nothing arrived yet)
    if (!it->second.destination) ++stats_.unexpectedMessages;
  } else {
    const Incoming& m = it->second;
    if (m.tag != h.tag || m.length != h.messageLength || m.rendezvous != rendezvous) {
      return Verdict::kViolation;  // disagrees with the message's earlier fragments
    }
  }
  Incoming& m = it->second;
  if (isRequest) {
    if (m.requestSeen) {
      ++stats_.duplicateFragments;
      return Verdict::kDuplicate;
    }
    m.requestSeen = true;
    finishIfComplete(id, now);  // a 0-byte rendezvous message is complete once matched
    return Verdict::kAccepted;
  }
  // Rendezvous data flows only after our CTS, i.e. into a posted buffer.
  if (rendezvous && !m.destination) return Verdict::kViolation;
  if (h.fragmentLength == 0) {
    if (m.emptyFragmentSeen) {
      ++stats_.duplicateFragments;
      return Verdict::kDuplicate;
    }
    m.emptyFragmentSeen = true;
  } else {
    newParts_.clear();
    const uint64_t added = m.received.insert(h.offset, h.offset + h.fragmentLength, &newParts_);
    if (added == 0) {
      ++stats_.duplicateFragments;
      return Verdict::kDuplicate;
    }
    for (const auto& part : newParts_) {
      writeBytes(m, part.begin, part.end, payload.data() + (part.begin - h.offset));
    }
    m.receivedBytes += added;
    stats_.payloadBytesReceived += added;
  }
  const bool allBytes = m.receivedBytes == m.length;  // `m` may be gone after the next call
  finishIfComplete(id, now);
  return allBytes ? Verdict::kCompleted : Verdict::kAccepted;
}

void MessageReceiver::writeBytes(Incoming& m, uint64_t begin, uint64_t end, const uint8_t* src) {
  if (m.destination) return deliverBytes(*m.destination, begin, end, src);
  // Unmatched eager message: its length is within eager_max_bytes and charged to the budget.
  if (m.unexpected.size() != m.length) m.unexpected.resize(m.length);
  std::memcpy(m.unexpected.data() + begin, src, end - begin);
}

void MessageReceiver::deliverBytes(const Posted& r, uint64_t begin, uint64_t end,
                                   const uint8_t* src) {
  // Never past the posted capacity: a longer message is truncated (and reported so).
  end = std::min(end, r.capacity);
  if (begin >= end) return;
  if (r.sink != nullptr) {
    r.sink->write(begin, src, end - begin);
  } else {
    std::memcpy(r.buffer + begin, src, end - begin);
  }
}

void MessageReceiver::matchNewlyOrdered(TimeUs now) {
  const MessageId upTo = seen_.firstMissingFrom(orderedUpTo_);
  if (upTo == orderedUpTo_) return;
  for (auto it = unmatched_.lower_bound(orderedUpTo_); it != unmatched_.end() && *it < upTo;) {
    const MessageId id = *it++;  // attach() erases id from unmatched_
    Incoming& m = active_.at(id);
    for (auto r = posted_.begin(); r != posted_.end(); ++r) {
      if (tagMatches(m.tag, *r)) {
        const Posted receive = *r;
        posted_.erase(r);
        attach(id, m, receive, now);
        break;
      }
    }
  }
  orderedUpTo_ = upTo;
}

void MessageReceiver::attach(MessageId id, Incoming& m, const Posted& r, TimeUs now) {
  unmatched_.erase(id);
  m.destination = r;
  if (!m.rendezvous) {
    if (!m.unexpected.empty()) {
      m.received.forEachAscending([&](const RangeSet::Range& part) {
        deliverBytes(r, part.begin, part.end, m.unexpected.data() + part.begin);
        return true;
      });
      std::vector<uint8_t>().swap(m.unexpected);
    }
    release(m, m.length);  // its bytes no longer need the budget
  } else if (m.length > 0) {
    clearToSend_.push_back(id);
  }
  finishIfComplete(id, now);
}

void MessageReceiver::finishIfComplete(MessageId id, TimeUs now) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  Incoming& m = it->second;
  bool complete;
  if (m.rendezvous) {
    complete = m.requestSeen && m.destination && m.receivedBytes == m.length;
  } else {
    complete = m.length == 0 ? m.emptyFragmentSeen : m.receivedBytes == m.length;
  }
  if (!complete || !m.destination) return;  // unexpected: wait for a receive
  Event e;
  e.kind = EventKind::kMessageReceived;
  e.id = m.destination->id;
  e.tag = m.tag;
  e.bytes = m.length;
  e.truncated = m.length > m.destination->capacity;
  events_.push_back(std::move(e));
  ++stats_.messagesReceived;
  stats_.bytesDelivered += std::min(m.length, m.destination->capacity);
  stats_.lastDeliveryUs = now;
  release(m, m.chargeHeld);
  finished_.insert(id);
  active_.erase(it);
}

bool MessageReceiver::receiving() const {
  return std::any_of(active_.begin(), active_.end(), [](const auto& entry) {
    const Incoming& m = entry.second;
    const bool dataAsked = !m.rendezvous || m.destination;
    return dataAsked && m.receivedBytes < m.length;
  });
}

void MessageReceiver::release(Incoming& m, uint64_t bytes) {
  bytes = std::min(bytes, m.chargeHeld);
  m.chargeHeld -= bytes;
  used_ -= bytes;
  released_ += bytes;
}

bool MessageReceiver::creditUpdateUrgent() const {
  const uint64_t limit = creditLimit();
  if (limit <= advertised_) return false;
  // What the peer can still start, as far as we know: the advertised limit minus every
  // charge we have seen. Below half the budget, each release is worth telling at once; above,
  // it rides the next regular ACK (like TCP's receive-window update rule).
  const uint64_t seenCharges = used_ + released_;
  const uint64_t remaining = advertised_ > seenCharges ? advertised_ - seenCharges : 0;
  return remaining < capacity_ / 2;
}

void MessageReceiver::takeClearToSend(size_t max, std::vector<MessageId>& out) {
  out.clear();
  while (!clearToSend_.empty() && out.size() < max) {
    out.push_back(clearToSend_.front());
    clearToSend_.pop_front();
  }
}

void MessageReceiver::onClearToSendLost(const std::vector<MessageId>& ids) {
  for (MessageId id : ids) {
    auto it = active_.find(id);
    // Still waiting for bytes: ask again (extra CTSs are harmless, the sender ignores them).
    if (it != active_.end() && it->second.receivedBytes < it->second.length) {
      clearToSend_.push_back(id);
    }
  }
}

void MessageReceiver::failReceive(const Posted& r, Tag tag, uint64_t bytes,
                                  const std::string& why) {
  Event e;
  e.kind = EventKind::kReceiveFailed;
  e.id = r.id;
  e.tag = tag;
  e.bytes = bytes;
  e.error = why;
  events_.push_back(std::move(e));
}

void MessageReceiver::failAll(const std::string& why) {
  for (const auto& [id, m] : active_) {
    if (m.destination) failReceive(*m.destination, m.tag, m.length, why);
  }
  failPosted(why);
  active_.clear();
  unmatched_.clear();
  clearToSend_.clear();
}

void MessageReceiver::failPosted(const std::string& why) {
  for (const Posted& r : posted_) failReceive(r, r.tag, 0, why);
  posted_.clear();
}

}  // namespace ucxb::udp
