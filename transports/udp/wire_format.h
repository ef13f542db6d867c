// The datagram format of the UDP transport, version 6: encoders, and a decoder that checks
// every length, offset and count before anything else looks at a datagram.
//
// Versions: 1 had DATA, ACK, CTS, PING and NACK; 2 adds CREDIT (receiver-driven congestion
// control, congestion=credit). A version-1 peer would count every CREDIT as bad_type and
// stall a credit sender, so the version says it: each end drops the other's datagrams as
// bad_version, and a mixed group fails loudly instead (the first intact datagram of another
// version fails the connection, naming both: otherWireVersion). 3 adds CREDIT's catch-up
// flag; 4 adds the ACK's receive timestamps (its fixed part grows from 44 to 56 bytes); 5 pads
// the DATA header from 60 to 64 bytes, so that a payload lies 8-aligned in an aligned datagram
// and fragments cut at multiples of 8 bytes (kFragmentAlignment): the fold of an 8-byte dtype then
// reads the payload where it lies, where a 60-byte header had it copied to an aligned page
// and every other fragment's boundary split an element (FoldTarget, transports/). 6 adds
// CLOSE, with which a closing endpoint ends its linger as soon as every peer has said it needs
// nothing more (Endpoint::lingerDone); a peer that knew no CLOSE would drop it as bad_type
// and wait out its quiet time.
//
// All integers are little-endian. Every datagram starts with the common header:
//
//    0  u8   version          kWireVersion; anything else is dropped
//    1  u8   type             PacketType
//    2  u16  source rank      demultiplexes datagrams arriving on one socket to connections
//    4  u32  crc32c           over every byte of the datagram except these four
//    8  u64  session token    random per group instance: stale or stray traffic is dropped
//
// Reliable packets (DATA, CTS, PING) then carry a packet number (u64 at 16), increasing by
// one per packet sent on the connection, retransmissions included: a number is never reused,
// so an ACK is never ambiguous and every ACK of the newest packet is a clean RTT sample.
//
// DATA (64-byte header, then the payload):
//   24 u64 tag   32 u64 message id   40 u64 message length   48 u64 offset
//   56 u16 fragment length   58 u8 flags (data_flags)   59 u8 reserved (0)
//   60 u32 reserved (0: the padding that aligns the payload)
//   Every fragment repeats the message's tag and length, so whichever fragment arrives first
//   can be matched to a posted receive and written straight into it. A trimmed DATA (flag
//   kTrimmed, set by a congested switch) is the header alone: its payload was cut on the way,
//   and its fragment length still says how long the payload was.
// ACK (56 bytes + 8 per extra range + 12 per timestamp; not reliable, never acknowledged):
//   16 u64 largest acknowledged   24 u64 credit limit   32 u32 ack delay (us)
//   36 u16 range count   38 u16 CE count (DATA received marked kCongestionExperienced, since
//   the start, modulo 2^16: the ECN echo)   40 u32 first range length
//   44 u64 ack time (us, the receiver's own clock, when it wrote this ACK)
//   52 u16 timestamp count   54 u16 reserved (0)
//   56 (range count - 1) x { u32 gap, u32 length }
//   then timestamp count x { u64 packet number, u32 age (us before the ack time) }
//   The first range is [largest - first range length, largest]; each next range ends `gap`+1
//   below the previous range's smallest (gap = missing numbers in between, >= 1) and spans
//   length+1 numbers. Range count 0 is a pure flow-control update (largest and first range
//   length are then 0). A timestamp says when a packet arrived, on the receiver's clock: with
//   several paths, the newest packet received on each path since the last ACK (at most one
//   per path, kMaxAckTimestamps), so that the sender sees each path's one-way delay and queue
//   (one_way_delay.h). The clocks need not agree: only differences of one clock are used.
// CTS (clear to send; 28 bytes + 8 per id): 24 u16 count   26 u16 reserved (0)   28 count x u64
//   message id: the receiver has posted the buffer for these rendezvous messages.
// PING (24 bytes): elicits an ACK (zero-window probe), carries nothing else.
// NACK (20 bytes + 8 per number; not reliable): 16 u16 count   18 u16 reserved (0)
//   20 count x u64 packet number: DATA that arrived trimmed; the sender resends at once.
// CREDIT (36 bytes; not reliable, never acknowledged; version 2, its catch-up flag version 3):
//   16 u64 granted   24 u64 wanted
//   32 u16 flags (credit_flags)   34 u16 reserved (0)
//   Both counts are cumulative bytes on the wire (datagram + kFramingOverheadBytes) of DATA
//   from the receiving end of this packet to its sending end, since the connection began:
//   `granted`, what this end lets the peer send it (0: this end grants nothing); `wanted`,
//   what this end wants to send the peer (what it sent plus its backlog). Cumulative, so a
//   later packet supersedes a lost or reordered one (congestion_credit.h).
// CLOSE (16 bytes, the common header alone; not reliable, never acknowledged; version 6): the
//   sender has closed the group, and everything it sent on this connection has been
//   acknowledged, so that it needs nothing more from the receiver, now or later (QUIC's
//   CONNECTION_CLOSE, for a close that is graceful: sent only once nothing is unacknowledged).
//   A closing endpoint repeats it with its ACKs while it lingers (endpoint.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "transports/udp/udp_types.h"

