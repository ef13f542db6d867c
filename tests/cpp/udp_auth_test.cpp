// The udp transport's authenticated mode (transports/udp/datagram_auth.h, auth_keys.h,
// replay_window.h, secret_file.h), alone and inside Endpoints on the simulated network
// (tests/udp_sim/endpoint_network.h): a forged datagram carrying the right token is dropped
// and counted (and, without authentication, accepted: the trust model's gap), a replayed one
// is dropped and counted, one of an earlier group instance never verifies, and the endpoint
// fault matrix (drop, dup, reorder, corrupt) still delivers every byte once. Deterministic:
// ``./udp_auth_test GROUP`` (see ``--list``). Built by tests/test_udp_auth.py.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "tests/cpp/check.h"
#include "tests/udp_sim/endpoint_network.h"
#include "transports/udp/auth_keys.h"
#include "transports/udp/datagram_auth.h"
#include "transports/udp/replay_window.h"
#include "transports/udp/secret_file.h"
#include "transports/udp/udp_transport.h"
#include "transports/udp/wire_format.h"

// While `gScanFreed` is set, every heap block freed with its size (what std::vector's
// allocator does) is searched for kSecretMarker: the secret_file group checks that no copy of
// a secret is left behind in freed memory (a vector's old buffer after it grew, or the buffer
// of a file refused for its length).
namespace {
std::atomic<bool> gScanFreed{false};
std::atomic<int> gFreedWithSecret{0};
constexpr char kSecretMarker[] = "ucxb-secret-marker";
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t n) noexcept {
  if (p != nullptr && gScanFreed.load() &&
      std::search(static_cast<char*>(p), static_cast<char*>(p) + n, kSecretMarker,
                  kSecretMarker + sizeof kSecretMarker - 1) != static_cast<char*>(p) + n) {
    ++gFreedWithSecret;
  }
  std::free(p);
}

using namespace ucxb;
using namespace ucxb::udp;
using ucxb::udp::sim::EndpointNetwork;

namespace {

constexpr DurationUs kSecond = 1'000'000;
constexpr uint64_t kToken = 0xA17Bu;

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }

const std::vector<uint8_t> kSecret = bytesOf("0123456789abcdef0123456789abcdef-test-secret");
const std::vector<uint8_t> kSalt(32, 0x5a);

AuthKey groupKey(int64_t instance, const std::vector<uint8_t>& secret = kSecret,
                 const std::vector<uint8_t>& salt = kSalt, const std::string& group = "g") {
  return deriveGroupKey(secret, salt, group, instance);
}

// A DATA datagram of one whole eager message, as a connection would write it.
std::vector<uint8_t> dataDatagram(uint16_t source, Tag tag, const std::vector<uint8_t>& payload,
                                  PacketNumber pn = 0, size_t room = kAuthTrailerBytes) {
  std::vector<uint8_t> out(kDataHeaderBytes + payload.size() + room);
  PacketHeader h;
  h.sourceRank = source;
  h.token = kToken;
  DataHeader d;
  d.tag = tag;
  d.messageId = 0;
  d.messageLength = payload.size();
  d.fragmentLength = static_cast<uint16_t>(payload.size());
  const size_t n = encodeData(out, h, pn, d, payload.data());
  out.resize(n + room);
  return out;
}

// ------------------------------------------------------------------------------ replay window

void testReplayWindow() {
  ReplayWindow w;
  CHECK(w.fresh(0));
  w.mark(0);
  CHECK(!w.fresh(0));
  CHECK(w.fresh(5));
  w.mark(5);
  CHECK(w.fresh(3));  // late but within the window: accepted once
  w.mark(3);
  CHECK(!w.fresh(3));
  CHECK(!w.fresh(5));
  CHECK(w.fresh(4));
  // Slide far: what fell out of the window is refused, what is inside is tracked.
  const uint64_t far = 5 + ReplayWindow::kBits + 10;
  w.mark(far);
  CHECK(!w.fresh(4));
  CHECK(!w.fresh(far - ReplayWindow::kBits));
  CHECK(w.fresh(far - ReplayWindow::kBits + 1));
  CHECK(w.fresh(far - 1));
  // A slot reused by a newer counter is cleared when the window reaches it.
  for (uint64_t c = far + 7; c < far + 2 * ReplayWindow::kBits; c += 7) {
    CHECK(w.fresh(c));
    w.mark(c);
    CHECK(!w.fresh(c));
    CHECK(w.fresh(c - 1));
  }
  // Against a plain set, over a seeded mix of new, late, duplicate and ancient counters.
  ReplayWindow a;
  std::set<uint64_t> seen;
  uint64_t highest = 0, x = 12345;
  int mismatches = 0;
  for (int i = 0; i < 200'000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t r = x >> 33;
    uint64_t c = r % 8 == 0 ? highest + 1 + r % 3000 : (highest > r % 5000 ? highest - r % 5000 : 0);
    const bool expected =
        !seen.count(c) && (seen.empty() || c > highest || highest - c < ReplayWindow::kBits);
    if (a.fresh(c) != expected) ++mismatches;
    if (expected) {
      a.mark(c);
      seen.insert(c);
      highest = std::max(highest, c);
    }
  }
  CHECK_EQ(mismatches, 0);
}

