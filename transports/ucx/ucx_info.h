// What the UCX library in this process is and what it can reach: for `ucxbackend info`.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ucxb::ucx {

std::string libraryVersion();
// Path of the libucp shared object actually loaded (resolved with dladdr).
std::string libraryPath();
// (transport, device) pairs of every memory domain UCX can open, e.g. ("tcp", "lo").
std::vector<std::pair<std::string, std::string>> transports();

}  // namespace ucxb::ucx
