#include "transports/udp/udp_transport.h"

#include <sys/epoll.h>
#include <sys/timerfd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <utility>

#include "transports/fold_target.h"
#include "transports/udp/wire_format.h"

namespace ucxb::udp {
namespace {

// A folding receive's destination as the core's sink (MessageReceiver hands each byte over
// once, so folding it is safe).
class FoldSink final : public ReceiveSink {
 public:
  FoldSink(void* dst, size_t bytes, size_t elementSize, Transport::Fold fold)
      : target_(dst, bytes, elementSize, std::move(fold)) {}
  void write(uint64_t offset, const uint8_t* bytes, size_t length) override {
    target_.unpack(offset, bytes, length);
  }

 private:
  FoldTarget target_;
};

constexpr size_t kReceiveBatch = 32;      // datagrams per recvmmsg
// Receive slots lie this far apart: kMaxDatagramBytes rounded up to a cache line, so that
// every slot starts aligned and a DATA payload (at kDataHeaderBytes) is 8-aligned for the fold.
constexpr size_t kReceiveSlotBytes = (kMaxDatagramBytes + 63) / 64 * 64;
constexpr size_t kReceiveBatchesPerProgress = 8;
constexpr size_t kSendBatch = 64;         // datagrams per sendmmsg
// Datagrams one progress() sends at least (then it returns to receive ACKs), and receives at
// most before it sends: with GRO a batch of 32 trains is up to 1408 datagrams, and 8 such
// batches (16 MB at Ethernet's size) before any send let one rank's receiving starve its
// sending (and its ACKs) while its peer, window spent, slept (the rig's slow mode, issue #23).
// A progress() that received more sends as many as it received: each direction gets as much
// of the thread as the other.
constexpr size_t kSendPerProgress = 512;
// Marks the receive buffer's record after the addresses in localAddress(); an address record
// starts with its family (4 or 6), so the two cannot be confused.
constexpr uint8_t kReceiveBufferTag = 'R';

[[noreturn]] void throwErrno(const std::string& what) {
  throw TransportError("udp: " + what + " failed: " + std::strerror(errno));
}

}  // namespace

TimeUs UdpTransport::nowUs() {
  return static_cast<TimeUs>(std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count());
}

UdpTransport::UdpTransport(int rank, int size, UdpTransportOptions options)
    : endpoint_(rank, size, options),
      socket_(SocketAddress::parse(options.bindHost, 0),
              static_cast<int>(options.config.socketBufferBytes)) {
  for (uint32_t p = 1; p < options.config.paths; ++p) {
    pathSockets_.push_back(std::make_unique<UdpSocket>(
        SocketAddress::parse(options.bindHost, 0),
        static_cast<int>(options.config.socketBufferBytes)));
  }
  epollFd_ = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  if (epollFd_.get() < 0) throwErrno("epoll_create1()");
  timerFd_ = UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (timerFd_.get() < 0) throwErrno("timerfd_create()");
  std::vector<int> fds = {timerFd_.get()};
  for (uint32_t p = 0; p < socketCount(); ++p) fds.push_back(socketOf(p).fd());
  for (int fd : fds) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epollFd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) throwErrno("epoll_ctl(ADD)");
  }
  // Left uninitialised (6 MB on loopback between the two): zeroing them cost every group's
  // creation milliseconds, and the kernel still hands out zeroed pages as they are touched.
  receiveArena_ = std::make_unique_for_overwrite<uint8_t[]>(kReceiveBatch * kReceiveSlotBytes);
  receiveBatch_.resize(kReceiveBatch);
  for (size_t i = 0; i < kReceiveBatch; ++i) {
    receiveBatch_[i].data = receiveArena_.get() + i * kReceiveSlotBytes;
    receiveBatch_[i].capacity = kMaxDatagramBytes;
  }
  const size_t mtu = endpoint_.options().config.mtuPayload;
  sendArena_ = std::make_unique_for_overwrite<uint8_t[]>(kSendBatch * mtu);
  outgoing_.resize(kSendBatch);
  outgoingPath_.resize(kSendBatch);
  // Each datagram is written right after the one before (transmit()): room for kSendBatch
  // of the largest.
}

