#include "transports/ucx/send_lane.h"

#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "transports/ucx/endpoint_close.h"
#include "transports/ucx/ucx_status.h"

namespace ucxb::ucx {

struct SendLane::Endpoint {
  SendLane* lane;
  int peer;
  ucp_ep_h ep = nullptr;
  std::string error;  // set by UCX's error callback or an abort; later sends fail with it
  int inflight = 0;   // sends UCX holds on it
};

namespace {

// One send UCX holds: what its callback needs.
struct InFlight {
  SendLane* lane;
  const void* token;
  SendLane::Endpoint* ep;
};

int makeEventFd(const char* what) {
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) throw TransportError(std::string(what) + ": eventfd: " + std::strerror(errno));
  return fd;
}

void drain(int fd) {
  uint64_t value = 0;
  while (::read(fd, &value, sizeof(value)) > 0) {
  }
}


}  // namespace

SendLane::SendLane(std::shared_ptr<Context> context)
    : context_(std::move(context)),
      doneFd_(makeEventFd("send lane completions")),
      wakeFd_(makeEventFd("send lane commands")) {}

SendLaneMode parseSendLaneMode(const std::string& text) {
  if (text == "on") return SendLaneMode::kOn;
  if (text == "off") return SendLaneMode::kOff;
  if (text == "auto") return SendLaneMode::kAuto;
  throw TransportError("send_lane must be 'auto', 'on' or 'off', not '" + text + "'");
}

SendLane::~SendLane() {
  stop();
  ::close(doneFd_);
  ::close(wakeFd_);
}

void SendLane::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake(wakeFd_);
  thread_.join();
}

void SendLane::wake(int fd) {
  const uint64_t one = 1;
  // An eventfd write fails only when its counter would overflow: it is readable then anyway.
  [[maybe_unused]] const ssize_t n = ::write(fd, &one, sizeof(one));
}

void SendLane::start() {
  if (thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) throw TransportError("the send lane was stopped");
  }
  thread_ = std::thread([this] { threadMain(); });
}

void SendLane::post(int peer, const std::vector<uint8_t>& address, uint64_t tag,
                    const void* data, size_t bytes, const void* token) {
  start();
  if (static_cast<size_t>(peer) >= addressSent_.size()) addressSent_.resize(peer + 1, false);
  Command cmd{Command::kSend, peer, {}, tag, data, bytes, token};
  if (!addressSent_[peer]) {
    cmd.address = address;
    addressSent_[peer] = true;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(cmd));
  }
  wake(wakeFd_);
}

void SendLane::abortPeer(int peer) {
  if (!thread_.joinable()) return;
  std::unique_lock<std::mutex> lock(mu_);
  commands_.push_back(Command{Command::kAbort, peer, {}, 0, nullptr, 0, nullptr});
  const uint64_t mine = ++abortsAsked_;
  lock.unlock();
  wake(wakeFd_);
  lock.lock();
  // The lane thread force-closes the endpoint within a second (forceClose); past that it is
  // stuck in UCX and waiting longer would not help.
  aborted_.wait_for(lock, std::chrono::seconds(2), [&] { return abortsDone_ >= mine; });
}

std::vector<SendLane::Completion> SendLane::takeCompleted() {
  if (!pending_.exchange(false, std::memory_order_acquire)) return {};
  drain(doneFd_);  // before taking the list: a completion added after this writes the fd again
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Completion> out;
  out.swap(done_);
  return out;
}

bool SendLane::hasCompleted() const { return pending_.load(std::memory_order_acquire); }

void SendLane::finish(const void* token, ucs_status_t status, std::string error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back(Completion{token, status, std::move(error)});
  }
  wake(doneFd_);
  // After the fd: a takeCompleted() that sees the flag drains this write too, so the fd is
  // never left readable with the flag clear (an epoll wait would return at once, forever).
  pending_.store(true, std::memory_order_release);
}

