// The 64-bit tag layout shared by every message of the backend. UCX matches receives by tag
// alone (not by endpoint), so the tag must carry the source rank for directed receives, and the
// sequence number keeps a late message of a failed or earlier op from matching a later op.
//
//   bit 63      kind   0 = collective, 1 = point-to-point
//   bits 62..52 group  11-bit hash of the group id (each group also has its own worker; the
//                      hash makes a cross-group mix-up visible in traces and tests)
//   collective: bits 51..32 seq   op sequence number modulo 2^20
//               bits 31..16 step  algorithm step / chunk index, 0..65535
//   p2p:        bits 51..16 user  the user's tag (0..2^31-1); 2^35 is the group's failure
//                                 notice (kNoticeUser), which no op uses
//   bits 15..0  src    source rank (groups are limited to 65536 ranks)
//
// Any-source receives use kAnySourceMask, which ignores the src bits. Within a window of 2^20
// collectives in flight, distinct (group, seq, step, src) give distinct tags.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace ucxb::tag {

constexpr int kGroupBits = 11;
constexpr int kSeqBits = 20;
constexpr int kStepBits = 16;
constexpr int kUserBits = 36;
constexpr int kSrcBits = 16;

constexpr uint64_t kP2PBit = uint64_t{1} << 63;
constexpr uint64_t kGroupMask = (uint64_t{1} << kGroupBits) - 1;
constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;
constexpr uint64_t kStepMask = (uint64_t{1} << kStepBits) - 1;
constexpr uint64_t kUserMask = (uint64_t{1} << kUserBits) - 1;
constexpr uint64_t kSrcMask = (uint64_t{1} << kSrcBits) - 1;

constexpr int kSrcShift = 0;
constexpr int kStepShift = kSrcBits;
constexpr int kUserShift = kSrcBits;
constexpr int kSeqShift = kStepShift + kStepBits;
constexpr int kGroupShift = kSeqShift + kSeqBits;

constexpr uint64_t kMaxRanks = kSrcMask + 1;
constexpr uint64_t kMaxSteps = kStepMask + 1;
constexpr int64_t kMaxUserTag = 0x7fffffff;

constexpr uint64_t kFullMask = ~uint64_t{0};
constexpr uint64_t kAnySourceMask = ~(kSrcMask << kSrcShift);

constexpr uint64_t collective(uint32_t group, uint64_t seq, uint32_t step, uint32_t src) {
  return ((uint64_t{group} & kGroupMask) << kGroupShift) | ((seq & kSeqMask) << kSeqShift) |
         ((uint64_t{step} & kStepMask) << kStepShift) | ((uint64_t{src} & kSrcMask) << kSrcShift);
}

constexpr uint64_t p2p(uint32_t group, uint64_t userTag, uint32_t src) {
  return kP2PBit | ((uint64_t{group} & kGroupMask) << kGroupShift) |
         ((userTag & kUserMask) << kUserShift) | ((uint64_t{src} & kSrcMask) << kSrcShift);
}

// A group's failure notice (csrc/engine/failure_notice.h): a point-to-point tag whose user
// field lies beyond every user's tag (they end at kMaxUserTag), so that no op ever posts or
// sends it, in the group's own field (not an op's marked one). The source rank is the
// failing rank's, as in every tag.
constexpr uint64_t kNoticeUser = uint64_t{1} << (kUserBits - 1);
static_assert(kNoticeUser > static_cast<uint64_t>(kMaxUserTag) && kNoticeUser <= kUserMask);

constexpr uint64_t notice(uint32_t group, uint32_t src) { return p2p(group, kNoticeUser, src); }
constexpr bool isNotice(uint64_t tag) {
  return (tag & kP2PBit) != 0 && ((tag >> kUserShift) & kUserMask) == kNoticeUser;
}
static_assert(isNotice(notice(5, 3)) && !isNotice(p2p(5, kMaxUserTag, 3)) &&
              !isNotice(collective(5, kNoticeUser >> 16, 0, 3)));

constexpr uint32_t source(uint64_t tag) { return static_cast<uint32_t>((tag >> kSrcShift) & kSrcMask); }
constexpr uint32_t group(uint64_t tag) { return static_cast<uint32_t>((tag >> kGroupShift) & kGroupMask); }
constexpr uint64_t seq(uint64_t tag) { return (tag >> kSeqShift) & kSeqMask; }
constexpr uint32_t step(uint64_t tag) { return static_cast<uint32_t>((tag >> kStepShift) & kStepMask); }
constexpr uint64_t user(uint64_t tag) { return (tag >> kUserShift) & kUserMask; }
constexpr bool isP2P(uint64_t tag) { return (tag & kP2PBit) != 0; }

// The group field of a collective's tags: the group's hash with a fingerprint of what every
// rank must pass alike to the op (`fields`: its kind, dtype, reduce op and root, as the
// backend numbers them) folded in. Ranks that disagree on any of them (one sums floats while
// the other sums ints of the same size, one sums while the other takes the max, two name
// different roots) then post tags that do not match, and the op times out naming the peer it
// waits for instead of reading the other op's bytes as its own. Sizes are left out: they may
// differ legitimately (all_to_all) and a receive of another size fails on its own. Two
// different fingerprints fold to the same 11 bits once in 2048.
inline uint32_t markedGroup(uint32_t group, std::initializer_list<int64_t> fields) {
  uint64_t h = 1469598103934665603ull;
  for (const int64_t f : fields) {
    for (int b = 0; b < 8; ++b) {
      h ^= static_cast<uint64_t>(f) >> (8 * b) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return (group ^ static_cast<uint32_t>(h ^ (h >> 32))) & kGroupMask;
}

// FNV-1a folded to kGroupBits: a stable group hash from the group id string.
inline uint32_t groupHash(const char* id) {
  uint64_t h = 1469598103934665603ull;
  for (const char* p = id; *p; ++p) {
    h ^= static_cast<unsigned char>(*p);
    h *= 1099511628211ull;
  }
  return static_cast<uint32_t>((h ^ (h >> 32)) & kGroupMask);
}

}  // namespace ucxb::tag
