// A build without OpenSSL (compiled with -DUCXB_WITHOUT_OPENSSL, as setup.py does when
// <openssl/evp.h> is missing): the authenticated mode is refused with an error that says why
// and how to fix it, and nothing else needs OpenSSL. Built by tests/test_udp_auth.py.
#include <string>

#include "tests/cpp/check.h"
#include "transports/udp/auth_keys.h"
#include "transports/udp/datagram_auth.h"

using namespace ucxb;
using namespace ucxb::udp;

namespace {

void testRefused() {
  CHECK(!authAvailable());
  const AuthKey key{};
  const std::vector<uint8_t> secret(32, 1);
  for (const char* part : {"built without it", "apt-get install libssl-dev",
                           "dnf install openssl-devel", "rebuild ucxbackend"}) {
    CHECK_THROWS(DatagramSealer(key, 0, 1), config::ConfigError, part);
  }
  CHECK_THROWS(DatagramOpener(key, 0, 1), config::ConfigError, "secret_file");
  CHECK_THROWS(deriveGroupKey(secret, secret, "g", 1), config::ConfigError, "OpenSSL");
}

const check::Group kGroups[] = {{"refused", testRefused, true}};

}  // namespace

int main(int argc, char** argv) {
  return check::runGroups("udp_auth_unavailable_test", kGroups, argc, argv);
}
