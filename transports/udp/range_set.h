// A set of 64-bit integers kept as disjoint half-open intervals [begin, end). One structure
// serves every "which of these have I seen" question in the core: packet numbers received
// (ACK ranges), bytes of a message received (duplicate suppression), message ids seen and
// finished (matching order, late duplicates). Memory grows with the number of gaps, not with
// the number of values, so a long lossless stream costs one interval.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

namespace ucxb::udp {

class RangeSet {
 public:
  struct Range {
    uint64_t begin;  // first value
    uint64_t end;    // one past the last value
  };

  // Adds [begin, end). Returns how many values were not in the set before; when `newParts` is
  // given, the sub-intervals that were new are appended to it in ascending order.
  uint64_t insert(uint64_t begin, uint64_t end, std::vector<Range>* newParts = nullptr);
  uint64_t insert(uint64_t value) { return insert(value, value + 1); }

  bool contains(uint64_t value) const;
  // True if every value of [begin, end) is in the set (vacuously true when begin >= end).
  bool containsAll(uint64_t begin, uint64_t end) const;
  // The smallest value >= `from` that is NOT in the set.
  uint64_t firstMissingFrom(uint64_t from) const;

  // Forgets every value below `value` (bounded history).
  void eraseBelow(uint64_t value);

  bool empty() const { return ranges_.empty(); }
  size_t rangeCount() const { return ranges_.size(); }
  // Valid only when !empty().
  uint64_t min() const { return ranges_.begin()->first; }
  uint64_t max() const { return std::prev(ranges_.end())->second - 1; }

  // Intervals in descending order (highest first), as ACK frames list them.
  template <typename F>
  void forEachDescending(F&& f) const {
    for (auto it = ranges_.rbegin(); it != ranges_.rend(); ++it) {
      if (!f(Range{it->first, it->second})) return;
    }
  }
  // Intervals in ascending order; `f` returns false to stop.
  template <typename F>
  void forEachAscending(F&& f) const {
    for (const auto& [b, e] : ranges_) {
      if (!f(Range{b, e})) return;
    }
  }

 private:
  std::map<uint64_t, uint64_t> ranges_;  // begin -> end; disjoint and never adjacent
};

}  // namespace ucxb::udp
