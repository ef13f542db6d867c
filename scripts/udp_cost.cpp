// What the UDP transport costs per byte moved, for comparing two builds: two ranks send each
// other BYTES ROUNDS times, and every byte received is compared with what was sent.
//
//   memory   two PeerConnections (the sans-IO core) hand each other their datagrams in one
//            thread: no sockets, no clock, the same run every time, so instruction counts
//            compare builds on a loaded host where CPU times do not
//   sockets  two UdpTransports over 127.0.0.1, one thread each, sleeping on eventFd()/arm()
//            when idle as the backend's progress thread does; prints each rank's CPU time
//   fold4, fold8
//            sockets, each receive folded into an accumulator as it arrives (recvFolded, as
//            the reduce-scatter receives) with a sum of 4- or 8-byte integers (exact, so every
//            element is checked): what a datagram's payload alignment costs the fold
//
// Built by tests/test_udp_cost.py (tests/cpp_build.py), or by hand from the repository root:
//   g++ -std=c++20 -O3 -DNDEBUG -pthread -I. scripts/udp_cost.cpp transports/udp/*.cpp
//       transports/config/*.cpp transports/fold_target.cpp -lcrypto -o /tmp/udp_cost
// (-DNDEBUG as the extension is built: with assertions on in udp_transport.cpp alone, the
// sockets mode measured 30-45% more CPU per GB, which hid what a change did.)
// Instructions per round (docs/performance.md): run under valgrind --tool=callgrind with 3
// rounds and with 1, and divide the difference by 2 rounds' bytes (2 directions x BYTES each).
//
//   udp_cost memory|sockets|fold4|fold8 BYTES ROUNDS [MTU_PAYLOAD=1472]
// Exit status: 0, 1 when a byte or a request was wrong, 2 for bad arguments.
#include <sys/epoll.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transports/udp/reliability.h"
#include "transports/udp/udp_config.h"
#include "transports/udp/udp_transport.h"

using namespace ucxb;

namespace {

uint8_t patternByte(size_t i, int rank) { return static_cast<uint8_t>(i * 31 + 7 * rank); }

std::vector<uint8_t> pattern(size_t bytes, int rank) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = patternByte(i, rank);
  return v;
}

[[noreturn]] void wrong(const std::string& what) {
  std::fprintf(stderr, "udp_cost: %s\n", what.c_str());
  std::exit(1);
}

int runMemory(size_t bytes, int rounds, const udp::UdpConfig& config) {
  udp::PeerConnection a(config, udp::PeerIdentity{0, 1, 7});
  udp::PeerConnection b(config, udp::PeerIdentity{1, 0, 7});
  udp::PeerConnection* conn[2] = {&a, &b};
  const std::vector<uint8_t> src[2] = {pattern(bytes, 0), pattern(bytes, 1)};
  std::vector<uint8_t> dst[2] = {std::vector<uint8_t>(bytes), std::vector<uint8_t>(bytes)};
  // A batch per turn, as a socket loop's sendmmsg would carry.
  constexpr size_t kBatch = 64;
  const size_t mtu = config.mtuPayload;
  std::vector<uint8_t> arena(kBatch * mtu);
  size_t lengths[kBatch];
  udp::TimeUs now = 1000;
  uint64_t datagrams = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < 2; ++i) {
      conn[i]->send(static_cast<Tag>(r), src[i].data(), bytes);
      conn[i]->postReceive(static_cast<Tag>(r), ~Tag{0}, dst[i].data(), bytes);
    }
    int completed = 0;  // 2 sends and 2 receives
    while (completed < 4) {
      for (int i = 0; i < 2; ++i) {
        size_t n = 0;
        while (n < kBatch) {
          lengths[n] = conn[i]->pollTransmit(now, std::span<uint8_t>(arena.data() + n * mtu, mtu));
          if (lengths[n] == 0) break;
          ++n;
        }
        datagrams += n;
        for (size_t k = 0; k < n; ++k) {
          conn[1 - i]->onDatagram(std::span<const uint8_t>(arena.data() + k * mtu, lengths[k]),
                                  now);
        }
        now += 5;  // a few microseconds per batch: RTT samples and timers stay plausible
      }
      for (int i = 0; i < 2; ++i) {
        if (const auto t = conn[i]->nextTimeout(); t && *t <= now) conn[i]->onTimeout(now);
        while (const auto e = conn[i]->pollEvent()) {
          if (e->kind != udp::EventKind::kSendCompleted &&
              e->kind != udp::EventKind::kMessageReceived) {
            wrong("round " + std::to_string(r) + ", connection " + std::to_string(i) + ": " +
                  udp::eventKindName(e->kind) + " " + e->error);
          }
          ++completed;
        }
      }
    }
    for (int i = 0; i < 2; ++i) {
      if (std::memcmp(dst[i].data(), src[1 - i].data(), bytes) != 0) {
        wrong("round " + std::to_string(r) + ": rank " + std::to_string(i) + " got wrong bytes");
      }
    }
  }
  const udp::Stats s = a.stats();
  std::printf("datagrams %llu retransmitted %llu\n", static_cast<unsigned long long>(datagrams),
              static_cast<unsigned long long>(s.retransmittedPackets));
  return 0;
}

double seconds(const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; }

struct RankResult {
  double userS = 0, systemS = 0;
  uint64_t retransmitted = 0;
  std::string error;
};

// The sum the fold modes fold with (elements of T, wrapping: exact whatever the bytes).
template <typename T>
void sumInto(void* acc, const void* in, size_t elements) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(in);
  for (size_t i = 0; i < elements; ++i) a[i] += b[i];
}