UdpTransport::~UdpTransport() {
  try {
    endpoint_.close(nowUs());
    linger();
  } catch (...) {
    // A destructor must not throw; the endpoint fails what is left when it goes.
  }
}

void UdpTransport::linger() {
  // The endpoint decides when to stop and what to send meanwhile; this only keeps the socket
  // served until then, sleeping between rounds. The wait is capped so that a state change no
  // fd reports (a connection falling idle) is looked at within a few ms.
  constexpr int kMaxWaitMs = 5;
  for (;;) {
    progress();
    if (endpoint_.lingerDone(nowUs())) return;
    if (arm()) {
      epoll_event ev;
      ::epoll_wait(epollFd_.get(), &ev, 1, kMaxWaitMs);
    }
  }
}

// The bare socket address: the record it travels in names the transport and is checked
// before connect() sees it (csrc/handshake.h).
// With several paths, one address per path, in path order. Then the receive buffer the kernel
// granted (the smallest of the sockets'), from which each peer sizes its send window towards
// this rank (sendWindowFor): kReceiveBufferTag, then 8 bytes, big-endian.
std::vector<uint8_t> UdpTransport::localAddress() const {
  std::vector<uint8_t> blob;
  uint64_t buffer = UINT64_MAX;
  for (uint32_t p = 0; p < socketCount(); ++p) {
    socketOf(p).localAddress().appendTo(blob);
    buffer = std::min(buffer, static_cast<uint64_t>(socketOf(p).receiveBufferBytes()));
  }
  blob.push_back(kReceiveBufferTag);
  for (int shift = 56; shift >= 0; shift -= 8) blob.push_back(static_cast<uint8_t>(buffer >> shift));
  return blob;
}

void UdpTransport::connect(int peer, const std::vector<uint8_t>& address) {
  size_t offset = 0;
  std::vector<SocketAddress> paths;
  std::optional<uint64_t> receiveBuffer;
  while (offset < address.size() || paths.empty()) {
    if (!paths.empty() && address[offset] == kReceiveBufferTag &&
        address.size() - offset == 1 + sizeof(uint64_t)) {
      receiveBuffer = 0;
      for (size_t i = 1; i <= sizeof(uint64_t); ++i) {
        *receiveBuffer = (*receiveBuffer << 8) | address[offset + i];
      }
      break;
    }
    SocketAddress a;
    try {
      a = SocketAddress::readFrom(address, offset);
    } catch (const TransportError& e) {
      // readFrom knows the bytes, not whose they are: name the rank that published them.
      throw TransportError("udp: the address of rank " + std::to_string(peer) + " (" +
                               std::to_string(address.size()) + " bytes) is not one: " +
                               e.what(),
                           peer);
    }
    if (a.family() != socket_.localAddress().family()) {
      throw TransportError("udp: rank " + std::to_string(peer) + " is at " + a.toString() +
                               ", another address family than this rank's " +
                               socket_.localAddress().toString(),
                           peer);
    }
    paths.push_back(a);
  }
  endpoint_.connect(peer, std::span<const SocketAddress>(paths), receiveBuffer);
}

RequestPtr UdpTransport::send(int peer, Tag tag, const void* data, size_t bytes,
                              MemoryType mem) {
  if (mem != MemoryType::kHost) {
    throw TransportError("udp: the udp transport carries host memory only", peer);
  }
  return endpoint_.send(peer, tag, data, bytes);
}

RequestPtr UdpTransport::recv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                              MemoryType mem) {
  if (mem != MemoryType::kHost) {
    throw TransportError("udp: the udp transport carries host memory only", peer);
  }
  return endpoint_.recv(peer, tag, mask, data, bytes);
}

