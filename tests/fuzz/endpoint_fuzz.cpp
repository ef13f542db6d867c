// The endpoint-level fuzz mode: one udp Endpoint (the victim, rank 0) with pending receives
// and sends, two honest Endpoints (ranks 1 and 2) sending it patterned messages, and an
// attacker. The input is a script of one opcode byte and its argument bytes per operation:
// post a receive (from a rank or any source), send honestly, move the honest traffic, inject
// raw bytes or a forged packet from any address (a stranger's, a peer's, the victim's own),
// replay an honest datagram from another address, advance time, cancel, abort a peer. After
// every operation the harness checks:
//   - a datagram from an address no rank has is counted as such and touches no connection;
//   - a datagram that is not authentic (another session's token, or a rank that does not
//     match the address it came from) is never accepted by a connection;
//   - a receive completes only with the bytes of a message an honest peer sent with that tag
//     and length, its tag matches under its mask, and nothing is written past its buffer or
//     into it after it completed (poisoned for ASan, and hashed);
// and at the end, after the victim closes, lingers and goes, that no request is left pending.
// Every endpoint records trace samples (trace_samples, every event, in rings of
// kTraceSamples that wrap within an input), and the victim runs congestion=credit, so the
// recorder and credit's sampled state see what the attacker does too: each time advances,
// the victim's samples are drained and must fit their rings and name a real peer.
// Leaks are LeakSanitizer's (the fuzz build runs with detect_leaks=1).
#include "tests/fuzz/endpoint_fuzz.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "transports/udp/endpoint.h"
#include "transports/udp/trace_recorder.h"
#include "transports/udp/wire_format.h"

#include "tests/fuzz/asan_poison.h"

