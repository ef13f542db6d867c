#include "csrc/launcher_hosts.hpp"

#include <cstdlib>
#include <utility>

namespace ucxb {

namespace {

// A positive count, or 0 for a variable that is unset or not a positive integer.
long count(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  return *end == '\0' && n > 0 ? n : 0;
}

}  // namespace

bool launcherSpansHosts(int groupSize) {
  // (ranks on this host, ranks in the job) as each launcher names them.
  static const std::pair<const char*, const char*> kLaunchers[] = {
      {"LOCAL_WORLD_SIZE", "WORLD_SIZE"},                      // torchrun
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"},  // Open MPI
  };
  for (const auto& [localName, worldName] : kLaunchers) {
    const long local = count(localName);
    const long world = count(worldName);
    if (local > 0 && world > 0 && (local < world || local < groupSize)) return true;
  }
  return false;
}

}  // namespace ucxb