RequestPtr UdpTransport::recvFolded(int peer, Tag tag, Tag mask, void* dst, size_t bytes,
                                    size_t elementSize, Fold fold) {
  if (peer == kAnySource) return nullptr;
  auto sink = std::make_shared<FoldSink>(dst, bytes, elementSize, std::move(fold));
  RequestPtr req = endpoint_.recv(peer, tag, mask, bytes, *sink);
  req->keepAlive(std::move(sink));
  return req;
}

bool UdpTransport::progress() {
  bool active = false;
  const TimeUs now = nowUs();
  const size_t received = receiveDatagrams(now, active);
  bool errorsReported = false;
  for (uint32_t p = 0; p < socketCount(); ++p) errorsReported |= socketOf(p).errorsReported();
  if (errorsReported && receiveRefusals(now)) active = true;
  if (endpoint_.handleTimeout(now)) active = true;
  transmit(now, active, std::max(kSendPerProgress, received));
  if (endpoint_.completeRequests()) active = true;
  return active;
}

size_t UdpTransport::receiveDatagrams(TimeUs now, bool& active) {
  size_t received = 0;
  for (uint32_t p = 0; p < socketCount(); ++p) received += receiveFrom(socketOf(p), now, active);
  return received;
}

size_t UdpTransport::receiveFrom(UdpSocket& socket, TimeUs now, bool& active) {
  size_t received = 0;  // datagrams, each of a train counted
  for (size_t round = 0; round < kReceiveBatchesPerProgress && received < kSendPerProgress;
       ++round) {
    const size_t n = socket.receiveBatch(receiveBatch_);
    if (n == 0) return received;
    ++counts_.receiveBatches;
    active = true;
    for (size_t i = 0; i < n; ++i) {
      const Datagram& d = receiveBatch_[i];
      received += d.segmentSize != 0 ? (d.length + d.segmentSize - 1) / d.segmentSize : 1;
      if (d.truncated) {
        ++counts_.truncatedOnReceive;
        continue;
      }
      // A coalesced train (UDP GRO) goes in whole: the endpoint cuts it apart.
      if (endpoint_.handleDatagram(now, d.peer, std::span<const uint8_t>(d.data, d.length),
                                   d.segmentSize) &&
          d.segmentSize != 0) {
        ++counts_.trainsReceived;
      }
    }
    if (n < receiveBatch_.size()) return received;
  }
  return received;
}

bool UdpTransport::receiveRefusals(TimeUs now) {
  refused_.clear();
  size_t errors = 0;
  for (uint32_t p = 0; p < socketCount(); ++p) errors += socketOf(p).receiveRefusals(refused_);
  counts_.socketErrors += errors;
  for (const SocketAddress& to : refused_) endpoint_.handlePortUnreachable(now, to);
  return errors > 0;
}

void UdpTransport::setWantWritable(bool want) {
  if (want == wantWritable_) return;
  for (uint32_t p = 0; p < socketCount(); ++p) {
    epoll_event ev{};
    ev.events = EPOLLIN | (want ? EPOLLOUT : 0u);
    ev.data.fd = socketOf(p).fd();
    if (::epoll_ctl(epollFd_.get(), EPOLL_CTL_MOD, ev.data.fd, &ev) != 0) {
      throwErrno("epoll_ctl(MOD)");
    }
  }
  wantWritable_ = want;
}

