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

std::vector<uint8_t> readSecretFile(const std::string& path) {
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY)};
  if (file.fd < 0) {
    refuse(path, std::string("cannot be read: ") + std::strerror(errno) +
                     " (create it with: head -c 64 /dev/urandom > FILE; chmod 600 FILE)");
  }
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) refuse(path, std::string("cannot be read: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse(path, "is not a regular file");
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    refuse(path, std::string("is accessible by group or others (mode ") + mode +
                     "): a secret must be readable by its owner only (chmod 600 FILE)");
  }
  std::vector<uint8_t> secret;
  uint8_t buffer[4096];
  for (;;) {
    const ssize_t n = ::read(file.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) refuse(path, std::string("cannot be read: ") + std::strerror(errno));
    if (n == 0) break;
    secret.insert(secret.end(), buffer, buffer + n);
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
