// A table of settings, each declared once: its name, kind, range or choices, help, and how it
// reads and writes one member of a plain struct. The struct's own member initializers are the
// defaults. From that one declaration come the parser (of "key=value,..." or of a name -> value
// map), the description of a value, the key list and the rows that Python, `info` and the
// docs' reference table show. Adding a setting is one Field in one table.
//
//   const Schema<UdpConfig>& s = udpConfigSchema();
//   UdpConfig c = s.parse("rto_min_us=500,loss_recovery=go_back_n");   // ConfigError if bad
//   s.describe(c);                                                     // every key=value
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "transports/config/key_values.h"

namespace ucxb::config {

enum class Kind { kInteger, kBytes, kProbability, kChoice, kText };

const char* kindName(Kind kind);  // "integer", "bytes", "probability", "choice", "text"

// What a setting is, independent of the struct it lives in.
struct FieldInfo {
  std::string name;
  Kind kind = Kind::kText;
  uint64_t min = 0;  // kInteger, kBytes
  uint64_t max = 0;
  std::vector<std::string> choices;  // kChoice
  std::string allowed;               // the allowed values in words, for errors and docs
  std::string help;
  // Passed between the layers but not a user's knob (e.g. the address Python picks to bind).
  bool internal = false;
  // Every rank of a group must hold the same value: the ranks exchange these settings when the
  // group is created and fail, naming the setting, if any differs (csrc/handshake.h). Set it
  // where the ranks' halves of one protocol depend on the value (how messages are cut up,
  // which algorithm runs, what a receiver accepts), never for what a rank does on its own
  // (how it waits, logs, times out or which device it uses), which may differ per rank.
  bool mustAgree = false;
};

// A setting's name and canonical value, as the ranks of a group compare them.
struct Setting {
  std::string name;
  std::string value;
  bool operator==(const Setting&) const = default;
};

// A kText setting's check: the value normalised, or a ConfigError.
using TextCheck = std::function<std::string(const std::string& value)>;

template <typename T>
struct Field {
  FieldInfo info;
  TextCheck check;  // kText only; none accepts any text
  std::function<void(T&, const std::string& canonical)> set;
  std::function<std::string(const T&)> get;
  // For a mustAgree field that holds settings of another schema ("key=value,..."): those of
  // them that must agree, which Schema::agreed() names "<field>.<key>". None: the field's
  // own value must agree.
  std::function<std::vector<Setting>(const T&)> agreedParts;
};

// The canonical spelling of `value` for a setting, or a ConfigError that names `what`.
std::string normalize(const FieldInfo& info, const TextCheck& check, std::string_view what,
                      const std::string& value);

namespace detail {

template <typename M>
void assign(M& member, const std::string& canonical) {
  if constexpr (std::is_same_v<M, std::string>) {
    member = canonical;
  } else if constexpr (std::is_floating_point_v<M>) {
    member = std::stod(canonical);
  } else {
    member = static_cast<M>(std::stoull(canonical));
  }
}

template <typename M>
std::string show(const M& member) {
  if constexpr (std::is_same_v<M, std::string>) {
    return member;
  } else if constexpr (std::is_floating_point_v<M>) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", static_cast<double>(member));
    return buf;
  } else {
    return std::to_string(member);
  }
}

}  // namespace detail

// Builders for the common case, a setting stored in one member.
template <typename T, typename M>
Field<T> member(FieldInfo info, M T::*m, TextCheck check = {}) {
  return Field<T>{std::move(info), std::move(check),
                  [m](T& t, const std::string& v) { detail::assign(t.*m, v); },
                  [m](const T& t) { return detail::show(t.*m); }, {}};
}

inline FieldInfo integer(std::string name, uint64_t min, uint64_t max, std::string help) {
  return {std::move(name), Kind::kInteger, min, max, {}, integerRange(min, max), std::move(help)};
}
inline FieldInfo bytes(std::string name, uint64_t min, uint64_t max, std::string help) {
  return {std::move(name), Kind::kBytes, min, max, {}, bytesRange(min, max), std::move(help)};
}
inline FieldInfo probability(std::string name, std::string help) {
  return {std::move(name), Kind::kProbability, 0, 1, {}, "a probability from 0 to 1",
          std::move(help)};
}
inline FieldInfo choice(std::string name, std::vector<std::string> choices, std::string help) {
  std::string allowed = quotedNames(choices);
  return {std::move(name), Kind::kChoice, 0, 0, std::move(choices), std::move(allowed),
          std::move(help)};
}
inline FieldInfo text(std::string name, std::string allowed, std::string help) {
  return {std::move(name), Kind::kText, 0, 0, {}, std::move(allowed), std::move(help)};
}
// The same setting, flagged: every rank of a group must hold the same value (FieldInfo).
inline FieldInfo sameOnEveryRank(FieldInfo info) {
  info.mustAgree = true;
  return info;
}

template <typename T>
class Schema {
 public:
  // `what` names the whole in errors: "udp config", "ucxbackend option".
  Schema(std::string what, std::vector<Field<T>> fields)
      : what_(std::move(what)), fields_(std::move(fields)) {}

  const std::string& what() const { return what_; }
  const std::vector<Field<T>>& fields() const { return fields_; }

  const Field<T>* find(std::string_view name) const {
    for (const auto& f : fields_) {
      if (f.info.name == name) return &f;
    }
    return nullptr;
  }

  std::vector<std::string> keys(bool withInternal = false) const {
    std::vector<std::string> out;
    for (const auto& f : fields_) {
      if (withInternal || !f.info.internal) out.push_back(f.info.name);
    }
    return out;
  }

  // Sets one setting from text; an unknown key or a bad value is a ConfigError.
  void set(T& target, const std::string& key, const std::string& value) const {
    const Field<T>* f = find(key);
    if (f == nullptr) throwUnknownKey(what_, KeyValue{key, value}, keys());
    f->set(target, normalize(f->info, f->check, what_, value));
  }

  // The canonical text of one setting's value (a ConfigError if bad).
  std::string normalizeValue(const std::string& key, const std::string& value) const {
    const Field<T>* f = find(key);
    if (f == nullptr) throwUnknownKey(what_, KeyValue{key, value}, keys());
    return normalize(f->info, f->check, what_, value);
  }

  // "key=value,..." applied over `base`.
  T parse(std::string_view keyValues, T base = {}) const {
    for (const KeyValue& kv : splitKeyValues(keyValues, what_)) set(base, kv.key, kv.value);
    return base;
  }

  // Every setting as "key=value,..." (parse(describe(t)) == t).
  std::string describe(const T& t) const {
    std::string out;
    for (const auto& f : fields_) {
      if (f.info.internal) continue;
      out += (out.empty() ? "" : ",") + f.info.name + "=" + f.get(t);
    }
    return out;
  }

  std::string defaultOf(const Field<T>& f) const { return f.get(T{}); }

  // The settings of `t` that every rank of a group must share (FieldInfo::mustAgree), in
  // schema order, each with its canonical value.
  std::vector<Setting> agreed(const T& t) const {
    std::vector<Setting> out;
    for (const auto& f : fields_) {
      if (!f.info.mustAgree) continue;
      if (!f.agreedParts) {
        out.push_back({f.info.name, f.get(t)});
        continue;
      }
      for (Setting& part : f.agreedParts(t)) {
        out.push_back({f.info.name + "." + part.name, std::move(part.value)});
      }
    }
    return out;
  }

 private:
  std::string what_;
  std::vector<Field<T>> fields_;
};

}  // namespace ucxb::config
