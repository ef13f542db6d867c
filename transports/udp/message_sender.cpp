#include "transports/udp/message_sender.h"

#include <algorithm>
#include <stdexcept>

#include "transports/udp/wire_format.h"

namespace ucxb::udp {

MessageSender::MessageSender(const UdpConfig& config, Stats& stats, std::deque<Event>& events)
    : maxFragment_(maxFragmentBytes(config.mtuPayload)),
      eagerMax_(config.eagerMaxBytes),
      maxMessage_(config.maxMessageBytes),
      stats_(stats),
      events_(events),
      // Until the first ACK says otherwise, the receiver's whole budget (both ends share the
      // configuration).
      creditLimit_(config.unexpectedBytes) {}

uint64_t MessageSender::fragmentsOf(uint64_t bytes) const {
  return (bytes + maxFragment_ - 1) / maxFragment_;
}

MessageId MessageSender::send(Tag tag, const void* data, uint64_t length) {
  if (length > maxMessage_) {
    throw std::invalid_argument("udp send: " + std::to_string(length) +
                                " bytes exceed max_message_bytes=" + std::to_string(maxMessage_));
  }
  if (length > 0 && data == nullptr) throw std::invalid_argument("udp send: null buffer");
  const MessageId id = nextId_++;
  Outgoing m;
  m.tag = tag;
  m.data = static_cast<const uint8_t*>(data);
  m.length = length;
  messages_.emplace(id, m);
  waiting_.push_back(id);
  return id;
}

void MessageSender::admit() {
  while (!waiting_.empty()) {
    const MessageId id = waiting_.front();
    Outgoing& m = messages_.at(id);
    const uint64_t room = creditLimit_ > charged_ ? creditLimit_ - charged_ : 0;
    if (m.length <= eagerMax_ && kMessageChargeBytes + m.length <= room) {
      m.rendezvous = false;
      m.fragmentsTotal = std::max<uint64_t>(1, fragmentsOf(m.length));
      charged_ += kMessageChargeBytes + m.length;
      ++stats_.eagerMessagesSent;
    } else if (kMessageChargeBytes <= room) {
      // Too large to buffer, or not enough credit to: announce it and wait for the receiver
      // to post its buffer. A short message takes this path only when the receiver holds a
      // lot of unexpected data, which keeps a posted receive reachable behind it.
      m.rendezvous = true;
      m.fragmentsTotal = 1 + fragmentsOf(m.length);  // the RTS, then the data
      charged_ += kMessageChargeBytes;
      ++stats_.rendezvousMessagesSent;
    } else {
      if (!stalled_) ++stats_.creditStalls;
      stalled_ = true;
      return;
    }
    stalled_ = false;
    waiting_.pop_front();
    ready_.insert(id);
  }
}

std::optional<MessageSender::Fragment> MessageSender::nextFragment() {
  while (!resend_.empty()) {
    PacketContent c = std::move(resend_.front());
    resend_.pop_front();
    auto it = messages_.find(c.messageId);
    if (it == messages_.end()) continue;  // failed meanwhile
    Fragment f;
    f.tag = it->second.tag;
    f.messageLength = it->second.length;
    f.payload = it->second.data + c.offset;
    f.content = std::move(c);
    f.retransmission = true;
    return f;
  }
  admit();
  while (!ready_.empty()) {
    const MessageId id = *ready_.begin();
    Outgoing& m = messages_.at(id);
    Fragment f;
    f.tag = m.tag;
    f.messageLength = m.length;
    f.content.kind = PacketContent::Kind::kData;
    f.content.messageId = id;
    if (m.rendezvous && !m.rtsSent) {
      m.rtsSent = true;
      f.content.flags = data_flags::kRendezvousRequest;
      ready_.erase(id);  // the data waits for the receiver's CTS, which makes it ready again
      return f;
    }
    f.content.offset = m.nextOffset;
    f.content.length = static_cast<uint32_t>(std::min(maxFragment_, m.length - m.nextOffset));
    f.content.flags = m.rendezvous ? data_flags::kRendezvousData : 0;
    f.payload = m.data + m.nextOffset;
    m.nextOffset += f.content.length;
    if (m.nextOffset >= m.length) ready_.erase(id);
    return f;
  }
  return std::nullopt;
}

bool MessageSender::onCreditLimit(uint64_t limit) {
  if (limit <= creditLimit_) return false;
  creditLimit_ = limit;
  stalled_ = false;
  return true;
}

bool MessageSender::ctsPlausible(MessageId id) const {
  if (id >= nextId_) return false;
  const auto it = messages_.find(id);
  if (it == messages_.end()) return true;  // completed: a CTS sent again meanwhile
  return it->second.rendezvous && it->second.rtsSent;
}

void MessageSender::onClearToSend(MessageId id) {
  auto it = messages_.find(id);
  if (it == messages_.end()) return;  // a CTS sent again after the message completed
  Outgoing& m = it->second;
  if (!m.rendezvous || m.clearToSend) return;
  m.clearToSend = true;
  if (m.length > 0 && m.nextOffset < m.length) ready_.insert(id);
}

void MessageSender::onAcked(const PacketContent& content) {
  auto it = messages_.find(content.messageId);
  if (it == messages_.end()) return;
  Outgoing& m = it->second;
  if (++m.fragmentsAcked < m.fragmentsTotal) return;
  Event e;
  e.kind = EventKind::kSendCompleted;
  e.id = content.messageId;
  e.tag = m.tag;
  e.bytes = m.length;
  events_.push_back(std::move(e));
  ++stats_.messagesSent;
  ready_.erase(content.messageId);
  messages_.erase(it);
}

void MessageSender::onLost(PacketContent content) {
  if (messages_.count(content.messageId) == 0) return;
  resend_.push_back(std::move(content));
}

uint64_t MessageSender::backlogWireBytes(uint64_t perDatagramOverhead) const {
  const uint64_t perDatagram = kDataHeaderBytes + perDatagramOverhead;
  const auto wire = [&](uint64_t payload) {
    return payload + std::max<uint64_t>(1, fragmentsOf(payload)) * perDatagram;
  };
  uint64_t total = 0;
  for (const PacketContent& c : resend_) total += c.length + perDatagram;
  for (const MessageId id : ready_) {
    const Outgoing& m = messages_.at(id);
    if (m.rendezvous && !m.rtsSent) {
      total += perDatagram;
    } else {
      total += wire(m.length - m.nextOffset);
    }
  }
  for (const MessageId id : waiting_) {
    const Outgoing& m = messages_.at(id);
    total += m.length <= eagerMax_ ? wire(m.length) : perDatagram;
  }
  return total;
}

bool MessageSender::blockedOnCredit() const {
  if (waiting_.empty() || !resend_.empty() || !ready_.empty()) return false;
  const uint64_t room = creditLimit_ > charged_ ? creditLimit_ - charged_ : 0;
  return room < kMessageChargeBytes;
}

void MessageSender::failAll(const std::string& why) {
  for (const auto& [id, m] : messages_) {
    Event e;
    e.kind = EventKind::kSendFailed;
    e.id = id;
    e.tag = m.tag;
    e.bytes = m.length;
    e.error = why;
    events_.push_back(std::move(e));
  }
  messages_.clear();
  waiting_.clear();
  ready_.clear();
  resend_.clear();
}

}  // namespace ucxb::udp