// ------------------------------------------------------------------------------ seal and open

void testSealOpen() {
  const AuthKey k01 = deriveDirectionKey(groupKey(1), 0, 1);
  DatagramSealer sealer(k01, 0, 1);
  DatagramOpener opener(k01, 0, 1);
  const std::vector<uint8_t> payload(300, 0x42);
  std::set<uint64_t> counters;
  std::set<std::vector<uint8_t>> trailers;
  for (int i = 0; i < 1000; ++i) {
    std::vector<uint8_t> d = dataDatagram(0, 7, payload);
    const size_t inner = d.size() - kAuthTrailerBytes;
    CHECK_EQ(sealer.seal(d, inner), d.size());
    // Nonce uniqueness: the counter (the nonce's variable part) never repeats, and the same
    // datagram gets another tag each time.
    uint64_t counter = 0;
    for (size_t b = 0; b < kAuthCounterBytes; ++b) counter |= uint64_t{d[inner + b]} << (8 * b);
    CHECK(counters.insert(counter).second);
    CHECK(trailers.insert(std::vector<uint8_t>(d.begin() + static_cast<long>(inner), d.end())).second);
    CHECK(opener.open(d) == OpenResult::kAccepted);
    CHECK(opener.open(d) == OpenResult::kReplayed);  // the very same bytes again
  }
  CHECK_EQ(sealer.sealed(), uint64_t{1000});
  CHECK_EQ(opener.replayed(), uint64_t{1000});
  CHECK_EQ(opener.authFailed(), uint64_t{0});

  // Tampering: every bit of every byte, header, payload, counter and tag alike.
  std::vector<uint8_t> d = dataDatagram(0, 9, std::vector<uint8_t>(40, 0x17));
  sealer.seal(d, d.size() - kAuthTrailerBytes);
  int undetected = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> t = d;
      t[i] ^= static_cast<uint8_t>(1u << bit);
      if (opener.open(t) != OpenResult::kAuthFailed) ++undetected;
    }
  }
  CHECK_EQ(undetected, 0);
  const uint64_t failedBefore = opener.authFailed();
  CHECK(opener.open(std::span<const uint8_t>(d).first(d.size() - 1)) == OpenResult::kAuthFailed);
  CHECK(opener.open(std::span<const uint8_t>(d).first(kAuthTrailerBytes - 1)) == OpenResult::kAuthFailed);
  CHECK(opener.open(d) == OpenResult::kAccepted);  // tampered copies did not burn its counter
  CHECK_EQ(opener.authFailed(), failedBefore + 2);

  // Under the other direction's key, or with the ranks swapped, nothing verifies.
  DatagramOpener reverse(deriveDirectionKey(groupKey(1), 1, 0), 1, 0);
  DatagramOpener swapped(k01, 1, 0);
  std::vector<uint8_t> e = dataDatagram(0, 10, payload);
  sealer.seal(e, e.size() - kAuthTrailerBytes);
  CHECK(reverse.open(e) == OpenResult::kAuthFailed);
  CHECK(swapped.open(e) == OpenResult::kAuthFailed);
  CHECK_THROWS(sealer.seal(e, e.size() - 3), std::length_error, "no room");
}

// ------------------------------------------------------------------------------ keys

void testKeys() {
  const AuthKey base = groupKey(1);
  CHECK(base == groupKey(1));  // every rank derives the same
  CHECK(base != groupKey(2));  // another instance
  CHECK(base != groupKey(1, kSecret, std::vector<uint8_t>(32, 0x5b)));  // another creation
  CHECK(base != groupKey(1, kSecret, kSalt, "h"));                         // another group
  CHECK(base != groupKey(1, bytesOf("another secret of at least thirty-two bytes!")));
  // Length-prefixed fields: ("g1", instance) and ("g", ...) cannot collide by concatenation.
  CHECK(groupKey(1, kSecret, kSalt, "g1") != groupKey(1, kSecret, kSalt, "g"));
  CHECK(deriveDirectionKey(base, 0, 1) != deriveDirectionKey(base, 1, 0));
  CHECK(deriveDirectionKey(base, 0, 1) == deriveDirectionKey(groupKey(1), 0, 1));
  const std::string check = keyCheck(base);
  CHECK_EQ(check.size(), size_t{16});
  CHECK_EQ(check, keyCheck(groupKey(1)));
  CHECK(check != keyCheck(groupKey(1, bytesOf("another secret of at least thirty-two bytes!"))));
  // The key check reveals neither key: it differs from every byte string of them.
  std::string hexKey;
  for (uint8_t b : base) {
    char h[3];
    std::snprintf(h, sizeof h, "%02x", b);
    hexKey += h;
  }
  CHECK(hexKey.find(check) == std::string::npos);
}