void UdpTransport::buildTrains() {
  // Datagrams lie back to back in sendArena_, so consecutive datagrams of one size to one
  // peer are already one contiguous train, and a shorter one (an ACK, a message's tail) ends
  // it. A train's segment size is its first datagram's: full DATA datagrams are the mtu, or
  // up to 7 bytes less where fragments are rounded down to kFragmentAlignment
  // (maxFragmentBytes).
  trains_.clear();
  trainSlots_.clear();
  trainPath_.clear();
  const size_t mtu = endpoint_.options().config.mtuPayload;
  for (size_t i = outgoingSent_; i < outgoingCount_;) {
    // Per path: a socket that met a refused train sends no more (UdpSocket::sendBatch).
    const bool gso = socketOf(outgoingPath_[i]).segmentationOffload() &&
                     2 * mtu <= UdpSocket::kMaxTrainBytes;
    Datagram train = outgoing_[i];
    size_t slots = 1;
    const size_t segment = train.length;
    while (gso && i + slots < outgoingCount_ && outgoing_[i + slots - 1].length == segment &&
           outgoing_[i + slots].data == outgoing_[i + slots - 1].data + segment &&
           outgoing_[i + slots].length <= segment && slots < UdpSocket::kMaxSegments &&
           train.length + outgoing_[i + slots].length <= UdpSocket::kMaxTrainBytes &&
           outgoing_[i + slots].peer == train.peer &&
           outgoingPath_[i + slots] == outgoingPath_[i]) {
      train.length += outgoing_[i + slots].length;
      ++slots;
    }
    train.segmentSize = slots > 1 ? static_cast<uint16_t>(segment) : 0;
    trains_.push_back(train);
    trainSlots_.push_back(slots);
    trainPath_.push_back(outgoingPath_[i]);
    i += slots;
  }
}

bool UdpTransport::flushOutgoing() {
  if (outgoingSent_ < outgoingCount_) {
    buildTrains();
    // One sendmmsg per run of trains leaving from the same path's socket.
    for (size_t k = 0; k < trains_.size();) {
      size_t end = k + 1;
      while (end < trains_.size() && trainPath_[end] == trainPath_[k]) ++end;
      const size_t sent = socketOf(trainPath_[k])
                              .sendBatch(std::span<Datagram>(trains_).subspan(k, end - k));
      ++counts_.sendBatches;
      for (size_t j = k; j < k + sent; ++j) {
        outgoingSent_ += trainSlots_[j];
        if (trainSlots_[j] > 1) ++counts_.trainsSent;
      }
      if (k + sent < end) break;
      k = end;
    }
  }
  if (outgoingSent_ < outgoingCount_) {
    ++counts_.sendBlocked;
    setWantWritable(true);
    return false;
  }
  outgoingSent_ = outgoingCount_ = 0;
  setWantWritable(false);
  return true;
}

void UdpTransport::transmit(TimeUs now, bool& active, size_t budget) {
  sendBacklog_ = false;
  if (!flushOutgoing()) return;
  const size_t mtu = endpoint_.options().config.mtuPayload;
  for (; budget > 0; --budget) {
    if (outgoingCount_ == outgoing_.size() && !flushOutgoing()) {
      sendBacklog_ = true;
      return;
    }
    Datagram& d = outgoing_[outgoingCount_];
    d.data = outgoingCount_ == 0 ? sendArena_.get()
                                 : outgoing_[outgoingCount_ - 1].data +
                                       outgoing_[outgoingCount_ - 1].length;
    const size_t n = endpoint_.pollTransmit(now, std::span<uint8_t>(d.data, mtu), d.peer,
                                            outgoingPath_[outgoingCount_]);
    if (n == 0) {
      if (!flushOutgoing()) sendBacklog_ = true;
      return;
    }
    d.length = n;
    ++outgoingCount_;
    active = true;
  }
  // The budget ran out: let progress() return to receive ACKs, and come back at once.
  sendBacklog_ = true;
  flushOutgoing();
}

void UdpTransport::abortPeer(int peer, const std::string& why) { endpoint_.abortPeer(peer, why); }

int UdpTransport::probe(Tag tag, Tag mask) { return endpoint_.probe(tag, mask); }

std::string UdpTransport::peerError(int peer) const { return endpoint_.peerError(peer); }

