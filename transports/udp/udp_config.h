// Every knob of the UDP transport's core, with defaults, and the parser of its
// "key=value,..." form. An experiment is a config change: loss recovery and congestion control
// are chosen by name here and built from registries (loss_recovery.h, congestion.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "transports/config/schema.h"
#include "transports/udp/udp_types.h"

namespace ucxb::udp {

// Configuration errors are the shared kind (transports/config/key_values.h).
using config::ConfigError;
using config::joinNames;

// The smallest mtu_payload: room for a DATA header and a useful fragment.
constexpr uint64_t kMinMtuPayload = 256;

struct UdpConfig {
  // Largest datagram sent (UDP payload bytes, our header included). 1472 = 1500-byte Ethernet
  // MTU minus IPv4 (20) and UDP (8) headers; 8972 for 9000-byte jumbo frames; up to 65507
  // over loopback.
  size_t mtuPayload = 1472;

  // Retransmission timeout: srtt + 4 rttvar + max ack delay, clamped to [rtoMinUs, rtoMaxUs]
  // and doubled per consecutive expiry. The floor is in microseconds because datacenter RTTs
  // are; 1 ms absorbs the scheduling jitter of a loaded host (lower it on quiet machines).
  DurationUs rtoMinUs = 1000;
  DurationUs rtoMaxUs = 1'000'000;
  DurationUs initialRttUs = 1000;  // the RTT assumed before the first sample
  // A silent peer is declared failed after this many consecutive RTO expiries without any
  // acknowledgement AND at least peerTimeoutUs without hearing anything from it, counted from
  // when the unanswered packets were sent: the count alone (about 1 s of doubling timeouts)
  // misjudged a live peer under heavy loss or when a loaded host starved its progress thread.
  // Silence cannot tell a dead peer from a stopped one (SIGSTOP, a GC pause), so in a group
  // the Endpoint raises peerTimeoutUs to the op timeout (EndpointOptions::opTimeoutUs); a dead
  // peer is found by its closed port instead (Endpoint::handlePortUnreachable).
  uint32_t maxRtoExpiries = 10;
  DurationUs peerTimeoutUs = 5'000'000;
  // While something is expected from the peer (a posted receive, a message half arrived) and
  // nothing is in flight, a PING goes out after this long without hearing from it, so that a
  // peer that died in silence is asked, and its closed port answers. 0 disables.
  DurationUs keepaliveUs = 200'000;
  // Tail-loss probes: with packets in flight and no ACK for srtt + 4 rttvar + max ack delay
  // (doubled per probe), send a PING, up to this many times before the RTO. Its ACK lets the
  // time threshold find a lost last packet in about two RTTs instead of rto_min_us; a probe
  // sent in vain costs one small datagram, where a spurious RTO would resend data. 0: none.
  uint32_t tailProbes = 2;

  // Acknowledge every `ackEvery` packets, or `maxAckDelayUs` after the first unacknowledged
  // one, whichever comes first; out-of-order arrivals are acknowledged at once.
  uint32_t ackEvery = 2;
  DurationUs maxAckDelayUs = 100;

  // Loss detection (RFC 9002 style): a packet is lost once `reorderThreshold` later packets
  // are acknowledged, or 9/8 RTT after a later packet was acknowledged.
  uint32_t reorderThreshold = 3;

  // Most bytes of reliable packets in flight at once, whatever the congestion controller
  // allows. In bytes, not packets, because what it bounds is the queue a burst can build: 1
  // MiB drains in 0.8 ms at 10 Gbit/s. It must also hold many of the largest datagrams: loss
  // detection needs `reorderThreshold` packets sent after a lost one, and a window of few
  // packets idles while it waits for them. 1 MiB is 16 loopback datagrams (65507 bytes) and
  // about 2x what same-host loopback carries per RTT (~4 GB/s x ~100 us); 512 KiB (8 of them)
  // made a message of 512 KiB take two round trips and lost 15-20% of the busbw at 5% drop.
  uint64_t sendWindowBytes = uint64_t{1} << 20;
  // The automatic window's ceiling. Where the peer's address says how large a receive buffer
  // its kernel granted (real sockets: UdpTransport), the window towards it is that buffer's
  // share (sendWindowFor below), never below sendWindowBytes nor above this: a fixed 1 MiB
  // bound a 64 MB all_reduce across the namespace rig to 1 MiB per RTT, 2.4-6 ms on a loaded
  // host (docs/performance.md). 8 MiB is the share of a root rank's 16 MiB buffer with one
  // peer. Without the peer's buffer (the simulator, in-memory pairs) the window stays at
  // sendWindowBytes; at or below sendWindowBytes it is fixed everywhere.
  uint64_t sendWindowMaxBytes = uint64_t{8} << 20;

