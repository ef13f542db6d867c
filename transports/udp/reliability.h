// PeerConnection: the reliability core for one peer, as a sans-IO state machine. Datagrams
// and the time go in; datagrams to send, the next timer and events come out. It never reads a
// clock, touches a socket or spawns a thread, so it runs identically under a socket loop and
// in the deterministic simulator (tests/udp_sim/).
//
// Driving it (one thread, like every Transport):
//   - hand every datagram from the peer to onDatagram(bytes, now);
//   - when nextTimeout() has passed, call onTimeout(now);
//   - after either, and after send()/postReceive()/cancelReceive(), call pollTransmit(now, buf)
//     until it returns 0, sending each datagram it writes;
//   - drain pollEvent().
//
// Inside: the message layer (message_sender.h, message_receiver.h) over a reliable packet
// layer: numbered packets (sent_packets.h), SACK-style ACKs (ack_tracker.h), RTT and RTO
// (rtt.h), loss detection by reordering threshold, by time and by timeout, a pluggable
// loss-recovery policy (loss_recovery.h) and congestion controller (congestion.h), and a
// credit window over the receiver's unexpected-message budget.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "transports/udp/ack_tracker.h"
#include "transports/udp/congestion.h"
#include "transports/udp/congestion_coupled.h"
#include "transports/udp/credit_scheduler.h"
#include "transports/udp/loss_recovery.h"
#include "transports/udp/message_receiver.h"
#include "transports/udp/message_sender.h"
#include "transports/udp/path_selector.h"
#include "transports/udp/rtt.h"
#include "transports/udp/sent_packets.h"
#include "transports/udp/stats.h"
#include "transports/udp/udp_config.h"
#include "transports/udp/wire_format.h"

namespace ucxb::udp {

// congestion=credit's state on one connection, both roles (trace_recorder.h samples it).
// Sending: the peer's cumulative grant, what we spent of it (forfeited credit included) and
// our cumulative demand as last reported, all 0 unless our policy is credit. Receiving: the
// rank's scheduler's cumulative grant to the peer and the demand the peer reported.
struct CreditView {
  uint64_t granted = 0;
  uint64_t spent = 0;
  uint64_t wanted = 0;
  uint64_t grantToPeer = 0;
  uint64_t peerWanted = 0;
};

struct PeerIdentity {
  uint16_t localRank = 0;
  uint16_t peerRank = 0;
  // Shared by every connection of one group instance (agreed at set-up, e.g. through the
  // Store): datagrams carrying another token are dropped.
  uint64_t sessionToken = 0;
};

class PeerConnection {
 public:
  // `credits`: the rank's CreditScheduler (congestion=credit's receiving side), which its
  // connections share because they share its downlink; it must outlive the connection.
  // Null: the connection grants credit from a scheduler of its own, as if it had the
  // downlink to itself.
  PeerConnection(const UdpConfig& config, const PeerIdentity& identity,
                 CreditScheduler* credits = nullptr);
  PeerConnection(const PeerConnection&) = delete;
  PeerConnection& operator=(const PeerConnection&) = delete;

  // Queues a message. `data` must stay valid until the kSendCompleted (or kSendFailed) event
  // with the returned id. Throws std::invalid_argument beyond max_message_bytes.
  MessageId send(Tag tag, const void* data, size_t length);
  // Posts a receive for the next message with (tag & mask) == (its tag & mask); the buffer
  // must stay valid until its kMessageReceived, kReceiveFailed or kReceiveCancelled event.
  // Throws std::invalid_argument for a null buffer with a non-zero capacity. With `sink`, the
  // bytes go to it instead of the buffer (MessageReceiver::postReceive).
  ReceiveId postReceive(Tag tag, Tag mask, void* buffer, size_t capacity,
                        ReceiveSink* sink = nullptr);
  // See MessageReceiver::cancelReceive. The kReceiveCancelled event comes from pollEvent().
  bool cancelReceive(ReceiveId id);
  // Whether postReceive(tag, mask, ...) would match a message that has already arrived.
  bool hasMatchable(Tag tag, Tag mask) const { return receiver_.hasMatchable(tag, mask); }