// ------------------------------------------------------------------------------ secret file

void testSecretFile() {
  char dir[] = "/tmp/ucxb-secret-XXXXXX";
  CHECK(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/secret";
  const auto write = [&](const std::string& text, mode_t mode) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    ::chmod(path.c_str(), mode);
  };
  CHECK_THROWS(readSecretFile(path), config::ConfigError, "cannot be read: No such file");
  write(std::string(64, 's'), 0600);
  CHECK_EQ(readSecretFile(path).size(), size_t{64});
  write(std::string(64, 's'), 0640);
  CHECK_THROWS(readSecretFile(path), config::ConfigError, "accessible by group or others (mode 640)");
  write(std::string(64, 's'), 0604);
  CHECK_THROWS(readSecretFile(path), config::ConfigError, "chmod 600");
  write(std::string(31, 's'), 0600);
  CHECK_THROWS(readSecretFile(path), config::ConfigError, "holds 31 bytes; a secret needs at least 32");
  write("", 0600);
  CHECK_THROWS(readSecretFile(path), config::ConfigError, "holds 0 bytes");
  CHECK_THROWS(readSecretFile(dir), config::ConfigError, "not a regular file");
  if (::geteuid() != 0) {  // root reads anything
    write(std::string(64, 's'), 0200);
    CHECK_THROWS(readSecretFile(path), config::ConfigError, "Permission denied");
  }
  CHECK_THROWS(readSecretFile(path), config::ConfigError, "secret_file (UCXBACKEND_SECRET_FILE)");
  // Owned by another user (only root can read such a file with mode 600): that user could
  // replace the secret with one they know, so it is refused, as ssh refuses such a key.
  if (::geteuid() == 0) {
    write(std::string(64, 's'), 0600);
    CHECK(::chown(path.c_str(), 65534, 65534) == 0);
    CHECK_THROWS(readSecretFile(path), config::ConfigError, "is owned by uid 65534");
    CHECK(::chown(path.c_str(), 0, 0) == 0);
    CHECK_EQ(readSecretFile(path).size(), size_t{64});  // root's own: fine
  }
  ::unlink(path.c_str());
  // No copy of a secret is left in freed heap memory: not the buffers a growing read leaves
  // behind, not the secret once its holder is done with it, not a file refused as too long.
  // The files are written with write(2) and their text allocated once, before the scan, so
  // that no stdio buffer or string of the test's own leaves the marker in a heap chunk that
  // is reused while the scan is on.
  const std::string longPath = std::string(dir) + "/long";
  std::string marked;
  marked.reserve(20000 + sizeof kSecretMarker + kMaxSecretBytes);
  while (marked.size() < 20000) marked += kSecretMarker;
  const size_t markedBytes = marked.size();
  const auto writeRaw = [](const std::string& to, const char* data, size_t n) {
    const int fd = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && ::write(fd, data, n) == static_cast<ssize_t>(n));
    ::close(fd);
  };
  writeRaw(path, marked.data(), markedBytes);
  marked.append(kMaxSecretBytes, 'x');  // no reallocation: reserved
  writeRaw(longPath, marked.data(), marked.size());
  gFreedWithSecret = 0;
  gScanFreed = true;
  CHECK_EQ(readSecretFile(path).size(), markedBytes);
  CHECK_THROWS(readSecretFile(longPath), config::ConfigError, "is longer than 65536 bytes");
  gScanFreed = false;
  CHECK_EQ(gFreedWithSecret.load(), 0);
  ::unlink(path.c_str());
  ::unlink(longPath.c_str());
  // A FIFO (or a device) under the knob: refused at once, never an open() that waits for a
  // writer and hangs the group's creation. If the read does hang, this side opens the FIFO
  // for writing, so that the check fails instead of the test hanging.
  const std::string fifo = std::string(dir) + "/fifo";
  CHECK(::mkfifo(fifo.c_str(), 0600) == 0);
  auto read = std::async(std::launch::async, [&] {
    try {
      readSecretFile(fifo);
      return std::string("accepted");
    } catch (const config::ConfigError& e) {
      return std::string(e.what());
    }
  });
  const bool promptly = read.wait_for(std::chrono::seconds(2)) == std::future_status::ready;
  CHECK_MSG(promptly, "readSecretFile hung on a FIFO (open() waits for a writer)");
  if (!promptly) {
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) ::close(writer);
  }
  const std::string why = read.get();
  CHECK_MSG(why.find("is not a regular file") != std::string::npos, why);
  ::unlink(fifo.c_str());
  ::rmdir(dir);
}