bool UdpTransport::arm() {
  if (sendBacklog_) return false;
  // An error left in the queue keeps the socket reporting EPOLLERR, which would wake the
  // sleeper at once forever: read it before sleeping (one system call per sleep), and come
  // back to progress() if it failed a peer.
  if (receiveRefusals(nowUs())) return false;
  const auto deadline = endpoint_.nextTimeout();
  if (deadline && *deadline <= nowUs()) return false;
  itimerspec spec{};
  if (deadline) {
    // steady_clock is CLOCK_MONOTONIC on Linux, the timerfd's clock.
    spec.it_value.tv_sec = static_cast<time_t>(*deadline / 1'000'000);
    spec.it_value.tv_nsec = static_cast<long>((*deadline % 1'000'000) * 1000);
  }
  // Re-arming (or disarming) also clears an expiry the fd still reports.
  if (::timerfd_settime(timerFd_.get(), TFD_TIMER_ABSTIME, &spec, nullptr) != 0) {
    throwErrno("timerfd_settime()");
  }
  return true;
}

std::vector<Counters> UdpTransport::peerCounters() const {
  std::vector<Counters> out(static_cast<size_t>(size()));
  for (int p = 0; p < size(); ++p) {
    out[static_cast<size_t>(p)] = statCounters(endpoint_.peerStats(p));
  }
  return out;
}

std::vector<TraceSeries> UdpTransport::drainTraceSeries() {
  const TraceRecorder* trace = endpoint_.trace();
  if (trace == nullptr) return {};
  std::vector<ConnectionSample> connections;
  std::vector<QueueSample> queues;
  endpoint_.drainTrace(connections, queues);
  TraceSeries conn{"conn", connectionSampleFields(), {}, trace->connectionsOverwritten()};
  for (const auto& s : connections) appendTraceValues(s, conn.values);
  TraceSeries queue{"queue", queueSampleFields(), {}, trace->queuesOverwritten()};
  for (const auto& s : queues) appendTraceValues(s, queue.values);
  return {std::move(conn), std::move(queue)};
}

Counters UdpTransport::transportCounters() const {
  Counters c = {
      {"unknown_source_drops", endpoint_.unknownSourceDrops()},
      {"truncated_on_receive", counts_.truncatedOnReceive},
      {"send_blocked", counts_.sendBlocked},
      {"receive_batches", counts_.receiveBatches},
      {"send_batches", counts_.sendBatches},
      {"trains_sent", counts_.trainsSent},
      {"trains_received", counts_.trainsReceived},
      {"socket_errors", counts_.socketErrors},
      {"port_unreachable", endpoint_.portUnreachableReports()},
      {"segmentation_offload", socket_.segmentationOffload() ? 1u : 0u},
      {"receive_offload", socket_.receiveOffload() ? 1u : 0u},
      {"mtu_payload", endpoint_.options().config.mtuPayload},
      {"paths", socketCount()},
      // 1: every datagram is sealed and checked (secret_file; datagram_auth.h)
      {"authenticated", endpoint_.options().groupKey ? 1u : 0u},
      {"socket_receive_buffer", static_cast<uint64_t>(socket_.receiveBufferBytes())},
      {"socket_send_buffer", static_cast<uint64_t>(socket_.sendBufferBytes())},
  };
  if (const FaultInjector* faults = endpoint_.faults()) {
    const auto f = faults->counters();
    c.insert(c.end(), {{"faults_seen", f.seen},
                       {"faults_dropped", f.dropped},
                       {"faults_duplicated", f.duplicated},
                       {"faults_reordered", f.reordered},
                       {"faults_delayed", f.delayed},
                       {"faults_corrupted", f.corrupted},
                       {"faults_burst_dropped", f.burstDropped},
                       {"faults_queue_dropped", f.queueDropped},
                       {"faults_marked", f.marked},
                       {"faults_trimmed", f.trimmed},
                       {"faults_queue_high_water", f.queueHighWater}});
    if (faults->paths() > 1) {
      for (size_t p = 0; p < faults->paths(); ++p) {
        const auto& pc = faults->pathCounters(p);
        const std::string prefix = "faults_path" + std::to_string(p) + "_";
        c.insert(c.end(), {{prefix + "dropped", pc.dropped + pc.burstDropped + pc.queueDropped},
                           {prefix + "marked", pc.marked},
                           {prefix + "trimmed", pc.trimmed}});
      }
    }
  }
  return c;
}

}  // namespace ucxb::udp