  // Sends our ACK again at the next pollTransmit, if anything was ever received. A closing
  // transport repeats its last ACK this way, so that a peer whose copy was lost is not left
  // waiting for a retransmission timeout we may no longer be around to answer.
  void acknowledgeAgain() {
    if (acks_.anyReceived()) acks_.ackSoon();
  }
  // Closing (Endpoint::close): sends a CLOSE at the next pollTransmit at which sendSettled()
  // holds, telling the peer that we need nothing more from it. A closing endpoint calls this
  // with every ACK repeat, so that a CLOSE lost on the way is sent again.
  void announceClose() {
    if (!failed_) closeDue_ = true;
  }
  // Nothing we sent the peer is unacknowledged (a PING aside: it carries nothing), and nothing
  // is left to send it: the peer has everything from us, and we wait for nothing from it but
  // what it chooses to send.
  bool sendSettled() const;
  // The peer has closed and everything it sent us has been acknowledged to it (its CLOSE):
  // it will send nothing new and needs nothing more from us, not even an ACK. The receives
  // that no message has taken fail then, and so does one posted later that none takes.
  bool peerClosed() const { return peerClosed_; }
  // We have sent the peer a CLOSE (at least once).
  bool closeSent() const { return stats_.closePacketsSent > 0; }
  // Sends a PING at the next pollTransmit, which a live peer acknowledges at once: how an
  // authenticated endpoint checks an (unauthenticated) ICMP port unreachable against the peer.
  void pingSoon() {
    if (!failed_) keepaliveDue_ = true;
  }
  // Whether an any-source receive that this peer could satisfy is pending at the Endpoint:
  // the keepalive then runs as if a receive were posted here, so that a peer that died
  // quietly is found as soon as for a receive from it (Endpoint::watchAnySource).
  void setAnySourcePending(bool pending) { anySourcePending_ = pending; }

  // One datagram from the peer, which came over `path` (its receive time goes into our ACKs'
  // timestamps). Anything malformed, forged or stale is counted and dropped.
  void onDatagram(std::span<const uint8_t> datagram, TimeUs now, uint32_t path = 0);
  // Writes the next datagram to send into `out` (at least mtu_payload bytes) and returns its
  // length, or 0 if nothing may be sent now.
  size_t pollTransmit(TimeUs now, std::span<uint8_t> out);
  // The path (0 .. paths-1) the datagram last written by pollTransmit must take.
  uint32_t transmitPath() const { return transmitPath_; }
  const PathSelector& pathSelector() const { return paths_; }
  // When onTimeout() must next be called (possibly already past), or nullopt for never.
  std::optional<TimeUs> nextTimeout() const;
  void onTimeout(TimeUs now);
  std::optional<Event> pollEvent();

  // Gives up on the peer: kPeerFailed, then every pending send and receive fails.
  void fail(const std::string& why);
  bool failed() const { return failed_; }
  const std::string& failure() const { return failure_; }

  Stats stats() const;
  const UdpConfig& config() const { return config_; }
  const PeerIdentity& identity() const { return identity_; }
  size_t packetsInFlight() const { return sent_.inFlightCount(); }
  uint64_t bytesInFlight() const { return sent_.inFlightBytes(); }
  uint64_t pathPacketsInFlight(uint32_t path) const { return sent_.pathInFlightCount(path); }
  uint64_t pathBytesInFlight(uint32_t path) const { return sent_.pathInFlightBytes(path); }
  uint64_t congestionWindow() const { return congestion_->windowPackets(); }
  // The most bytes in flight to the peer: send_window_bytes until the Endpoint learns the
  // peer's receive buffer and sizes it from that (sendWindowFor, udp_config.h).
  uint64_t sendWindowBytes() const { return sendWindowBytes_; }
  void setSendWindowBytes(uint64_t bytes) {
    sendWindowBytes_ = std::max<uint64_t>(bytes, config_.mtuPayload);
  }
  // The most reliable packets in flight at once, whatever the windows in bytes allow: the
  // authenticated mode keeps them within its replay window (ReplayWindow::kInFlightLimit).
  void limitPacketsInFlight(uint64_t packets) { packetLimit_ = std::max<uint64_t>(packets, 1); }
  uint64_t packetLimit() const { return packetLimit_; }
  CreditView creditView() const;  // reliability_credit.cpp
  uint64_t unexpectedBytesInUse() const { return receiver_.unexpectedBytesInUse(); }
  // Nothing left to send or to wait for from the peer: what a closing endpoint's linger waits
  // for (tests use it to detect quiescence too). A PING in flight does not count: it carries
  // nothing, and once the peer has gone each timeout sends the next. Nor does a message that
  // arrived whole but that no receive has matched: its ACK was sent (an ACK still due
  // counts), and no receive may ever take it, so waiting for one would keep a closing group
  // for linger_max.
  bool idle() const;