// ------------------------------------------------------------------------------ endpoints

EndpointOptions authOptions(std::optional<AuthKey> key) {
  EndpointOptions o;
  o.sessionToken = kToken;
  o.config.mtuPayload = 1200;
  o.lingerQuietUs = 20'000;
  o.groupKey = key;
  return o;
}

uint64_t dropped(const Stats& s, DropReason r) { return s.dropped(r); }

// A receive posted on node 0 from node 1; a stranger who knows the token (it is in the Store
// and in every datagram) forges node 1's message from node 1's address.
struct Forgery {
  bool landed = false;  // the forged payload reached the posted buffer
  Stats stats;
};

Forgery forge(std::optional<AuthKey> key) {
  EndpointNetwork net(2, authOptions(key));
  std::vector<uint8_t> inbox(64, 0);
  auto r = net.endpoint(0)->recv(1, 77, ~Tag{0}, inbox.data(), inbox.size());
  const std::vector<uint8_t> evil(64, 0xEE);
  // With or without room for a trailer: a forger without the key can only guess one.
  net.inject(net.address(1), 0, dataDatagram(1, 77, evil, 0, 0));
  std::vector<uint8_t> guessed = dataDatagram(1, 77, evil, 0, kAuthTrailerBytes);
  net.inject(net.address(1), 0, guessed);
  net.runUntil([&] { return !r->pending(); }, kSecond / 10);
  return {r->state() == RequestState::kDone && inbox == evil, net.endpoint(0)->peerStats(1)};
}

void testForgery() {
  const Forgery open = forge(std::nullopt);
  CHECK_MSG(open.landed, "without authentication a forged datagram with the token is accepted");
  const Forgery sealed = forge(groupKey(1));
  CHECK(!sealed.landed);
  CHECK_EQ(dropped(sealed.stats, DropReason::kAuthFailed), uint64_t{2});
  CHECK_EQ(sealed.stats.datagramsAccepted, uint64_t{0});
  CHECK_EQ(sealed.stats.datagramsDropped, uint64_t{2});
  CHECK_EQ(sealed.stats.datagramsReceived, uint64_t{2});

  // ICMP carries no tag: a forged port unreachable must not fail a live peer (without
  // authentication it does at once; the network is trusted there). Authenticated, the peer is
  // pinged, answers, and the receive still completes with its message.
  for (const bool authenticated : {false, true}) {
    EndpointNetwork net(2, authOptions(authenticated ? std::optional(groupKey(1)) : std::nullopt));
    std::vector<uint8_t> inbox(64, 0);
    auto r = net.endpoint(0)->recv(1, 78, ~Tag{0}, inbox.data(), inbox.size());
    net.endpoint(0)->handlePortUnreachable(net.nowUs(), net.address(1));
    net.runUntil([&] { return !r->pending(); }, kSecond);
    CHECK_EQ(r->pending(), authenticated);
    if (!authenticated) continue;
    CHECK(net.endpoint(0)->peerError(1).empty());
    const std::vector<uint8_t> real(64, 0x33);
    auto s = net.endpoint(1)->send(0, 78, real.data(), real.size());
    CHECK(net.runUntil([&] { return !r->pending() && !s->pending(); }, kSecond));
    CHECK(r->state() == RequestState::kDone && inbox == real);
  }
  // A peer that is really gone is still failed by its closed port, a grace period later.
  EndpointNetwork net(2, authOptions(groupKey(1)));
  std::vector<uint8_t> inbox(64, 0);
  auto r = net.endpoint(0)->recv(1, 79, ~Tag{0}, inbox.data(), inbox.size());
  net.kill(1);
  const TimeUs start = net.nowUs();
  CHECK(net.runUntil([&] { return !r->pending(); }, 20 * kSecond));
  CHECK_MSG(check::contains(r->error(), "is closed (ICMP port unreachable) and nothing "
                                        "authenticated came from it"),
            r->error());
  CHECK(net.nowUs() - start < 2 * kSecond);
}

