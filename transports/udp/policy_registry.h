// What the tables of the udp transport's named policies (congestion.cpp, loss_recovery.cpp)
// share: each is an array of rows with a `name`, looked up by a udp_config key's value.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "transports/config/key_values.h"

namespace ucxb::udp {

// The rows' names, in table order.
template <class Row, size_t N>
std::vector<std::string> policyNames(const Row (&rows)[N]) {
  std::vector<std::string> names;
  for (const Row& r : rows) names.emplace_back(r.name);
  return names;
}

// The row named `value`, or the udp config's error for `key`='value', naming the rows.
template <class Row, size_t N>
const Row& policyNamed(const Row (&rows)[N], const char* key, const std::string& value) {
  for (const Row& r : rows) {
    if (value == r.name) return r;
  }
  config::throwBadValue("udp config", {key, value}, config::joinNames(policyNames(rows)));
}

}  // namespace ucxb::udp
