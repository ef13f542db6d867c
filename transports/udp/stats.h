// Counters of one connection (one peer, both directions). Plain numbers, cheap to copy: the
// future Transport will expose them to Python; the simulator and tests read them directly.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "transports/udp/udp_types.h"

namespace ucxb::udp {

// Why an incoming datagram was dropped. Every datagram handed to a connection is either
// accepted or counted under exactly one of these (the last two are counted by the Endpoint,
// which authenticates a datagram before its connection sees it).
enum class DropReason : uint8_t {
  kTruncated,     // decoder: shorter than its header or its declared lengths
  kBadVersion,    // decoder: unknown wire version
  kBadType,       // decoder: unknown packet type
  kBadChecksum,   // decoder: CRC32C mismatch (corruption becomes loss)
  kMalformed,     // decoder: impossible lengths, offsets, counts, ranges, reserved bits
  kBadToken,      // not this session's token (stale group instance, stray sender)
  kWrongPeer,     // source rank is not this connection's peer
  kProtocol,      // well-formed but impossible here: ACK of a packet never sent, fragment
                  // disagreeing with its message, credit overrun, CTS for an unknown message
  kStale,         // packet number older than the receive history kept
  kAfterGap,      // go-back-N (the sender's kInOrder flag): DATA that follows a packet not yet
                  // received is discarded, and the sender will send it again
  kClosed,        // the connection has failed
  kAuthFailed,    // authenticated mode: the datagram does not verify under the peer's key
                  // (forged, altered, another group's or instance's, no trailer)
  kReplayed,      // authenticated mode: genuine, but its counter was accepted before (or is
                  // older than the replay window)
  kCount,
};

const char* dropReasonName(DropReason reason);

// Counters of one path of one connection (what `stats` shows per path).
struct PathStats {
  uint64_t packetsSent = 0;    // reliable packets (DATA, CTS, PING)
  uint64_t retransmitted = 0;  // of those, DATA whose content had been sent before
  uint64_t acked = 0;
  uint64_t lost = 0;           // declared lost (any cause)
  DurationUs rttSmoothedUs = 0;  // from every acked packet (ACK delay included)
  uint64_t weightPermille = 1000;  // adaptive: the path's share weight, 1000 = full
  // adaptive under aimd (a window per path, congestion_coupled.h): the path's window now, how
  // often it was halved for losses and for a standing queue (the peer's receive timestamps,
  // one_way_delay.h), and how often a queue was seen with the window already at the path's
  // bandwidth-delay product, where no cut for a queue takes it (reliability.cpp).
  uint64_t windowPackets = 0;
  uint64_t lossCuts = 0;
  uint64_t queueCuts = 0;
  uint64_t queueAtBdp = 0;
};

struct Stats {
  // Datagrams, all kinds, as handed to / taken from the socket (UDP payload bytes).
  uint64_t datagramsSent = 0;
  uint64_t bytesSent = 0;
  uint64_t datagramsReceived = 0;
  uint64_t bytesReceived = 0;
  uint64_t datagramsAccepted = 0;
  uint64_t datagramsDropped = 0;  // sum of droppedBy
  std::array<uint64_t, static_cast<size_t>(DropReason::kCount)> droppedBy{};

  // Sending side.
  uint64_t dataPacketsSent = 0;     // DATA packets, retransmissions included
  uint64_t ctsPacketsSent = 0;
  uint64_t pingPacketsSent = 0;
  uint64_t closePacketsSent = 0;      // CLOSE, while the group closes (wire_format.h)
  uint64_t closePacketsReceived = 0;
  uint64_t ackPacketsSent = 0;
  uint64_t retransmittedPackets = 0;  // reliable packets whose content had been sent before
  uint64_t retransmittedBytes = 0;    // their payload bytes
  uint64_t packetsDeclaredLost = 0;   // by reordering threshold, time threshold or timeout,
                                      // plus go-back-N's give-ups
  uint64_t lateAcks = 0;              // ACKs of packets already declared lost (spurious losses)
  uint64_t spuriousRetransmissions = 0;  // of those, DATA whose content was resent for nothing
  uint64_t nacksReceived = 0;         // NACK datagrams (trimmed DATA reported by the peer)
  uint64_t packetsNacked = 0;         // packets they declared lost at once
  uint64_t ceEchoed = 0;              // our DATA the peer saw marked Congestion Experienced
  uint64_t rtoExpiries = 0;
  uint64_t spuriousRtos = 0;          // runs of expiries the next ACK showed were early (F-RTO)
  uint64_t tailLossProbes = 0;        // PINGs sent because ACKs stopped with packets in flight
  uint64_t creditStalls = 0;          // times a message waited for the receiver's credit
  // congestion=credit (congestion_credit.h): CREDIT datagrams either way (grants we sent the
  // peer, demands we told it), and requests sent again after cc_credit_timeout_us in vain.
  uint64_t creditPacketsSent = 0;
  uint64_t creditPacketsReceived = 0;
  uint64_t creditTimeouts = 0;

  // Receiving side.
  uint64_t ackPacketsReceived = 0;
  uint64_t duplicatePackets = 0;    // a packet number received before
  uint64_t duplicateFragments = 0;  // DATA whose bytes had all arrived already (retransmissions)
  uint64_t outOfOrderPackets = 0;   // arrived after a higher-numbered packet
  uint64_t ceReceived = 0;          // DATA that arrived marked Congestion Experienced
  uint64_t trimmedReceived = 0;     // DATA that arrived trimmed (payload cut by the network)
  uint64_t nacksSent = 0;           // NACK datagrams sent for them
  uint64_t unexpectedMessages = 0;  // messages that arrived before their receive was posted
  uint64_t unexpectedBytesHighWater = 0;  // most unexpected budget ever in use

  // Messages.
  uint64_t messagesSent = 0;           // sends completed
  uint64_t eagerMessagesSent = 0;
  uint64_t rendezvousMessagesSent = 0;
  uint64_t messagesReceived = 0;       // delivered to posted receives
  uint64_t payloadBytesReceived = 0;   // distinct payload bytes accepted from the wire
  uint64_t bytesDelivered = 0;         // bytes of delivered messages (goodput numerator)
  TimeUs firstDataReceivedUs = 0;      // goodput interval, receiving side
  TimeUs lastDeliveryUs = 0;

  // Round-trip time, as estimated (0 before the first sample).
  DurationUs rttSmoothedUs = 0;
  DurationUs rttMinUs = 0;
  DurationUs rttLatestUs = 0;
  uint64_t rttSamples = 0;

  // The most bytes this connection lets be in flight (a gauge: send_window_bytes, or the
  // automatic window sized from the peer's receive buffer, udp_config.h's sendWindowFor).
  uint64_t sendWindowBytes = 0;

  // Per path, when the peer is reached over several (udp_config paths > 1; empty otherwise).
  std::vector<PathStats> paths;

  uint64_t dropped(DropReason r) const { return droppedBy[static_cast<size_t>(r)]; }
};

// Delivered bits per second between the first DATA received and the last delivery.
double goodputBitsPerSecond(const Stats& stats);

// Every counter by its snake_case name (one per drop reason too), in a fixed order: what the
// transport hands to Python.
std::vector<std::pair<std::string, uint64_t>> statCounters(const Stats& stats);

// One "name=value" per counter, space-separated (drop reasons that are zero are left out).
std::string formatStats(const Stats& stats);

}  // namespace ucxb::udp
