// Whether a rank that a group's creation waits for can still come: each rank publishes a card
// (its host and process) before it waits for anyone, and while a rank waits on the Store for
// longer than a normal creation's wait, a thread of its looks at the processes the cards name
// (csrc/creation_watch.hpp). A rank on this
// host whose process is provably gone (killed, say) will never write what the creation waits
// for, so the waiters fail at once naming it instead of at the Store's timeout. Torch-free.
//
// A rank on another host cannot be checked without a connection (there is none yet): it is
// found dead only by a waiter on its own host, which then gives the creation up, waking every
// other rank (AddressExchange).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "transports/shm/shared_segment.h"

namespace ucxb {

struct RankCard {
  std::string host;  // shm::hostIdentity(); empty where it is not unique to this machine
  shm::SegmentOwner process;
  // Its launcher hosts the Store (torchrun's agent: TORCHELASTIC_USE_AGENT_STORE=True, which
  // torch's own rendezvous reads), so rank 0's exit does not take the Store away
  // (AddressExchange::complete). mine() reads the variable; AddressExchange clears it where
  // the group's Store is a TCPStore other than the agent's (maybeRank0sTcpStore).
  bool storeOutlivesRank0 = false;
  // Known to the watch only, never published: the watch looks no more at this rank (it
  // finished the creation, or the wait ends without it anyway), so its exit fails nothing.
  bool settled = false;

  // This process's card.
  static RankCard mine();
  std::vector<uint8_t> encode() const;
  // nullopt for bytes that are not a card (another release's, or damaged).
  static std::optional<RankCard> decode(const std::vector<uint8_t>& bytes);
  // True only when the rank's process is on this host and provably gone (no such process, a
  // zombie, or its pid taken by a process that started at another time).
  bool provablyDead() const;
  // "pid 1234 on this host" or "on host <identity>", for messages.
  std::string where() const;
};

// UCXBACKEND_TEST_KILL_AT=<point> (a test-only hook, docs/testing.md#test-only-hooks): this
// process dies by SIGKILL at that point of a group's creation, as a rank killed there would.
void testKillPoint(const char* point);
// UCXBACKEND_TEST_THREAD_FAILS=<point> (test-only, the same page): starting the thread at that
// point throws std::system_error (EAGAIN), as std::thread does where the process is at its
// thread limit.
void testThreadStartPoint(const char* point);

}  // namespace ucxb