namespace ucxb::udp::fuzz {
namespace {

[[noreturn]] void violated(int line, const char* condition, const std::string& detail) {
  std::fprintf(stderr, "udp_fuzz: endpoint invariant violated at endpoint_fuzz.cpp:%d: %s\n  %s\n",
               line, condition, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

#define ENDPOINT_CHECK(cond, detail)                 \
  do {                                               \
    if (!(cond)) violated(__LINE__, #cond, (detail)); \
  } while (0)

constexpr int kRanks = 3;  // 0: the victim; 1 and 2: honest peers
constexpr uint64_t kToken = 0xE0D0'F022'0000'0001ull;
constexpr size_t kGuard = 16;
// Bounds that keep one input cheap whatever it asks for.
constexpr size_t kMaxReceives = 24;
constexpr size_t kMaxSends = 24;
constexpr size_t kMaxOps = 400;
constexpr size_t kHistory = 16;     // honest datagrams kept for replays
constexpr size_t kMaxInFlight = 256;
// Rounds of settling: a lossless wire delivers two dozen short messages in a few; a peer
// still retransmitting into a failed connection would go on until its peer timeout, which is
// not worth waiting for.
constexpr int kSettleRounds = 40;
constexpr int kQuietRounds = 2;  // rounds of 500 us: a retransmission timeout's worth
constexpr size_t kTraceSamples = 8;  // per kind: small, so that the rings wrap

UDP_FUZZ_NO_COVERAGE uint8_t patternByte(int from, Tag tag, size_t i) {
  uint64_t x = (static_cast<uint64_t>(from) << 40) ^ (tag * 0x9e3779b97f4a7c15ull) ^ (i * 0x2545f491u);
  x ^= x >> 31;
  return static_cast<uint8_t>((x * 0xbf58476d1ce4e5b9ull) >> 56);
}

UDP_FUZZ_NO_COVERAGE uint64_t hashBytes(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  bool more() const { return pos_ < in_.size(); }
  uint8_t byte() { return pos_ < in_.size() ? in_[pos_++] : 0; }
  std::span<const uint8_t> take(size_t n) {
    n = std::min(n, in_.size() - pos_);
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

// A receive of the victim's, its buffer followed by guard bytes.
struct Receive {
  RequestPtr request;
  std::unique_ptr<uint8_t[]> buffer;
  size_t capacity = 0;
  Tag tag = 0, mask = 0;
  bool settled = false;  // checked and poisoned after its terminal state
  uint64_t hash = 0;
};

struct InFlight {
  int from;
  int to;
  std::vector<uint8_t> bytes;
};

class EndpointHarness {
 public:
  EndpointHarness() {
    EndpointOptions o;
    o.sessionToken = kToken;
    o.config.mtuPayload = 600;
    o.config.unexpectedBytes = 16384;
    o.config.eagerMaxBytes = 1000;  // longer messages go by rendezvous
    // Short timers, so that a linger stretched to rto_max stays a few dozen rounds.
    o.config.rtoMaxUs = 4000;
    o.lingerQuietUs = 1000;
    o.lingerMaxUs = 8000;
    o.config.traceSamples = kTraceSamples;
    o.config.traceIntervalUs = 0;  // a sample at every event
    // UDP_FUZZ_AUTH=1: every endpoint in the authenticated mode (secret_file). Then nothing the
    // attacker makes may be accepted, not even a packet with the right token, rank and address
    // (which the unauthenticated mode must accept), and the content checks stay on throughout.
    if (const char* auth = std::getenv("UDP_FUZZ_AUTH"); auth != nullptr && auth[0] == '1') {
      AuthKey key{};
      for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(0xA0 + i);
      o.groupKey = key;
      auth_ = true;
    }
    for (int r = 0; r < kRanks; ++r) {
      addresses_[r] = SocketAddress::parse("10.0.0." + std::to_string(r + 1), 7000);
    }
    for (int r = 0; r < kRanks; ++r) {
      // The victim's sends wait for its peers' grants; every rank grants (the receiver
      // serves a demand whatever its own policy).
      EndpointOptions mine = o;
      if (r == 0) mine.config.congestion = "credit";
      endpoints_[r] = std::make_unique<Endpoint>(r, kRanks, mine);
      for (int p = 0; p < kRanks; ++p) endpoints_[r]->connect(p, addresses_[p]);
    }
    scratch_.resize(o.config.mtuPayload);
  }

  ~EndpointHarness() {
    for (auto& r : receives_) ASAN_UNPOISON_MEMORY_REGION(r.buffer.get(), r.capacity + kGuard);
  }

  void run(Reader& in) {
    for (size_t op = 0; op < kMaxOps && in.more(); ++op) {
      step(in);
      for (auto& e : endpoints_) e->completeRequests();
      checkReceives();
    }
    settle();
  }

 private:
  Endpoint& victim() { return *endpoints_[0]; }

  void step(Reader& in) {
    switch (in.byte() % 10) {
      case 0: postReceive(in.byte(), in.byte(), in.byte()); break;
      case 1: honestSend(1 + in.byte() % 2, in.byte(), in.byte(), in.byte()); break;
      case 2: pump(); break;
      case 3: deliver(in.byte() % 32 + 1); break;
      case 4: raw(in); break;
      case 5: forged(in); break;
      case 6: replay(in.byte(), in.byte()); break;
      case 7: advance((in.byte() + 1) * TimeUs{40}); break;
      case 8: cancel(in.byte()); break;
      case 9: victimSendOrAbort(in.byte(), in.byte()); break;
    }
  }

  void postReceive(uint8_t who, uint8_t tagLow, uint8_t size) {
    if (receives_.size() >= kMaxReceives) return;
    Receive r;
    const int peer = who % 4 == 3 ? kAnySource : who % 4;
    r.capacity = size_t{size} * 8;
    r.mask = peer == kAnySource ? Tag{0xff} : ~Tag{0};
    r.tag = (static_cast<Tag>(peer == kAnySource ? 0 : peer) << 8) | (tagLow % 4);
    r.buffer = std::make_unique<uint8_t[]>(r.capacity + kGuard);
    std::memset(r.buffer.get(), 0, r.capacity + kGuard);
    ASAN_POISON_MEMORY_REGION(r.buffer.get() + r.capacity, kGuard);
    r.request = victim().recv(peer, r.tag, r.mask, r.buffer.get(), r.capacity);
    receives_.push_back(std::move(r));
  }

  void honestSend(int from, uint8_t tagLow, uint8_t hi, uint8_t lo) {
    if (honestSends_.size() >= kMaxSends) return;
    const Tag tag = (static_cast<Tag>(from) << 8) | (tagLow % 4);
    const size_t length = static_cast<size_t>(hi % 8) * 256 + lo;  // up to ~2 KB: eager and rendezvous
    auto payload = std::make_unique<std::vector<uint8_t>>(length);
    for (size_t i = 0; i < length; ++i) (*payload)[i] = patternByte(from, tag, i);
    honestSends_.push_back(endpoints_[from]->send(0, tag, payload->data(), length));
    payloads_.push_back(std::move(payload));
  }

  // Everything the endpoints want to send goes on the wire, in order.
  void pump() {
    for (int r = 0; r < kRanks; ++r) {
      SocketAddress to;
      while (const size_t n = endpoints_[r]->pollTransmit(now_, scratch_, to)) {
        ENDPOINT_CHECK(n <= scratch_.size(), std::to_string(n));
        int dest = -1;
        for (int p = 0; p < kRanks; ++p) {
          if (addresses_[p] == to) dest = p;
        }
        ENDPOINT_CHECK(dest >= 0, "an endpoint sent to " + to.toString());
        std::vector<uint8_t> bytes(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(n));
        if (history_.size() == kHistory) history_.pop_front();
        history_.push_back({r, dest, bytes});
        if (wire_.size() < kMaxInFlight) wire_.push_back({r, dest, std::move(bytes)});
      }
    }
  }

  void deliver(size_t count) {
    for (; count > 0 && !wire_.empty(); --count) {
      InFlight d = std::move(wire_.front());
      wire_.pop_front();
      endpoints_[d.to]->handleDatagram(now_, addresses_[d.from], d.bytes);
    }
  }

  // Where an attacker's datagram claims to come from.
  SocketAddress sourceFor(uint8_t selector, uint8_t port) const {
    if (selector % 4 < 3) return addresses_[selector % 4];
    const std::string host = "10.0." + std::to_string(selector % 7) + "." + std::to_string(port);
    return SocketAddress::parse(host, static_cast<uint16_t>(7000 + (selector & 1)));
  }

  // Whether a datagram would pass the checks an off-path attacker cannot: this session's
  // token, and the rank of the address it came from.
  bool authentic(std::span<const uint8_t> bytes, const SocketAddress& from) const {
    if (bytes.size() < kCommonHeaderBytes) return false;
    uint64_t token;
    uint16_t rank;
    std::memcpy(&token, bytes.data() + 8, 8);
    std::memcpy(&rank, bytes.data() + 2, 2);
    return token == kToken && rank < kRanks && addresses_[rank] == from;
  }

  uint64_t acceptedByVictim() const {
    uint64_t n = 0;
    for (int p = 0; p < kRanks; ++p) n += endpoints_[0]->peerStats(p).datagramsAccepted;
    return n;
  }
  uint64_t receivedByVictim() const {
    uint64_t n = 0;
    for (int p = 0; p < kRanks; ++p) n += endpoints_[0]->peerStats(p).datagramsReceived;
    return n;
  }

  // Hands an attacker's datagram to the victim and checks what it may do.
  void attack(const SocketAddress& from, std::span<const uint8_t> bytes) {
    bool known = false;
    for (const auto& a : addresses_) known = known || a == from;
    const bool authenticLooking = !auth_ && authentic(bytes, from);
    if (authenticLooking) tainted_ = true;  // content checks are off from here on
    const uint64_t unknownBefore = victim().unknownSourceDrops();
    const uint64_t receivedBefore = receivedByVictim();
    const uint64_t acceptedBefore = acceptedByVictim();
    const bool routed = victim().handleDatagram(now_, from, bytes);
    ENDPOINT_CHECK(routed == known, from.toString());
    if (!known) {
      ENDPOINT_CHECK(victim().unknownSourceDrops() == unknownBefore + 1, from.toString());
      ENDPOINT_CHECK(receivedByVictim() == receivedBefore, "a stranger's datagram reached a connection");
    }
    if (!authenticLooking) {
      ENDPOINT_CHECK(acceptedByVictim() == acceptedBefore,
                     "an unauthenticated datagram from " + from.toString() + " was accepted");
    }
  }

  void raw(Reader& in) {
    const uint8_t selector = in.byte(), port = in.byte(), length = in.byte();
    const auto bytes = in.take(length);
    attack(sourceFor(selector, port), std::vector<uint8_t>(bytes.begin(), bytes.end()));
  }

  // A well-formed-looking packet with a valid checksum that fails authentication: another
  // session's token, or this one's with a rank that is not the sender address's.
  void forged(Reader& in) {
    const uint8_t selector = in.byte(), kind = in.byte(), length = in.byte();
    const auto body = in.take(length);
    std::vector<uint8_t> bytes(kReliableHeaderBytes + body.size(), 0);
    std::copy(body.begin(), body.end(), bytes.begin() + kReliableHeaderBytes);
    bytes[0] = kWireVersion;
    bytes[1] = static_cast<uint8_t>(1 + kind % 4);
    const SocketAddress from = sourceFor(selector, 1);
    uint16_t rank = static_cast<uint16_t>(selector % 4);
    uint64_t token = kToken;
    if (kind & 0x10) {
      token ^= uint64_t{kind} << 32 | 1;  // another session
    } else {
      rank = static_cast<uint16_t>((rank + 1 + (kind >> 5) % 2) % kRanks);  // the wrong rank
    }
    std::memcpy(bytes.data() + 2, &rank, 2);
    std::memcpy(bytes.data() + 8, &token, 8);
    if (bytes.size() >= kCommonHeaderBytes) sealChecksum(bytes);
    attack(from, bytes);
  }

  // An honest datagram again: from its own address (a duplicate, harmless), or from another.
  void replay(uint8_t index, uint8_t selector) {
    if (history_.empty()) return;
    const InFlight& d = history_[index % history_.size()];
    if (d.to != 0) return;
    const SocketAddress from = (selector & 0x80) ? addresses_[d.from] : sourceFor(selector, 2);
    if (from == addresses_[d.from]) {
      victim().handleDatagram(now_, from, d.bytes);
    } else {
      attack(from, d.bytes);
    }
  }

  void advance(TimeUs by) {
    now_ += by;
    for (auto& e : endpoints_) e->handleTimeout(now_);
    checkTrace();
  }

  // What the victim recorded since the last look: at most a ring of each kind, about real
  // peers other than itself, with consistent credit counts; what the rings overwrote only
  // grows.
  void checkTrace() {
    const TraceRecorder* trace = victim().trace();
    ENDPOINT_CHECK(trace != nullptr, "trace_samples is on");
    connectionSamples_.clear();
    queueSamples_.clear();
    victim().drainTrace(connectionSamples_, queueSamples_);
    ENDPOINT_CHECK(connectionSamples_.size() <= kTraceSamples, std::to_string(connectionSamples_.size()));
    ENDPOINT_CHECK(queueSamples_.empty(), "a queue sample without an emulated bottleneck");
    for (const ConnectionSample& s : connectionSamples_) {
      ENDPOINT_CHECK(s.peer > 0 && s.peer < kRanks, "a sample of peer " + std::to_string(s.peer));
      ENDPOINT_CHECK(s.path == 0 && s.tUs <= now_, std::to_string(s.tUs));
      ENDPOINT_CHECK(s.creditAvailable <= s.creditGranted, std::to_string(s.creditAvailable));
    }
    ENDPOINT_CHECK(trace->connectionsOverwritten() >= overwritten_, "overwritten went down");
    overwritten_ = trace->connectionsOverwritten();
  }

  void cancel(uint8_t index) {
    if (receives_.empty()) return;
    receives_[index % receives_.size()].request->cancel();
  }

  void victimSendOrAbort(uint8_t what, uint8_t arg) {
    const int peer = 1 + arg % 2;
    if (what < 240) {
      if (victimSends_.size() >= kMaxSends) return;
      // The honest peers take whatever the victim sends.
      peerInboxes_.push_back(std::make_unique<std::vector<uint8_t>>(2048));
      peerReceives_.push_back(
          endpoints_[peer]->recv(0, 0, 0, peerInboxes_.back()->data(), peerInboxes_.back()->size()));
      const size_t length = size_t{what} * 8;
      payloads_.push_back(std::make_unique<std::vector<uint8_t>>(length, what));
      victimSends_.push_back(victim().send(peer, what, payloads_.back()->data(), length));
    } else {
      victim().abortPeer(what % 4 == 3 ? 0 : peer, "aborted by the script");
    }
  }

  void checkReceives() {
    for (auto& r : receives_) {
      if (r.settled || r.request->pending()) continue;
      r.settled = true;
      if (r.request->state() == RequestState::kDone) {
        const Tag got = r.request->senderTag();
        const size_t n = r.request->receivedBytes();
        ENDPOINT_CHECK((got & r.mask) == (r.tag & r.mask), "tag " + std::to_string(got));
        ENDPOINT_CHECK(n <= r.capacity, std::to_string(n));
        if (!tainted_) {
          const int from = static_cast<int>(got >> 8);
          ENDPOINT_CHECK(from == 1 || from == 2, "a message from rank " + std::to_string(from));
          for (size_t i = 0; i < n; ++i) {
            ENDPOINT_CHECK(r.buffer[i] == patternByte(from, got, i),
                           "byte " + std::to_string(i) + " of a message from rank " +
                               std::to_string(from) + " was not sent by it");
          }
        }
      }
      // Nothing may touch the buffer any more.
      r.hash = hashBytes(r.buffer.get(), r.capacity);
      ASAN_POISON_MEMORY_REGION(r.buffer.get(), r.capacity);
    }
  }

  // Honest traffic runs until the wire is quiet (a rendezvous waiting for a receive never
  // posted stays pending: its endpoint's destructor fails it), then the victim closes,
  // lingers and goes, and so do the others.
  void settle() {
    for (int round = 0; round < kSettleRounds; ++round) {
      pump();
      const bool quiet = wire_.empty();
      deliver(kMaxInFlight);
      advance(500);
      for (auto& e : endpoints_) e->completeRequests();
      checkReceives();
      if (quiet && round >= kQuietRounds) break;
    }
    victim().close(now_);
    for (int round = 0; round < kSettleRounds; ++round) {
      pump();
      deliver(kMaxInFlight);
      advance(1000);
      for (auto& e : endpoints_) e->completeRequests();
      if (victim().lingerDone(now_)) break;
      ENDPOINT_CHECK(round + 1 < kSettleRounds, "the linger never ended");
    }
    checkReceives();
    for (auto& e : endpoints_) e.reset();
    for (auto& r : receives_) {
      ENDPOINT_CHECK(!r.request->pending(), "a receive outlived its endpoint");
      ASAN_UNPOISON_MEMORY_REGION(r.buffer.get(), r.capacity);
      if (r.settled) {
        ENDPOINT_CHECK(hashBytes(r.buffer.get(), r.capacity) == r.hash,
                       "a receive buffer changed after its request completed");
      }
    }
    for (const auto& s : honestSends_) ENDPOINT_CHECK(!s->pending(), "a send outlived its endpoint");
    for (const auto& s : victimSends_) ENDPOINT_CHECK(!s->pending(), "a send outlived its endpoint");
  }

  // Declared first, destroyed last: the endpoints point into these until they go.
  std::vector<std::unique_ptr<std::vector<uint8_t>>> payloads_;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> peerInboxes_;
  std::vector<Receive> receives_;
  std::vector<RequestPtr> honestSends_, victimSends_, peerReceives_;
  std::array<SocketAddress, kRanks> addresses_;
  std::array<std::unique_ptr<Endpoint>, kRanks> endpoints_;
  std::deque<InFlight> wire_;
  std::deque<InFlight> history_;
  std::vector<uint8_t> scratch_;
  std::vector<ConnectionSample> connectionSamples_;
  std::vector<QueueSample> queueSamples_;
  uint64_t overwritten_ = 0;
  TimeUs now_ = 1;
  bool tainted_ = false;
  bool auth_ = false;  // UDP_FUZZ_AUTH=1: the authenticated mode
};

}  // namespace

void fuzzEndpoint(std::span<const uint8_t> input) {
  Reader in(input);
  EndpointHarness harness;
  harness.run(in);
}

}  // namespace ucxb::udp::fuzz