// A datagram sealed by the genuine key, delivered twice: the copy is dropped and counted. And
// one sealed under an earlier instance's key (a datagram captured from that group) never
// verifies, even with the same token.
void testReplayAndInstances() {
  const AuthKey current = groupKey(2);
  EndpointNetwork net(2, authOptions(current));
  std::vector<uint8_t> inbox(16, 0);
  auto r = net.endpoint(0)->recv(1, 5, ~Tag{0}, inbox.data(), inbox.size());
  const std::vector<uint8_t> payload(16, 0x21);

  DatagramSealer earlier(deriveDirectionKey(groupKey(1), 1, 0), 1, 0);
  std::vector<uint8_t> old = dataDatagram(1, 5, payload);
  earlier.seal(old, old.size() - kAuthTrailerBytes);
  net.inject(net.address(1), 0, old);
  net.runUntil([] { return false; }, kSecond / 100);
  CHECK(r->pending());
  CHECK_EQ(dropped(net.endpoint(0)->peerStats(1), DropReason::kAuthFailed), uint64_t{1});

  // The genuine sender's key (as node 1 holds it), counters far past node 1's own.
  DatagramSealer genuine(deriveDirectionKey(current, 1, 0), 1, 0);
  std::vector<uint8_t> d = dataDatagram(1, 5, payload, 1000);
  for (int i = 0; i < 100; ++i) genuine.seal(d, d.size() - kAuthTrailerBytes);
  net.inject(net.address(1), 0, d);
  net.runUntil([&] { return !r->pending(); }, kSecond / 10);
  CHECK(r->state() == RequestState::kDone && inbox == payload);
  std::vector<uint8_t> second(16, 0);
  auto r2 = net.endpoint(0)->recv(1, 5, ~Tag{0}, second.data(), second.size());
  net.inject(net.address(1), 0, d);  // the same datagram, replayed
  net.runUntil([] { return false; }, kSecond / 100);
  CHECK(r2->pending());
  const Stats s = net.endpoint(0)->peerStats(1);
  CHECK_EQ(dropped(s, DropReason::kReplayed), uint64_t{1});
  CHECK_EQ(dropped(s, DropReason::kAuthFailed), uint64_t{1});
  r2->cancel();
}

