#include "transports/udp/udp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/udp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>

#include "transports/transport.h"

namespace ucxb::udp {
namespace {

[[noreturn]] void throwErrno(const std::string& what, int err) {
  throw TransportError("udp: " + what + " failed: " + std::strerror(err));
}

// Errors a datagram send can meet that say nothing about our socket: the datagram is lost.
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
      return true;
    default:
      return false;
  }
}

// Room for one UDP_SEGMENT / UDP_GRO control message (a 16-bit or int segment size).
constexpr size_t kControlBytes = CMSG_SPACE(sizeof(int));

}  // namespace

SocketAddress SocketAddress::parse(const std::string& host, uint16_t port) {
  SocketAddress a;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    a.length = sizeof(sockaddr_in);
    return a;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    a.length = sizeof(sockaddr_in6);
    return a;
  }
  throw TransportError("udp: '" + host + "' is not a numeric IPv4 or IPv6 address");
}

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  }
  return 0;
}

std::string SocketAddress::host() const {
  char text[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, text,
              sizeof(text));
  } else if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, text,
              sizeof(text));
  } else {
    return "?";
  }
  return text;
}

std::string SocketAddress::toString() const {
  return family() == AF_INET6 ? "[" + host() + "]:" + std::to_string(port())
                              : host() + ":" + std::to_string(port());
}

bool SocketAddress::operator==(const SocketAddress& other) const {
  if (family() != other.family()) return false;
  if (family() == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(storage);
    const auto& b = reinterpret_cast<const sockaddr_in&>(other.storage);
    return a.sin_port == b.sin_port && a.sin_addr.s_addr == b.sin_addr.s_addr;
  }
  if (family() == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(storage);
    const auto& b = reinterpret_cast<const sockaddr_in6&>(other.storage);
    return a.sin6_port == b.sin6_port &&
           std::memcmp(&a.sin6_addr, &b.sin6_addr, sizeof(a.sin6_addr)) == 0;
  }
  return false;
}

void SocketAddress::appendTo(std::vector<uint8_t>& out) const {
  out.push_back(family() == AF_INET6 ? 6 : 4);
  const uint16_t p = htons(port());
  const auto* pb = reinterpret_cast<const uint8_t*>(&p);
  out.insert(out.end(), pb, pb + 2);
  if (family() == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(storage).sin6_addr;
    const auto* b = reinterpret_cast<const uint8_t*>(&a);
    out.insert(out.end(), b, b + sizeof(a));
  } else {
    const auto& a = reinterpret_cast<const sockaddr_in&>(storage).sin_addr;
    const auto* b = reinterpret_cast<const uint8_t*>(&a);
    out.insert(out.end(), b, b + sizeof(a));
  }
}

SocketAddress SocketAddress::readFrom(std::span<const uint8_t> in, size_t& offset) {
  const auto need = [&](size_t n) {
    if (in.size() < offset + n) throw TransportError("udp: truncated address blob");
  };
  need(3);
  const uint8_t version = in[offset];
  uint16_t p;
  std::memcpy(&p, &in[offset + 1], 2);
  offset += 3;
  SocketAddress a;
  if (version == 4) {
    need(4);
    auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage);
    v4->sin_family = AF_INET;
    v4->sin_port = p;
    std::memcpy(&v4->sin_addr, &in[offset], 4);
    a.length = sizeof(sockaddr_in);
    offset += 4;
  } else if (version == 6) {
    need(16);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    v6->sin6_family = AF_INET6;
    v6->sin6_port = p;
    std::memcpy(&v6->sin6_addr, &in[offset], 16);
    a.length = sizeof(sockaddr_in6);
    offset += 16;
  } else {
    throw TransportError("udp: unknown address family " + std::to_string(version) +
                         " in address blob");
  }
  return a;
}

size_t SocketAddressHash::operator()(const SocketAddress& a) const {
  size_t h = std::hash<uint16_t>()(a.port());
  if (a.family() == AF_INET) {
    h ^= std::hash<uint32_t>()(reinterpret_cast<const sockaddr_in&>(a.storage).sin_addr.s_addr) *
         0x9e3779b97f4a7c15ull;
  } else if (a.family() == AF_INET6) {
    const auto& b = reinterpret_cast<const sockaddr_in6&>(a.storage).sin6_addr;
    uint64_t words[2];
    std::memcpy(words, &b, sizeof(words));
    h ^= std::hash<uint64_t>()(words[0] ^ (words[1] * 0x9e3779b97f4a7c15ull));
  }
  return h;
}

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
    // A device that cannot checksum a train rejects it (EIO): it is lost (the protocol
    // resends it) and trains are not tried again.
    if (err == EIO && batch[done].segmentSize != 0) {
      gso_ = false;
      ++done;
      continue;
    }
    // sendmmsg reports an error only for the first datagram of the batch: that one is lost.
    if (isPerDatagramError(err)) {
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
    // An ICMP error queued for an earlier send (e.g. port unreachable): nothing to receive.
    if (isPerDatagramError(err)) continue;
    throwErrno("recvmmsg()", err);
  }
}

}  // namespace ucxb::udp
