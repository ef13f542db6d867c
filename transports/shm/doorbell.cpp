#include "transports/shm/doorbell.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "transports/transport.h"

namespace ucxb::shm {

Doorbell::Address Doorbell::addressOf(const std::string& name) {
  Address a;
  a.addr.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof(a.addr.sun_path)) {
    throw TransportError("doorbell name too long: " + name);
  }
  // sun_path[0] stays NUL: the abstract namespace.
  std::memcpy(a.addr.sun_path + 1, name.data(), name.size());
  a.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

Doorbell::Doorbell(const std::string& name) {
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    throw TransportError(std::string("socket(AF_UNIX) for a doorbell: ") + std::strerror(errno));
  }
  const Address self = addressOf(name);
  if (::bind(fd_, reinterpret_cast<const sockaddr*>(&self.addr), self.length) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw TransportError("bind of doorbell @" + name + ": " + std::strerror(err));
  }
}

Doorbell::~Doorbell() {
  if (fd_ >= 0) ::close(fd_);
}

bool Doorbell::drain() {
  bool any = false;
  char buf[64];
  while (::recv(fd_, buf, sizeof buf, MSG_DONTWAIT) >= 0) any = true;
  return any;
}

void Doorbell::ring(const Address& peer) const {
  const char byte = 1;
  // EAGAIN (queue full), ECONNREFUSED / ENOENT (peer gone): see the header.
  (void)::sendto(fd_, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(&peer.addr), peer.length);
}

}  // namespace ucxb::shm
