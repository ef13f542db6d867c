// The datagram socket under the UDP transport: RAII for the fd and batched send and receive
// (sendmmsg/recvmmsg: one system call for many datagrams, since per-datagram syscalls are
// what limits UDP throughput).
//
// Everything here reports failures as TransportError with the failing call and errno text;
// "would block" is not a failure (the calls return how many datagrams went through).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transports/udp/socket_address.h"

namespace ucxb::udp {

// One datagram of a batch: the bytes and, for receives, who sent them. With segmentSize set
// it is a train of datagrams of that size (the last may be shorter) in one buffer: sent with
// UDP generic segmentation offload (the kernel cuts it, one system call and one trip through
// the stack for up to 64 datagrams) and received coalesced the same way (UDP GRO).
struct Datagram {
  uint8_t* data = nullptr;
  size_t length = 0;        // send: bytes to send; receive: bytes received
  size_t capacity = 0;      // receive: room at data
  SocketAddress peer;       // send: destination; receive: source
  uint16_t segmentSize = 0; // 0: one datagram; else the size of each datagram in the train
  bool truncated = false;   // receive: longer than capacity (the rest was discarded)
};

// Owns a file descriptor: closed on destruction, movable, never copied.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

class UdpSocket {
 public:
  // A non-blocking socket bound to `local` (port 0 picks a free one). `bufferBytes` is the
  // kernel send and receive buffer to ask for: as root beyond net.core.[rw]mem_max.
  UdpSocket(const SocketAddress& local, int bufferBytes);
  UdpSocket(const UdpSocket&) = delete;
  UdpSocket& operator=(const UdpSocket&) = delete;

  int fd() const { return fd_.get(); }
  const SocketAddress& localAddress() const { return local_; }
  // What the kernel actually granted (it may cap, and it reports twice the request).
  int receiveBufferBytes() const { return receiveBuffer_; }
  int sendBufferBytes() const { return sendBuffer_; }
  // Whether trains may be sent (UDP_SEGMENT works here) and arrive coalesced (UDP_GRO).
  bool segmentationOffload() const { return gso_; }
  bool receiveOffload() const { return gro_; }
  // Most datagrams in one train, and most bytes (the kernel's limits).
  static constexpr size_t kMaxSegments = 64;
  static constexpr size_t kMaxTrainBytes = 65000;

  // Sends datagrams from the front of `batch`; returns how many left (fewer if the socket
  // buffer is full). Datagrams the network refuses outright (e.g. an unreachable host) count
  // as sent: to the protocol above they are lost, like any datagram.
  size_t sendBatch(std::span<Datagram> batch);
  // Receives up to batch.size() datagrams into the buffers of `batch`; returns how many
  // arrived (0 if none were waiting).
  size_t receiveBatch(std::span<Datagram> batch);

  // Drains the socket's error queue (IP_RECVERR / IPV6_RECVERR, asked for at creation) and
  // appends to `refused` the destination of every datagram answered by an ICMP port
  // unreachable: no socket is bound there any more, so the process that had it is gone (a
  // stopped process keeps its socket and its port answers nothing). Other errors (host or
  // network unreachable, too big) are dropped: to the protocol those datagrams are just lost.
  // Returns how many errors were read; without the option, always 0.
  size_t receiveRefusals(std::vector<SocketAddress>& refused);
  // Whether a send or receive since the last receiveRefusals() reported an ICMP error.
  bool errorsReported() const { return errorsReported_; }

 private:
  UniqueFd fd_;
  SocketAddress local_;
  int receiveBuffer_ = 0;
  int sendBuffer_ = 0;
  bool gso_ = false;
  bool gro_ = false;
  bool recvErr_ = false;        // the error queue is on
  bool errorsReported_ = false;
  // Scratch for the mmsg calls, sized to the largest batch seen.
  std::vector<mmsghdr> headers_;
  std::vector<iovec> iovecs_;
  std::vector<uint8_t> controls_;  // one control buffer of kControlBytes per message
};

}  // namespace ucxb::udp
