#include "transports/udp/secret_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "transports/config/key_values.h"

namespace ucxb::udp {
namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  throw config::ConfigError("secret_file (UCXBACKEND_SECRET_FILE) '" + path + "' " + why);
}

// Closes the descriptor whatever happens while the file is read.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

SecretBytes readSecretFile(const std::string& path) {
  // O_NONBLOCK: a FIFO (or a device) under the knob must be refused below as not a regular
  // file, not wait in open() for a writer that never comes; a regular file reads the same.
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)};
  if (file.fd < 0) {
    refuse(path, std::string("cannot be read: ") + std::strerror(errno) +
                     " (create it with: head -c 64 /dev/urandom > FILE; chmod 600 FILE)");
  }
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) refuse(path, std::string("cannot be read: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse(path, "is not a regular file");
  // Its owner can change it at will: it must be this user (or root, as for a mounted
  // secret), as ssh demands of a private key. Matters for root, which reads any file.
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    refuse(path, "is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
                     std::to_string(::geteuid()) +
                     ") or root: whoever owns it can change the secret (chown it)");
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    refuse(path, std::string("is accessible by group or others (mode ") + mode +
                     "): a secret must be readable by its owner only (chmod 600 FILE)");
  }
  // Read straight into the (wiping) vector: no other buffer ever holds the secret.
  SecretBytes secret;
  constexpr size_t kChunk = 4096;
  for (;;) {
    const size_t had = secret.size();
    secret.resize(had + kChunk);
    const ssize_t n = ::read(file.fd, secret.data() + had, kChunk);
    secret.resize(had + static_cast<size_t>(n > 0 ? n : 0));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) refuse(path, std::string("cannot be read: ") + std::strerror(errno));
    if (n == 0) break;
    if (secret.size() > kMaxSecretBytes) {
      refuse(path, "is longer than " + std::to_string(kMaxSecretBytes) + " bytes: not a secret");
    }
  }
  if (secret.size() < kMinSecretBytes) {
    refuse(path, "holds " + std::to_string(secret.size()) + " bytes; a secret needs at least " +
                     std::to_string(kMinSecretBytes) +
                     " (create one with: head -c 64 /dev/urandom > FILE; chmod 600 FILE)");
  }
  return secret;
}

}  // namespace ucxb::udp
