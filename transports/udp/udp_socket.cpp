#include "transports/udp/udp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <netinet/udp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "transports/transport.h"

namespace ucxb::udp {
namespace {

[[noreturn]] void throwErrno(const std::string& what, int err) {
  throw TransportError("udp: " + what + " failed: " + std::strerror(err));
}

// Errors a datagram send can meet that say nothing about our socket: the datagram is lost.
// With IP_RECVERR the kernel also hands every ICMP error about an earlier datagram to the next
// send or receive, whatever datagram that is about: each errno an ICMP or ICMPv6 report maps
// to is here (icmp_err_convert, icmpv6_err_convert), since a router's report, or anyone's
// forged one, must not fail the socket (it did for EPROTO and the next four until 2026-11-28).
bool isPerDatagramError(int err) {
  switch (err) {
    case ECONNREFUSED:   // an ICMP port unreachable from an earlier datagram (peer gone)
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
    case EPERM:          // a firewall rule dropped it (iptables on OUTPUT)
    case EMSGSIZE:       // larger than the path allows: configuration, reported by the RTO
    case ENOBUFS:
    case EPROTO:         // ICMP parameter problem
    case ENOPROTOOPT:    // ICMP protocol unreachable
    case EOPNOTSUPP:     // ICMP source route failed
    case ENONET:         // ICMP host isolated
    case EACCES:         // ICMPv6 administratively prohibited, policy failure, reject route
      return true;
    default:
      return false;
  }
}

// Room for one UDP_SEGMENT / UDP_GRO control message (a 16-bit or int segment size).
constexpr size_t kControlBytes = CMSG_SPACE(sizeof(int));

}  // namespace

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

UdpSocket::UdpSocket(const SocketAddress& local, int bufferBytes)
    : fd_(::socket(local.family(), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) {
  if (fd_.get() < 0) throwErrno("socket()", errno);
  const int fd = fd_.get();
  {
    // FORCE variants pass net.core.[rw]mem_max when we may (root); the plain ones otherwise.
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bufferBytes, sizeof(bufferBytes)) != 0) {
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufferBytes, sizeof(bufferBytes));
    }
    if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bufferBytes, sizeof(bufferBytes)) != 0) {
      ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufferBytes, sizeof(bufferBytes));
    }
    socklen_t len = sizeof(receiveBuffer_);
    ::getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receiveBuffer_, &len);
    len = sizeof(sendBuffer_);
    ::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sendBuffer_, &len);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&local.storage), local.length) != 0) {
      throwErrno("bind(" + local.toString() + ")", errno);
    }
    local_.length = sizeof(local_.storage);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local_.storage), &local_.length) != 0) {
      throwErrno("getsockname()", errno);
    }
    // Both offloads are optional (Linux >= 4.18 / 5.0): without them every datagram is its
    // own trip through the stack, which is slower but the same on the wire.
    int zero = 0, one = 1;
    gso_ = ::setsockopt(fd, IPPROTO_UDP, UDP_SEGMENT, &zero, sizeof(zero)) == 0;
    gro_ = ::setsockopt(fd, IPPROTO_UDP, UDP_GRO, &one, sizeof(one)) == 0;
    // ICMP errors on an unconnected UDP socket reach it only through the error queue. Also
    // optional: without it a dead peer is found by the op's timeout instead of its closed
    // port. An IPv6 socket may carry IPv4-mapped traffic, hence both options there.
    recvErr_ = ::setsockopt(fd, IPPROTO_IP, IP_RECVERR, &one, sizeof(one)) == 0;
    if (local.family() == AF_INET6) {
      recvErr_ = ::setsockopt(fd, IPPROTO_IPV6, IPV6_RECVERR, &one, sizeof(one)) == 0;
    }
  }
}

size_t UdpSocket::sendBatch(std::span<Datagram> batch) {
  size_t done = 0;
  while (done < batch.size()) {
    const size_t n = batch.size() - done;
    headers_.resize(std::max(headers_.size(), n));
    iovecs_.resize(std::max(iovecs_.size(), n));
    controls_.resize(std::max(controls_.size(), n * kControlBytes));
    for (size_t i = 0; i < n; ++i) {
      Datagram& d = batch[done + i];
      iovecs_[i] = iovec{d.data, d.length};
      msghdr& m = headers_[i].msg_hdr;
      m = msghdr{};
      m.msg_name = &d.peer.storage;
      m.msg_namelen = d.peer.length;
      m.msg_iov = &iovecs_[i];
      m.msg_iovlen = 1;
      if (d.segmentSize != 0 && d.length > d.segmentSize) {
        m.msg_control = controls_.data() + i * kControlBytes;
        m.msg_controllen = CMSG_SPACE(sizeof(uint16_t));
        cmsghdr* cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = IPPROTO_UDP;
        cm->cmsg_type = UDP_SEGMENT;
        cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        const uint16_t size = d.segmentSize;
        std::memcpy(CMSG_DATA(cm), &size, sizeof(size));
      }
    }
    const int sent = ::sendmmsg(fd_.get(), headers_.data(), static_cast<unsigned>(n), 0);
    if (sent > 0) {
      done += static_cast<size_t>(sent);
      continue;
    }
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) break;
    // A device that cannot checksum a train rejects it (EIO), and so does the stack a train
    // whose datagrams are larger than the path's MTU (EMSGSIZE: mtu_payload above the
    // interface's, or above a smaller MTU the path reported; EINVAL on kernels before 6.14
    // without its backport, "udp: gso: do not drop small packets when PMTU reduces"), which it
    // would fragment if they went one by one:
    // the train is lost (the protocol resends it) and trains are not tried again. Left on,
    // every train met the same error, and a 16 MB all_reduce with jumbo datagrams over a
    // 1500-byte path resent 99% of its datagrams, taking 3 s, not 0.1 s; and EINVAL, taken
    // for a broken socket, failed the group.
    if ((err == EIO || err == EMSGSIZE || err == EINVAL) && batch[done].segmentSize != 0) {
      gso_ = false;
      ++done;
      continue;
    }
    // sendmmsg reports an error only for the first datagram of the batch: that one is lost.
    if (isPerDatagramError(err)) {
      if (err == ECONNREFUSED) errorsReported_ = true;
      ++done;
      continue;
    }
    throwErrno("sendmmsg() to " + batch[done].peer.toString(), err);
  }
  return done;
}

