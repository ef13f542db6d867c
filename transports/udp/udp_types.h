// Vocabulary shared by every part of the UDP transport's core: time, identifiers and the
// events the core reports. Torch-free, UCX-free, socket-free.
#pragma once

#include <cstdint>
#include <string>

namespace ucxb::udp {

// Time is always passed in by the caller (the socket loop's monotonic clock, or the
// simulator's virtual clock); the core never reads a clock itself, so the same inputs always
// produce the same outputs.
using TimeUs = uint64_t;      // a point in time, microseconds
using DurationUs = uint64_t;  // a span of time, microseconds

using Tag = uint64_t;  // the same 64-bit tags as ucxb::Tag (transports/tag.h)
using PacketNumber = uint64_t;
using MessageId = uint64_t;  // per direction, assigned 0, 1, 2, ... in send() order
using ReceiveId = uint64_t;  // per connection, assigned 0, 1, 2, ... in postReceive() order

enum class EventKind : uint8_t {
  kMessageReceived,   // a posted receive holds the whole message (or its first `capacity` bytes)
  kSendCompleted,     // the peer has every byte: the send buffer may be reused
  kSendFailed,        // the connection failed before the peer had every byte
  kReceiveFailed,     // the connection failed before the message arrived
  kReceiveCancelled,  // cancelReceive() took effect: the core no longer touches the buffer
  kPeerFailed,        // the connection gave up on the peer (reported once, before the above)
};

const char* eventKindName(EventKind kind);

struct Event {
  EventKind kind = EventKind::kPeerFailed;
  uint64_t id = 0;         // MessageId for sends, ReceiveId for receives
  Tag tag = 0;             // the message's tag as sent (receives: the sender's full tag)
  uint64_t bytes = 0;      // the message's length
  bool truncated = false;  // received: the message was longer than the posted capacity
  std::string error;       // failures: why
};

}  // namespace ucxb::udp
