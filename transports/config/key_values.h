// The value grammar every setting shares, torch-free so the transports and the backend parse
// alike: "key=value,key=value" lists, integers, byte sizes, probabilities and names. Every error
// is a ConfigError whose message names what was being parsed, the key, the value and what is
// allowed. The one byte-size parser lives here: "4194304", "4M", "4 MiB" and "4mb" all mean
// 4 * 1024^2, everywhere a size is accepted.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ucxb::config {

class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct KeyValue {
  std::string key;
  std::string value;
};

std::string_view trim(std::string_view s);

// Splits "a=1, b=2" into pairs. Whitespace around items, keys and values is ignored, and so
// are empty items ("a=1,,b=2", a trailing comma). `what` names the string in errors (e.g.
// "udp config"). Throws on an item without '=', an empty key or value, or a repeated key.
std::vector<KeyValue> splitKeyValues(std::string_view text, std::string_view what);

// Plain base-10 digits (surrounding blanks ignored); nullopt for anything else or overflow.
std::optional<uint64_t> parseInteger(std::string_view text);
// Digits with an optional unit: K, M, G or T (powers of 1024), optionally followed by "iB"
// or "B", any case, blanks allowed before the unit; nullopt for anything else or overflow.
std::optional<uint64_t> parseSize(std::string_view text);
// "1T", "4M", "3K" or "1000": the shortest exact spelling of `bytes` in parseSize's units.
std::string formatSize(uint64_t bytes);

// The same, checked against [min, max], or a ConfigError naming `what`, the key and the range.
uint64_t parseInteger(std::string_view what, const KeyValue& kv, uint64_t min, uint64_t max);
uint64_t parseBytes(std::string_view what, const KeyValue& kv, uint64_t min, uint64_t max);
// A probability: a decimal number in [0, 1].
double parseProbability(std::string_view what, const KeyValue& kv);
// One of `allowed`, matched without regard to case; returns the allowed spelling.
std::string parseChoice(std::string_view what, const KeyValue& kv,
                        const std::vector<std::string>& allowed);

// "unknown key 'x' (allowed: a, b, c)".
[[noreturn]] void throwUnknownKey(std::string_view what, const KeyValue& kv,
                                  const std::vector<std::string>& allowedKeys);
// "<what>: key='value' is invalid (allowed: <allowed>)".
[[noreturn]] void throwBadValue(std::string_view what, const KeyValue& kv,
                                const std::string& allowed);

std::string joinNames(const std::vector<std::string>& names);

// The allowed-values texts, shared so that every error and the docs word a kind alike.
std::string integerRange(uint64_t min, uint64_t max);  // "an integer from 0 to 7"
std::string bytesRange(uint64_t min, uint64_t max);    // "bytes from 1 to 1T, e.g. ..."
std::string quotedNames(const std::vector<std::string>& names);  // "'a', 'b'"

}  // namespace ucxb::config
