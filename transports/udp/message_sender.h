// The sending half of the message layer: cuts messages into fragments of at most one
// datagram, chooses eager or rendezvous per message, respects the receiver's credit
// (back-pressure for unexpected messages), sends lost content again first, and reports each
// message complete once every fragment is acknowledged.
//
// Credit: the receiver grants a cumulative limit on what the sender may have "charged"
// against its unexpected-message budget (like QUIC's MAX_DATA). Starting a message charges
// kMessageChargeBytes, plus its length if sent eagerly, because the receiver may have to
// buffer it. The receiver returns the charge as the message is matched and finished, and
// raises the limit in its ACKs. A sender out of credit waits: the receiver never has to drop
// data for lack of room.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "transports/udp/sent_packets.h"
#include "transports/udp/stats.h"
#include "transports/udp/udp_config.h"

namespace ucxb::udp {

class MessageSender {
 public:
  MessageSender(const UdpConfig& config, Stats& stats, std::deque<Event>& events);

  // Queues a message; `data` must stay valid until its kSendCompleted or kSendFailed event.
  // Throws std::invalid_argument beyond max_message_bytes.
  MessageId send(Tag tag, const void* data, uint64_t length);

  // A fragment ready to go into a DATA packet.
  struct Fragment {
    PacketContent content;  // kData
    Tag tag = 0;
    uint64_t messageLength = 0;
    const uint8_t* payload = nullptr;  // content.length bytes
    bool retransmission = false;
  };
  // The next fragment to send: lost content first, then new data in message order.
  std::optional<Fragment> nextFragment();

  // The receiver's cumulative credit limit, from an ACK (only ever raises it). Returns true
  // if it grew.
  bool onCreditLimit(uint64_t limit);
  // False for a CTS no honest receiver sends (a protocol violation): one naming a message
  // never sent, an eager one, or a rendezvous one whose RTS has not gone out (the receiver
  // learns of it from the RTS; taking such a CTS as its clearance made the real one look like
  // a repeat, and the message's data never went). Duplicates, and CTSs for a message that is
  // over, are fine.
  bool ctsPlausible(MessageId id) const;
  void onClearToSend(MessageId id);
  void onAcked(const PacketContent& content);
  void onLost(PacketContent content);

  // True when messages wait for credit and nothing else could be sent: the connection then
  // probes the receiver so that a lost credit update cannot stall it forever.
  bool blockedOnCredit() const;
  bool idle() const { return messages_.empty(); }
  // What could be sent now or as soon as the flow-control credit allows, in bytes on the
  // wire (each datagram's header and `perDatagramOverhead` counted): lost content, the rest
  // of admitted and waiting messages (of a rendezvous one its RTS, and its data once the
  // receiver cleared it). What congestion=credit asks the receiver for.
  uint64_t backlogWireBytes(uint64_t perDatagramOverhead) const;
  // Fails every message not yet complete (kSendFailed events).
  void failAll(const std::string& why);

 private:
  struct Outgoing {
    Tag tag = 0;
    const uint8_t* data = nullptr;
    uint64_t length = 0;
    bool rendezvous = false;
    bool rtsSent = false;
    bool clearToSend = false;  // rendezvous: the receiver posted its buffer
    uint64_t nextOffset = 0;   // first byte never sent
    uint64_t fragmentsTotal = 0;
    uint64_t fragmentsAcked = 0;
  };

  // Starts waiting messages, in order, while the credit allows.
  void admit();
  uint64_t fragmentsOf(uint64_t bytes) const;

  const uint64_t maxFragment_;
  const uint64_t eagerMax_;
  const uint64_t maxMessage_;
  Stats& stats_;
  std::deque<Event>& events_;

  MessageId nextId_ = 0;
  std::map<MessageId, Outgoing> messages_;  // not yet complete
  std::deque<MessageId> waiting_;           // not yet admitted under credit, in send() order
  std::set<MessageId> ready_;               // admitted, with a fragment (or RTS) never sent
  std::deque<PacketContent> resend_;        // lost content, oldest first
  uint64_t creditLimit_;
  uint64_t charged_ = 0;
  bool stalled_ = false;  // the head of waiting_ is known not to fit (counted once)
};

}  // namespace ucxb::udp
