// Prints, for each argument taken as a UCX_TLS value, "1" when it leaves UCX's shared-memory
// transports in (transports/ucx/shared_memory_tls.h) and "0" when not, one a line: the rule
// the ucx transport answers Transport::permitsSharedMemory with. tests/test_shared_memory.py
// holds the table of values and answers.
#include <cstdio>

#include "transports/ucx/shared_memory_tls.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::printf("%d\n", ucxb::ucx::tlsIncludesSharedMemory(argv[i]) ? 1 : 0);
  }
  return 0;
}
