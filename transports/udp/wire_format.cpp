#include "transports/udp/wire_format.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "transports/udp/crc32c.h"

namespace ucxb::udp {
namespace {

// Field offsets (see the layout in wire_format.h).
constexpr size_t kOffVersion = 0, kOffType = 1, kOffSource = 2, kOffCrc = 4, kOffToken = 8;
constexpr size_t kOffPacketNumber = 16;
constexpr size_t kOffTag = 24, kOffMessageId = 32, kOffMessageLength = 40, kOffOffset = 48,
                 kOffFragmentLength = 56, kOffFlags = 58, kOffDataReserved = 59,
                 kOffDataPadding = 60;
constexpr size_t kOffLargest = 16, kOffCredit = 24, kOffAckDelay = 32, kOffRangeCount = 36,
                 kOffCeCount = 38, kOffFirstRange = 40, kOffAckTime = 44,
                 kOffTimestampCount = 52, kOffAckReserved = 54;
constexpr size_t kOffCtsCount = 24, kOffCtsReserved = 26;
constexpr size_t kOffNackCount = 16, kOffNackReserved = 18;
constexpr size_t kOffGranted = 16, kOffWanted = 24, kOffCreditFlags = 32, kOffCreditReserved = 34;

// Explicit little-endian stores and loads: the format does not depend on the host.
void put8(uint8_t* p, uint8_t v) { p[0] = v; }
void put16(uint8_t* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

// The checksum covers bytes [0, 4) and [8, n): everything but the checksum field itself
// (n may stop at the end of a header, for a payload summed elsewhere).
uint32_t datagramChecksum(const uint8_t* p, size_t n) {
  return crc32cExtend(crc32c(p, kOffCrc), p + kOffCrc + 4, n - kOffCrc - 4);
}

void requireRoom(std::span<uint8_t> out, size_t bytes, const char* what) {
  if (out.size() < bytes) {
    throw std::length_error(std::string("udp wire format: ") + what + " needs " +
                            std::to_string(bytes) + " bytes, buffer has " +
                            std::to_string(out.size()));
  }
}

void writeCommon(uint8_t* p, const PacketHeader& h, PacketType type) {
  put8(p + kOffVersion, kWireVersion);
  put8(p + kOffType, static_cast<uint8_t>(type));
  put16(p + kOffSource, h.sourceRank);
  put32(p + kOffCrc, 0);
  put64(p + kOffToken, h.token);
}

DecodeError decodeData(const uint8_t* p, size_t n, DecodedPacket& out) {
  if (n < kDataHeaderBytes) return DecodeError::kTruncated;
  DataHeader& d = out.data;
  d.tag = get64(p + kOffTag);
  d.messageId = get64(p + kOffMessageId);
  d.messageLength = get64(p + kOffMessageLength);
  d.offset = get64(p + kOffOffset);
  d.fragmentLength = get16(p + kOffFragmentLength);
  d.flags = p[kOffFlags];
  const size_t carried = n - kDataHeaderBytes;
  const bool trimmed = d.flags & data_flags::kTrimmed;
  // A trimmed fragment keeps its length but carries nothing (its payload was cut).
  if (trimmed ? carried != 0 : carried < d.fragmentLength) {
    return trimmed ? DecodeError::kMalformed : DecodeError::kTruncated;
  }
  if (!trimmed && carried > d.fragmentLength) return DecodeError::kMalformed;  // trailing bytes
  if (p[kOffDataReserved] != 0 || get32(p + kOffDataPadding) != 0 ||
      (d.flags & ~data_flags::kKnown) != 0) {
    return DecodeError::kMalformed;
  }
  const bool rts = d.flags & data_flags::kRendezvousRequest;
  if (rts && (d.flags & data_flags::kRendezvousData)) return DecodeError::kMalformed;
  if ((d.flags & data_flags::kRestart) && !(d.flags & data_flags::kInOrder)) {
    return DecodeError::kMalformed;
  }
  if (d.messageLength > kMaxMessageBytes) return DecodeError::kMalformed;
  // Ids count up from 0 per connection; the range sets that track them need id + 1 to exist.
  if (d.messageId > kMaxMessageId) return DecodeError::kMalformed;
  // offset + fragmentLength <= messageLength, written so that it cannot overflow.
  if (d.offset > d.messageLength || d.fragmentLength > d.messageLength - d.offset) {
    return DecodeError::kMalformed;
  }
  if (rts) {
    if (d.fragmentLength != 0 || d.offset != 0) return DecodeError::kMalformed;
  } else if (d.fragmentLength == 0) {
    // The only empty fragment is the one fragment of an empty eager message.
    if (d.messageLength != 0 || (d.flags & data_flags::kRendezvousData)) {
      return DecodeError::kMalformed;
    }
  }
  if (trimmed && d.fragmentLength == 0) return DecodeError::kMalformed;  // nothing to cut
  out.payload = std::span<const uint8_t>(p + kDataHeaderBytes, trimmed ? 0 : d.fragmentLength);
  return DecodeError::kNone;
}

DecodeError decodeAck(const uint8_t* p, size_t n, DecodedPacket& out) {
  if (n < kAckFixedBytes) return DecodeError::kTruncated;
  AckFrame& a = out.ack;
  const uint64_t largest = get64(p + kOffLargest);
  a.creditLimit = get64(p + kOffCredit);
  a.ackDelayUs = get32(p + kOffAckDelay);
  const uint16_t count = get16(p + kOffRangeCount);
  const uint32_t firstLength = get32(p + kOffFirstRange);
  a.ceCount = get16(p + kOffCeCount);
  a.ackTimeUs = get64(p + kOffAckTime);
  const uint16_t stamps = get16(p + kOffTimestampCount);
  if (count > kMaxAckRanges || stamps > kMaxAckTimestamps || get16(p + kOffAckReserved) != 0) {
    return DecodeError::kMalformed;
  }
  const size_t expected = ackBytes(count, stamps);
  if (n < expected) return DecodeError::kTruncated;
  if (n > expected) return DecodeError::kMalformed;
  a.rangeCount = count;
  a.timestampCount = stamps;
  const uint8_t* t = p + ackBytes(count);
  for (uint16_t i = 0; i < stamps; ++i, t += kAckTimestampBytes) {
    a.timestamps[i] = {get64(t), get32(t + 8)};
    // A packet received before the clock began, or one never acknowledged, is impossible.
    if (a.timestamps[i].ageUs > a.ackTimeUs || count == 0 ||
        a.timestamps[i].packetNumber > largest) {
      return DecodeError::kMalformed;
    }
  }
  if (count == 0) {
    return largest == 0 && firstLength == 0 ? DecodeError::kNone : DecodeError::kMalformed;
  }
  if (largest > kMaxPacketNumber || firstLength > largest) return DecodeError::kMalformed;
  a.ranges[0] = {largest - firstLength, largest};
  const uint8_t* r = p + kAckFixedBytes;
  for (uint16_t i = 1; i < count; ++i, r += kAckRangeBytes) {
    const uint64_t gap = get32(r);
    const uint64_t length = get32(r + 4);
    const uint64_t below = a.ranges[i - 1].smallest;  // numbers available below the last range
    // next largest = below - gap - 1 and next smallest = next largest - length, both >= 0.
    if (gap == 0 || below < gap + 1 || below - gap - 1 < length) return DecodeError::kMalformed;
    const PacketNumber hi = below - gap - 1;
    a.ranges[i] = {hi - length, hi};
  }
  return DecodeError::kNone;
}

DecodeError decodeCts(const uint8_t* p, size_t n, DecodedPacket& out) {
  if (n < kCtsFixedBytes) return DecodeError::kTruncated;
  const uint16_t count = get16(p + kOffCtsCount);
  if (get16(p + kOffCtsReserved) != 0 || count == 0 || count > kMaxCtsIds) {
    return DecodeError::kMalformed;
  }
  const size_t expected = ctsBytes(count);
  if (n < expected) return DecodeError::kTruncated;
  if (n > expected) return DecodeError::kMalformed;
  out.cts.count = count;
  for (uint16_t i = 0; i < count; ++i) out.cts.ids[i] = get64(p + kCtsFixedBytes + 8 * i);
  return DecodeError::kNone;
}

DecodeError decodeNack(const uint8_t* p, size_t n, DecodedPacket& out) {
  if (n < kNackFixedBytes) return DecodeError::kTruncated;
  const uint16_t count = get16(p + kOffNackCount);
  if (get16(p + kOffNackReserved) != 0 || count == 0 || count > kMaxNackNumbers) {
    return DecodeError::kMalformed;
  }
  const size_t expected = nackBytes(count);
  if (n < expected) return DecodeError::kTruncated;
  if (n > expected) return DecodeError::kMalformed;
  out.nack.count = count;
  for (uint16_t i = 0; i < count; ++i) {
    out.nack.numbers[i] = get64(p + kNackFixedBytes + 8 * i);
    if (out.nack.numbers[i] > kMaxPacketNumber) return DecodeError::kMalformed;
  }
  return DecodeError::kNone;
}

DecodeError decodeCredit(const uint8_t* p, size_t n, DecodedPacket& out) {
  if (n < kCreditBytes) return DecodeError::kTruncated;
  if (n > kCreditBytes) return DecodeError::kMalformed;
  CreditFrame& c = out.credit;
  c.granted = get64(p + kOffGranted);
  c.wanted = get64(p + kOffWanted);
  c.flags = get16(p + kOffCreditFlags);
  if ((c.flags & ~credit_flags::kKnown) != 0 || get16(p + kOffCreditReserved) != 0) {
    return DecodeError::kMalformed;
  }
  return DecodeError::kNone;
}

// A DATA datagram whose checksum holds (an emulated switch leaves anything else alone).
bool isIntactData(std::span<const uint8_t> d) {
  return d.size() >= kDataHeaderBytes && d[kOffVersion] == kWireVersion &&
         d[kOffType] == static_cast<uint8_t>(PacketType::kData) &&
         get32(d.data() + kOffCrc) == datagramChecksum(d.data(), d.size());
}

}  // namespace

std::optional<uint8_t> otherWireVersion(std::span<const uint8_t> datagram, uint64_t token,
                                        uint16_t sourceRank) {
  const uint8_t* p = datagram.data();
  const size_t n = datagram.size();
  if (n < kCommonHeaderBytes || p[kOffVersion] == kWireVersion) return std::nullopt;
  if (get64(p + kOffToken) != token || get16(p + kOffSource) != sourceRank) return std::nullopt;
  if (get32(p + kOffCrc) != datagramChecksum(p, n)) return std::nullopt;
  return p[kOffVersion];
}

const char* decodeErrorName(DecodeError e) {
  switch (e) {
    case DecodeError::kNone: return "none";
    case DecodeError::kTruncated: return "truncated";
    case DecodeError::kBadVersion: return "bad_version";
    case DecodeError::kBadType: return "bad_type";
    case DecodeError::kBadChecksum: return "bad_checksum";
    case DecodeError::kMalformed: return "malformed";
  }
  return "unknown";
}

DecodeError decodePacket(std::span<const uint8_t> datagram, DecodedPacket& out) {
  const uint8_t* p = datagram.data();
  const size_t n = datagram.size();
  if (n < kCommonHeaderBytes) return DecodeError::kTruncated;
  if (n > kMaxDatagramBytes) return DecodeError::kMalformed;
  if (p[kOffVersion] != kWireVersion) return DecodeError::kBadVersion;
  const uint8_t type = p[kOffType];
  if (type < static_cast<uint8_t>(PacketType::kData) ||
      type > static_cast<uint8_t>(PacketType::kClose)) {
    return DecodeError::kBadType;
  }
  // The checksum before any other field: a corrupted length must not be believed.
  if (get32(p + kOffCrc) != datagramChecksum(p, n)) return DecodeError::kBadChecksum;
  out.header.type = static_cast<PacketType>(type);
  out.header.sourceRank = get16(p + kOffSource);
  out.header.token = get64(p + kOffToken);
  out.payload = {};
  if (out.header.type == PacketType::kAck) return decodeAck(p, n, out);
  if (out.header.type == PacketType::kNack) return decodeNack(p, n, out);
  if (out.header.type == PacketType::kCredit) return decodeCredit(p, n, out);
  if (out.header.type == PacketType::kClose) {
    return n == kCloseBytes ? DecodeError::kNone : DecodeError::kMalformed;
  }
  if (n < kReliableHeaderBytes) return DecodeError::kTruncated;
  out.packetNumber = get64(p + kOffPacketNumber);
  if (out.packetNumber > kMaxPacketNumber) return DecodeError::kMalformed;
  switch (out.header.type) {
    case PacketType::kData: return decodeData(p, n, out);
    case PacketType::kCts: return decodeCts(p, n, out);
    case PacketType::kPing:
      return n == kPingBytes ? DecodeError::kNone : DecodeError::kMalformed;
    case PacketType::kAck:
    case PacketType::kNack:
    case PacketType::kCredit:
    case PacketType::kClose: break;
  }
  return DecodeError::kBadType;
}

std::optional<uint16_t> peekSourceRank(std::span<const uint8_t> datagram) {
  if (datagram.size() < kCommonHeaderBytes) return std::nullopt;
  return get16(datagram.data() + kOffSource);
}

size_t encodeData(std::span<uint8_t> out, const PacketHeader& header, PacketNumber pn,
                  const DataHeader& data, const uint8_t* payload) {
  const size_t n = kDataHeaderBytes + data.fragmentLength;
  requireRoom(out, n, "DATA packet");
  uint8_t* p = out.data();
  writeCommon(p, header, PacketType::kData);
  put64(p + kOffPacketNumber, pn);
  put64(p + kOffTag, data.tag);
  put64(p + kOffMessageId, data.messageId);
  put64(p + kOffMessageLength, data.messageLength);
  put64(p + kOffOffset, data.offset);
  put16(p + kOffFragmentLength, data.fragmentLength);
  put8(p + kOffFlags, data.flags);
  put8(p + kOffDataReserved, 0);
  put32(p + kOffDataPadding, 0);
  // datagramChecksum(p, n), with the payload summed as it is copied in (crc32cCopy).
  put32(p + kOffCrc, crc32cCopy(datagramChecksum(p, kDataHeaderBytes), p + kDataHeaderBytes,
                                payload, data.fragmentLength));
  return n;
}

size_t encodeAck(std::span<uint8_t> out, const PacketHeader& header, const AckFrame& ack) {
  if (ack.timestampCount > kMaxAckTimestamps) {
    throw std::length_error("udp wire format: an ACK carries at most 16 timestamps");
  }
  const size_t n = ackBytes(ack.rangeCount, ack.timestampCount);
  requireRoom(out, n, "ACK packet");
  uint8_t* p = out.data();
  writeCommon(p, header, PacketType::kAck);
  put64(p + kOffCredit, ack.creditLimit);
  put32(p + kOffAckDelay, ack.ackDelayUs);
  put16(p + kOffRangeCount, ack.rangeCount);
  put16(p + kOffCeCount, ack.ceCount);
  put64(p + kOffAckTime, ack.ackTimeUs);
  put16(p + kOffTimestampCount, ack.timestampCount);
  put16(p + kOffAckReserved, 0);
  uint8_t* t = p + ackBytes(ack.rangeCount);
  for (uint16_t i = 0; i < ack.timestampCount; ++i, t += kAckTimestampBytes) {
    put64(t, ack.timestamps[i].packetNumber);
    put32(t + 8, ack.timestamps[i].ageUs);
  }
  if (ack.rangeCount == 0) {
    put64(p + kOffLargest, 0);
    put32(p + kOffFirstRange, 0);
  } else {
    put64(p + kOffLargest, ack.ranges[0].largest);
    put32(p + kOffFirstRange, static_cast<uint32_t>(ack.ranges[0].largest - ack.ranges[0].smallest));
    uint8_t* r = p + kAckFixedBytes;
    for (uint16_t i = 1; i < ack.rangeCount; ++i, r += kAckRangeBytes) {
      put32(r, static_cast<uint32_t>(ack.ranges[i - 1].smallest - ack.ranges[i].largest - 1));
      put32(r + 4, static_cast<uint32_t>(ack.ranges[i].largest - ack.ranges[i].smallest));
    }
  }
  put32(p + kOffCrc, datagramChecksum(p, n));
  return n;
}

size_t encodeCts(std::span<uint8_t> out, const PacketHeader& header, PacketNumber pn,
                 std::span<const MessageId> ids) {
  if (ids.empty() || ids.size() > kMaxCtsIds) {
    throw std::length_error("udp wire format: a CTS packet carries 1 to 64 message ids");
  }
  const size_t n = ctsBytes(ids.size());
  requireRoom(out, n, "CTS packet");
  uint8_t* p = out.data();
  writeCommon(p, header, PacketType::kCts);
  put64(p + kOffPacketNumber, pn);
  put16(p + kOffCtsCount, static_cast<uint16_t>(ids.size()));
  put16(p + kOffCtsReserved, 0);
  for (size_t i = 0; i < ids.size(); ++i) put64(p + kCtsFixedBytes + 8 * i, ids[i]);
  put32(p + kOffCrc, datagramChecksum(p, n));
  return n;
}

size_t encodePing(std::span<uint8_t> out, const PacketHeader& header, PacketNumber pn) {
  requireRoom(out, kPingBytes, "PING packet");
  uint8_t* p = out.data();
  writeCommon(p, header, PacketType::kPing);
  put64(p + kOffPacketNumber, pn);
  put32(p + kOffCrc, datagramChecksum(p, kPingBytes));
  return kPingBytes;
}

size_t encodeNack(std::span<uint8_t> out, const PacketHeader& header,
                  std::span<const PacketNumber> numbers) {
  if (numbers.empty() || numbers.size() > kMaxNackNumbers) {
    throw std::length_error("udp wire format: a NACK packet carries 1 to 64 packet numbers");
  }
  const size_t n = nackBytes(numbers.size());
  requireRoom(out, n, "NACK packet");
  uint8_t* p = out.data();
  writeCommon(p, header, PacketType::kNack);
  put16(p + kOffNackCount, static_cast<uint16_t>(numbers.size()));
  put16(p + kOffNackReserved, 0);
  for (size_t i = 0; i < numbers.size(); ++i) put64(p + kNackFixedBytes + 8 * i, numbers[i]);
  put32(p + kOffCrc, datagramChecksum(p, n));
  return n;
}

size_t encodeCredit(std::span<uint8_t> out, const PacketHeader& header, const CreditFrame& credit) {
  requireRoom(out, kCreditBytes, "CREDIT packet");
  uint8_t* p = out.data();
  writeCommon(p, header, PacketType::kCredit);
  put64(p + kOffGranted, credit.granted);
  put64(p + kOffWanted, credit.wanted);
  put16(p + kOffCreditFlags, credit.flags);
  put16(p + kOffCreditReserved, 0);
  put32(p + kOffCrc, datagramChecksum(p, kCreditBytes));
  return kCreditBytes;
}

size_t encodeClose(std::span<uint8_t> out, const PacketHeader& header) {
  requireRoom(out, kCloseBytes, "CLOSE packet");
  uint8_t* p = out.data();
  writeCommon(p, header, PacketType::kClose);
  put32(p + kOffCrc, datagramChecksum(p, kCloseBytes));
  return kCloseBytes;
}

size_t maxAckRangesFor(size_t mtuPayload, size_t timestamps) {
  const size_t fixed = ackBytes(0, timestamps);
  if (mtuPayload < fixed) return 0;
  return std::min(kMaxAckRanges, (mtuPayload - fixed) / kAckRangeBytes + 1);
}

size_t maxCtsIdsFor(size_t mtuPayload) {
  if (mtuPayload < kCtsFixedBytes) return 0;
  return std::min(kMaxCtsIds, (mtuPayload - kCtsFixedBytes) / 8);
}

void sealChecksum(std::span<uint8_t> datagram) {
  if (datagram.size() < kCommonHeaderBytes) return;
  put32(datagram.data() + kOffCrc, datagramChecksum(datagram.data(), datagram.size()));
}

}  // namespace ucxb::udp

namespace ucxb::udp {

bool markCongestionExperienced(std::span<uint8_t> datagram) {
  if (!isIntactData(datagram)) return false;
  datagram[kOffFlags] |= data_flags::kCongestionExperienced;
  sealChecksum(datagram);
  return true;
}

bool trimData(std::vector<uint8_t>& datagram) {
  if (!isIntactData(datagram) || datagram.size() == kDataHeaderBytes ||
      (datagram[kOffFlags] & data_flags::kTrimmed)) {
    return false;
  }
  datagram.resize(kDataHeaderBytes);
  datagram[kOffFlags] |= data_flags::kTrimmed;
  sealChecksum(datagram);
  return true;
}

}  // namespace ucxb::udp
