// Prints, for each argument taken as a UCX_TLS value, "1" when it leaves UCX's shared-memory
// transports in (transports/ucx/shared_memory_tls.h) and "0" when not, one a line: the rule
// the ucx transport answers Transport::permitsSharedMemory with. With --lacks-sysv first, each
// later argument is a comma-separated list of the transports a context opened ("" none), and
// the answer is lacksSysv's. tests/test_shared_memory.py holds the tables of values and answers.
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "transports/ucx/shared_memory_tls.h"

int main(int argc, char** argv) {
  const bool sysv = argc > 1 && std::strcmp(argv[1], "--lacks-sysv") == 0;
  for (int i = sysv ? 2 : 1; i < argc; ++i) {
    bool answer = false;
    if (sysv) {
      std::vector<std::string> opened;
      std::istringstream list(argv[i]);
      for (std::string name; std::getline(list, name, ',');) opened.push_back(name);
      answer = ucxb::ucx::lacksSysv(opened);
    } else {
      answer = ucxb::ucx::tlsIncludesSharedMemory(argv[i]);
    }
    std::printf("%d\n", answer ? 1 : 0);
  }
  return 0;
}
