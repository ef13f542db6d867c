// Reading the user's secret for the udp transport's authenticated mode (the `secret_file`
// knob): a file of at least kMinSecretBytes bytes (any bytes; `head -c 64 /dev/urandom` makes
// one) that only its owner may read or write, as ssh demands of a private key. Whatever is
// wrong with it (missing, not a regular file, unreadable, too short, too long, open to the
// group or to others) is a ConfigError naming the knob, the path and the fix. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ucxb::udp {

constexpr size_t kMinSecretBytes = 32;           // 256 bits: the strength of the keys
constexpr size_t kMaxSecretBytes = size_t{1} << 16;  // a secret, not a data file

std::vector<uint8_t> readSecretFile(const std::string& path);

}  // namespace ucxb::udp
