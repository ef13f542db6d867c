// The "key=value,key=value" strings that configure the UDP transport (udp_config.h) and its
// fault injection (faults.h), and the value parsers they share. Every error is a ConfigError
// whose message names what was being parsed, the key, the value and what is allowed.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ucxb::udp {

class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct KeyValue {
  std::string key;
  std::string value;
};

// Splits "a=1, b=2" into pairs. Whitespace around items, keys and values is ignored, and so
// are empty items ("a=1,,b=2", a trailing comma). `what` names the string in errors (e.g.
// "udp config"). Throws on an item without '=', an empty key or value, or a repeated key.
std::vector<KeyValue> splitKeyValues(std::string_view text, std::string_view what);

// An unsigned integer in [min, max]; a K, M or G suffix (powers of 1024) multiplies it.
uint64_t parseUnsigned(std::string_view what, const KeyValue& kv, uint64_t min, uint64_t max);
// A probability: a decimal number in [0, 1].
double parseProbability(std::string_view what, const KeyValue& kv);
// One of `allowed` (exact match).
std::string parseChoice(std::string_view what, const KeyValue& kv,
                        const std::vector<std::string>& allowed);

// "unknown key 'x' (allowed: a, b, c)".
[[noreturn]] void throwUnknownKey(std::string_view what, const KeyValue& kv,
                                  const std::vector<std::string>& allowedKeys);

std::string joinNames(const std::vector<std::string>& names);

}  // namespace ucxb::udp