 private:
  PacketHeader header() const;
  void drop(DropReason reason);
  bool onAck(const AckFrame& ack, TimeUs now);
  // The peer saw these DATA trimmed: false (a protocol violation) for a number never sent.
  bool onNack(const NackFrame& nack, TimeUs now);
  // go-back-N's receive window of one: false if this DATA must be discarded.
  bool acceptInOrder(PacketNumber pn, uint8_t flags);
  void detectAndRecover(TimeUs now);
  // What declared packets lost: which congestion signal it is.
  enum class LossCause { kDetected, kTimeout, kNacked };
  // Hands lost content back to whoever produced it. kTimeout: the RTO already told the
  // congestion controller.
  void recover(std::vector<SentPacket>& lost, TimeUs now, LossCause cause);
  DurationUs lossDelay() const;
  // The longest a packet may wait in a path's queue (by the peer's receive timestamps) before
  // the path's window is cut for it, with windows per path: the least RTT, the queue a halved
  // window needs to keep its link busy, and at least kQueueLimitPackets full datagrams' drain.
  DurationUs queueLimitUs(uint32_t path) const;
  // 16: with 8, `multipath_rate_limited` made 1.42x and 1.43x round-robin at 4 and 16 MiB on
  // the mean of three seeds, against 16's 1.47x and 1.52x (udp-protocol.md has the figures).
  static constexpr double kQueueLimitPackets = 16;
  // The path's bandwidth-delay product in full datagrams: the least RTT over the time the
  // path drains one (0 until the drain time is measured). A cut for a standing queue stops
  // there.
  double bdpPackets(uint32_t path) const;
  DurationUs currentRto() const;
  std::optional<TimeUs> rtoDeadline() const;
  std::optional<TimeUs> probeDeadline() const;
  std::optional<TimeUs> tailProbeDeadline() const;
  std::optional<TimeUs> keepaliveDeadline() const;
  // Whether the send window or the congestion window keeps a new reliable packet back.
  bool windowFull() const;
  // Why a receive fails once the peer has closed (peerClosed()).
  std::string peerClosedReceive() const;
  // The paths (a PathSelector mask) whose congestion window has room: every path unless the
  // policy keeps a window per path.
  uint32_t pathsWithRoom() const;
  size_t sendAck(TimeUs now, std::span<uint8_t> out);
  size_t sendNack(std::span<uint8_t> out);
  // congestion=credit (reliability_credit.cpp): a CREDIT from the peer; writes a CREDIT to
  // it when a grant or a request is due (0 otherwise); when that is next; whether credit
  // holds DATA back, and what a DATA datagram sent spends of it.
  void onCredit(const CreditFrame& credit, TimeUs now);
  size_t pollCredit(TimeUs now, std::span<uint8_t> out);
  std::optional<TimeUs> creditDeadline() const;
  bool creditBlocksData() const;
  bool grantDue() const;  // the peer's grant grew enough to be sent
  // Whether a credit timeout may fire: the peer was heard from since our last request or
  // grant, within the last cc_credit_timeout_us (a silent one is not running, or is gone:
  // a PING, or the RTO of what is in flight, finds out which).
  bool creditMayTimeOut() const;
  void creditOtherArrival(size_t datagramBytes);  // a non-DATA datagram used the downlink
  void spendCredit(size_t datagramBytes);
  size_t recordAndCount(TimeUs now, PacketContent content, size_t bytes, bool retransmission,
                        bool ackedAtOnce);
  // An unreliable control datagram (ACK, NACK, CREDIT) of `bytes` written: the path it goes
  // on and the datagram counts. Returns `bytes`.
  size_t controlSent(size_t bytes);

  const UdpConfig config_;
  const PeerIdentity identity_;
  Stats stats_;
  std::deque<Event> events_;
  MessageSender sender_;
  MessageReceiver receiver_;
  AckTracker acks_;
  SentPackets sent_;
  RttEstimator rtt_;
  std::unique_ptr<CongestionControl> congestion_;
  std::unique_ptr<LossRecovery> lossRecovery_;
  PathSelector paths_;
  uint32_t transmitPath_ = 0;
  uint64_t sendWindowBytes_;

