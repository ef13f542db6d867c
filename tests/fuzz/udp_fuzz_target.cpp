// Fuzz target for the UDP transport's sans-IO core (transports/udp/): libFuzzer's entry point,
// also driven by tests/fuzz/standalone_driver.cpp where no libFuzzer exists (g++ builds).
//
// Every input is used three times:
//   1. as one datagram, for the wire format alone: whatever decodes must re-encode to the same
//      bytes and satisfy the decoder's promises, and a resealed copy (checksum recomputed) must
//      fail only for reasons other than the checksum;
//   2. as a script for two PeerConnections joined by a fuzz-controlled link: post receives into
//      guarded buffers, send, deliver, reorder, duplicate or drop honest datagrams, deliver
//      mutated, crafted or raw ones (resealed, so that they get past the CRC and reach the
//      deeper checks), advance time, fire timers, fail a side. After every step the harness
//      checks the invariants below and abort()s with a message on the first violation;
//   3. as a script for one Endpoint, two honest peers and an attacker sending from any address
//      (endpoint_fuzz.cpp, with its own invariants).
//
// Invariants checked (parts 1 and 2):
//   - every datagram handed to onDatagram is accepted or dropped, counted under exactly one
//     DropReason, and the reason is the one the datagram deserves whenever it can be known
//     without the connection's state (closed, undecodable, wrong token, wrong peer);
//   - no honest datagram is dropped as a protocol violation while nothing forged got in;
//   - nothing is written outside a receive buffer (guard bytes, ASan-poisoned), nothing after
//     the receive's terminal event or a successful cancel (poisoned, and hashed to catch it
//     without ASan), and send buffers are never written and never read after their terminal
//     event (poisoned);
//   - every receive and every send gets at most one terminal event, of a kind that fits what
//     happened to it; delivered messages match the receive's tag under its mask, report
//     truncation exactly when longer than the capacity, and (while nothing forged got in)
//     hold the bytes of a message the peer really sent;
//   - every datagram a connection emits fits the MTU, decodes, carries its token, rank and the
//     next packet number, and DATA carries the sender's own bytes for a live message;
//   - after a failure every send and receive has failed; after the script, a lossless settle
//     delivers every message for which a matching receive is waiting (when nothing forged got
//     in, masks are exact, nothing was cancelled and credit cannot run out).
//
// Building (from the repository root; tests/test_udp_fuzz.py does the g++ one):
//   g++ (no libFuzzer): compile the core and this file with -fsanitize=address,undefined
//     -fsanitize-coverage=trace-pc, standalone_driver.cpp without trace-pc, link them.
//   clang (libFuzzer), checked with Debian's clang 14:
//     clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
//       -I. $(ls transports/udp/*.cpp | grep -v -e udp_socket -e udp_transport) \
//       tests/fuzz/udp_fuzz_target.cpp tests/fuzz/endpoint_fuzz.cpp -o udp_fuzz_libfuzzer
//     udp_fuzz -dump_seeds=corpus && ./udp_fuzz_libfuzzer -max_total_time=600 corpus
//
// Script layout: three config bytes (see configFrom), then operations of one opcode byte
// (bit 0: which side, the rest: the operation) and its argument bytes. An input that ends
// early just ends the script: every byte string is a valid input.

#include "tests/fuzz/udp_fuzz_target.h"

#include "tests/fuzz/endpoint_fuzz.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "transports/udp/reliability.h"
#include "transports/udp/wire_format.h"

#include "tests/fuzz/asan_poison.h"