// Whether `acc`, started as a copy of `start` and then folded with `rounds` copies of
// `added`, holds start + rounds x added in every element of T.
template <typename T>
bool foldedRight(const std::vector<uint8_t>& acc, const std::vector<uint8_t>& start,
                 const std::vector<uint8_t>& added, int rounds) {
  for (size_t i = 0; i + sizeof(T) <= acc.size(); i += sizeof(T)) {
    T a, s, d;
    std::memcpy(&a, acc.data() + i, sizeof(T));
    std::memcpy(&s, start.data() + i, sizeof(T));
    std::memcpy(&d, added.data() + i, sizeof(T));
    if (a != static_cast<T>(s + static_cast<T>(rounds) * d)) return false;
  }
  return true;
}

// elementSize 0: plain receives, every round's bytes checked; 4 or 8: folded receives.
void runRank(udp::UdpTransport& t, size_t bytes, int rounds, size_t elementSize,
             RankResult& out) {
  const int me = t.rank(), peer = 1 - me;
  const std::vector<uint8_t> src = pattern(bytes, me);
  std::vector<uint8_t> dst(bytes);
  if (elementSize != 0) dst = src;  // the accumulator starts as this rank's own pattern
  const Transport::Fold fold = elementSize == 8 ? sumInto<uint64_t> : sumInto<uint32_t>;
  rusage before{}, after{};
  getrusage(RUSAGE_THREAD, &before);
  for (int r = 0; r < rounds; ++r) {
    auto recv = elementSize == 0
                    ? t.recv(peer, static_cast<Tag>(r + 1), ~Tag{0}, dst.data(), bytes)
                    : t.recvFolded(peer, static_cast<Tag>(r + 1), ~Tag{0}, dst.data(), bytes,
                                   elementSize, fold);
    auto send = t.send(peer, static_cast<Tag>(r + 1), src.data(), bytes);
    while (recv->pending() || send->pending()) {
      if (t.progress()) continue;
      if (t.arm()) {
        epoll_event ev;
        ::epoll_wait(t.eventFd(), &ev, 1, 100);
      }
    }
    if (recv->failed() || send->failed()) {
      out.error = "rank " + std::to_string(me) + ": " + recv->error() + send->error();
      return;
    }
    for (size_t i = 0; elementSize == 0 && i < bytes; ++i) {
      if (dst[i] != patternByte(i, peer)) {
        out.error = "rank " + std::to_string(me) + " got a wrong byte at " + std::to_string(i);
        return;
      }
    }
  }
  getrusage(RUSAGE_THREAD, &after);
  const std::vector<uint8_t> sent = pattern(bytes, peer);
  if (elementSize != 0 && !(elementSize == 8 ? foldedRight<uint64_t>(dst, src, sent, rounds)
                                             : foldedRight<uint32_t>(dst, src, sent, rounds))) {
    out.error = "rank " + std::to_string(me) + " folded a wrong sum";
    return;
  }
  out.userS = seconds(after.ru_utime) - seconds(before.ru_utime);
  out.systemS = seconds(after.ru_stime) - seconds(before.ru_stime);
  const auto counters = t.peerCounters();
  for (const auto& [name, value] : counters[static_cast<size_t>(peer)]) {
    if (name == "retransmitted") out.retransmitted = value;
  }
}

int runSockets(size_t bytes, int rounds, size_t elementSize, const udp::UdpConfig& config) {
  udp::UdpTransportOptions options;
  options.config = config;
  options.sessionToken = 7;
  std::unique_ptr<udp::UdpTransport> t[2] = {std::make_unique<udp::UdpTransport>(0, 2, options),
                                             std::make_unique<udp::UdpTransport>(1, 2, options)};
  for (int a = 0; a < 2; ++a) {
    for (int b = 0; b < 2; ++b) t[a]->connect(b, t[b]->localAddress());
  }
  RankResult result[2];
  std::thread other([&] { runRank(*t[1], bytes, rounds, elementSize, result[1]); });
  runRank(*t[0], bytes, rounds, elementSize, result[0]);
  other.join();
  double cpu = 0;
  for (int r = 0; r < 2; ++r) {
    if (!result[r].error.empty()) wrong(result[r].error);
    std::printf("rank %d user_s %.3f system_s %.3f retransmitted %llu\n", r, result[r].userS,
                result[r].systemS, static_cast<unsigned long long>(result[r].retransmitted));
    cpu += result[r].userS + result[r].systemS;
  }
  // Per rank, per GB that rank sent (it received as much).
  std::printf("cpu_s_per_gb %.3f\n", cpu / 2 / (static_cast<double>(bytes) * rounds / 1e9));
  return 0;
}

int usage() {
  std::fprintf(stderr, "usage: udp_cost memory|sockets|fold4|fold8 BYTES ROUNDS [MTU_PAYLOAD=1472]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) return usage();
  const std::string mode = argv[1];
  char* end = nullptr;
  const unsigned long long bytes = std::strtoull(argv[2], &end, 10);
  if (*end != '\0' || bytes == 0) return usage();
  const long rounds = std::strtol(argv[3], &end, 10);
  if (*end != '\0' || rounds < 1) return usage();
  udp::UdpConfig config;
  config.mtuPayload = 1472;  // Ethernet's: the per-datagram costs show, as across the rig
  try {
    if (argc == 5) config = udp::parseUdpConfig("mtu_payload=" + std::string(argv[4]), config);
    if (mode == "memory") return runMemory(bytes, static_cast<int>(rounds), config);
    if (mode == "sockets") return runSockets(bytes, static_cast<int>(rounds), 0, config);
    if (mode == "fold4" || mode == "fold8") {
      const size_t elementSize = mode == "fold8" ? 8 : 4;
      if (bytes % elementSize != 0) return usage();
      return runSockets(bytes, static_cast<int>(rounds), elementSize, config);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "udp_cost: %s\n", e.what());
    return 2;
  }
  return usage();
}
