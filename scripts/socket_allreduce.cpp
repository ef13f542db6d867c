// A 2-rank float32 all_reduce over one plain TCP connection, without UCX, torch or Python:
// the least CPU per byte an all_reduce over the kernel's TCP can spend, for comparison with
// the backend's ucx and with two opposite iperf3 transfers on the namespace rig
// (scripts/rig_socket_allreduce.py runs it there; docs/performance.md, issue #23).
//
//   g++ -O3 -march=native -std=c++20 -pthread scripts/socket_allreduce.cpp -o /tmp/x
//   /tmp/x RANK LISTEN_ADDR PEER_ADDR PORT MBYTES ITERS WARMUP MODE
//
// Rank 0 listens on LISTEN_ADDR:PORT, rank 1 connects to PEER_ADDR:PORT. Each rank owns half
// of the tensor. Per op a sender thread writes the peer's half (reduce-scatter), then its own
// half piece by piece as the receiving thread finishes folding each piece (all-gather,
// pipelined); the receiving thread reads the peer's copy of its half and folds it, then reads
// the peer's folded half. Both threads block in the system call, as iperf3 does; 512 KiB per
// call, the backend's UCX TCP segment. MODE says how the bytes reach the tensor:
//   fold     reduce-scatter pieces read into one warm 512 KiB buffer and summed into the
//            tensor; the all-gather read straight into the tensor (the least work possible)
//   copyout  as fold, but the all-gather read into the warm buffer and copied into the tensor
//            (what UCX's TCP transport does: it has no receive into the user's buffer)
//   move     no arithmetic: both phases read straight into the tensor (the transfer alone,
//            from and into a tensor of this size)
//   epoll    as fold, on a non-blocking socket: a call that would block waits in epoll_wait
//            and is retried, as UCX's TCP transport waits (what the event loop alone costs)
// Prints one JSON line: the loop's seconds and the process's CPU seconds (all threads, user +
// system). Every element must equal 2^(WARMUP+ITERS) at the end (fold/copyout), else exit 1.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kPiece = size_t{512} << 10;

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(2);
}

// The socket's direction for one thread: blocking calls, or (epoll >= 0) non-blocking ones
// that wait in epoll_wait for the socket to become ready when they would block.
struct Channel {
  int fd;
  int epoll = -1;

  void waitReady() const {
    epoll_event ev;
    while (epoll_wait(epoll, &ev, 1, -1) < 0) {
      if (errno != EINTR) die("epoll_wait");
    }
  }
  void writeAll(const char* p, size_t n) const {
    while (n > 0) {
      ssize_t k = ::send(fd, p, n, 0);
      if (k < 0 && epoll >= 0 && errno == EAGAIN) {
        waitReady();
        continue;
      }
      if (k < 0) die("send");
      p += k;
      n -= static_cast<size_t>(k);
    }
  }
  void readAll(char* p, size_t n) const {
    while (n > 0) {
      ssize_t k = ::recv(fd, p, n, epoll >= 0 ? 0 : MSG_WAITALL);
      if (k < 0 && epoll >= 0 && errno == EAGAIN) {
        waitReady();
        continue;
      }
      if (k <= 0) die("recv");
      p += k;
      n -= static_cast<size_t>(k);
    }
  }
};

// An epoll set that reports `fd` ready for `events` (level-triggered).
int epollFor(int fd, uint32_t events) {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) die("epoll_create1");
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl");
  return ep;
}

double cpuSeconds() {
  rusage r{};
  if (getrusage(RUSAGE_SELF, &r) != 0) die("getrusage");
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return s(r.ru_utime) + s(r.ru_stime);
}

int connectPair(int rank, const char* listenAddr, const char* peerAddr, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  if (rank == 0) {
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) die("setsockopt");
    if (inet_pton(AF_INET, listenAddr, &sa.sin_addr) != 1) die("inet_pton");
    if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) die("bind");
    if (listen(fd, 1) != 0) die("listen");
    int conn = accept(fd, nullptr, nullptr);
    if (conn < 0) die("accept");
    close(fd);
    return conn;
  }
  if (inet_pton(AF_INET, peerAddr, &sa.sin_addr) != 1) die("inet_pton");
  for (int tries = 0; connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0; ++tries) {
    if (tries > 200) die("connect");  // 10 s for rank 0 to listen
    close(fd);
    usleep(50000);
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
  }
  return fd;
}