namespace ucxb::udp::fuzz {
namespace {

[[noreturn]] void violated(const char* file, int line, const char* condition,
                           const std::string& detail) {
  std::fprintf(stderr, "udp_fuzz: invariant violated at %s:%d: %s\n  %s\n", file, line,
               condition, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

// The detail is built only on failure: the checks sit on every datagram.
#define FUZZ_CHECK(cond, detail)                                \
  do {                                                          \
    if (!(cond)) violated(__FILE__, __LINE__, #cond, (detail)); \
  } while (0)

// Self-test of the harness (tests/test_udp_fuzz.py): with UDP_FUZZ_PLANTED_OVERFLOW in the
// environment, the harness behaves as a core that writes one byte past a receive's capacity
// would, and the run must fail. Read at run time, so that the test needs no second build.
const bool kPlantedOverflow = std::getenv("UDP_FUZZ_PLANTED_OVERFLOW") != nullptr;

constexpr uint64_t kToken = 0x5eed'0f'f0220ull;
constexpr size_t kGuard = 16;
constexpr uint8_t kGuardByte = 0xA5;
// Bounds that keep one input to well under a millisecond or so, whatever it asks for.
constexpr size_t kMaxReceives = 48;
constexpr size_t kMaxSends = 48;
constexpr size_t kMaxWire = 512;      // datagrams queued on one direction of the link
constexpr size_t kHistory = 32;       // honest datagrams kept per side for replays and mutations
constexpr size_t kMaxPump = 8192;     // a pollTransmit loop that never ends is a bug
// The settle phase ends when everything due has arrived; these only bound a stuck one.
constexpr int kSettleRounds = 50000;
constexpr TimeUs kSettleTimeUs = 600'000'000;

constexpr uint64_t kInteresting[] = {0,
                                     1,
                                     2,
                                     0x7f,
                                     0x80,
                                     0xff,
                                     0x100,
                                     0xffff,
                                     0x10000,
                                     0x7fffffff,
                                     0xffffffff,
                                     uint64_t{1} << 32,
                                     uint64_t{1} << 40,
                                     kMaxMessageBytes,
                                     kMaxMessageBytes + 1,
                                     kMaxPacketNumber,
                                     kMaxPacketNumber + 1,
                                     uint64_t{1} << 63,
                                     ~uint64_t{0} - 1,
                                     ~uint64_t{0}};

// Byte i of message `key`: a hash of (key, i), so a byte from the wrong message or offset
// shows.
UDP_FUZZ_NO_COVERAGE uint8_t patternByte(uint64_t key, uint64_t i) {
  uint64_t x = key * 0x9e3779b97f4a7c15ull + (i >> 3) + 1;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<uint8_t>(x >> (8 * (i & 7)));
}

UDP_FUZZ_NO_COVERAGE bool matchesPattern(const uint8_t* p, uint64_t n, uint64_t key,
                                         uint64_t offset = 0) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != patternByte(key, offset + i)) return false;
  }
  return true;
}

UDP_FUZZ_NO_COVERAGE uint64_t hashBytes(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// A heap block of exactly `n` bytes: anything read or written past a datagram's end is an
// ASan report, not a silent read of the rest of a larger buffer.
struct Exact {
  explicit Exact(std::span<const uint8_t> bytes)
      : size(bytes.size()), data(size ? new uint8_t[size] : nullptr) {
    if (size) std::memcpy(data.get(), bytes.data(), size);
  }
  std::span<const uint8_t> span() const { return {data.get(), size}; }
  size_t size;
  std::unique_ptr<uint8_t[]> data;
};

std::string hex(std::span<const uint8_t> b, size_t max = 96) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < b.size() && i < max; ++i) {
    s += digits[b[i] >> 4];
    s += digits[b[i] & 15];
  }
  if (b.size() > max) s += "...";
  return s + " (" + std::to_string(b.size()) + " bytes)";
}

// ---------------------------------------------------------------------------------------------
// Part 1: the wire format on its own.

void checkDecoded(std::span<const uint8_t> datagram, const DecodedPacket& p) {
  const size_t n = datagram.size();
  FUZZ_CHECK(n >= kCommonHeaderBytes && n <= kMaxDatagramBytes, hex(datagram));
  FUZZ_CHECK(datagram[0] == kWireVersion, hex(datagram));
  FUZZ_CHECK(p.header.sourceRank == *peekSourceRank(datagram), hex(datagram));
  std::vector<uint8_t> again(n + 8);
  size_t m = 0;
  switch (p.header.type) {
    case PacketType::kData: {
      const DataHeader& d = p.data;
      FUZZ_CHECK(p.packetNumber <= kMaxPacketNumber, hex(datagram));
      FUZZ_CHECK(d.messageLength <= kMaxMessageBytes, hex(datagram));
      FUZZ_CHECK(d.offset <= d.messageLength && d.fragmentLength <= d.messageLength - d.offset,
                 hex(datagram));
      FUZZ_CHECK((d.flags & ~data_flags::kKnown) == 0, hex(datagram));
      FUZZ_CHECK(!((d.flags & data_flags::kRendezvousRequest) &&
                   (d.flags & data_flags::kRendezvousData)),
                 hex(datagram));
      FUZZ_CHECK(!(d.flags & data_flags::kRestart) || (d.flags & data_flags::kInOrder),
                 hex(datagram));
      if (d.flags & data_flags::kTrimmed) {
        // Cut by a switch: the header alone, its fragment length that of the lost payload.
        FUZZ_CHECK(p.payload.empty() && n == kDataHeaderBytes && d.fragmentLength > 0,
                   hex(datagram));
        DataHeader whole = d;
        whole.flags &= static_cast<uint8_t>(~data_flags::kTrimmed);
        std::vector<uint8_t> zeros(d.fragmentLength), full(kDataHeaderBytes + d.fragmentLength);
        encodeData(full, p.header, p.packetNumber, whole, zeros.data());
        FUZZ_CHECK(trimData(full), hex(datagram));
        std::memcpy(again.data(), full.data(), full.size());
        m = full.size();
        break;
      }
      FUZZ_CHECK(p.payload.size() == d.fragmentLength, hex(datagram));
      // The payload must lie inside the datagram, at its end: the receiver copies from it.
      FUZZ_CHECK(p.payload.empty() ||
                     (p.payload.data() == datagram.data() + kDataHeaderBytes &&
                      kDataHeaderBytes + p.payload.size() == n),
                 hex(datagram));
      m = encodeData(again, p.header, p.packetNumber, d, p.payload.data());
      break;
    }
    case PacketType::kAck: {
      const AckFrame& a = p.ack;
      FUZZ_CHECK(a.rangeCount <= kMaxAckRanges, hex(datagram));
      for (uint16_t i = 0; i < a.rangeCount; ++i) {
        FUZZ_CHECK(a.ranges[i].smallest <= a.ranges[i].largest, hex(datagram));
        FUZZ_CHECK(a.ranges[i].largest <= kMaxPacketNumber, hex(datagram));
        // Descending, disjoint and non-adjacent: the sender's ACK processing relies on it.
        FUZZ_CHECK(i == 0 || a.ranges[i].largest + 1 < a.ranges[i - 1].smallest, hex(datagram));
      }
      m = encodeAck(again, p.header, a);
      break;
    }
    case PacketType::kCts:
      FUZZ_CHECK(p.cts.count >= 1 && p.cts.count <= kMaxCtsIds, hex(datagram));
      m = encodeCts(again, p.header, p.packetNumber,
                    std::span<const MessageId>(p.cts.ids.data(), p.cts.count));
      break;
    case PacketType::kPing:
      m = encodePing(again, p.header, p.packetNumber);
      break;
    case PacketType::kNack:
      FUZZ_CHECK(p.nack.count >= 1 && p.nack.count <= kMaxNackNumbers, hex(datagram));
      m = encodeNack(again, p.header,
                     std::span<const PacketNumber>(p.nack.numbers.data(), p.nack.count));
      break;
    case PacketType::kCredit:
      FUZZ_CHECK((p.credit.flags & ~credit_flags::kKnown) == 0, hex(datagram));
      m = encodeCredit(again, p.header, p.credit);
      break;
    case PacketType::kClose:
      m = encodeClose(again, p.header);
      break;
    default:
      FUZZ_CHECK(false, "decoded an unknown packet type: " + hex(datagram));
  }
  // The decoder rejects every non-canonical form (reserved bits, trailing bytes, ...), so a
  // datagram it accepts is exactly what the encoder would write for the same fields.
  FUZZ_CHECK(m == n && std::memcmp(again.data(), datagram.data(), n) == 0,
             "re-encoding differs: in " + hex(datagram) + " out " +
                 hex(std::span<const uint8_t>(again.data(), m)));
}

void checkCodec(std::span<const uint8_t> input) {
  const Exact raw(input);
  const auto peeked = peekSourceRank(raw.span());
  FUZZ_CHECK(peeked.has_value() == (raw.size >= kCommonHeaderBytes), hex(raw.span()));
  DecodedPacket p;
  if (decodePacket(raw.span(), p) == DecodeError::kNone) {
    checkDecoded(raw.span(), p);
    // CRC32C catches every single-bit error: one flipped bit anywhere must stop the datagram.
    Exact flipped(raw.span());
    const size_t bit = hashBytes(raw.data.get(), raw.size) % (raw.size * 8);
    flipped.data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    DecodedPacket q;
    FUZZ_CHECK(decodePacket(flipped.span(), q) != DecodeError::kNone,
               "a one-bit change went unnoticed: " + hex(flipped.span()));
  }
  if (raw.size < kCommonHeaderBytes) return;
  // Random bytes almost never carry a valid checksum: reseal them so that the length, offset
  // and count checks behind the checksum see fuzzed values too.
  Exact sealed(raw.span());
  sealChecksum(std::span<uint8_t>(sealed.data.get(), sealed.size));
  const DecodeError e = decodePacket(sealed.span(), p);
  FUZZ_CHECK(e != DecodeError::kBadChecksum, "resealed datagram fails its checksum: " +
                                                 hex(sealed.span()));
  if (e == DecodeError::kNone) checkDecoded(sealed.span(), p);
}

// ---------------------------------------------------------------------------------------------
// Part 2: two connections driven by a script.

class Script {
 public:
  Script(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint64_t le(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{u8()} << (8 * i);
    return v;
  }
  uint16_t u16() { return static_cast<uint16_t>(le(2)); }
  // A value for a numeric field: usually near `base` (where the state makes it interesting),
  // sometimes an edge value, sometimes anything.
  uint64_t near(uint64_t base) {
    const uint8_t how = u8();
    switch (how & 3) {
      case 0:
      case 1: {
        const auto delta = static_cast<int8_t>(u8());
        return delta < 0 && base < uint64_t(-int64_t{delta}) ? 0 : base + delta;
      }
      case 2: return kInteresting[(how >> 2) % std::size(kInteresting)];
      default: return le(8);
    }
  }
  std::span<const uint8_t> take(size_t n) {
    n = std::min(n, size_ - pos_);
    std::span<const uint8_t> s(data_ + pos_, n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

enum Op : uint8_t {
  kPost,
  kSend,
  kCancel,
  kPump,
  kDeliver,
  kMutate,
  kRaw,
  kCraft,
  kAdvance,
  kTimeout,
  kFail,
  kBurst,
  kOpCount
};

UdpConfig configFrom(Script& s) {
  const uint8_t a = s.u8(), b = s.u8(), d = s.u8();
  UdpConfig c;
  c.lossRecovery = (a & 1) ? "go_back_n" : "selective_repeat";
  c.congestion = (a & 2) ? "aimd" : "none";
  static constexpr size_t kMtus[] = {256, 600, 1472, 9000};
  c.mtuPayload = kMtus[(a >> 2) & 3];
  static constexpr uint64_t kBudgets[] = {1024, 4096, 32768, uint64_t{1} << 20};
  c.unexpectedBytes = kBudgets[(a >> 4) & 3];
  static constexpr uint64_t kEager[] = {0, 300, 2000, 8192};
  c.eagerMaxBytes = std::min(kEager[(a >> 6) & 3], c.unexpectedBytes - kMessageChargeBytes);
  c.ackEvery = 1 + (b & 3);
  c.reorderThreshold = 1 + ((b >> 2) & 3);
  static constexpr DurationUs kAckDelays[] = {0, 25, 100, 2000};
  c.maxAckDelayUs = kAckDelays[(b >> 4) & 3];
  c.maxRtoExpiries = (b & 0x40) ? 3 : 10;
  if (b & 0x80) c.maxMessageBytes = 4096;  // longer sends throw; longer arrivals are violations
  static constexpr DurationUs kRtoMins[] = {1, 200, 1000, 5000};
  c.rtoMinUs = kRtoMins[d & 3];
  static constexpr DurationUs kInitialRtts[] = {1, 100, 1000, 20000};
  c.initialRttUs = kInitialRtts[(d >> 2) & 3];
  static constexpr uint32_t kCwnds[] = {2, 4, 10, 32};
  c.initialCwndPackets = kCwnds[(d >> 4) & 3];
  c.minCwndPackets = 2;
  const uint64_t windows[] = {c.mtuPayload, 4 * c.mtuPayload, 64 << 10, 512 << 10};
  c.sendWindowBytes = std::max<uint64_t>(windows[(d >> 6) & 3], c.mtuPayload);
  return c;
}

struct Receive {
  Receive(ReceiveId id_, Tag tag_, Tag mask_, size_t cap_)
      : id(id_), tag(tag_), mask(mask_), cap(cap_), storage(new uint8_t[cap_ + 2 * kGuard]) {
    std::memset(storage.get(), kGuardByte, cap + 2 * kGuard);
    // Guards are poisoned for good: under ASan a stray write is reported where it happens.
    ASAN_POISON_MEMORY_REGION(storage.get(), kGuard);
    ASAN_POISON_MEMORY_REGION(data() + cap, kGuard);
  }
  ~Receive() { ASAN_UNPOISON_MEMORY_REGION(storage.get(), cap + 2 * kGuard); }
  Receive(const Receive&) = delete;
  Receive& operator=(const Receive&) = delete;
  uint8_t* data() { return storage.get() + kGuard; }
  // From now on the core must not touch the buffer.
  void freeze() {
    if (frozen) return;
    frozen = true;
    frozenHash = hashBytes(data(), cap);
    ASAN_POISON_MEMORY_REGION(data(), cap);
  }
  bool guardsIntact() {
    ASAN_UNPOISON_MEMORY_REGION(storage.get(), cap + 2 * kGuard);
    for (size_t i = 0; i < kGuard; ++i) {
      if (storage[i] != kGuardByte || data()[cap + i] != kGuardByte) return false;
    }
    return true;
  }

  ReceiveId id;
  Tag tag, mask;
  size_t cap;
  std::unique_ptr<uint8_t[]> storage;
  bool cancelRequested = false;
  bool terminal = false;
  bool frozen = false;
  uint64_t frozenHash = 0;
};

struct Send {
  Send(Tag tag_, uint64_t length_, uint64_t key_)
      : tag(tag_), length(length_), key(key_), data(length_ ? new uint8_t[length_] : nullptr) {
    for (uint64_t i = 0; i < length; ++i) data[i] = patternByte(key, i);
  }
  ~Send() { ASAN_UNPOISON_MEMORY_REGION(data.get(), length); }
  Send(const Send&) = delete;
  Send& operator=(const Send&) = delete;
  Tag tag;
  uint64_t length;
  uint64_t key;
  std::unique_ptr<uint8_t[]> data;
  bool terminal = false;
  bool completed = false;
};

struct Side {
  int rank = 0;
  std::unique_ptr<PeerConnection> conn;
  std::unique_ptr<uint8_t[]> txBuffer;  // exactly mtu_payload bytes
  std::vector<std::unique_ptr<Receive>> receives;  // index == ReceiveId
  std::vector<std::unique_ptr<Send>> sends;        // index == MessageId
  std::deque<std::vector<uint8_t>> wire;           // emitted, not yet delivered to the peer
  std::vector<std::vector<uint8_t>> history;       // recent emissions, for replays/mutations
  size_t historyNext = 0;
  uint64_t fed = 0;                 // datagrams handed to onDatagram
  PacketNumber nextPacketNumber = 0;  // of the next reliable packet this side emits
  bool peerFailedSeen = false;
  bool anyCancel = false;
  bool anyInexactMask = false;
  std::map<Tag, uint64_t> deliveredByTag;  // kMessageReceived events, by the message's tag
};

class Harness {
 public:
  explicit Harness(const UdpConfig& config) : config_(config) {
    for (int i = 0; i < 2; ++i) {
      Side& s = sides_[i];
      s.rank = i;
      PeerIdentity id;
      id.localRank = static_cast<uint16_t>(i);
      id.peerRank = static_cast<uint16_t>(1 - i);
      id.sessionToken = kToken;
      s.conn = std::make_unique<PeerConnection>(config, id);
      s.txBuffer.reset(new uint8_t[config.mtuPayload]);
    }
  }

  void run(Script& s) {
    while (!s.done()) {
      const uint8_t opcode = s.u8();
      const int side = opcode & 1;
      switch (static_cast<Op>((opcode >> 1) % kOpCount)) {
        case kPost: post(side, s); break;
        case kSend: send(side, s); break;
        case kCancel: cancel(side, s); break;
        case kPump: pump(side); break;
        case kDeliver: deliverHonest(side, s); break;
        case kMutate: mutate(side, s); break;
        case kRaw: raw(side, s); break;
        case kCraft: craft(side, s); break;
        case kAdvance: advance(s); break;
        case kTimeout: sides_[side].conn->onTimeout(now_); break;
        case kFail:
          if ((s.u8() & 7) == 0) sides_[side].conn->fail("failed by the fuzz script");
          break;
        case kBurst: burst(side, s); break;
        case kOpCount: break;
      }
      drainEvents(0);
      drainEvents(1);
    }
    settle();
    finalChecks();
  }

 private:
  Side& peerOf(int side) { return sides_[1 - side]; }

  size_t maxFragment() const { return maxFragmentBytes(config_.mtuPayload); }

  // Sizes that sit on the boundaries the core cares about.
  uint64_t interestingSize(uint8_t pick) const {
    const uint64_t f = maxFragment();
    const uint64_t e = config_.eagerMaxBytes;
    const uint64_t sizes[] = {0,     1,     7,         f - 1, f,    f + 1, 2 * f + 3,
                              e,     e + 1, e ? e - 1 : 0, 3000, 5000, 20000, 16};
    return sizes[pick % std::size(sizes)];
  }

  void post(int side, Script& s) {
    Side& me = sides_[side];
    const Tag tag = s.u8() & 3;
    const uint8_t maskPick = s.u8();
    const Tag mask = maskPick < 200 ? ~Tag{0} : (maskPick & 1 ? Tag{0} : Tag{2});
    const size_t cap = std::min<uint64_t>(interestingSize(s.u8()), 20000);
    if (me.receives.size() >= kMaxReceives) return;
    auto r = std::make_unique<Receive>(0, tag, mask, cap);
    const ReceiveId id = me.conn->postReceive(tag, mask, r->data(), cap);
    FUZZ_CHECK(id == me.receives.size(), "receive ids are 0, 1, 2, ... in post order: got " +
                                             std::to_string(id));
    r->id = id;
    if (mask != ~Tag{0}) me.anyInexactMask = true;
    me.receives.push_back(std::move(r));
  }

  void send(int side, Script& s) {
    Side& me = sides_[side];
    const Tag tag = s.u8() & 3;
    const uint64_t length = interestingSize(s.u8());
    if (me.sends.size() >= kMaxSends) return;
    const uint64_t key = (uint64_t(side) << 32) | (me.sends.size() + 1);
    auto m = std::make_unique<Send>(tag, length, key);
    if (length > config_.maxMessageBytes) {
      bool threw = false;
      try {
        me.conn->send(tag, m->data.get(), length);
      } catch (const std::invalid_argument&) {
        threw = true;
      }
      FUZZ_CHECK(threw, "send beyond max_message_bytes was accepted");
      return;
    }
    const MessageId id = me.conn->send(tag, m->data.get(), length);
    FUZZ_CHECK(id == me.sends.size(), "message ids are 0, 1, 2, ... in send order: got " +
                                          std::to_string(id));
    me.sends.push_back(std::move(m));
  }

  void cancel(int side, Script& s) {
    Side& me = sides_[side];
    const uint8_t pick = s.u8();
    if (me.receives.empty()) return;
    Receive& r = *me.receives[pick % me.receives.size()];
    const bool took = me.conn->cancelReceive(r.id);
    if (!took) return;
    FUZZ_CHECK(!r.terminal && !r.cancelRequested,
               "cancelReceive(" + std::to_string(r.id) + ") took effect twice or after the end");
    r.cancelRequested = true;
    me.anyCancel = true;
    r.freeze();
  }

  // Everything the side wants to send now goes onto the link.
  void pump(int side) {
    Side& me = sides_[side];
    const std::span<uint8_t> out(me.txBuffer.get(), config_.mtuPayload);
    for (size_t i = 0;; ++i) {
      const size_t n = me.conn->pollTransmit(now_, out);
      if (n == 0) return;
      FUZZ_CHECK(i < kMaxPump, "pollTransmit never stops producing datagrams");
      std::vector<uint8_t> d(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n));
      checkEmitted(side, d);
      if (me.wire.size() >= kMaxWire) me.wire.pop_front();
      me.wire.push_back(d);
      if (me.history.size() < kHistory) {
        me.history.push_back(std::move(d));
      } else {
        me.history[me.historyNext++ % kHistory] = std::move(d);
      }
    }
  }

  void checkEmitted(int side, const std::vector<uint8_t>& d) {
    Side& me = sides_[side];
    const auto what = [&] { return "side " + std::to_string(side) + " emitted " + hex(d); };
    FUZZ_CHECK(d.size() <= config_.mtuPayload, what());
    DecodedPacket p;
    const DecodeError e = decodePacket(d, p);
    FUZZ_CHECK(e == DecodeError::kNone, std::string(decodeErrorName(e)) + ": " + what());
    checkDecoded(d, p);
    FUZZ_CHECK(p.header.token == kToken && p.header.sourceRank == me.rank, what());
    if (p.header.type != PacketType::kAck && p.header.type != PacketType::kNack &&
        p.header.type != PacketType::kCredit && p.header.type != PacketType::kClose) {
      // One number per reliable packet, retransmissions included, never reused.
      FUZZ_CHECK(p.packetNumber == me.nextPacketNumber,
                 "expected packet number " + std::to_string(me.nextPacketNumber) + ": " + what());
      ++me.nextPacketNumber;
    }
    switch (p.header.type) {
      case PacketType::kData: {
        const DataHeader& h = p.data;
        FUZZ_CHECK(h.messageId < me.sends.size(), "DATA for a message never sent: " + what());
        const Send& m = *me.sends[h.messageId];
        FUZZ_CHECK(!m.terminal, "DATA for a message already completed or failed: " + what());
        FUZZ_CHECK(h.tag == m.tag && h.messageLength == m.length, what());
        FUZZ_CHECK(h.fragmentLength <= maxFragment(), what());
        FUZZ_CHECK(matchesPattern(p.payload.data(), p.payload.size(), m.key, h.offset),
                   "DATA payload is not the message's bytes at its offset: " + what());
        break;
      }
      case PacketType::kAck:
        if (!tainted_) {
          FUZZ_CHECK(p.ack.rangeCount == 0 || p.ack.largest() < peerOf(side).nextPacketNumber,
                     "ACK of a packet the peer never sent: " + what());
        }
        break;
      case PacketType::kCts:
        if (!tainted_) {
          for (uint16_t i = 0; i < p.cts.count; ++i) {
            FUZZ_CHECK(p.cts.ids[i] < peerOf(side).sends.size(),
                       "CTS for a message the peer never sent: " + what());
          }
        }
        break;
      case PacketType::kPing:
      case PacketType::kCredit:
      case PacketType::kClose: break;
      case PacketType::kNack:
        if (!tainted_) {
          for (uint16_t i = 0; i < p.nack.count; ++i) {
            FUZZ_CHECK(p.nack.numbers[i] < peerOf(side).nextPacketNumber,
                       "NACK of a packet the peer never sent: " + what());
          }
        }
        break;
    }
  }

  // Hands one datagram to `to` and checks how it was accounted for.
  void deliver(int to, std::span<const uint8_t> bytes, bool honest) {
    Side& rx = sides_[to];
    const Exact d(bytes);
    DecodedPacket p;
    const DecodeError error = decodePacket(d.span(), p);
    const bool failedBefore = rx.conn->failed();
    const Stats before = rx.conn->stats();
    rx.conn->onDatagram(d.span(), now_);
    ++rx.fed;
    const Stats after = rx.conn->stats();
    const auto what = [&] {
      return std::string(honest ? "honest" : "forged") + " datagram to side " +
             std::to_string(to) + ": " + hex(d.span());
    };

    FUZZ_CHECK(after.datagramsReceived == before.datagramsReceived + 1 &&
                   after.datagramsReceived == rx.fed,
               what());
    FUZZ_CHECK(after.bytesReceived == before.bytesReceived + d.size, what());
    const uint64_t accepted = after.datagramsAccepted - before.datagramsAccepted;
    const uint64_t dropped = after.datagramsDropped - before.datagramsDropped;
    FUZZ_CHECK(accepted + dropped == 1, "accepted " + std::to_string(accepted) + " dropped " +
                                            std::to_string(dropped) + ": " + what());
    std::optional<DropReason> reason;
    for (size_t r = 0; r < after.droppedBy.size(); ++r) {
      const uint64_t delta = after.droppedBy[r] - before.droppedBy[r];
      FUZZ_CHECK(delta <= 1 && (delta == 0 || !reason),
                 "counted under more than one drop reason: " + what());
      if (delta) reason = static_cast<DropReason>(r);
    }
    FUZZ_CHECK(reason.has_value() == (dropped == 1), "drop without a reason: " + what());

    // What the datagram deserves whatever the connection's state.
    std::optional<DropReason> deserved;
    if (failedBefore) {
      deserved = DropReason::kClosed;
    } else if (error != DecodeError::kNone) {
      switch (error) {
        case DecodeError::kTruncated: deserved = DropReason::kTruncated; break;
        case DecodeError::kBadVersion: deserved = DropReason::kBadVersion; break;
        case DecodeError::kBadType: deserved = DropReason::kBadType; break;
        case DecodeError::kBadChecksum: deserved = DropReason::kBadChecksum; break;
        default: deserved = DropReason::kMalformed; break;
      }
    } else if (p.header.token != kToken) {
      deserved = DropReason::kBadToken;
    } else if (p.header.sourceRank != 1 - to) {
      deserved = DropReason::kWrongPeer;
    }
    const std::string got = reason ? dropReasonName(*reason) : "accepted";
    if (deserved) {
      FUZZ_CHECK(reason == deserved, "expected drop as " + std::string(dropReasonName(*deserved)) +
                                         ", got " + got + ": " + what());
      return;
    }
    FUZZ_CHECK(!reason || *reason == DropReason::kProtocol ||
                   (*reason == DropReason::kStale && p.header.type != PacketType::kAck &&
                    p.header.type != PacketType::kNack) ||
                   (*reason == DropReason::kAfterGap && p.header.type == PacketType::kData &&
                    (p.data.flags & data_flags::kInOrder)),
               "unexpected drop reason " + got + ": " + what());
    // A connection that only ever saw honest traffic has no reason to call any of it a
    // protocol violation.
    FUZZ_CHECK(!honest || tainted_ || reason != DropReason::kProtocol,
               "honest datagram dropped as a protocol violation: " + what());
    // A forged datagram that got this far may have changed state in ways the honest peer
    // never would: from here on, checks that assume honest traffic are off.
    if (!honest) tainted_ = true;
  }

  void deliverHonest(int to, Script& s) {
    Side& from = peerOf(to);
    const uint8_t mode = s.u8();
    const uint8_t pick = s.u8();
    if (from.wire.empty()) return;
    switch (mode & 7) {
      case 0:
      case 1: {  // in order
        std::vector<uint8_t> d = std::move(from.wire.front());
        from.wire.pop_front();
        deliver(to, d, true);
        break;
      }
      case 2: {  // out of order
        const size_t i = pick % from.wire.size();
        std::vector<uint8_t> d = std::move(from.wire[i]);
        from.wire.erase(from.wire.begin() + static_cast<std::ptrdiff_t>(i));
        deliver(to, d, true);
        break;
      }
      case 3: {  // duplicated: the copy stays on the link
        const std::vector<uint8_t> d = from.wire[pick % from.wire.size()];
        deliver(to, d, true);
        break;
      }
      case 4:  // lost
        from.wire.erase(from.wire.begin() +
                        static_cast<std::ptrdiff_t>(pick % from.wire.size()));
        break;
      case 5:    // everything queued, in order, with a loss pattern (many ACK ranges)
      case 6: {  // everything queued, last first
        std::deque<std::vector<uint8_t>> all;
        all.swap(from.wire);
        if ((mode & 7) == 6) std::reverse(all.begin(), all.end());
        for (size_t i = 0; i < all.size(); ++i) {
          if ((mode & 7) == 5 && ((pick >> (i % 8)) & 1)) continue;
          deliver(to, all[i], true);
        }
        break;
      }
      default:  // everything queued, in order
        while (!from.wire.empty()) {
          std::vector<uint8_t> d = std::move(from.wire.front());
          from.wire.pop_front();
          deliver(to, d, true);
        }
        break;
    }
  }

  // Forged PINGs with gaps between their packet numbers: more ranges than an ACK can carry,
  // so the receiver's history of packet numbers has to forget its oldest ones.
  void burst(int to, Script& s) {
    Side& from = peerOf(to);
    const size_t count = 1 + s.u8();
    const uint64_t stride = 1 + s.u8() % 4;
    const PacketNumber base = std::min(s.near(from.nextPacketNumber), kMaxPacketNumber);
    std::array<uint8_t, kPingBytes> d{};
    PacketHeader h;
    h.sourceRank = static_cast<uint16_t>(1 - to);
    h.token = kToken;
    for (size_t i = 0; i < count; ++i) {
      const PacketNumber pn = std::min(base + i * stride, kMaxPacketNumber);
      encodePing(d, h, pn);
      deliver(to, d, false);
    }
  }

  // A copy of an honest datagram (from the link or from history), changed: the checksum is
  // recomputed unless the script says not to, so the change reaches the checks behind it.
  void mutate(int to, Script& s) {
    Side& from = peerOf(to);
    const uint8_t source = s.u8();
    const uint8_t kind = s.u8();
    const uint16_t where = s.u16();
    const uint64_t value = s.near(0);
    std::vector<uint8_t> d;
    if (!from.wire.empty() && (source & 1)) {
      d = from.wire[(source >> 1) % from.wire.size()];
    } else if (!from.history.empty()) {
      d = from.history[(source >> 1) % from.history.size()];
    } else {
      return;
    }
    const std::vector<uint8_t> original = d;
    static constexpr size_t kFieldOffsets[] = {0,  1,  2,  3,  8,  15, 16, 23, 24, 26, 28,
                                               32, 36, 38, 40, 44, 48, 56, 57, 58, 59, 60};
    switch (kind & 7) {
      case 0:  // one bit
        if (!d.empty()) d[where % d.size()] ^= static_cast<uint8_t>(1u << (value & 7));
        break;
      case 1:  // cut short
        d.resize(where % (d.size() + 1));
        break;
      case 2: {  // a header field overwritten
        const size_t width = size_t{1} << ((kind >> 3) & 3);
        const size_t at = kFieldOffsets[where % std::size(kFieldOffsets)];
        for (size_t i = 0; i < width && at + i < d.size(); ++i) {
          d[at + i] = static_cast<uint8_t>(value >> (8 * i));
        }
        break;
      }
      case 3:  // grown
        for (size_t i = 0; i < 1 + where % 64u; ++i) d.push_back(static_cast<uint8_t>(value + i));
        break;
      case 4: {  // spliced with another
        if (from.history.empty()) break;
        const auto& other = from.history[value % from.history.size()];
        d.resize(where % (d.size() + 1));
        const size_t skip = std::min<size_t>(other.size(), (where >> 8) % (other.size() + 1));
        d.insert(d.end(), other.begin() + static_cast<std::ptrdiff_t>(skip), other.end());
        break;
      }
      case 5:  // another session's token
        if (d.size() >= 16) d[8 + where % 8] ^= static_cast<uint8_t>(1 + (value & 0x7f));
        break;
      case 6:  // from an address that is not the peer's (another source rank)
        if (d.size() >= 4) {
          const uint16_t rank = static_cast<uint16_t>(value == uint64_t(1 - to) ? 7 : value);
          d[2] = static_cast<uint8_t>(rank);
          d[3] = static_cast<uint8_t>(rank >> 8);
        }
        break;
      default:  // another packet type with the same body
        if (d.size() >= 2) d[1] = static_cast<uint8_t>(value % 6);
        break;
    }
    if ((kind & 0xc0) != 0xc0) sealChecksum(d);
    deliver(to, d, d == original);
  }

  // Bytes straight from the input, optionally dressed as a datagram of this session.
  void raw(int to, Script& s) {
    const uint8_t flags = s.u8();
    const size_t length = (flags & 0x80) ? s.u16() % 2048 : s.u8();
    std::vector<uint8_t> d;
    const auto bytes = s.take(length);
    d.assign(bytes.begin(), bytes.end());
    if ((flags & 1) && d.size() >= kCommonHeaderBytes) {
      d[0] = kWireVersion;
      d[1] = static_cast<uint8_t>(1 + ((flags >> 1) & 3));
      d[2] = static_cast<uint8_t>(1 - to);
      d[3] = 0;
      for (int i = 0; i < 8; ++i) d[8 + i] = static_cast<uint8_t>(kToken >> (8 * i));
    }
    if (flags & 0x41) sealChecksum(d);
    deliver(to, d, false);
  }

  // A well-formed datagram of this session with fuzzed field values, aimed near the state of
  // the connection that receives it (its own packet numbers, the peer's message ids).
  void craft(int to, Script& s) {
    Side& rx = sides_[to];
    Side& from = peerOf(to);
    const uint8_t kind = s.u8();
    PacketHeader h;
    h.sourceRank = static_cast<uint16_t>(1 - to);
    h.token = kToken;
    if ((kind & 0x30) == 0x30) {
      if (kind & 0x40) {
        h.token ^= uint64_t{1} << (kind & 63);
      } else {
        h.sourceRank = static_cast<uint16_t>(2 + (kind & 7));
      }
    }
    std::vector<uint8_t> d(kMaxDatagramBytes);
    size_t n = 0;
    switch (kind & 3) {
      case 0: {
        const PacketNumber pn = std::min(s.near(from.nextPacketNumber), kMaxPacketNumber);
        DataHeader dh;
        dh.tag = s.u8() & 3;
        dh.messageId = s.near(from.sends.size());
        dh.messageLength = std::min(s.near(interestingSize(s.u8())), kMaxMessageBytes);
        dh.offset = std::min(s.near(0), dh.messageLength);
        const uint64_t room = std::min<uint64_t>(dh.messageLength - dh.offset, maxFragment());
        dh.fragmentLength = static_cast<uint16_t>(room ? s.u16() % (room + 1) : 0);
        dh.flags = s.u8() & ((kind & 0x80) ? 0xff : data_flags::kKnown);
        std::vector<uint8_t> payload(dh.fragmentLength);
        for (size_t i = 0; i < payload.size(); ++i) payload[i] = patternByte(dh.messageId, i);
        n = encodeData(d, h, pn, dh, payload.data());
        break;
      }
      case 1: {
        AckFrame a;
        a.creditLimit = s.near(config_.unexpectedBytes);
        a.ackDelayUs = static_cast<uint32_t>(s.near(0));
        a.rangeCount = static_cast<uint16_t>(s.u8() % 5);
        PacketNumber top = std::min(s.near(rx.nextPacketNumber), kMaxPacketNumber);
        for (uint16_t i = 0; i < a.rangeCount; ++i) {
          const uint64_t length = s.u8() % 8;
          a.ranges[i] = {top >= length ? top - length : 0, top};
          const uint64_t gap = 1 + s.u8() % 4;
          if (a.ranges[i].smallest < gap + 1) {
            a.rangeCount = static_cast<uint16_t>(i + 1);
            break;
          }
          top = a.ranges[i].smallest - gap - 1;
        }
        n = encodeAck(d, h, a);
        break;
      }
      case 2: {
        const PacketNumber pn = std::min(s.near(from.nextPacketNumber), kMaxPacketNumber);
        std::vector<MessageId> ids(1 + s.u8() % 4);
        for (auto& id : ids) id = s.near(rx.sends.size());
        n = encodeCts(d, h, pn, ids);
        break;
      }
      default:
        n = encodePing(d, h, std::min(s.near(from.nextPacketNumber), kMaxPacketNumber));
        break;
    }
    d.resize(n);
    deliver(to, d, false);
  }

  void advance(Script& s) {
    static constexpr DurationUs kSteps[] = {0, 1, 10, 60, 100, 500, 1000, 5000, 30000, 250000};
    now_ += kSteps[s.u8() % std::size(kSteps)];
    for (Side& side : sides_) {
      if (const auto t = side.conn->nextTimeout(); t && *t <= now_) side.conn->onTimeout(now_);
    }
  }

  void drainEvents(int side) {
    Side& me = sides_[side];
    while (const auto e = me.conn->pollEvent()) checkEvent(side, *e);
    if (me.conn->failed()) {
      // A failed connection ends everything it had: nothing may be left waiting.
      FUZZ_CHECK(me.peerFailedSeen, "connection failed without kPeerFailed");
      for (const auto& r : me.receives) {
        FUZZ_CHECK(r->terminal, "receive " + std::to_string(r->id) + " outlived the failure");
      }
      for (size_t i = 0; i < me.sends.size(); ++i) {
        FUZZ_CHECK(me.sends[i]->terminal, "send " + std::to_string(i) + " outlived the failure");
      }
    }
  }

  void checkEvent(int side, const Event& e) {
    Side& me = sides_[side];
    const std::string what = "side " + std::to_string(side) + " event " +
                             eventKindName(e.kind) + " id " + std::to_string(e.id);
    switch (e.kind) {
      case EventKind::kMessageReceived:
      case EventKind::kReceiveCancelled:
      case EventKind::kReceiveFailed: {
        FUZZ_CHECK(e.id < me.receives.size(), "no such receive: " + what);
        Receive& r = *me.receives[e.id];
        FUZZ_CHECK(!r.terminal, "second terminal event: " + what);
        r.terminal = true;
        if (e.kind == EventKind::kReceiveCancelled) {
          FUZZ_CHECK(r.cancelRequested, "cancelled without cancelReceive: " + what);
        } else if (e.kind == EventKind::kReceiveFailed) {
          // A CLOSE (here only a forged one) fails the receives that no message has taken.
          FUZZ_CHECK(me.conn->failed() || me.conn->peerClosed(),
                     "receive failed on a live connection: " + what);
        } else {
          FUZZ_CHECK(!r.cancelRequested, "delivered after a successful cancel: " + what);
          checkDelivery(side, r, e);
          if (kPlantedOverflow) r.data()[r.cap] ^= 0x5a;
        }
        r.freeze();
        break;
      }
      case EventKind::kSendCompleted:
      case EventKind::kSendFailed: {
        FUZZ_CHECK(e.id < me.sends.size(), "no such send: " + what);
        Send& m = *me.sends[e.id];
        FUZZ_CHECK(!m.terminal, "second terminal event: " + what);
        FUZZ_CHECK(e.tag == m.tag && e.bytes == m.length, what);
        FUZZ_CHECK(e.kind == EventKind::kSendCompleted || me.conn->failed(),
                   "send failed on a live connection: " + what);
        // The core only reads a send buffer.
        FUZZ_CHECK(matchesPattern(m.data.get(), m.length, m.key), "send buffer changed: " + what);
        m.terminal = true;
        m.completed = e.kind == EventKind::kSendCompleted;
        // The buffer is the caller's again: any later access by the core is a bug.
        ASAN_POISON_MEMORY_REGION(m.data.get(), m.length);
        break;
      }
      case EventKind::kPeerFailed:
        FUZZ_CHECK(!me.peerFailedSeen && me.conn->failed(), what);
        me.peerFailedSeen = true;
        break;
    }
  }

  void checkDelivery(int side, Receive& r, const Event& e) {
    Side& me = sides_[side];
    const std::string what = "side " + std::to_string(side) + " receive " + std::to_string(r.id) +
                             " (tag " + std::to_string(r.tag) + " cap " + std::to_string(r.cap) +
                             ") got tag " + std::to_string(e.tag) + " bytes " +
                             std::to_string(e.bytes);
    FUZZ_CHECK((e.tag & r.mask) == (r.tag & r.mask), "tag does not match: " + what);
    FUZZ_CHECK(e.truncated == (e.bytes > r.cap), "truncated flag wrong: " + what);
    ++me.deliveredByTag[e.tag];
    if (tainted_) return;
    // Honest traffic only: the bytes are those of a message the peer sent with that tag and
    // length (which one is up to matching order).
    const Side& peer = peerOf(side);
    const uint64_t shown = std::min<uint64_t>(e.bytes, r.cap);
    bool found = false;
    uint64_t sent = 0;
    for (const auto& m : peer.sends) {
      if (m->tag != e.tag) continue;
      ++sent;
      if (!found && m->length == e.bytes && matchesPattern(r.data(), shown, m->key)) found = true;
    }
    FUZZ_CHECK(found, "delivered bytes are no message the peer sent: " + what);
    FUZZ_CHECK(me.deliveredByTag[e.tag] <= sent, "more deliveries than sends: " + what);
  }

  // Lets both sides finish what they can over a lossless link, then checks that nothing is
  // stuck that the protocol promises to deliver.
  void settle() {
    const TimeUs deadline = now_ + kSettleTimeUs;
    for (int round = 0; round < kSettleRounds && now_ < deadline; ++round) {
      bool moved = false;
      for (int side = 0; side < 2; ++side) {
        pump(side);
        Side& from = sides_[side];
        while (!from.wire.empty()) {
          std::vector<uint8_t> d = std::move(from.wire.front());
          from.wire.pop_front();
          deliver(1 - side, d, true);
          moved = true;
        }
        drainEvents(0);
        drainEvents(1);
      }
      if (moved) continue;
      if (livenessSatisfied(0) && livenessSatisfied(1)) return;
      std::optional<TimeUs> next;
      for (Side& side : sides_) {
        if (const auto t = side.conn->nextTimeout(); t && (!next || *t < *next)) next = t;
      }
      if (!next) break;
      now_ = std::max(now_, *next);
      for (Side& side : sides_) {
        if (const auto t = side.conn->nextTimeout(); t && *t <= now_) side.conn->onTimeout(now_);
      }
      drainEvents(0);
      drainEvents(1);
    }
    for (int side = 0; side < 2; ++side) {
      FUZZ_CHECK(livenessSatisfied(side), "side " + std::to_string(side) + " is stuck: " +
                                              livenessProblem(side));
    }
  }

  bool livenessSatisfied(int side) { return livenessProblem(side).empty(); }

  // Empty if the receiving side `side` has got everything it must get, or if the checks do
  // not apply (forged traffic got in, a side failed, masks or cancels make matching depend on
  // timing, or the credit could run out and legitimately hold messages back).
  std::string livenessProblem(int side) {
    Side& me = sides_[side];
    Side& peer = peerOf(side);
    if (tainted_ || me.conn->failed() || peer.conn->failed() || me.anyCancel ||
        me.anyInexactMask) {
      return {};
    }
    uint64_t charges = 0;
    for (const auto& m : peer.sends) {
      charges += kMessageChargeBytes + (m->length <= config_.eagerMaxBytes ? m->length : 0);
    }
    if (charges > config_.unexpectedBytes) return {};
    std::map<Tag, uint64_t> sent, waiting;
    for (const auto& m : peer.sends) ++sent[m->tag];
    for (const auto& r : me.receives) {
      if (!r->terminal) ++waiting[r->tag];
    }
    for (const auto& [tag, count] : waiting) {
      const uint64_t delivered = me.deliveredByTag[tag];
      if (count > 0 && sent[tag] > delivered) {
        return std::to_string(count) + " receive(s) for tag " + std::to_string(tag) +
               " wait while " + std::to_string(sent[tag] - delivered) +
               " message(s) with that tag were sent and never delivered";
      }
    }
    for (size_t i = 0; i < peer.sends.size(); ++i) {
      const Send& m = *peer.sends[i];
      // Eager messages complete once acknowledged, matched or not; rendezvous ones once
      // delivered, which every message of a tag is when receives for it are waiting.
      const bool delivered = waiting[m.tag] > 0 || m.length <= config_.eagerMaxBytes ||
                             me.deliveredByTag[m.tag] >= sent[m.tag];
      if (delivered && !m.completed) {
        return "send " + std::to_string(i) + " (tag " + std::to_string(m.tag) + ", " +
               std::to_string(m.length) + " bytes) never completed";
      }
    }
    return {};
  }

  void finalChecks() {
    for (Side& me : sides_) {
      for (const auto& r : me.receives) {
        FUZZ_CHECK(r->guardsIntact(), "guard bytes around receive " + std::to_string(r->id) +
                                          " (capacity " + std::to_string(r->cap) +
                                          ") were overwritten");
        if (r->frozen) {
          FUZZ_CHECK(hashBytes(r->data(), r->cap) == r->frozenHash,
                     "receive " + std::to_string(r->id) + " was written after its end");
        }
      }
      for (const auto& m : me.sends) {
        ASAN_UNPOISON_MEMORY_REGION(m->data.get(), m->length);
        FUZZ_CHECK(matchesPattern(m->data.get(), m->length, m->key), "a send buffer changed");
      }
      const Stats st = me.conn->stats();
      uint64_t byReason = 0;
      for (uint64_t r : st.droppedBy) byReason += r;
      FUZZ_CHECK(byReason == st.datagramsDropped &&
                     st.datagramsAccepted + st.datagramsDropped == st.datagramsReceived &&
                     st.datagramsReceived == me.fed,
                 formatStats(st));
      FUZZ_CHECK(me.conn->unexpectedBytesInUse() <= config_.unexpectedBytes, formatStats(st));
    }
  }

  const UdpConfig config_;
  std::array<Side, 2> sides_;
  TimeUs now_ = 1;
  bool tainted_ = false;
};

// ---------------------------------------------------------------------------------------------
// Seeds.

class ScriptWriter {
 public:
  explicit ScriptWriter(std::array<uint8_t, 3> config) : bytes_(config.begin(), config.end()) {}
  ScriptWriter& op(Op o, int side, std::initializer_list<uint8_t> args = {}) {
    bytes_.push_back(static_cast<uint8_t>((o << 1) | side));
    bytes_.insert(bytes_.end(), args);
    return *this;
  }
  // Both directions pumped and delivered in order, then time moves on.
  ScriptWriter& exchange(int rounds, uint8_t step = 4) {
    for (int i = 0; i < rounds; ++i) {
      op(kPump, 0).op(kDeliver, 1, {7, 0}).op(kPump, 1).op(kDeliver, 0, {7, 0});
      op(kAdvance, 0, {step});
    }
    return *this;
  }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace

std::vector<std::vector<uint8_t>> seedInputs() {
  std::vector<std::vector<uint8_t>> seeds;
  const std::array<std::array<uint8_t, 3>, 6> configs = {{
      // Spread over both loss-recovery policies, both congestion controllers, the four MTUs,
      // budgets and eager limits (see configFrom for the bits).
      {0x00, 0x00, 0x00},
      {0xf5, 0x15, 0x26},
      {0xb8, 0x21, 0x9a},
      {0x7b, 0x3e, 0x55},
      {0xe6, 0x40, 0xf1},
      {0x64, 0x85, 0x32},
  }};
  for (size_t c = 0; c < configs.size(); ++c) {
    // A clean transfer of every interesting size, receives posted first.
    ScriptWriter clean(configs[c]);
    for (uint8_t i = 0; i < 14; ++i) {
      clean.op(kPost, 1, {uint8_t(i & 3), 0, i}).op(kSend, 0, {uint8_t(i & 3), i});
    }
    seeds.push_back(clean.exchange(12).take());
    // Unexpected messages (sent before any receive), both directions, with loss, duplication,
    // reordering and timeouts.
    ScriptWriter lossy(configs[c]);
    for (uint8_t i = 0; i < 6; ++i) lossy.op(kSend, 0, {i, uint8_t(i * 3)});
    lossy.op(kSend, 1, {1, 5}).op(kPump, 0).op(kPump, 1);
    lossy.op(kDeliver, 1, {4, 1}).op(kDeliver, 1, {2, 3}).op(kDeliver, 1, {3, 0});
    lossy.op(kDeliver, 0, {4, 0}).op(kAdvance, 0, {7}).op(kAdvance, 0, {8});
    for (uint8_t i = 0; i < 6; ++i) lossy.op(kPost, 1, {i, 0, uint8_t(i * 3)});
    lossy.op(kPost, 0, {1, 255, 12}).op(kCancel, 1, {2});
    seeds.push_back(lossy.exchange(10, 6).take());
    // Honest traffic with forged, mutated and raw datagrams mixed in.
    ScriptWriter attacked(configs[c]);
    attacked.op(kPost, 1, {0, 0, 11}).op(kPost, 1, {1, 0, 12}).op(kSend, 0, {0, 11});
    attacked.op(kSend, 0, {1, 12}).op(kPump, 0);
    attacked.op(kMutate, 1, {0, 2, 40, 0, 2, 8}).op(kMutate, 1, {1, 1, 30, 0, 0, 5});
    attacked.op(kMutate, 1, {2, 5, 1, 0, 0, 3}).op(kMutate, 1, {3, 6, 0, 0, 0, 9});
    attacked.op(kCraft, 1, {0, 0, 1, 2, 0, 3, 0, 0, 0, 2, 0, 40, 0, 0});
    attacked.op(kCraft, 0, {1, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 1});
    attacked.op(kCraft, 0, {2, 0, 0, 1, 0, 0}).op(kCraft, 1, {3, 0, 0});
    attacked.op(kRaw, 1, {0x03, 40, 1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                          0, 0, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9});
    seeds.push_back(attacked.exchange(8).op(kFail, 0, {0}).exchange(1).take());
  }

  // Raw datagrams of every kind from an honest exchange, for the wire-format half.
  UdpConfig config;
  config.mtuPayload = 600;
  config.unexpectedBytes = 8192;
  config.eagerMaxBytes = 1000;
  PeerIdentity a{0, 1, kToken}, b{1, 0, kToken};
  PeerConnection ca(config, a), cb(config, b);
  std::vector<uint8_t> payload(3000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = patternByte(9, i);
  std::vector<uint8_t> sink(3000);
  for (int i = 0; i < 4; ++i) ca.send(Tag(i), payload.data(), i == 3 ? 2500 : 100 * i);
  std::vector<uint8_t> out(config.mtuPayload);
  TimeUs now = 1;
  for (int round = 0; round < 20; ++round) {
    if (round == 3) cb.postReceive(3, ~Tag{0}, sink.data(), sink.size());
    for (PeerConnection* from : {&ca, &cb}) {
      PeerConnection* to = from == &ca ? &cb : &ca;
      while (size_t n = from->pollTransmit(now, out)) {
        seeds.emplace_back(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n));
        // What a congested switch makes of DATA: marked, and trimmed to its header.
        std::vector<uint8_t> marked = seeds.back(), trimmed = seeds.back();
        if (markCongestionExperienced(marked)) seeds.push_back(std::move(marked));
        if (trimData(trimmed)) seeds.push_back(std::move(trimmed));
        to->onDatagram(std::span<const uint8_t>(out.data(), n), now);
      }
    }
    now += 500;
    for (PeerConnection* c : {&ca, &cb}) {
      if (const auto t = c->nextTimeout(); t && *t <= now) c->onTimeout(now);
      while (c->pollEvent()) {
      }
    }
  }

  const PacketNumber nacked[] = {1, 4, 5};
  seeds.emplace_back(nackBytes(3));
  encodeNack(seeds.back(), PacketHeader{PacketType::kNack, 1, kToken}, nacked);

  uint64_t x = 0x243f6a8885a308d3ull;
  for (size_t len : {0, 1, 16, 24, 60, 100, 700}) {
    std::vector<uint8_t> r(len);
    for (auto& byte : r) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      byte = static_cast<uint8_t>(x);
    }
    seeds.push_back(std::move(r));
  }
  return seeds;
}

}  // namespace ucxb::udp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ucxb::udp::fuzz;
  checkCodec(std::span<const uint8_t>(data, size));
  Script script(data, size);
  const ucxb::udp::UdpConfig config = configFrom(script);
  Harness harness(config);
  harness.run(script);
  fuzzEndpoint(std::span<const uint8_t>(data, size));
  return 0;
}
