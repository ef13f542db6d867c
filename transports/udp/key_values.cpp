#include "transports/udp/key_values.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace ucxb::udp {
namespace {

std::string_view trim(std::string_view s) {
  const auto isSpace = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && isSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && isSpace(s.back())) s.remove_suffix(1);
  return s;
}

[[noreturn]] void badValue(std::string_view what, const KeyValue& kv, const std::string& allowed) {
  throw ConfigError(std::string(what) + ": " + kv.key + "='" + kv.value + "' is invalid (allowed: " +
                    allowed + ")");
}

}  // namespace

std::string joinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::vector<KeyValue> splitKeyValues(std::string_view text, std::string_view what) {
  std::vector<KeyValue> out;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      throw ConfigError(std::string(what) + ": '" + std::string(item) +
                        "' is not of the form key=value");
    }
    KeyValue kv{std::string(trim(item.substr(0, eq))), std::string(trim(item.substr(eq + 1)))};
    if (kv.key.empty() || kv.value.empty()) {
      throw ConfigError(std::string(what) + ": '" + std::string(item) +
                        "' needs both a key and a value");
    }
    for (const auto& seen : out) {
      if (seen.key == kv.key) {
        throw ConfigError(std::string(what) + ": key '" + kv.key + "' given twice");
      }
    }
    out.push_back(std::move(kv));
  }
  return out;
}

uint64_t parseUnsigned(std::string_view what, const KeyValue& kv, uint64_t min, uint64_t max) {
  const std::string allowed = "an integer from " + std::to_string(min) + " to " +
                              std::to_string(max) + ", K/M/G suffixes accepted";
  std::string digits = kv.value;
  uint64_t scale = 1;
  switch (digits.back()) {
    case 'K': case 'k': scale = uint64_t{1} << 10; break;
    case 'M': case 'm': scale = uint64_t{1} << 20; break;
    case 'G': case 'g': scale = uint64_t{1} << 30; break;
    default: break;
  }
  if (scale != 1) digits.pop_back();
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
    badValue(what, kv, allowed);
  }
  errno = 0;
  const unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno == ERANGE || v > max / scale || v * scale < min) badValue(what, kv, allowed);
  return v * scale;
}

double parseProbability(std::string_view what, const KeyValue& kv) {
  const std::string allowed = "a probability from 0 to 1";
  if (kv.value.find_first_not_of("0123456789.eE-+") != std::string::npos) {
    badValue(what, kv, allowed);
  }
  char* end = nullptr;
  const double v = std::strtod(kv.value.c_str(), &end);
  if (end != kv.value.c_str() + kv.value.size() || !std::isfinite(v) || v < 0.0 || v > 1.0) {
    badValue(what, kv, allowed);
  }
  return v;
}

std::string parseChoice(std::string_view what, const KeyValue& kv,
                        const std::vector<std::string>& allowed) {
  for (const auto& a : allowed) {
    if (kv.value == a) return a;
  }
  badValue(what, kv, joinNames(allowed));
}

void throwUnknownKey(std::string_view what, const KeyValue& kv,
                     const std::vector<std::string>& allowedKeys) {
  throw ConfigError(std::string(what) + ": unknown key '" + kv.key + "' (allowed: " +
                    joinNames(allowedKeys) + ")");
}

}  // namespace ucxb::udp
