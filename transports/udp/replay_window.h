// ReplayWindow: which datagram counters of one direction have already been accepted, as a
// sliding bitmap over the newest kBits counters (IPsec's anti-replay window, RFC 4303 3.4.3;
// QUIC keeps the same kind of record per packet number space). A counter seen before, or older
// than the window, is refused: a replayed datagram is dropped even when its authentication tag
// is valid. Only counters whose datagram authenticated are recorded (mark() after the tag
// checked), so a forger cannot slide the window and make genuine datagrams look old.
//
// A genuine datagram older than the window (reordered by more than kBits datagrams) is dropped
// too; the reliability layer above resends its content under a new counter.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace ucxb::udp {

class ReplayWindow {
 public:
  // 4096 counters: 512 bytes per peer, more than any reordering the transport tolerates
  // (reorder_threshold packets) and than a socket buffer of 64 KB datagrams holds.
  static constexpr uint64_t kBits = 4096;
  // The most reliable packets an authenticated connection keeps in flight to one peer
  // (PeerConnection::limitPacketsInFlight), whatever their size: what can overtake a genuine
  // datagram on the way is what is sent after it meanwhile, counted in datagrams, so the
  // window's limit is one in packets. Half the window: the other half covers the datagrams
  // sealed beside them (an ACK per packet of the peer's at most, a CREDIT, a NACK, a CLOSE)
  // and the later packets acknowledged before loss detection gives up on the late one (its
  // content then goes again under a new counter, and dropping the original costs nothing).
  // A byte bound (send window / mtu_payload) counted only full-size datagrams: small
  // messages made many more of them, and a genuine datagram could be taken for a replay.
  static constexpr uint64_t kInFlightLimit = kBits / 2;

  // Whether a datagram with `counter` may be accepted: newer than every one seen, or within
  // the window and not seen.
  bool fresh(uint64_t counter) const;
  // Records `counter` as accepted (call only after fresh(counter) and authentication).
  void mark(uint64_t counter);

  uint64_t highest() const { return highest_; }

 private:
  bool test(uint64_t counter) const { return bits_[word(counter)] >> (counter % 64) & 1u; }
  static size_t word(uint64_t counter) { return static_cast<size_t>(counter / 64 % kWords); }

  static constexpr size_t kWords = kBits / 64;
  std::array<uint64_t, kWords> bits_{};
  uint64_t highest_ = 0;
  bool any_ = false;
};

}  // namespace ucxb::udp
