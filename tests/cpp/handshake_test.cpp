// The address record of csrc/handshake.h on its own: encoding, and every check a rank makes
// on its peers' records before its transport sees an address.
#include "csrc/handshake.h"

#include "tests/cpp/check.h"

namespace {

using ucxb::checkHandshakes;
using ucxb::encodeHandshake;
using ucxb::Handshake;
using ucxb::HandshakeMismatch;
using Records = std::vector<std::vector<uint8_t>>;

Handshake record(const std::string& transport, std::vector<ucxb::config::Setting> settings,
                 uint8_t addressByte) {
  return Handshake{transport, std::move(settings), std::vector<uint8_t>(37, addressByte)};
}

const std::vector<ucxb::config::Setting> kSettings = {{"chunk_bytes", "4194304"},
                                                      {"algo_allreduce", "auto"}};

void testAgreeingRanks() {
  std::vector<Handshake> mine;
  Records published;
  for (uint8_t r = 0; r < 3; ++r) {
    mine.push_back(record("ucx", kSettings, r));
    published.push_back(encodeHandshake(mine.back()));
  }
  for (int r = 0; r < 3; ++r) {
    const Records addresses = checkHandshakes(r, mine[r], published);
    CHECK_EQ(addresses.size(), size_t{3});
    for (uint8_t p = 0; p < 3; ++p) CHECK(addresses[p] == std::vector<uint8_t>(37, p));
  }
  // An empty address and no settings encode and check too (a group of one, a bare record).
  const Handshake bare{"udp", {}, {}};
  const Records one = checkHandshakes(0, bare, {encodeHandshake(bare)});
  CHECK(one.size() == 1 && one[0].empty());
  CHECK_EQ(checkHandshakes(1, bare, {encodeHandshake(bare), {}}).size(), size_t{2});
}

void testAnotherBackend() {
  const Handshake ucx = record("ucx", kSettings, 1);
  const Handshake udp = record("udp", kSettings, 2);
  const Records published = {encodeHandshake(ucx), encodeHandshake(udp)};
  CHECK_THROWS(checkHandshakes(0, ucx, published), HandshakeMismatch,
               "rank 1 published a udp address but this group is ucx");
  CHECK_THROWS(checkHandshakes(1, udp, published), HandshakeMismatch,
               "rank 0 published a ucx address but this group is udp");
  // The backend is named before any setting, even where the settings differ too.
  const Handshake other = record("udp", {{"chunk_bytes", "1"}}, 2);
  CHECK_THROWS(checkHandshakes(0, ucx, {encodeHandshake(ucx), encodeHandshake(other)}),
               HandshakeMismatch, "published a udp address");
}

void testNotARecord() {
  const Handshake ucx = record("ucx", kSettings, 1);
  // What a release before the record published: a bare UCX address, or the udp blob.
  const std::vector<uint8_t> bareUcx = {5, 0, 0, 0, 1, 2, 3, 4, 5, 6};
  const std::vector<uint8_t> oldUdp = {'U', 'D', 'P', 1, 4, 0, 80, 127, 0, 0, 1};
  for (const auto& junk : {bareUcx, oldUdp, std::vector<uint8_t>{}, std::vector<uint8_t>{'U'}}) {
    CHECK_THROWS(checkHandshakes(0, ucx, {encodeHandshake(ucx), junk}), HandshakeMismatch,
                 "rank 1 published " + std::to_string(junk.size()) +
                     " bytes that are not a ucxbackend address record");
  }
  // Another version of the record: both versions named, nothing after them read.
  std::vector<uint8_t> later = encodeHandshake(ucx);
  later[4] = ucxb::kHandshakeVersion + 1;
  later.resize(6);
  CHECK_THROWS(checkHandshakes(0, ucx, {encodeHandshake(ucx), later}), HandshakeMismatch,
               "rank 1 published an address record of version " +
                   std::to_string(ucxb::kHandshakeVersion + 1) + " but this rank reads version " +
                   std::to_string(ucxb::kHandshakeVersion));
  // What the release before the ucx address carried its host (and udp wire version 2)
  // published: version 1, which must not be read as this one.
  std::vector<uint8_t> earlier = encodeHandshake(ucx);
  earlier[4] = 1;
  CHECK_THROWS(checkHandshakes(0, ucx, {encodeHandshake(ucx), earlier}), HandshakeMismatch,
               "rank 1 published an address record of version 1 but this rank reads version " +
                   std::to_string(ucxb::kHandshakeVersion));
  // Cut short anywhere, or with bytes after its end.
  const std::vector<uint8_t> full = encodeHandshake(ucx);
  for (size_t n = 5; n < full.size(); ++n) {
    const std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK_THROWS(checkHandshakes(1, ucx, {cut, full}), HandshakeMismatch,
                 "rank 0's address record (" + std::to_string(n) + " bytes) is truncated");
  }
  std::vector<uint8_t> longer = full;
  longer.push_back(0);
  CHECK_THROWS(checkHandshakes(1, ucx, {longer, full}), HandshakeMismatch,
               "has 1 bytes after its end");
}

void testDisagreeingSettings() {
  // Ranks 0 and 1 agree, rank 2 differs in both settings: every rank fails, naming the
  // setting, both values and both ranks; a rank that agrees with the others names rank 2.
  std::vector<Handshake> mine;
  Records published;
  for (uint8_t r = 0; r < 3; ++r) {
    auto settings = kSettings;
    if (r == 2) settings = {{"chunk_bytes", "1048576"}, {"algo_allreduce", "ring"}};
    mine.push_back(record("ucx", settings, r));
    published.push_back(encodeHandshake(mine.back()));
  }
  for (int r = 0; r < 2; ++r) {
    const std::string me = "rank " + std::to_string(r);
    const std::string what = ucxb::check::thrownMessage<HandshakeMismatch>(
        [&] { checkHandshakes(r, mine[r], published); });
    CHECK_MSG(what.find("the ranks disagree on settings that must be the same on every rank: "
                        "chunk_bytes is '4194304' on " + me +
                        " (this rank) but '1048576' on rank 2; algo_allreduce is 'auto' on " +
                        me + " (this rank) but 'ring' on rank 2") != std::string::npos,
              what);
  }
  CHECK_THROWS(checkHandshakes(2, mine[2], published), HandshakeMismatch,
               "chunk_bytes is '1048576' on rank 2 (this rank) but '4194304' on rank 0; "
               "algo_allreduce is 'ring' on rank 2 (this rank) but 'auto' on rank 0");
  // Only what differs is named; a setting only one side has counts as unset there.
  const Handshake a = record("udp", {{"chunk_bytes", "4"}, {"udp_config.eager_max_bytes", "9"}}, 0);
  const Handshake b = record("udp", {{"chunk_bytes", "4"}, {"udp_config.unexpected_bytes", "7"}}, 1);
  const std::string what = ucxb::check::thrownMessage<HandshakeMismatch>(
      [&] { checkHandshakes(0, a, {encodeHandshake(a), encodeHandshake(b)}); });
  CHECK_MSG(what.find("udp_config.eager_max_bytes is '9' on rank 0 (this rank) but unset on "
                      "rank 1; udp_config.unexpected_bytes is unset on rank 0 (this rank) but "
                      "'7' on rank 1") != std::string::npos,
            what);
  CHECK_MSG(what.find("chunk_bytes") == std::string::npos, what);
  // Values are compared as bytes: an empty one, and one with a comma or a newline, survive.
  const Handshake c = record("ucx", {{"x", ""}, {"y", "a,b\nc"}}, 0);
  CHECK_EQ(checkHandshakes(1, c, {encodeHandshake(c), encodeHandshake(c)}).size(), size_t{2});
}

void testTooLong() {
  const Handshake huge{"ucx", {{"x", std::string(70000, 'v')}}, {}};
  CHECK_THROWS(encodeHandshake(huge), HandshakeMismatch, "value of x (70000 bytes) is too long");
}

// A rank whose transport could not be made publishes why in place of an address: every other
// rank names it and the reason, before the backend or the settings (its record lacks nothing
// else, but the reason is what the user needs), and a long reason is cut to fit a record.
void testFailedRank() {
  const Handshake ucx = record("ucx", kSettings, 0);
  auto settings = kSettings;
  settings.push_back({ucxb::kFailedSetting, ucxb::failedValue("no worker: out of memory")});
  const Handshake failed{"ucx", settings, {}};
  CHECK_THROWS(checkHandshakes(0, ucx, {encodeHandshake(ucx), encodeHandshake(failed)}),
               HandshakeMismatch,
               "rank 1 could not make its ucx transport for this group, so no rank can create "
               "it: no worker: out of memory");
  // Named as soon as its record is read: before a disagreeing setting of its own.
  auto other = settings;
  other[0].value = "1";
  const Handshake failedAndOther{"ucx", other, {}};
  CHECK_THROWS(checkHandshakes(0, ucx, {encodeHandshake(ucx), encodeHandshake(failedAndOther)}),
               HandshakeMismatch, "could not make its ucx transport");
  const std::string cut = ucxb::failedValue(std::string(100000, 'w'));
  CHECK_MSG(cut.size() < 65535 && cut.substr(cut.size() - 3) == "...", cut.substr(0, 20));
  auto longSettings = kSettings;
  longSettings.push_back({ucxb::kFailedSetting, cut});
  CHECK(!encodeHandshake(Handshake{"ucx", longSettings, {}}).empty());
}

const ucxb::check::Group kGroups[] = {
    {"failed_rank", testFailedRank, true},
    {"agreeing", testAgreeingRanks, true},
    {"backend", testAnotherBackend, true},
    {"not_a_record", testNotARecord, true},
    {"settings", testDisagreeingSettings, true},
    {"too_long", testTooLong, true},
};

}  // namespace

int main(int argc, char** argv) {
  return ucxb::check::runGroups("handshake_test", kGroups, argc, argv);
}
