#include "csrc/creation_liveness.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <system_error>

namespace ucxb {

namespace {

// "UXC2\n<host>\n<pid> <start time> <pid namespace>".
constexpr char kCardMagic[] = "UXC3";

}  // namespace

RankCard RankCard::mine() {
  RankCard card;
  if (shm::hostIdentityIsUnique()) card.host = shm::hostIdentity();
  card.process = shm::currentOwner();
  const char* agentStore = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  card.storeOutlivesRank0 = agentStore != nullptr && std::string(agentStore) == "True";
  return card;
}

std::vector<uint8_t> RankCard::encode() const {
  const std::string text = std::string(kCardMagic) + "\n" + host + "\n" +
                           std::to_string(process.pid) + " " +
                           std::to_string(process.startTime) + " " +
                           std::to_string(process.pidNamespace) + " " +
                           (storeOutlivesRank0 ? "1" : "0");
  return {text.begin(), text.end()};
}

std::optional<RankCard> RankCard::decode(const std::vector<uint8_t>& bytes) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  std::string magic;
  RankCard card;
  if (!std::getline(in, magic) || magic != kCardMagic || !std::getline(in, card.host)) {
    return std::nullopt;
  }
  int outlives = 0;
  if (!(in >> card.process.pid >> card.process.startTime >> card.process.pidNamespace >>
        outlives)) {
    return std::nullopt;
  }
  card.storeOutlivesRank0 = outlives == 1;
  return card;
}

bool RankCard::provablyDead() const {
  // Pids and pid namespaces mean something only on the machine that made them: the initial
  // pid namespace has the same inode number on every host.
  if (host.empty() || !shm::hostIdentityIsUnique() || host != shm::hostIdentity()) return false;
  return shm::ownerLiveness(process) == shm::Liveness::kDead;
}

std::string RankCard::where() const {
  if (!host.empty() && shm::hostIdentityIsUnique() && host == shm::hostIdentity()) {
    return "pid " + std::to_string(process.pid) + " on this host";
  }
  return "pid " + std::to_string(process.pid) + " on another host";
}

void testKillPoint(const char* point) {
  const char* v = std::getenv("UCXBACKEND_TEST_KILL_AT");
  if (v != nullptr && std::strcmp(v, point) == 0) ::kill(::getpid(), SIGKILL);
}

void testThreadStartPoint(const char* point) {
  const char* v = std::getenv("UCXBACKEND_TEST_THREAD_FAILS");
  if (v != nullptr && std::strcmp(v, point) == 0) {
    throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                            "UCXBACKEND_TEST_THREAD_FAILS");
  }
}

}  // namespace ucxb
