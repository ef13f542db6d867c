#include "transports/udp/range_set.h"

#include <algorithm>
#include <iterator>

namespace ucxb::udp {

uint64_t RangeSet::insert(uint64_t begin, uint64_t end, std::vector<Range>* newParts) {
  if (begin >= end) return 0;
  // The first interval that may overlap or touch [begin, end): the last one starting at or
  // before `begin`, if it reaches `begin`; otherwise the first one starting after it.
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= begin) it = prev;
  }
  // The first interval met is kept and becomes the union; the others it swallows are erased.
  // Keeping it is what makes the common case (a stream arriving in order extends its one
  // interval, once per datagram) free of allocation and rebalancing.
  auto kept = ranges_.end();
  uint64_t mergedEnd = end;
  uint64_t cursor = begin;  // values below cursor are accounted for
  uint64_t added = 0;
  while (it != ranges_.end() && it->first <= end) {
    const uint64_t gapEnd = std::min(it->first, end);
    if (cursor < gapEnd) {
      added += gapEnd - cursor;
      if (newParts) newParts->push_back({cursor, gapEnd});
    }
    cursor = std::max(cursor, it->second);
    mergedEnd = std::max(mergedEnd, it->second);
    if (kept == ranges_.end()) {
      kept = it++;
    } else {
      it = ranges_.erase(it);
    }
  }
  if (cursor < end) {
    added += end - cursor;
    if (newParts) newParts->push_back({cursor, end});
  }
  if (kept == ranges_.end()) {
    ranges_.emplace_hint(it, begin, end);
  } else if (kept->first <= begin) {
    kept->second = mergedEnd;
  } else {
    // The union starts before the kept interval: its key changes, its node is reused. No
    // interval lies between the two starts, so its place (just before `it`) stays the same.
    auto node = ranges_.extract(kept);
    node.key() = begin;
    node.mapped() = mergedEnd;
    ranges_.insert(it, std::move(node));
  }
  return added;
}

bool RangeSet::contains(uint64_t value) const {
  auto it = ranges_.upper_bound(value);
  if (it == ranges_.begin()) return false;
  return std::prev(it)->second > value;
}

bool RangeSet::containsAll(uint64_t begin, uint64_t end) const {
  if (begin >= end) return true;
  auto it = ranges_.upper_bound(begin);
  if (it == ranges_.begin()) return false;
  return std::prev(it)->second >= end;
}

uint64_t RangeSet::firstMissingFrom(uint64_t from) const {
  auto it = ranges_.upper_bound(from);
  if (it == ranges_.begin()) return from;
  const auto prev = std::prev(it);
  return prev->second > from ? prev->second : from;
}

void RangeSet::eraseBelow(uint64_t value) {
  while (!ranges_.empty() && ranges_.begin()->first < value) {
    auto first = ranges_.begin();
    const uint64_t e = first->second;
    ranges_.erase(first);
    if (e > value) {
      ranges_.emplace(value, e);
      break;
    }
  }
}

}  // namespace ucxb::udp
