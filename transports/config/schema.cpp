#include "transports/config/schema.h"

namespace ucxb::config {

const char* kindName(Kind kind) {
  switch (kind) {
    case Kind::kInteger: return "integer";
    case Kind::kBytes: return "bytes";
    case Kind::kProbability: return "probability";
    case Kind::kChoice: return "choice";
    case Kind::kText: return "text";
  }
  return "?";
}

std::string normalize(const FieldInfo& info, const TextCheck& check, std::string_view what,
                      const std::string& value) {
  const KeyValue kv{info.name, value};
  switch (info.kind) {
    case Kind::kInteger:
      return std::to_string(parseInteger(what, kv, info.min, info.max));
    case Kind::kBytes:
      return std::to_string(parseBytes(what, kv, info.min, info.max));
    case Kind::kProbability:
      parseProbability(what, kv);
      return std::string(trim(value));
    case Kind::kChoice:
      return parseChoice(what, kv, info.choices);
    case Kind::kText:
      return check ? check(std::string(trim(value))) : std::string(trim(value));
  }
  return value;
}

}  // namespace ucxb::config