namespace ucxb::udp {

constexpr uint8_t kWireVersion = 6;

enum class PacketType : uint8_t {
  kData = 1,
  kAck = 2,
  kCts = 3,
  kPing = 4,
  kNack = 5,
  kCredit = 6,  // version 2
  kClose = 7,   // version 6
};

// DATA flags. A message is sent either eagerly (fragments go out at once; the receiver
// buffers them if no receive is posted yet) or by rendezvous (a request-to-send carrying only
// the tag and length; the data follows once the receiver answers CTS).
namespace data_flags {
constexpr uint8_t kRendezvousRequest = 0x01;  // RTS: no payload, offset 0
constexpr uint8_t kRendezvousData = 0x02;     // a fragment of a rendezvous message
// Go-back-N (loss_recovery=go_back_n): the sender wants this packet discarded unless it is the
// next reliable packet after the last one received, so that the receiver keeps nothing that
// arrives after a gap. The sender sets the flag; the receiver's own policy does not matter.
constexpr uint8_t kInOrder = 0x04;
// With kInOrder: the sender went back and abandoned every earlier packet the receiver has not
// seen; in-order delivery restarts here.
constexpr uint8_t kRestart = 0x08;
// Set by the network, never by a sender (the fault layer's emulated bottleneck, which reseals
// the checksum): the packet found a queue above its marking threshold (ECN's CE) ...
constexpr uint8_t kCongestionExperienced = 0x10;
// ... or above its trimming threshold, and lost its payload on the way (UET packet trimming).
constexpr uint8_t kTrimmed = 0x20;
constexpr uint8_t kKnown =
    kRendezvousRequest | kRendezvousData | kInOrder | kRestart | kCongestionExperienced | kTrimmed;
}  // namespace data_flags

// CREDIT flags.
namespace credit_flags {
// The sender of this packet asks for the peer's grant at once (its demand grew, or it waited
// a credit timeout in vain). Only a request is answered at once, so two ends never echo each
// other's CREDIT packets back and forth.
constexpr uint16_t kRequest = 0x0001;
// The grant made up for a stall of the receiving rank (its scheduler kept the credit it
// earned meanwhile, credit_scheduler.h): the sender keeps it whole instead of cutting unused
// credit to what a paced stream leaves unused (congestion_credit.h).
constexpr uint16_t kCatchUp = 0x0002;
constexpr uint16_t kKnown = kRequest | kCatchUp;
}  // namespace credit_flags

constexpr size_t kCommonHeaderBytes = 16;
constexpr size_t kReliableHeaderBytes = 24;  // common header + packet number
constexpr size_t kDataHeaderBytes = 64;
// A sender cuts messages at multiples of this many bytes (maxFragmentBytes): the largest
// element a reduction commonly folds (float64, int64), so that no fragment boundary splits one.
constexpr size_t kFragmentAlignment = 8;
constexpr size_t kAckFixedBytes = 56;
constexpr size_t kAckRangeBytes = 8;
constexpr size_t kAckTimestampBytes = 12;
constexpr size_t kMaxAckTimestamps = 16;  // one per path: kMaxPaths (path_selector.h)
constexpr size_t kCtsFixedBytes = 28;
constexpr size_t kPingBytes = 24;
constexpr size_t kNackFixedBytes = 20;
constexpr size_t kMaxNackNumbers = 64;
constexpr size_t kCreditBytes = 36;
constexpr size_t kCloseBytes = kCommonHeaderBytes;
constexpr size_t kMaxDatagramBytes = 65507;  // largest UDP payload over IPv4
constexpr size_t kMaxAckRanges = 64;
constexpr size_t kMaxCtsIds = 64;
// Larger values in a packet are impossible, not merely unusual: dropped as malformed.
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 48;
constexpr PacketNumber kMaxPacketNumber = (uint64_t{1} << 62) - 1;
constexpr MessageId kMaxMessageId = (uint64_t{1} << 62) - 1;

// What a receiver charges against its unexpected-message budget for keeping track of one
// message, on top of the payload it buffers (see message_receiver.h). Part of the protocol:
// both ends must agree on it.
constexpr uint64_t kMessageChargeBytes = 256;

struct PacketHeader {
  PacketType type = PacketType::kData;
  uint16_t sourceRank = 0;
  uint64_t token = 0;
};

struct DataHeader {
  Tag tag = 0;
  MessageId messageId = 0;
  uint64_t messageLength = 0;
  uint64_t offset = 0;
  uint16_t fragmentLength = 0;
  uint8_t flags = 0;
};

// An inclusive range of packet numbers.
struct PacketRange {
  PacketNumber smallest = 0;
  PacketNumber largest = 0;
};

// When the receiver got one packet: `ageUs` before the frame's ackTimeUs.
struct AckTimestamp {
  PacketNumber packetNumber = 0;
  uint32_t ageUs = 0;
};

struct AckFrame {
  uint64_t creditLimit = 0;
  uint32_t ackDelayUs = 0;
  uint16_t rangeCount = 0;  // 0: no packet acknowledged, only the credit limit
  uint16_t ceCount = 0;     // DATA received marked Congestion Experienced, modulo 2^16
  std::array<PacketRange, kMaxAckRanges> ranges{};  // descending, disjoint, non-adjacent
  TimeUs ackTimeUs = 0;     // the receiver's clock
  uint16_t timestampCount = 0;
  std::array<AckTimestamp, kMaxAckTimestamps> timestamps{};
  PacketNumber largest() const { return rangeCount ? ranges[0].largest : 0; }
};

struct CreditFrame {
  uint64_t granted = 0;
  uint64_t wanted = 0;
  uint16_t flags = 0;
};

struct CtsFrame {
  uint16_t count = 0;
  std::array<MessageId, kMaxCtsIds> ids{};
};

struct NackFrame {
  uint16_t count = 0;
  std::array<PacketNumber, kMaxNackNumbers> numbers{};
};

// Why a datagram could not be decoded. Connections add the reasons that need state
// (wrong token, protocol violations): see stats.h.
enum class DecodeError : uint8_t {
  kNone,
  kTruncated,    // shorter than its header or than the lengths it declares
  kBadVersion,   // not kWireVersion
  kBadType,      // unknown packet type
  kBadChecksum,  // CRC32C mismatch: corrupted on the way
  kMalformed,    // impossible field values: reserved bits, lengths, offsets, ranges, counts
};

const char* decodeErrorName(DecodeError e);

// The version of a datagram of another wire version whose common header is intact: its
// checksum holds (every version so far computes it alike) and it carries `token` and
// `sourceRank`. Such a datagram was sent by that rank of this group instance, which then
// runs another release of the transport (a version byte flipped on the way fails the
// checksum); nullopt for anything else, a datagram of this version included.
std::optional<uint8_t> otherWireVersion(std::span<const uint8_t> datagram, uint64_t token,
                                        uint16_t sourceRank);

struct DecodedPacket {
  PacketHeader header;
  PacketNumber packetNumber = 0;  // DATA, CTS, PING
  DataHeader data;                // DATA
  std::span<const uint8_t> payload;  // DATA: points into the datagram
  AckFrame ack;                   // ACK
  CtsFrame cts;                   // CTS
  NackFrame nack;                 // NACK
  CreditFrame credit;             // CREDIT
};

// Checks and decodes one datagram. On kNone, `out` describes it; otherwise `out` is
// unspecified. Never reads outside `datagram`.
DecodeError decodePacket(std::span<const uint8_t> datagram, DecodedPacket& out);

// The source rank, without any other check: lets a socket loop pick the connection that will
// check the rest. std::nullopt if the datagram is too short to carry one.
std::optional<uint16_t> peekSourceRank(std::span<const uint8_t> datagram);

// Encoders write one datagram into `out`, checksum included, and return its length. `out`
// must be large enough (the sizes below): they throw std::length_error otherwise.
size_t encodeData(std::span<uint8_t> out, const PacketHeader& header, PacketNumber pn,
                  const DataHeader& data, const uint8_t* payload);
size_t encodeAck(std::span<uint8_t> out, const PacketHeader& header, const AckFrame& ack);
size_t encodeCts(std::span<uint8_t> out, const PacketHeader& header, PacketNumber pn,
                 std::span<const MessageId> ids);
size_t encodePing(std::span<uint8_t> out, const PacketHeader& header, PacketNumber pn);
size_t encodeNack(std::span<uint8_t> out, const PacketHeader& header,
                  std::span<const PacketNumber> numbers);

size_t encodeCredit(std::span<uint8_t> out, const PacketHeader& header, const CreditFrame& credit);
size_t encodeClose(std::span<uint8_t> out, const PacketHeader& header);

constexpr size_t ackBytes(size_t ranges, size_t timestamps = 0) {
  return kAckFixedBytes + (ranges > 1 ? (ranges - 1) * kAckRangeBytes : 0) +
         timestamps * kAckTimestampBytes;
}
constexpr size_t ctsBytes(size_t ids) { return kCtsFixedBytes + ids * 8; }
constexpr size_t nackBytes(size_t numbers) { return kNackFixedBytes + numbers * 8; }

// Most payload bytes one DATA datagram of at most `mtuPayload` bytes carries: what fits, rounded
// down to kFragmentAlignment (1408 at Ethernet's 1472, the whole room; at most 7 bytes short).
constexpr size_t maxFragmentBytes(size_t mtuPayload) {
  return (mtuPayload - kDataHeaderBytes) / kFragmentAlignment * kFragmentAlignment;
}
// Most ACK ranges (beside `timestamps` timestamps) / CTS ids that fit in one datagram of at
// most `mtuPayload` bytes.
size_t maxAckRangesFor(size_t mtuPayload, size_t timestamps = 0);
size_t maxCtsIdsFor(size_t mtuPayload);

// Recomputes the checksum of an encoded datagram in place (tests and fault injection use it
// to make a mutated datagram pass the CRC and reach the deeper checks).
void sealChecksum(std::span<uint8_t> datagram);

// What an emulated switch does to a DATA datagram with a valid checksum (anything else is
// left alone and false returned); both reseal the checksum. Sets kCongestionExperienced:
bool markCongestionExperienced(std::span<uint8_t> datagram);
// Cuts the payload off and sets kTrimmed (the fragment length stays):
bool trimData(std::vector<uint8_t>& datagram);

}  // namespace ucxb::udp
