#include "transports/config/key_values.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace ucxb::config {

std::string_view trim(std::string_view s) {
  const auto isSpace = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && isSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && isSpace(s.back())) s.remove_suffix(1);
  return s;
}

std::string joinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string quotedNames(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

std::string integerRange(uint64_t min, uint64_t max) {
  return "an integer from " + std::to_string(min) + " to " + std::to_string(max);
}

std::string bytesRange(uint64_t min, uint64_t max) {
  return "bytes from " + formatSize(min) + " to " + formatSize(max) +
         ", e.g. 4194304, '4M' or '4MiB' (K/M/G/T = 1024^n)";
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

std::optional<uint64_t> parseInteger(std::string_view text) {
  text = trim(text);
  if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  const std::string digits(text);
  errno = 0;
  const unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno == ERANGE) return std::nullopt;
  return v;
}

std::optional<uint64_t> parseSize(std::string_view text) {
  text = trim(text);
  const size_t end = text.find_first_not_of("0123456789");
  const auto number = parseInteger(text.substr(0, end));
  if (!number) return std::nullopt;
  std::string unit;
  for (char c : trim(end == std::string_view::npos ? std::string_view{} : text.substr(end))) {
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  int shift = 0;
  if (!unit.empty() && std::string_view("kmgt").find(unit[0]) != std::string_view::npos) {
    shift = 10 * (1 + static_cast<int>(std::string_view("kmgt").find(unit[0])));
    unit.erase(0, 1);
  }
  if (!(unit.empty() || unit == "b" || (shift != 0 && unit == "ib"))) return std::nullopt;
  if (shift != 0 && *number > (UINT64_MAX >> shift)) return std::nullopt;
  return *number << shift;
}

std::string formatSize(uint64_t bytes) {
  static constexpr const char* kUnits = "KMGT";
  int unit = -1;
  while (unit < 3 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + (unit < 0 ? "" : std::string(1, kUnits[unit]));
}

void throwBadValue(std::string_view what, const KeyValue& kv, const std::string& allowed) {
  throw ConfigError(std::string(what) + ": " + kv.key + "='" + kv.value + "' is invalid (allowed: " +
                    allowed + ")");
}

uint64_t parseInteger(std::string_view what, const KeyValue& kv, uint64_t min, uint64_t max) {
  const auto v = parseInteger(kv.value);
  if (!v || *v < min || *v > max) throwBadValue(what, kv, integerRange(min, max));
  return *v;
}

uint64_t parseBytes(std::string_view what, const KeyValue& kv, uint64_t min, uint64_t max) {
  const auto v = parseSize(kv.value);
  if (!v || *v < min || *v > max) throwBadValue(what, kv, bytesRange(min, max));
  return *v;
}

double parseProbability(std::string_view what, const KeyValue& kv) {
  const std::string allowed = "a probability from 0 to 1";
  const std::string value(trim(kv.value));
  if (value.empty() || value.find_first_not_of("0123456789.eE-+") != std::string::npos) {
    throwBadValue(what, kv, allowed);
  }
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (end != value.c_str() + value.size() || !std::isfinite(v) || v < 0.0 || v > 1.0) {
    throwBadValue(what, kv, allowed);
  }
  return v;
}

std::string parseChoice(std::string_view what, const KeyValue& kv,
                        const std::vector<std::string>& allowed) {
  const std::string_view value = trim(kv.value);
  for (const auto& a : allowed) {
    if (a.size() != value.size()) continue;
    bool same = true;
    for (size_t i = 0; i < a.size() && same; ++i) {
      same = std::tolower(static_cast<unsigned char>(a[i])) ==
             std::tolower(static_cast<unsigned char>(value[i]));
    }
    if (same) return a;
  }
  throwBadValue(what, kv, quotedNames(allowed));
}

void throwUnknownKey(std::string_view what, const KeyValue& kv,
                     const std::vector<std::string>& allowedKeys) {
  throw ConfigError(std::string(what) + ": unknown key '" + kv.key + "' (allowed: " +
                    joinNames(allowedKeys) + ")");
}

}  // namespace ucxb::config
