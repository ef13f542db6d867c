#include "transports/udp/udp_types.h"

namespace ucxb::udp {

const char* eventKindName(EventKind kind) {
  switch (kind) {
    case EventKind::kMessageReceived: return "message_received";
    case EventKind::kSendCompleted: return "send_completed";
    case EventKind::kSendFailed: return "send_failed";
    case EventKind::kReceiveFailed: return "receive_failed";
    case EventKind::kReceiveCancelled: return "receive_cancelled";
    case EventKind::kPeerFailed: return "peer_failed";
  }
  return "unknown";
}

}  // namespace ucxb::udp
