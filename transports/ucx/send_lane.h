// A second UCX worker with a thread of its own that carries a rank's large sends to peers it
// reaches over TCP, so that sending and receiving run at once on two threads.
//
// Why: over TCP, every byte costs a system call on each side (sendmsg runs most of the
// kernel's work, the peer's receive processing included, on a veth). With one worker, one
// thread makes both kinds of call in turn, and a 2-rank ring, which sends and receives its
// whole tensor at once, leaves each direction idle while the thread serves the other. Here the
// lane's worker connects to the peer's main worker: the lane thread makes this rank's sendmsg
// calls while the main (progress) thread receives, and the peer's own lane sends the other
// way on a connection of its own. Tag matching is per receiving worker, so receivers see no
// difference (docs/performance.md#both-directions-at-once).
//
// Threading: the lane thread alone touches the lane's worker (UCS_THREAD_MODE_SINGLE). The
// owner (the transport's driving thread) hands it commands through a queue and an eventfd,
// and collects completions through another queue whose eventfd is part of the transport's
// event fd, so a sleeping progress thread wakes when a lane send completes. The worker and
// thread start on the first post(): a group that never sends a large message to a remote
// peer costs nothing. With nothing posted the lane thread sleeps in epoll_wait.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transports/tag.h"
#include "transports/ucx/ucx_context.h"

namespace ucxb::ucx {

// The send_lane option: kAuto uses a lane for a peer on another host reached over TCP only.
enum class SendLaneMode { kAuto, kOn, kOff };
SendLaneMode parseSendLaneMode(const std::string& text);  // "auto", "on", "off"

// Sends smaller than this stay on the main worker: they are latency-bound, and a thread hop
// each way would cost more than the overlap gains. 256 KiB is past UCX's rendezvous switch
// over TCP, where a send's time is its bytes.
constexpr size_t kSendLaneMinBytes = size_t{256} << 10;

class SendLane {
 public:
  // A finished send: the token given to post(), and UCX's status (UCS_OK, or why it failed;
  // `error` then says what the lane knows of the peer, possibly empty).
  struct Completion {
    const void* token;
    ucs_status_t status;
    std::string error;
  };

  explicit SendLane(std::shared_ptr<Context> context);
  // Stops the thread: healthy endpoints are flushed (bounded), the rest force-closed, and
  // every send still in flight completes (failed) before the thread ends.
  ~SendLane();
  // The same, leaving the completions to be taken. Owner thread.
  void stop();
  SendLane(const SendLane&) = delete;
  SendLane& operator=(const SendLane&) = delete;

  // Queues a send of `bytes` at `data` to `peer`'s main worker, whose UCX address is
  // `address` (used once, to create the lane's endpoint). The buffer must stay valid until
  // the completion for `token` has been taken. Owner thread.
  void post(int peer, const std::vector<uint8_t>& address, uint64_t tag, const void* data,
            size_t bytes, const void* token);
  // Force-closes the lane's endpoint to `peer` and waits (bounded) until every send to it has
  // completed. Owner thread.
  void abortPeer(int peer);
  // Completions since the last call; drains the eventfd. Owner thread.
  std::vector<Completion> takeCompleted();
  bool hasCompleted() const;
  // Readable while completions are waiting.
  int completionFd() const { return doneFd_; }

 private:
  struct Command {
    enum Kind { kSend, kAbort } kind;
    int peer;
    std::vector<uint8_t> address;  // kSend, the first to this peer
    uint64_t tag;
    const void* data;
    size_t bytes;
    const void* token;
  };

 public:
  struct Endpoint;  // the lane's connection to one peer (lane thread only)

 private:
  void start();
  void threadMain();
  void runCommand(ucp_worker_h worker, Command& cmd);
  void closeAll(ucp_worker_h worker);
  void finish(const void* token, ucs_status_t status, std::string error);
  void wake(int fd);

  std::shared_ptr<Context> context_;
  int doneFd_ = -1;  // eventfd: completions waiting (owner side)
  int wakeFd_ = -1;  // eventfd: commands waiting, or stop (lane side)
  mutable std::mutex mu_;
  std::condition_variable aborted_;
  std::deque<Command> commands_;   // guarded by mu_
  std::vector<Completion> done_;   // guarded by mu_
  // Set by finish() after it signals doneFd_, cleared by takeCompleted() before it drains:
  // the owner's progress() reaps at every call, and without completions waiting that costs
  // one load instead of a read() on the eventfd and the mutex (a group whose peers are on
  // other hosts has a lane even if no send ever takes it).
  std::atomic<bool> pending_{false};
  uint64_t abortsDone_ = 0;        // guarded by mu_
  uint64_t abortsAsked_ = 0;       // owner thread
  bool stop_ = false;              // guarded by mu_
  std::vector<bool> addressSent_;  // owner thread: the peer's address went with a command
  // Lane thread only.
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::thread thread_;
};

}  // namespace ucxb::ucx
