#include "transports/udp/socket_address.h"

#include <arpa/inet.h>

#include <cstring>
#include <functional>

#include "transports/transport.h"

namespace ucxb::udp {

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

}  // namespace ucxb::udp