size_t UdpSocket::receiveBatch(std::span<Datagram> batch) {
  if (batch.empty()) return 0;
  headers_.resize(std::max(headers_.size(), batch.size()));
  iovecs_.resize(std::max(iovecs_.size(), batch.size()));
  controls_.resize(std::max(controls_.size(), batch.size() * kControlBytes));
  for (size_t i = 0; i < batch.size(); ++i) {
    Datagram& d = batch[i];
    iovecs_[i] = iovec{d.data, d.capacity};
    msghdr& m = headers_[i].msg_hdr;
    m = msghdr{};
    m.msg_name = &d.peer.storage;
    m.msg_namelen = sizeof(d.peer.storage);
    m.msg_iov = &iovecs_[i];
    m.msg_iovlen = 1;
    m.msg_control = controls_.data() + i * kControlBytes;
    m.msg_controllen = kControlBytes;
  }
  for (;;) {
    const int got = ::recvmmsg(fd_.get(), headers_.data(), static_cast<unsigned>(batch.size()),
                               MSG_DONTWAIT, nullptr);
    if (got >= 0) {
      for (int i = 0; i < got; ++i) {
        Datagram& d = batch[static_cast<size_t>(i)];
        d.length = headers_[static_cast<size_t>(i)].msg_len;
        d.peer.length = headers_[static_cast<size_t>(i)].msg_hdr.msg_namelen;
        msghdr& m = headers_[static_cast<size_t>(i)].msg_hdr;
        d.truncated = (m.msg_flags & MSG_TRUNC) != 0;
        d.segmentSize = 0;
        for (cmsghdr* cm = CMSG_FIRSTHDR(&m); cm != nullptr; cm = CMSG_NXTHDR(&m, cm)) {
          if (cm->cmsg_level == IPPROTO_UDP && cm->cmsg_type == UDP_GRO) {
            int size = 0;
            std::memcpy(&size, CMSG_DATA(cm), sizeof(size));
            if (size > 0 && static_cast<size_t>(size) < d.length) {
              d.segmentSize = static_cast<uint16_t>(size);
            }
          }
        }
      }
      return static_cast<size_t>(got);
    }
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return 0;
    // An ICMP error queued for an earlier send (e.g. port unreachable): nothing to receive;
    // receiveRefusals() reads which destination it was about.
    if (isPerDatagramError(err)) {
      errorsReported_ = true;
      continue;
    }
    throwErrno("recvmmsg()", err);
  }
}

size_t UdpSocket::receiveRefusals(std::vector<SocketAddress>& refused) {
  errorsReported_ = false;
  if (!recvErr_) return 0;
  size_t errors = 0;
  for (;;) {
    SocketAddress to;
    uint8_t payload[64];  // the start of the datagram that was refused: not needed
    iovec iov{payload, sizeof(payload)};
    alignas(cmsghdr) uint8_t control[512];
    msghdr m{};
    m.msg_name = &to.storage;
    m.msg_namelen = sizeof(to.storage);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    if (::recvmsg(fd_.get(), &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return errors;
      throwErrno("recvmsg(MSG_ERRQUEUE)", err);
    }
    ++errors;
    to.length = m.msg_namelen;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&m); cm != nullptr; cm = CMSG_NXTHDR(&m, cm)) {
      const bool v4 = cm->cmsg_level == IPPROTO_IP && cm->cmsg_type == IP_RECVERR;
      const bool v6 = cm->cmsg_level == IPPROTO_IPV6 && cm->cmsg_type == IPV6_RECVERR;
      if (!v4 && !v6) continue;
      sock_extended_err ee;
      std::memcpy(&ee, CMSG_DATA(cm), sizeof(ee));
      const bool icmp = ee.ee_origin == SO_EE_ORIGIN_ICMP || ee.ee_origin == SO_EE_ORIGIN_ICMP6;
      if (icmp && ee.ee_errno == ECONNREFUSED) refused.push_back(to);
    }
  }
}

}  // namespace ucxb::udp