  // Per-peer budget for messages that arrive before their receive is posted (payload plus
  // kMessageChargeBytes of bookkeeping each). The receiver grants it as credit; a sender out
  // of credit waits (back-pressure), it never overruns the receiver. Both ends must agree.
  uint64_t unexpectedBytes = uint64_t{1} << 20;
  // Messages up to this size are sent eagerly (buffered by the receiver if unexpected);
  // larger ones by rendezvous (RTS, CTS once the receive is posted, then data straight into
  // the posted buffer).
  uint64_t eagerMaxBytes = uint64_t{64} << 10;
  // Longest message accepted, sent or received.
  uint64_t maxMessageBytes = uint64_t{1} << 40;
  // Kernel receive and send buffer the socket asks for (forced as root; otherwise the kernel
  // caps it at net.core.rmem_max / wmem_max). A burst from every peer must fit, or the kernel
  // drops it and the sender waits out a loss timeout.
  uint64_t socketBufferBytes = uint64_t{8} << 20;

  // Time series within an op (trace_recorder.h): this many samples of each kind (connection,
  // bottleneck queue) are kept until the progress thread takes them (at each op's start and
  // end), the oldest overwritten; 0 records nothing and costs nothing. A sample is taken at most every traceIntervalUs per peer (and path),
  // and at every window cut and drop-tail whatever the interval; 0: at every event.
  uint64_t traceSamples = 0;
  DurationUs traceIntervalUs = 100;

  std::string lossRecovery = "selective_repeat";  // see lossRecoveryNames()
  std::string congestion = "none";                // see congestionControlNames()
  uint32_t initialCwndPackets = 32;  // window at start (aimd: its slow-start origin)
  uint32_t minCwndPackets = 2;       // floor after losses and timeouts
  // delay: the queueing delay (RTT sample less min RTT) the window aims at, and how hard it
  // backs off per unit of excess (Swift's beta).
  DurationUs ccTargetDelayUs = 50;
  double ccBeta = 0.8;
  // ecn: weight of the latest window's marked fraction in alpha (DCTCP's g).
  double ccEcnGain = 1.0 / 16;
  // bdp: the bottleneck's rate, which times the min RTT is the cap on bytes in flight.
  // credit: the rate of this rank's downlink, at which it grants credit, unless an emulated
  // bottleneck (faults rate_mbps) in front of it says what its downlink's rate is.
  uint64_t ccLinkMbps = 10'000;
  // credit: what a sender may send before any grant, and again after each burst (the
  // unsolicited window; bytes on the wire, 66 bytes of framing per datagram counted). About
  // one bandwidth-delay product keeps the downlink busy for the round trip the first grant
  // takes; the senders of an incast together must fit the downlink's queue: 32 KiB is 3.6
  // jumbo datagrams, 21 of 1472 bytes (three senders: 64 in a 64-packet queue at most).
  uint64_t ccCreditInitialBytes = uint64_t{32} << 10;
  // credit: a sender with a backlog and no credit asks again after this long without a grant.
  DurationUs ccCreditTimeoutUs = 1000;

  // A DATA datagram that arrives trimmed (a congested switch cut its payload) is answered at
  // once with a NACK, on which the sender resends it: loss news one queue early. 0: the
  // trimmed packet is treated as lost, and found by SACK like any loss.
  uint32_t trimNack = 1;

  // Multipath: the sockets (source ports) each rank opens, one path per pair of them with the
  // same index; each path gets its own fault section (faults.h). Every rank opens the same
  // number. How a connection spreads its packets over them: see path_selector.h.
  uint32_t paths = 1;
  std::string pathPolicy = "spray";  // see pathPolicyNames(); with paths=1 all are the same
};

// Every knob above, declared once: name, range, help (defaults: the initializers above).
const config::Schema<UdpConfig>& udpConfigSchema();
// The keys parseUdpConfig() accepts.
std::vector<std::string> udpConfigKeys();

// Applies "key=value,..." on top of `base`. Throws ConfigError (transports/config/) naming the key,
// the value and what is allowed, for an unknown key, a bad value, or an inconsistent
// combination (see validate()).
UdpConfig parseUdpConfig(std::string_view text, UdpConfig base = {});

// Checks the relations between values (e.g. rto_min_us <= rto_max_us, an eager message fits
// the unexpected budget). Throws ConfigError.
void validate(const UdpConfig& config);

// The send window towards a peer whose kernel granted its socket `peerReceiveBuffer` bytes
// (SO_RCVBUF as getsockopt reports it) and to which `senders` ranks may send at once: half of
// the buffer (the kernel reports twice what was asked for and charges every datagram more
// than its payload) divided among the senders, clamped to [send_window_bytes,
// send_window_max_bytes]. Every sender's window then fits the receiver's buffer together
// with the others', unless the floor does not (the group warns of that). The authenticated
// mode bounds the packets in flight too, in packets (ReplayWindow::kInFlightLimit), not here:
// a bound in bytes holds many more small datagrams than full-size ones.
uint64_t sendWindowFor(const UdpConfig& config, uint64_t peerReceiveBuffer, int senders);

// The configuration as "key=value,..." (parseUdpConfig(describe(c)) == c).
std::string describe(const UdpConfig& config);

}  // namespace ucxb::udp