  uint32_t rtoBackoff_ = 0;        // the RTO is doubled this many times
  uint32_t consecutiveRtos_ = 0;   // expiries since anything was last acknowledged
  // When the run of expiries counted by consecutiveRtos_ began waiting: the later of the
  // oldest packet in flight and the last ACK that acknowledged something new. Silence is
  // measured from here (or from the last datagram heard, if later), not from the last ACK
  // progress: after an idle hour, that alone would have failed a peer on its first timeouts.
  TimeUs rtoRunStart_ = 0;
  // A run of timeouts whose verdict is open (F-RTO, RFC 5682, judged with SACK): each expiry
  // resends only the oldest packet in flight, and the first ACK that acknowledges anything
  // tells a peer that was merely slow (a descheduled process: it acknowledges packets sent
  // before the first expiry, numbered below rtoBoundary_) from real loss (it acknowledges
  // only what the timeouts sent). Only then does the rest of the window count as lost
  // (everything sent at or before rtoCutoff_, what the last expiry would have expired) and
  // the congestion controller hear of the timeout.
  bool rtoVerdictPending_ = false;
  PacketNumber rtoBoundary_ = 0;
  TimeUs rtoCutoff_ = 0;
  // The last expiry: the next one waits a whole (doubled) RTO from it, though the packets
  // still in flight are older than that.
  TimeUs lastRtoAt_ = 0;
  // Settles the open verdict on an ACK frame that acknowledged something (onAck).
  void judgeTimeouts(TimeUs now);
  uint32_t probeBackoff_ = 0;      // zero-window probes sent without the credit growing
  bool probeDue_ = false;
  bool keepaliveDue_ = false;
  uint64_t packetLimit_ = UINT64_MAX;  // limitPacketsInFlight
  bool closeDue_ = false;    // announceClose(): a CLOSE waits for sendSettled()
  bool peerClosed_ = false;  // a CLOSE came from the peer
  bool anySourcePending_ = false;  // setAnySourcePending
  bool timeoutProbeDue_ = false;   // a PING to go out (timeout or tail-loss probe)
  uint32_t tailProbesSent_ = 0;    // since anything was last acknowledged
  TimeUs lastReliableSent_ = 0;
  // The last reliable packet sent is one the peer acknowledges at once (a PING, or the
  // packet that completes a message): a probe for it need not wait out the ACK delay.
  bool lastSentAckedAtOnce_ = false;
  TimeUs lastHeard_ = 0;           // last datagram accepted from the peer
  TimeUs lastActivity_ = 0;        // last reliable packet sent or ACK received
  TimeUs lastAckProgress_ = 0;     // last ACK that acknowledged something new
  TimeUs lastNow_ = 0;             // latest time seen (for calls that carry none)
  bool failed_ = false;
  std::string failure_;
  // In-order-only DATA (go-back-N). Sending: the next DATA packet is marked kRestart (the
  // first one, and the first after every loss). Receiving: where the current in-order run
  // started, or the next number it needed when last looked up (acceptInOrder).
  bool restartPending_ = true;
  PacketNumber inOrderNext_ = 0;

  // ECN echo: DATA received marked (sent back in every ACK), and the peer's echo of ours as
  // last seen (both modulo 2^16 on the wire).
  uint64_t ceReceived_ = 0;
  uint16_t ceEchoSeen_ = 0;
  // congestion=credit. Receiving: the rank's scheduler (or our own), our slot in it, the
  // grant last sent and whether the peer asked for it. Sending: the policy's credit side
  // (null for the window-based policies), and whether the backlog must be recounted.
  std::unique_ptr<CreditScheduler> ownCredits_;
  CreditScheduler* creditScheduler_ = nullptr;
  size_t creditSlot_ = 0;
  uint64_t grantSent_ = 0;
  bool creditAnswerDue_ = false;
  CreditCongestionControl* credit_ = nullptr;
  // The congestion policy's per-path windows (congestion_coupled.h), or null: one window.
  CoupledAimdCongestionControl* pathWindows_ = nullptr;
  // Its cuts per path, counted for stats() (PathStats: loss_cuts, queue_cuts, queue_at_bdp).
  struct PathCuts {
    uint64_t loss = 0, queue = 0, queueAtBdp = 0;
  };
  std::array<PathCuts, kMaxPaths> pathCuts_{};
  bool backlogChanged_ = true;

  // Trimmed DATA received and not yet NACKed.
  std::vector<PacketNumber> pendingNacks_;

  // Scratch, kept to avoid allocating per datagram.
  DecodedPacket decoded_;
  SentPackets::AckResult ackResult_;
  AckFrame ackFrame_;
  std::vector<SentPacket> lost_;
  std::vector<PacketNumber> lostNumbers_, inFlightNumbers_, alsoResend_;
  std::vector<MessageId> ctsIds_;
};

}  // namespace ucxb::udp
