// Where a group's creation spent its time: the phases of TransportBackend's constructor and
// the Store traffic it made. Read by ucxbackend.startup_profile() and printed per phase by
// `python -m ucxbackend bench startup` (docs/performance.md#start-up).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ucxb {

// The Store traffic of one creation: every call (a multi-key get, set or wait is one) and the
// bytes of the keys and values it carried, both ways.
struct StoreTraffic {
  uint64_t calls = 0;
  uint64_t bytes = 0;
  // The calls of the creation watch (csrc/creation_watch.hpp), on a connection of its own and
  // only in a wait longer than a normal creation's: not in `calls`, which counts the common path.
  uint64_t watchCalls = 0;
};

struct StartupProfile {
  std::vector<std::pair<std::string, double>> phases;  // seconds, in the order they ran
  StoreTraffic store;
  // store.calls made in each phase of `phases`, same order: which phase's calls a rank's role
  // changes (joining before rank 0 opened the creation, cleaning up) and which none may.
  std::vector<uint64_t> phaseStoreCalls;
  // Transport::lowerTransports() of the transport the group kept (ucx: its UCP context's).
  std::vector<std::string> transports;
};

// Cuts the time since construction, and the Store calls made in it, into consecutive named
// phases: each mark() ends one.
class PhaseClock {
 public:
  explicit PhaseClock(StartupProfile& profile)
      : profile_(profile),
        last_(std::chrono::steady_clock::now()),
        lastCalls_(profile.store.calls) {}

  void mark(const char* phase) {
    const auto now = std::chrono::steady_clock::now();
    profile_.phases.emplace_back(phase, std::chrono::duration<double>(now - last_).count());
    profile_.phaseStoreCalls.push_back(profile_.store.calls - lastCalls_);
    last_ = now;
    lastCalls_ = profile_.store.calls;
  }

 private:
  StartupProfile& profile_;
  std::chrono::steady_clock::time_point last_;
  uint64_t lastCalls_;
};

}  // namespace ucxb