// What the receiving thread has finished, for the sender: the op and the bytes of this rank's
// half folded in it (the all-gather sends a piece once it is folded).
struct Progress {
  std::mutex mu;
  std::condition_variable cv;
  long op = -1;         // ops the receiver has finished completely
  size_t folded = 0;    // bytes of this rank's half folded in op `op + 1`

  void publish(long doneOp, size_t bytes) {
    {
      std::lock_guard<std::mutex> g(mu);
      op = doneOp;
      folded = bytes;
    }
    cv.notify_one();
  }
  // Waits until the receiver finished op `wantOp` (-1: none) and folded `bytes` of the next.
  void await(long wantOp, size_t bytes) {
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [&] { return op > wantOp || (op == wantOp && folded >= bytes); });
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 9 ? argv[8] : "";
  const int rank = argc == 9 ? std::atoi(argv[1]) : -1;
  const size_t bytes = argc == 9 ? static_cast<size_t>(std::atol(argv[5])) << 20 : 0;
  const long iters = argc == 9 ? std::atol(argv[6]) : 0, warmup = argc == 9 ? std::atol(argv[7]) : 0;
  if ((mode != "fold" && mode != "copyout" && mode != "move" && mode != "epoll") || (rank != 0 && rank != 1) ||
      bytes == 0 || iters < 1 || warmup < 0 || warmup + iters > 100) {
    // 2^(warmup+iters) must stay an exact float for the check at the end.
    std::fprintf(stderr,
                 "usage: %s RANK(0|1) LISTEN PEER PORT MBYTES(>=1) ITERS(>=1) WARMUP "
                 "fold|copyout|move|epoll (WARMUP+ITERS <= 100)\n",
                 argv[0]);
    return 2;
  }
  const size_t half = bytes / 2;
  std::vector<float> tensor(bytes / sizeof(float), 1.0f);
  char* base = reinterpret_cast<char*>(tensor.data());
  char* mine = base + rank * half;
  char* theirs = base + (1 - rank) * half;
  const int fd = connectPair(rank, argv[2], argv[3], std::atoi(argv[4]));
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) die("setsockopt");
  Channel out{fd}, in{fd};
  if (mode == "epoll") {
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) die("fcntl");
    out.epoll = epollFor(fd, EPOLLOUT);
    in.epoll = epollFor(fd, EPOLLIN);
  }

  const long ops = warmup + iters;
  Progress progress;
  std::thread sender([&] {
    for (long op = 0; op < ops; ++op) {
      progress.await(op - 1, 0);  // the peer's half holds last op's result
      out.writeAll(theirs, half);
      for (size_t at = 0; at < half; at += kPiece) {
        const size_t n = std::min(kPiece, half - at);
        progress.await(op - 1, at + n);
        out.writeAll(mine + at, n);
      }
    }
  });

  std::vector<float> warm(kPiece / sizeof(float));
  char* warmBytes = reinterpret_cast<char*>(warm.data());
  double t0 = 0, c0 = 0;
  for (long op = 0; op < ops; ++op) {
    if (op == warmup) {
      t0 = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
      c0 = cpuSeconds();
    }
    for (size_t at = 0; at < half; at += kPiece) {
      const size_t n = std::min(kPiece, half - at);
      if (mode == "move") {
        in.readAll(mine + at, n);
      } else {
        in.readAll(warmBytes, n);
        float* dst = reinterpret_cast<float*>(mine + at);
        for (size_t i = 0; i < n / sizeof(float); ++i) dst[i] += warm[i];
      }
      progress.publish(op - 1, at + n);
    }
    if (mode == "copyout") {
      for (size_t at = 0; at < half; at += kPiece) {
        const size_t n = std::min(kPiece, half - at);
        in.readAll(warmBytes, n);
        std::memcpy(theirs + at, warmBytes, n);
      }
    } else {
      in.readAll(theirs, half);
    }
    progress.publish(op, 0);
  }
  const double t1 =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const double c1 = cpuSeconds();
  sender.join();
  for (int ep : {in.epoll, out.epoll}) {
    if (ep >= 0) close(ep);
  }
  close(fd);
  if (mode != "move") {
    const float want = std::ldexp(1.0f, static_cast<int>(ops));
    for (float v : tensor) {
      if (v != want) {
        std::fprintf(stderr, "rank %d: element %g, want %g\n", rank, v, want);
        return 1;
      }
    }
  }
  std::printf("{\"rank\": %d, \"mode\": \"%s\", \"seconds\": %.6f, \"cpu\": %.6f}\n", rank,
              mode.c_str(), t1 - t0, c1 - c0);
  return 0;
}