void SendLane::runCommand(ucp_worker_h worker, Command& cmd) {
  if (static_cast<size_t>(cmd.peer) >= endpoints_.size()) endpoints_.resize(cmd.peer + 1);
  auto& slot = endpoints_[cmd.peer];
  if (!slot) slot = std::make_unique<Endpoint>(Endpoint{this, cmd.peer, nullptr, {}, 0});
  Endpoint& ep = *slot;
  if (cmd.kind == Command::kAbort) {
    forceClose(worker, ep.ep);
    if (ep.error.empty()) ep.error = "the connection to rank " + std::to_string(ep.peer) +
                                     " was aborted";
    std::lock_guard<std::mutex> lock(mu_);
    ++abortsDone_;
    aborted_.notify_all();
    return;
  }
  if (ep.ep == nullptr && ep.error.empty()) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(cmd.address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t status) {
      auto* failed = static_cast<Endpoint*>(arg);
      failed->error = describe(status, "send lane connection to rank " +
                                           std::to_string(failed->peer) + " failed");
    };
    params.err_handler.arg = &ep;
    const ucs_status_t status = cmd.address.empty() ? UCS_ERR_INVALID_ADDR
                                                    : ucp_ep_create(worker, &params, &ep.ep);
    if (status != UCS_OK) {
      ep.ep = nullptr;
      ep.error = describe(status, "send lane ucp_ep_create to rank " + std::to_string(ep.peer));
    }
  }
  if (ep.ep == nullptr) {
    finish(cmd.token, UCS_ERR_UNREACHABLE, ep.error);
    return;
  }
  auto* flight = new InFlight{this, cmd.token, &ep};
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  param.cb.send = [](void* request, ucs_status_t status, void* user) {
    auto* f = static_cast<InFlight*>(user);
    ucp_request_free(request);
    --f->ep->inflight;
    f->lane->finish(f->token, status, status == UCS_OK ? std::string() : f->ep->error);
    delete f;
  };
  param.user_data = flight;
  param.memory_type = UCS_MEMORY_TYPE_HOST;
  const ucs_status_ptr_t r = ucp_tag_send_nbx(ep.ep, cmd.data, cmd.bytes, cmd.tag, &param);
  if (!UCS_PTR_IS_PTR(r)) {
    const ucs_status_t status = UCS_PTR_STATUS(r);
    finish(cmd.token, status, status == UCS_OK ? std::string() : ep.error);
    delete flight;
  } else {
    ++ep.inflight;
  }
}

void SendLane::closeAll(ucp_worker_h worker) {
  // A healthy endpoint is flushed, so that a send UCX reported done has left; a peer that
  // already exited cannot acknowledge the flush, hence the bound. One with sends still in
  // flight (the group is being destroyed after a failed op) is force-closed, which completes
  // them as cancelled before the thread ends.
  std::vector<void*> closing;
  for (auto& ep : endpoints_) {
    if (ep) startClose(ep->ep, !ep->error.empty() || ep->inflight != 0, closing);
  }
  finishCloses(worker, closing, std::chrono::milliseconds(500));
}

void SendLane::threadMain() {
  pthread_setname_np(pthread_self(), "ucxb-sendlane");  // for top -H, perf and /proc
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;  // this thread alone touches the lane's worker
  ucp_worker_h worker = nullptr;
  int workerFd = -1;
  const int epollFd = ::epoll_create1(EPOLL_CLOEXEC);
  ucs_status_t status = epollFd < 0 ? UCS_ERR_IO_ERROR
                                    : ucp_worker_create(context_->handle(), &params, &worker);
  if (status == UCS_OK) status = ucp_worker_get_efd(worker, &workerFd);
  for (int fd : {workerFd, wakeFd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    if (status == UCS_OK && ::epoll_ctl(epollFd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      status = UCS_ERR_IO_ERROR;
    }
  }
  const std::string startError =
      status == UCS_OK ? std::string() : describe(status, "creating the send lane's worker");

  for (;;) {
    drain(wakeFd_);
    std::deque<Command> commands;
    bool stop = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands.swap(commands_);
      stop = stop_;
    }
    for (Command& cmd : commands) {
      if (!startError.empty()) {
        if (cmd.kind == Command::kSend) finish(cmd.token, status, startError);
        std::lock_guard<std::mutex> lock(mu_);
        if (cmd.kind == Command::kAbort) ++abortsDone_;
        aborted_.notify_all();
        continue;
      }
      runCommand(worker, cmd);
    }
    if (stop) break;
    if (!startError.empty()) {
      // No worker, or an epoll set that may lack wakeFd_: wait on the command fd alone, so
      // that later sends fail at once and stop() (destroying the group) is seen.
      pollfd wake{wakeFd_, POLLIN, 0};
      if (::poll(&wake, 1, -1) < 0 && errno != EINTR) std::this_thread::yield();
      continue;
    }
    if (worker != nullptr) {
      while (ucp_worker_progress(worker) != 0) {
      }
      const ucs_status_t armed = ucp_worker_arm(worker);
      if (armed == UCS_ERR_BUSY) continue;  // events came in meanwhile: progress again
      if (armed != UCS_OK) {
        // Cannot sleep on the worker: poll it, yielding the core, rather than hang its sends.
        std::this_thread::yield();
        continue;
      }
    }
    epoll_event events[2];
    const int n = ::epoll_wait(epollFd, events, 2, -1);
    if (n < 0 && errno != EINTR) std::this_thread::yield();
  }

  if (worker != nullptr) {
    closeAll(worker);
    ucp_worker_destroy(worker);  // completes nothing more: every send finished above
  }
  if (epollFd >= 0) ::close(epollFd);
}

}  // namespace ucxb::ucx
