#include "transports/ucx/shared_memory_tls.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

namespace ucxb::ucx {

namespace {

std::string trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\n");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\n") - first + 1);
}

}  // namespace

bool tlsIncludesSharedMemory(const std::string& tls) {
  // UCX_TLS names of UCX's shared-memory (mm) transports and their aliases.
  static const std::set<std::string> kSharedMemory = {"sm", "shm", "mm", "posix", "sysv"};
  const std::string value = trimmed(tls);
  if (value.empty()) return true;
  const bool exclude = value.front() == '^';
  const size_t names = value.find_first_not_of('^');
  std::istringstream list(names == std::string::npos ? "" : value.substr(names));
  bool namesSharedMemory = false;
  bool all = false;
  for (std::string name; std::getline(list, name, ',');) {
    name = trimmed(name);
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    namesSharedMemory = namesSharedMemory || kSharedMemory.count(name) > 0;
    all = all || name == "all";
  }
  return exclude ? !namesSharedMemory : all || namesSharedMemory;
}

bool lacksSysv(const std::vector<std::string>& transports) {
  return !transports.empty() &&
         std::find(transports.begin(), transports.end(), "sysv") == transports.end();
}

}  // namespace ucxb::ucx
