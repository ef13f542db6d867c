// The receiving half of the message layer: tag matching, reassembly and the bounded buffer
// for unexpected messages.
//
// Matching follows UCX/MPI semantics: a posted receive takes the earliest message (in the
// sender's order) whose tag matches under the receive's mask, and a message goes to the
// earliest posted receive it matches. Because datagrams arrive in any order, a message is
// matched only once every earlier message of the connection has been seen (any fragment of
// it arrived), so a retransmitted message can never be overtaken by a later one with the
// same tag.
//
// Reassembly writes each fragment straight into the posted buffer at its offset, never past
// the posted capacity, and never twice (a per-message set of received byte ranges drops
// duplicates). A message that arrives before its receive is posted is buffered (eager) or
// just remembered (rendezvous: its data is only requested, by CTS, once the receive is
// posted), within `unexpected_bytes`: see message_sender.h for the credit that guarantees the
// sender never exceeds it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "transports/udp/range_set.h"
#include "transports/udp/stats.h"
#include "transports/udp/udp_config.h"
#include "transports/udp/wire_format.h"

namespace ucxb::udp {

// Where a posted receive's bytes go when they are not stored in its buffer (the socket loop
// folds them into a reduction's accumulator: Transport::recvFolded). Each byte of the message
// up to the posted capacity is handed over exactly once (duplicates never reach it), in
// pieces, in any order.
class ReceiveSink {
 public:
  virtual ~ReceiveSink() = default;
  virtual void write(uint64_t offset, const uint8_t* bytes, size_t length) = 0;
};

class MessageReceiver {
 public:
  MessageReceiver(const UdpConfig& config, Stats& stats, std::deque<Event>& events);

  // Posts a buffer for the next message whose tag equals `tag` on the bits set in `mask`.
  // The buffer must stay valid until the receive's event (received, failed or cancelled).
  // With `sink`, the bytes go to it instead of `buffer` (which may then be null); the sink
  // must stay valid as the buffer would.
  ReceiveId postReceive(Tag tag, Tag mask, uint8_t* buffer, uint64_t capacity, TimeUs now,
                        ReceiveSink* sink = nullptr);
  // Stops a receive that no message has matched yet: it gets a kReceiveCancelled event and its
  // buffer is never written. False if the receive already completed, is unknown, or has begun
  // to take a message (it cannot be withdrawn then: see the definition).
  bool cancelReceive(ReceiveId id);
  // Whether a receive posted now with (tag, mask) would match a message that already arrived
  // (any-source receives use it to pick the peer to post on).
  bool hasMatchable(Tag tag, Tag mask) const;
  // Something is expected from the peer: a posted receive, or a message partly arrived.
  bool expecting() const { return !posted_.empty() || !active_.empty(); }

  enum class Verdict {
    kAccepted,   // new bytes (or a new message) taken
    kCompleted,  // new bytes that complete the message: its sender finishes on their ACK
    kDuplicate,  // nothing new: acknowledged, otherwise ignored
    kViolation,  // impossible from an honest peer: dropped, not acknowledged
  };
  Verdict onData(const DataHeader& header, std::span<const uint8_t> payload, TimeUs now);

  // Credit granted to the peer (cumulative; see message_sender.h).
  uint64_t creditLimit() const { return released_ + capacity_; }
  // True when the peer may be running short of credit and more has been released since the
  // last advertisement: worth an ACK right away rather than with the next regular one.
  bool creditUpdateUrgent() const;
  void noteCreditAdvertised(uint64_t limit) { advertised_ = std::max(advertised_, limit); }

  bool hasClearToSend() const { return !clearToSend_.empty(); }
  // Moves up to `max` message ids due a CTS into `out`.
  void takeClearToSend(size_t max, std::vector<MessageId>& out);
  // A CTS packet was lost: send again those ids still waiting for data.
  void onClearToSendLost(const std::vector<MessageId>& ids);

  uint64_t unexpectedBytesInUse() const { return used_; }
  size_t postedCount() const { return posted_.size(); }
  size_t activeMessages() const { return active_.size(); }
  // Some message still has bytes on their way from the peer: an eager one partly arrived, or
  // a rendezvous one whose data we asked for (matched, or its receive cancelled). A message
  // that only waits for a receive (whole and eager, or rendezvous with its data not asked
  // for) is not: nothing more comes from the peer until a receive matches it, and it may
  // never (what a closing endpoint's linger needs to know, see PeerConnection::idle).
  bool receiving() const;

  // Fails every posted or partly filled receive (kReceiveFailed events).
  void failAll(const std::string& why);
  // Fails the receives that no message has matched (kReceiveFailed events), leaving those
  // that have begun to take one: what a peer that closed will never send them.
  void failPosted(const std::string& why);

 private:
  struct Posted {
    ReceiveId id = 0;
    Tag tag = 0;
    Tag mask = 0;
    uint8_t* buffer = nullptr;
    uint64_t capacity = 0;
    ReceiveSink* sink = nullptr;  // instead of buffer, where set
  };
  struct Incoming {
    Tag tag = 0;
    uint64_t length = 0;
    bool rendezvous = false;
    bool requestSeen = false;        // rendezvous: the RTS arrived
    bool emptyFragmentSeen = false;  // eager 0-byte message: its one fragment arrived
    RangeSet received;               // byte ranges that arrived
    uint64_t receivedBytes = 0;
    std::optional<Posted> destination;
    std::vector<uint8_t> unexpected;  // eager and not yet matched: the bytes so far
    uint64_t chargeHeld = 0;         // what it still holds of the unexpected budget
  };

  static bool tagMatches(Tag messageTag, const Posted& r) {
    return (messageTag & r.mask) == (r.tag & r.mask);
  }
  // Matches the messages that just became matchable (all earlier ones seen), in order.
  void matchNewlyOrdered(TimeUs now);
  // Binds message `id` to receive `r`: moves buffered bytes over, asks for rendezvous data.
  void attach(MessageId id, Incoming& m, const Posted& r, TimeUs now);
  void writeBytes(Incoming& m, uint64_t begin, uint64_t end, const uint8_t* src);
  // Hands [begin, end) of a matched message to its receive (its buffer or its sink), never
  // past the posted capacity.
  static void deliverBytes(const Posted& r, uint64_t begin, uint64_t end, const uint8_t* src);
  // Delivers and forgets the message if it is complete (may erase it from active_).
  void finishIfComplete(MessageId id, TimeUs now);
  void release(Incoming& m, uint64_t bytes);
  void failReceive(const Posted& r, Tag tag, uint64_t bytes, const std::string& why);

  const uint64_t capacity_;
  const uint64_t eagerMax_;
  const uint64_t maxMessage_;
  Stats& stats_;
  std::deque<Event>& events_;

  ReceiveId nextReceiveId_ = 0;
  std::deque<Posted> posted_;             // unmatched receives, in post order
  std::map<MessageId, Incoming> active_;  // seen and not finished
  std::set<MessageId> unmatched_;         // active, no destination
  RangeSet seen_;                         // message ids with at least one fragment arrived
  RangeSet finished_;                     // message ids delivered or discarded
  MessageId orderedUpTo_ = 0;             // every id below has been seen
  std::deque<MessageId> clearToSend_;

  uint64_t used_ = 0;      // unexpected budget in use
  uint64_t released_ = 0;  // cumulative budget returned
  uint64_t advertised_ = 0;
  std::vector<RangeSet::Range> newParts_;  // scratch
};

}  // namespace ucxb::udp