// Small messages, authenticated: the sender may have only so many datagrams in flight that
// its first one, arriving after everything sent behind it (a slow path, a long queue), is
// still inside the receiver's replay window. The window counts datagrams; the send window
// counts bytes, and 8-byte messages fit some 14 000 datagrams into its 1 MiB, where the byte
// bound of 2048 full-size datagrams assumed 2048. Driven by hand, two Endpoints: rank 0
// sends everything it may before hearing anything back, and rank 1 gets it last-first-late.
void testReplaySmallDatagrams() {
  for (const bool sealed : {true, false}) {
    EndpointOptions options = authOptions(sealed ? std::optional<AuthKey>(groupKey(4))
                                                 : std::nullopt);
    options.config.unexpectedBytes = uint64_t{8} << 20;  // credit is no bound here
    Endpoint sender(0, 2, options), receiver(1, 2, options);
    const SocketAddress a0 = SocketAddress::parse("127.0.0.1", 40000);
    const SocketAddress a1 = SocketAddress::parse("127.0.0.1", 40001);
    for (Endpoint* e : {&sender, &receiver}) {
      e->connect(0, a0);
      e->connect(1, a1);
    }
    constexpr size_t kMessages = 6000;
    const std::vector<uint8_t> payload(8, 0x5C);
    std::vector<RequestPtr> sends;
    for (size_t i = 0; i < kMessages; ++i) sends.push_back(sender.send(1, 9, payload.data(), 8));
    std::vector<std::vector<uint8_t>> wire;
    std::vector<uint8_t> buf(options.config.mtuPayload);
    SocketAddress to;
    const TimeUs now = 1000;
    size_t elsewhere = 0;
    for (size_t n; (n = sender.pollTransmit(now, buf, to)) != 0;) {
      elsewhere += to == a1 ? 0 : 1;
      wire.emplace_back(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
    }
    CHECK_EQ(elsewhere, size_t{0});
    if (sealed) {
      CHECK_MSG(wire.size() <= ReplayWindow::kInFlightLimit,
                std::to_string(wire.size()) + " datagrams in flight");
    } else {
      CHECK(wire.size() > ReplayWindow::kBits);  // nothing else bounds them this far
    }
    // The first datagram comes last: it is genuine and must be taken.
    for (size_t i = 1; i < wire.size(); ++i) receiver.handleDatagram(now + 50, a0, wire[i]);
    receiver.handleDatagram(now + 60, a0, wire[0]);
    const Stats s = receiver.peerStats(0);
    CHECK_EQ(dropped(s, DropReason::kReplayed), uint64_t{0});
    CHECK_EQ(s.datagramsAccepted, static_cast<uint64_t>(wire.size()));
    std::printf("ok %s: %zu datagrams in flight of %zu messages, none taken for a replay\n",
                sealed ? "sealed" : "open", wire.size(), kMessages);
  }
}

// Byte i of the message from `from` with `tag`: a wrong source, tag or offset shows.
uint8_t patternByte(int from, Tag tag, size_t i) {
  return static_cast<uint8_t>((i * 131 + (i >> 8) * 7) ^ (tag * 29) ^ (static_cast<uint64_t>(from) << 6));
}

// Every pair of three ranks sends messages of three sizes through drop, dup, reorder, delay
// and corruption, authenticated: every byte arrives once and intact, corrupted copies count
// as auth_failed and duplicates as replayed.
void testFaultMatrix() {
  EndpointOptions options = authOptions(groupKey(3));
  options.faults =
      parseFaultConfig("drop=0.05,dup=0.05,reorder=0.05,delay=0.02,corrupt=0.02,seed=21");
  EndpointNetwork net(3, options);
  std::vector<std::vector<uint8_t>> outs, inboxes;
  outs.reserve(64);
  inboxes.reserve(64);
  std::vector<RequestPtr> requests;
  struct Expect {
    int from;
    Tag tag;
    size_t index;
  };
  std::vector<Expect> expects;
  for (int from = 0; from < 3; ++from) {
    for (int to = 0; to < 3; ++to) {
      if (from == to) continue;
      for (size_t bytes : {size_t{10}, size_t{4000}, size_t{60'000}}) {
        const Tag tag = static_cast<Tag>(from * 1'000'000 + to * 1000 + bytes);
        outs.emplace_back(bytes);
        for (size_t i = 0; i < bytes; ++i) outs.back()[i] = patternByte(from, tag, i);
        inboxes.emplace_back(bytes + 8, 0);
        requests.push_back(net.endpoint(to)->recv(from, tag, ~Tag{0}, inboxes.back().data(), bytes));
        requests.push_back(net.endpoint(from)->send(to, tag, outs.back().data(), bytes));
        expects.push_back({from, tag, inboxes.size() - 1});
      }
    }
  }
  const auto done = [&] {
    for (const auto& r : requests) {
      if (r->pending()) return false;
    }
    return true;
  };
  CHECK_MSG(net.runUntil(done, 60 * kSecond), net.stuckReason());
  for (const auto& r : requests) CHECK_MSG(r->state() == RequestState::kDone, r->error());
  for (const auto& e : expects) {
    const auto& in = inboxes[e.index];
    bool same = true;
    for (size_t i = 0; i < in.size() - 8; ++i) same = same && in[i] == patternByte(e.from, e.tag, i);
    for (size_t i = in.size() - 8; i < in.size(); ++i) same = same && in[i] == 0;
    CHECK(same);
  }
  uint64_t failed = 0, replayed = 0, delivered = 0, sent = 0;
  for (int n = 0; n < 3; ++n) {
    for (int p = 0; p < 3; ++p) {
      const Stats s = net.endpoint(n)->peerStats(p);
      failed += dropped(s, DropReason::kAuthFailed);
      replayed += dropped(s, DropReason::kReplayed);
      delivered += s.bytesDelivered;
      CHECK_EQ(dropped(s, DropReason::kBadChecksum), uint64_t{0});  // auth sees it first
    }
  }
  for (const auto& o : outs) sent += o.size();
  CHECK_EQ(delivered, sent);  // every byte delivered once
  CHECK(failed > 0);
  CHECK(replayed > 0);
}

void testMtuRoom() {
  EndpointOptions o = authOptions(groupKey(1));
  o.config.mtuPayload = 270;
  CHECK_THROWS(Endpoint(0, 2, o), config::ConfigError, "at least 280");
  o.config.mtuPayload = 280;
  Endpoint ok(0, 2, o);
  CHECK_EQ(ok.rank(), 0);
}

// ------------------------------------------------------------------------------ real sockets

// One IPv4 UDP datagram to 127.0.0.1:`to` that claims to come from 127.0.0.1:`from`, through
// a raw socket (as any root on the path could): what a Store reader who sniffed the token
// sends. false when raw sockets are not allowed here (not root, no CAP_NET_RAW).
bool sendSpoofed(uint16_t from, uint16_t to, const std::vector<uint8_t>& payload) {
  const int fd = ::socket(AF_INET, SOCK_RAW, IPPROTO_RAW);  // IPPROTO_RAW: we write the IP header
  if (fd < 0) return false;
  std::vector<uint8_t> packet(28 + payload.size(), 0);
  const auto put16 = [&packet](size_t at, uint16_t v) {
    packet[at] = static_cast<uint8_t>(v >> 8);  // network byte order
    packet[at + 1] = static_cast<uint8_t>(v);
  };
  packet[0] = 0x45;  // IPv4, 20-byte header
  put16(2, static_cast<uint16_t>(packet.size()));
  packet[8] = 64;  // TTL
  packet[9] = IPPROTO_UDP;
  const uint8_t loopback[4] = {127, 0, 0, 1};
  std::memcpy(&packet[12], loopback, 4);
  std::memcpy(&packet[16], loopback, 4);
  put16(20, from);
  put16(22, to);
  put16(24, static_cast<uint16_t>(8 + payload.size()));  // UDP checksum 0: none (IPv4)
  std::memcpy(&packet[28], payload.data(), payload.size());
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool sent = ::sendto(fd, packet.data(), packet.size(), 0,
                             reinterpret_cast<const sockaddr*>(&dst), sizeof dst) ==
                    static_cast<ssize_t>(packet.size());
  ::close(fd);
  return sent;
}

uint64_t counter(const Counters& counters, const std::string& name) {
  for (const auto& [key, value] : counters) {
    if (key == name) return value;
  }
  return ~uint64_t{0};
}

// An ICMP port unreachable to 127.0.0.1, quoting a UDP datagram from port `from` to port
// `to`: what the kernel hands the socket bound to `from` as "`to` is closed".
bool sendSpoofedPortUnreachable(uint16_t from, uint16_t to) {
  const int fd = ::socket(AF_INET, SOCK_RAW, IPPROTO_ICMP);  // the kernel writes the IP header
  if (fd < 0) return false;
  std::vector<uint8_t> m(8 + 20 + 8, 0);  // ICMP header, quoted IP header, quoted UDP header
  const auto put16 = [&m](size_t at, uint16_t v) {
    m[at] = static_cast<uint8_t>(v >> 8);
    m[at + 1] = static_cast<uint8_t>(v);
  };
  const auto checksum = [&m](size_t from, size_t n) {
    uint32_t sum = 0;
    for (size_t i = from; i < from + n; i += 2) sum += uint32_t{m[i]} << 8 | m[i + 1];
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    return static_cast<uint16_t>(~sum);
  };
  m[0] = 3;  // destination unreachable
  m[1] = 3;  // port unreachable
  m[8] = 0x45;
  put16(10, 28 + 40);
  m[16] = 64;
  m[17] = IPPROTO_UDP;
  const uint8_t loopback[4] = {127, 0, 0, 1};
  std::memcpy(&m[20], loopback, 4);
  std::memcpy(&m[24], loopback, 4);
  put16(18, checksum(8, 20));
  put16(28, from);
  put16(30, to);
  put16(32, 48);
  put16(2, checksum(0, m.size()));
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool sent = ::sendto(fd, m.data(), m.size(), 0, reinterpret_cast<const sockaddr*>(&dst),
                             sizeof dst) == static_cast<ssize_t>(m.size());
  ::close(fd);
  return sent;
}

struct SocketForgery {
  bool sent = false;
  bool landed = false;
  uint64_t authFailed = 0;
};

// Two UdpTransports on 127.0.0.1, connected to each other.
std::vector<std::unique_ptr<UdpTransport>> loopbackPair(std::optional<AuthKey> key) {
  UdpTransportOptions options;
  options.sessionToken = kToken;
  options.groupKey = key;
  options.config.mtuPayload = 8972;
  options.lingerQuietUs = 1000;
  options.lingerMaxUs = 50'000;  // rank 1 has a forged packet's ACK to wonder about
  std::vector<std::unique_ptr<UdpTransport>> ts;
  for (int r = 0; r < 2; ++r) ts.push_back(std::make_unique<UdpTransport>(r, 2, options));
  for (int r = 0; r < 2; ++r) {
    for (int p = 0; p < 2; ++p) ts[r]->connect(p, ts[p]->localAddress());
  }
  return ts;
}

// Two UdpTransports on 127.0.0.1; rank 0 waits for a message from rank 1, and a third party
// forges it with the token, from rank 1's address.
SocketForgery forgeOverSockets(std::optional<AuthKey> key) {
  const auto ts = loopbackPair(key);
  std::vector<uint8_t> inbox(64, 0);
  auto r = ts[0]->recv(1, 77, ~Tag{0}, inbox.data(), inbox.size());
  const std::vector<uint8_t> evil(64, 0xEE);
  SocketForgery out;
  std::vector<uint8_t> forged = dataDatagram(1, 77, evil, 0, 0);
  sealChecksum(forged);
  out.sent = sendSpoofed(ts[1]->boundAddress().port(), ts[0]->boundAddress().port(), forged);
  if (!out.sent) return out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (r->pending() && std::chrono::steady_clock::now() < deadline) ts[0]->progress();
  out.landed = r->state() == RequestState::kDone && inbox == evil;
  out.authFailed = counter(ts[0]->peerCounters()[1], "dropped_auth_failed");
  r->cancel();
  ts[0]->progress();
  return out;
}

// The automatic send window (sendWindowFor) is the share of the peer's buffer in both modes:
// the authenticated one bounds its packets in flight in packets instead
// (ReplayWindow::kInFlightLimit, replay_small_datagrams), where until 2026-11-28 it cut the
// window to 2048 x mtu_payload bytes, which holds many more small datagrams than 2048.
void testReplaySafeWindow() {
  constexpr uint64_t kPayload = 1472;
  for (const bool sealed : {false, true}) {
    UdpTransportOptions options;
    options.sessionToken = kToken;
    if (sealed) options.groupKey = groupKey(1);
    options.config.mtuPayload = kPayload;
    options.lingerQuietUs = 1000;
    std::vector<std::unique_ptr<UdpTransport>> ts;
    for (int r = 0; r < 2; ++r) ts.push_back(std::make_unique<UdpTransport>(r, 2, options));
    for (int r = 0; r < 2; ++r) ts[r]->connect(1 - r, ts[1 - r]->localAddress());
    const uint64_t buffer = counter(ts[1]->transportCounters(), "socket_receive_buffer");
    const uint64_t share = sendWindowFor(options.config, buffer, 1);
    const uint64_t window = counter(ts[0]->peerCounters()[1], "send_window_bytes");
    CHECK_EQ(window, share);
    std::printf("ok %s window %llu bytes (buffer share %llu)\n", sealed ? "sealed" : "open",
                static_cast<unsigned long long>(window), static_cast<unsigned long long>(share));
  }
}

void testSpoofedSocket() {
  const SocketForgery open = forgeOverSockets(std::nullopt);
  if (!open.sent) {
    std::printf("skipped: raw sockets are not allowed here (needs root or CAP_NET_RAW)\n");
    return;
  }
  CHECK_MSG(open.landed, "without authentication a spoofed datagram with the token lands");
  CHECK_EQ(open.authFailed, uint64_t{0});
  const SocketForgery sealed = forgeOverSockets(groupKey(1));
  CHECK(sealed.sent);
  CHECK(!sealed.landed);
  CHECK_EQ(sealed.authFailed, uint64_t{1});

  // A forged ICMP port unreachable for rank 1's port, while rank 0 waits for rank 1: the
  // authenticated connection stays up (rank 1 answers the PING it gets), and the message
  // then arrives.
  const auto ts = loopbackPair(groupKey(1));
  std::vector<uint8_t> inbox(64, 0);
  auto r = ts[0]->recv(1, 77, ~Tag{0}, inbox.data(), inbox.size());
  CHECK(sendSpoofedPortUnreachable(ts[0]->boundAddress().port(), ts[1]->boundAddress().port()));
  const auto progressFor = [&](std::chrono::milliseconds ms, const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + ms;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      for (auto& t : ts) t->progress();
    }
  };
  // Past the grace period (keepalive_us, 200 ms) the forged report is contradicted.
  progressFor(std::chrono::milliseconds(400), [&] { return !r->pending(); });
  CHECK_MSG(r->pending(), "a forged ICMP failed the authenticated connection: " + r->error());
  const std::vector<uint8_t> real(64, 0x44);
  auto s = ts[1]->send(0, 77, real.data(), real.size());
  progressFor(std::chrono::seconds(5), [&] { return !r->pending() && !s->pending(); });
  CHECK(r->state() == RequestState::kDone && inbox == real);
}

// Not a test: what sealing and opening cost per byte on this machine, for the docs
// (`./udp_auth_test measure`).
void measure() {
  const AuthKey key = deriveDirectionKey(groupKey(1), 0, 1);
  DatagramSealer sealer(key, 0, 1);
  DatagramOpener opener(key, 0, 1);
  for (size_t size : {size_t{1472}, size_t{8972}, size_t{65507}}) {
    std::vector<uint8_t> d(size, 0x33);
    const size_t inner = size - kAuthTrailerBytes;
    const int rounds = static_cast<int>((size_t{256} << 20) / size);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) sealer.seal(d, inner);
    const double sealMs = check::wallMs(t0);
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) opener.open(d);  // all but the last are replays: same work
    const double openMs = check::wallMs(t1);
    const double mb = static_cast<double>(size) * rounds / 1e6;
    std::printf("datagram %6zu B: seal %.2f GB/s, open %.2f GB/s (one core)\n", size,
                mb / sealMs, mb / openMs);  // MB per ms = GB/s
  }
}

const check::Group kGroups[] = {
    {"replay_window", testReplayWindow, true},
    {"seal_open", testSealOpen, true},
    {"keys", testKeys, true},
    {"secret_file", testSecretFile, true},
    {"forgery", testForgery, true},
    {"replay_and_instances", testReplayAndInstances, true},
    {"fault_matrix", testFaultMatrix, true},
    {"mtu_room", testMtuRoom, true},
    {"spoofed_socket", testSpoofedSocket, true},
    {"replay_safe_window", testReplaySafeWindow, true},
    {"replay_small_datagrams", testReplaySmallDatagrams, true},
    {"measure", measure, false},
};

}  // namespace

int main(int argc, char** argv) { return check::runGroups("udp_auth_test", kGroups, argc, argv); }
