// How a rank that sleeps is woken by a peer on its host: a datagram socket in the abstract
// Unix namespace (nothing in the file system to clean up) that peers send one byte to. The
// socket is what the sleeper polls; the byte carries nothing. Torch-free, UCX-free.
//
// The abstract namespace belongs to the network namespace, as the host identity does
// (shared_segment.h), so two ranks with one host identity reach each other's doorbells.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <string>

namespace ucxb::shm {

class Doorbell {
 public:
  // Binds `name` (without the leading NUL). Throws TransportError naming the call and errno.
  explicit Doorbell(const std::string& name);
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  int fd() const { return fd_; }
  // Takes every ring waiting on this doorbell; true if there was one.
  bool drain();

  // A peer's doorbell, by the name it bound.
  struct Address {
    sockaddr_un addr{};
    socklen_t length = 0;
  };
  static Address addressOf(const std::string& name);
  // Rings `peer` from this socket. A full queue (the peer has rings it has not taken yet) or
  // a peer that is gone is no error: the first wakes anyway, the second is found by its
  // pidfd (shm_transport.cpp).
  void ring(const Address& peer) const;

 private:
  int fd_ = -1;
};

}  // namespace ucxb::shm
