#include "csrc/engine/failure_notice.h"

#include <sched.h>

#include <algorithm>
#include <exception>
#include <memory>

#include "transports/tag.h"

namespace ucxb {

namespace {

using Clock = std::chrono::steady_clock;

// The failing rank, ahead of the text: 4 bytes, little-endian.
constexpr size_t kRankBytes = 4;

// Progress calls that reading a notice already here may take (an eager message matched from
// the unexpected queue completes in the first).
constexpr int kReadRounds = 64;

}  // namespace

void FailureNotices::tell(Transport& transport, const FailureNotice& notice) {
  // Kept by each request that is still sending (the transport reads it until then).
  auto body = std::make_shared<std::string>(kRankBytes, '\0');
  const auto failed = static_cast<uint32_t>(notice.failed);
  for (size_t i = 0; i < kRankBytes; ++i) (*body)[i] = static_cast<char>(failed >> (8 * i));
  *body += notice.text.substr(0, kMaxBytes);
  const int me = transport.rank();
  const Tag tag = tag::notice(group_, static_cast<uint32_t>(me));
  for (int peer = 0; peer < transport.size(); ++peer) {
    if (peer == me || peer == notice.failed || peer == notice.from) continue;
    try {
      RequestPtr r = transport.send(peer, tag, body->data(), body->size());
      if (r->pending()) {
        r->keepAlive(body);
        sent_.push_back(std::move(r));
      }
    } catch (const std::exception&) {
      // Best effort: a peer this rank cannot reach hears nothing, as before notices.
    }
  }
}

std::optional<FailureNotice> FailureNotices::take(Transport& transport) {
  const int peer = transport.probe(tag::notice(group_, 0), tag::kAnySourceMask);
  if (peer < 0) return std::nullopt;
  FailureNotice notice{peer, peer, {}};
  auto buffer = std::make_shared<std::string>(kRankBytes + kMaxBytes, '\0');
  RequestPtr r;
  try {
    r = transport.recv(peer, tag::notice(group_, static_cast<uint32_t>(peer)), tag::kFullMask,
                       buffer->data(), buffer->size());
    for (int i = 0; i < kReadRounds && r->pending(); ++i) transport.progress();
  } catch (const std::exception& e) {
    notice.text = std::string("(its notice could not be read: ") + e.what() + ")";
    return notice;
  }
  if (r->pending()) {
    r->keepAlive(buffer);  // the transport may still write into it
    r->cancel();
    notice.text = "(its notice did not arrive whole)";
  } else if (r->failed()) {
    notice.text = "(its notice could not be read: " + r->error() + ")";
  } else if (r->receivedBytes() < kRankBytes) {
    notice.text = "(its notice was " + std::to_string(r->receivedBytes()) + " bytes long)";
  } else {
    uint32_t failed = 0;
    for (size_t i = 0; i < kRankBytes; ++i) {
      failed |= uint32_t{static_cast<uint8_t>((*buffer)[i])} << (8 * i);
    }
    if (failed < static_cast<uint32_t>(transport.size())) notice.failed = static_cast<int>(failed);
    notice.text = buffer->substr(kRankBytes, r->receivedBytes() - kRankBytes);
  }
  return notice;
}

void FailureNotices::finish(Transport& transport) {
  const auto pending = [this] {
    std::erase_if(sent_, [](const RequestPtr& r) { return !r->pending(); });
    return !sent_.empty();
  };
  const auto until = Clock::now() + kFlushBound;
  while (pending() && Clock::now() < until) {
    if (!transport.progress()) sched_yield();
  }
  // One notice per peer at most is left; each take() removes one.
  for (int i = 0; i < transport.size() && take(transport); ++i) {
  }
}

}  // namespace ucxb
