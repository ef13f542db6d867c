// SocketAddress: an IPv4 or IPv6 address and port as a value, with the compact form the UDP
// transport publishes through the Store. No I/O: the sans-IO endpoint (endpoint.h) routes
// datagrams by it, and the simulator and fuzzer build it without a socket.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ucxb::udp {

// An IPv4 or IPv6 address and port.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  // "1.2.3.4" or "::1" (numeric only: name resolution belongs to the caller) and a port.
  static SocketAddress parse(const std::string& host, uint16_t port);
  int family() const { return storage.ss_family; }
  uint16_t port() const;
  std::string host() const;
  std::string toString() const;  // "1.2.3.4:5678" or "[::1]:5678"
  bool operator==(const SocketAddress& other) const;

  // The compact form carried in the transport's address blob: family (1 byte), port (2),
  // address (4 or 16), all in network order.
  void appendTo(std::vector<uint8_t>& out) const;
  // Reads what appendTo wrote at `in[offset]`, advancing offset. Throws TransportError.
  static SocketAddress readFrom(std::span<const uint8_t> in, size_t& offset);
};

// A hash usable for an unordered_map keyed by address.
struct SocketAddressHash {
  size_t operator()(const SocketAddress& a) const;
};

}  // namespace ucxb::udp
