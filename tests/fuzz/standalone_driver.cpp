// A small fuzzing driver for LLVMFuzzerTestOneInput where libFuzzer is not available (g++ has
// no -fsanitize=fuzzer). Its flags follow libFuzzer's, so the same command lines work with
// either build:
//
//   udp_fuzz [-runs=N] [-max_total_time=S] [-seed=N] [-max_len=N] [-timeout=S]
//            [-artifact_prefix=DIR/] [-dump_seeds=DIR] [CORPUS_DIR...]
//   udp_fuzz FILE...          replays each file once (a crash reproduces)
//   udp_fuzz -merge=1 OUT_DIR IN_DIR...
//                             copies to OUT_DIR the inputs of the IN_DIRs that reach an
//                             edge that neither the seeds nor a smaller input reached
//
// It mutates a corpus that starts from the target's seeds (udp_fuzz_target.h) and every file
// in the CORPUS_DIRs: bit flips, byte sets, insertions, deletions, interesting values, copies
// within an input, splices of two inputs. When the code under test was compiled with
// -fsanitize-coverage=trace-pc (g++ and clang both have it), it is also coverage-guided:
// inputs that reach a new edge join the corpus and, as with libFuzzer, are written to the
// first CORPUS_DIR. An input that aborts, trips a sanitizer or times out is written to
// <artifact_prefix>crash-<hash> (timeout-<hash>) before the process dies, for replay. A fatal
// signal that another process sent (kill -ABRT, a supervisor's timeout) is no crash of the
// target: its input goes to killed-<hash>, and the sender's pid is printed. Replaying FILEs
// writes no artifact: the input is the file already, named on stderr.
//
// Single-threaded and deterministic for a given -seed (timeouts aside).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/udp_fuzz_target.h"

#if defined(__has_include)
#if __has_include(<sanitizer/common_interface_defs.h>)
#include <sanitizer/common_interface_defs.h>
#define UDP_FUZZ_HAVE_SANITIZER_HOOKS 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define UDP_FUZZ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UDP_FUZZ_ASAN 1
#endif
#endif

namespace {

// ---------------------------------------------------------------------------------------------
// Coverage: AFL-style edges (previous block, this block) hashed into a bitmap. Only the
// objects built with -fsanitize-coverage=trace-pc call in; this file must not be, or the
// callback would instrument itself.

constexpr size_t kMapSize = size_t{1} << 18;
uint8_t g_edges[kMapSize];
uintptr_t g_previous = 0;
size_t g_newEdges = 0;
size_t g_totalEdges = 0;

}  // namespace

// Called on every edge of the code under test: kept out of ASan's and UBSan's checks (the
// index is masked into the map), which would otherwise double its cost.
extern "C" __attribute__((no_sanitize("address", "undefined"))) void __sanitizer_cov_trace_pc() {
  const auto pc = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  uint64_t h = (pc ^ g_previous) * 0x9e3779b97f4a7c15ull;
  const size_t i = static_cast<size_t>(h >> 46) & (kMapSize - 1);
  g_previous = pc >> 1;
  if (!g_edges[i]) {
    g_edges[i] = 1;
    ++g_newEdges;
  }
}

namespace {

// ---------------------------------------------------------------------------------------------
// Crash capture: the input being run is kept here so that the death paths can write it out
// with nothing but async-signal-safe calls.

const uint8_t* g_input = nullptr;
size_t g_inputSize = 0;
const char* g_replaying = nullptr;  // the file being replayed, if any
char g_artifactPrefix[1024] = "./";
volatile sig_atomic_t g_saved = 0;

void writeAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w <= 0) return;
    b += w;
    n -= static_cast<size_t>(w);
  }
}

void say(const char* s) { writeAll(2, s, std::strlen(s)); }

void sayNumber(unsigned long long v) {
  char digits[24];
  size_t n = sizeof digits;
  digits[--n] = '\0';
  do {
    digits[--n] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  say(digits + n);
}

void saveCurrentInput(const char* kind) {
  if (g_saved || g_input == nullptr) return;
  g_saved = 1;
  if (g_replaying != nullptr) {
    // A copy of a file being replayed would only be a second name for it, written wherever
    // the replay happened to run (a test's replay of a planted crash left one in the repo).
    say("udp_fuzz: ");
    say(kind);
    say(" while replaying ");
    say(g_replaying);
    say(" (no artifact written)\n");
    return;
  }
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < g_inputSize; ++i) h = (h ^ g_input[i]) * 0x100000001b3ull;
  char path[1200];
  size_t n = 0;
  for (const char* p = g_artifactPrefix; *p && n < 1100; ++p) path[n++] = *p;
  for (const char* p = kind; *p; ++p) path[n++] = *p;
  path[n++] = '-';
  for (int shift = 60; shift >= 0; shift -= 4) path[n++] = "0123456789abcdef"[(h >> shift) & 15];
  path[n] = '\0';
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    say("udp_fuzz: could not write the crashing input to ");
    say(path);
    say("\n");
    return;
  }
  writeAll(fd, g_input, g_inputSize);
  ::close(fd);
  say("udp_fuzz: ");
  say(kind);
  say(" input written to ");
  say(path);
  say(" (replay: udp_fuzz ");
  say(path);
  say(")\n");
}

// Sent by another process (kill(), sigqueue(), tgkill()): si_code <= 0 marks a signal sent
// from user space, and abort() and raise() in this process send it with our own pid.
bool sentByAnother(const siginfo_t* info) {
  return info != nullptr && info->si_code <= 0 && info->si_pid != ::getpid();
}

void onFatalSignal(int sig, siginfo_t* info, void* /*context*/) {
  if (sentByAnother(info)) {
    say("udp_fuzz: signal ");
    sayNumber(static_cast<unsigned long long>(sig));
    say(" sent by pid ");
    sayNumber(static_cast<unsigned long long>(info->si_pid));
    say(": the process was killed, not crashed by its input\n");
    saveCurrentInput("killed");
  } else {
    saveCurrentInput(sig == SIGALRM ? "timeout" : "crash");
    if (sig == SIGALRM) say("udp_fuzz: an input ran past -timeout\n");
  }
  ::signal(sig == SIGALRM ? SIGABRT : sig, SIG_DFL);
  ::raise(sig == SIGALRM ? SIGABRT : sig);
}

void onSanitizerDeath() { saveCurrentInput("crash"); }

void installCrashHandlers() {
  struct sigaction sa {};
  sa.sa_sigaction = onFatalSignal;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGABRT, &sa, nullptr);
  ::sigaction(SIGALRM, &sa, nullptr);
#ifndef UDP_FUZZ_ASAN
  // Under ASan its own handlers report these (with a stack) and then call the death callback.
  ::sigaction(SIGSEGV, &sa, nullptr);
  ::sigaction(SIGBUS, &sa, nullptr);
  ::sigaction(SIGFPE, &sa, nullptr);
  ::sigaction(SIGILL, &sa, nullptr);
#endif
#ifdef UDP_FUZZ_HAVE_SANITIZER_HOOKS
  __sanitizer_set_death_callback(onSanitizerDeath);
#endif
}

// ---------------------------------------------------------------------------------------------

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t below(size_t bound) { return bound ? static_cast<size_t>(next() % bound) : 0; }

 private:
  uint64_t s_;
};

using Input = std::vector<uint8_t>;

uint64_t fnv1a(const Input& d) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t b : d) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

constexpr uint64_t kInteresting[] = {0,      1,          0x7f,       0x80,      0xff,
                                     0x100,  0x7fff,     0xffff,     0x10000,   0x7fffffff,
                                     0xffffffff, 1ull << 32, 1ull << 48, (1ull << 62) - 1,
                                     1ull << 63, ~0ull};

void mutateOnce(Input& d, const std::vector<Input>& corpus, Rng& rng) {
  switch (rng.below(10)) {
    case 0:  // flip a bit
      if (!d.empty()) d[rng.below(d.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
      break;
    case 1:  // set a byte
      if (!d.empty()) d[rng.below(d.size())] = static_cast<uint8_t>(rng.next());
      break;
    case 2: {  // add to a byte (lengths, counts and opcodes move by small steps)
      if (!d.empty()) d[rng.below(d.size())] += static_cast<uint8_t>(1 + rng.below(16) - 8);
      break;
    }
    case 3: {  // insert random bytes
      const size_t at = rng.below(d.size() + 1);
      const size_t n = 1 + rng.below(8);
      Input bytes(n);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng.next());
      d.insert(d.begin() + static_cast<std::ptrdiff_t>(at), bytes.begin(), bytes.end());
      break;
    }
    case 4: {  // delete a range
      if (d.empty()) break;
      const size_t at = rng.below(d.size());
      const size_t n = 1 + rng.below(std::min<size_t>(16, d.size() - at));
      d.erase(d.begin() + static_cast<std::ptrdiff_t>(at),
              d.begin() + static_cast<std::ptrdiff_t>(at + n));
      break;
    }
    case 5: {  // an interesting value, little-endian, 1 to 8 bytes wide
      const size_t width = size_t{1} << rng.below(4);
      if (d.size() < width) break;
      const size_t at = rng.below(d.size() - width + 1);
      const uint64_t v = kInteresting[rng.below(std::size(kInteresting))];
      for (size_t i = 0; i < width; ++i) d[at + i] = static_cast<uint8_t>(v >> (8 * i));
      break;
    }
    case 6: {  // copy a chunk within the input (repeats script operations)
      if (d.empty()) break;
      const size_t from = rng.below(d.size());
      const size_t n = 1 + rng.below(std::min<size_t>(64, d.size() - from));
      const Input chunk(d.begin() + static_cast<std::ptrdiff_t>(from),
                        d.begin() + static_cast<std::ptrdiff_t>(from + n));
      const size_t at = rng.below(d.size() + 1);
      d.insert(d.begin() + static_cast<std::ptrdiff_t>(at), chunk.begin(), chunk.end());
      break;
    }
    case 7: {  // splice: our head, another input's tail
      const Input& other = corpus[rng.below(corpus.size())];
      d.resize(rng.below(d.size() + 1));
      const size_t from = rng.below(other.size() + 1);
      d.insert(d.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
      break;
    }
    case 8: {  // insert a chunk of another input
      const Input& other = corpus[rng.below(corpus.size())];
      if (other.empty()) break;
      const size_t from = rng.below(other.size());
      const size_t n = 1 + rng.below(std::min<size_t>(64, other.size() - from));
      const size_t at = rng.below(d.size() + 1);
      d.insert(d.begin() + static_cast<std::ptrdiff_t>(at),
               other.begin() + static_cast<std::ptrdiff_t>(from),
               other.begin() + static_cast<std::ptrdiff_t>(from + n));
      break;
    }
    default:  // cut the tail
      d.resize(rng.below(d.size() + 1));
      break;
  }
}

struct Options {
  int64_t runs = -1;  // -1: no limit (libFuzzer's meaning)
  double maxTotalTime = 0;  // seconds, 0: no limit
  uint64_t seed = 0;
  bool seedGiven = false;
  size_t maxLen = 4096;
  unsigned timeout = 20;  // seconds per input
  std::string dumpSeeds;
  bool merge = false;
  std::vector<std::string> files;
  std::vector<std::string> dirs;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "udp_fuzz: %s\nusage: udp_fuzz [-runs=N] [-max_total_time=S] [-seed=N] "
               "[-max_len=N] [-timeout=S] [-artifact_prefix=DIR/] [-dump_seeds=DIR] "
               "[CORPUS_DIR...]\n       udp_fuzz FILE...\n"
               "       udp_fuzz -merge=1 OUT_DIR IN_DIR...\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&](std::string_view flag) -> const char* {
      return a.substr(0, flag.size()) == flag ? argv[i] + flag.size() : nullptr;
    };
    const auto number = [&](const char* v) {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(v, &end, 10);
      if (*v == '\0' || *end != '\0') usage("not a number: " + std::string(a));
      return static_cast<uint64_t>(n);
    };
    if (const char* v = value("-runs=")) {
      o.runs = std::string_view(v) == "-1" ? -1 : static_cast<int64_t>(number(v));
    } else if (const char* v = value("-max_total_time=")) {
      o.maxTotalTime = static_cast<double>(number(v));
    } else if (const char* v = value("-seed=")) {
      o.seed = number(v);
      o.seedGiven = true;
    } else if (const char* v = value("-max_len=")) {
      o.maxLen = number(v);
    } else if (const char* v = value("-timeout=")) {
      o.timeout = static_cast<unsigned>(number(v));
    } else if (const char* v = value("-artifact_prefix=")) {
      if (std::strlen(v) >= sizeof(g_artifactPrefix) - 64) usage("artifact prefix too long");
      std::strcpy(g_artifactPrefix, v);
    } else if (const char* v = value("-dump_seeds=")) {
      o.dumpSeeds = v;
    } else if (const char* v = value("-merge=")) {
      o.merge = number(v) != 0;
    } else if (!a.empty() && a[0] == '-') {
      usage("unknown flag " + std::string(a));
    } else if (std::filesystem::is_directory(std::string(a))) {
      o.dirs.emplace_back(a);
    } else {
      o.files.emplace_back(a);
    }
  }
  if (!o.dirs.empty() && !o.files.empty()) usage("give either files to replay or directories");
  if (o.merge && o.dirs.size() < 2) usage("-merge=1 needs an output and an input directory");
  return o;
}

Input readFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) usage("cannot read " + path);
  return Input((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Every regular file of `dir`, in name order, cut to maxLen.
std::vector<Input> readDir(const std::string& dir, size_t maxLen) {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<Input> inputs;
  for (const std::string& path : paths) {
    inputs.push_back(readFile(path));
    if (inputs.back().size() > maxLen) inputs.back().resize(maxLen);
  }
  return inputs;
}

// `dir`/<hash of the bytes>: libFuzzer, too, names corpus files by their content.
void writeToDir(const std::string& dir, const Input& d) {
  char name[32];
  std::snprintf(name, sizeof name, "/%016llx", static_cast<unsigned long long>(fnv1a(d)));
  std::ofstream f(dir + name, std::ios::binary);
  f.write(reinterpret_cast<const char*>(d.data()), static_cast<std::streamsize>(d.size()));
  if (!f) usage("cannot write to " + dir);
}

double cpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

void runOne(const Input& d, unsigned timeout) {
  // libFuzzer hands the target a buffer of exactly the input's size; so do we, so that ASan
  // sees a read past the end.
  std::unique_ptr<uint8_t[]> exact(new uint8_t[d.size() + (d.empty() ? 1 : 0)]);
  if (!d.empty()) std::memcpy(exact.get(), d.data(), d.size());
  g_input = exact.get();
  g_inputSize = d.size();
  if (timeout) ::alarm(timeout);
  LLVMFuzzerTestOneInput(exact.get(), d.size());
  if (timeout) ::alarm(0);
  g_input = nullptr;
}

int replay(const Options& o) {
  for (const std::string& path : o.files) {
    const Input d = readFile(path);
    std::printf("Running: %s (%zu bytes)\n", path.c_str(), d.size());
    std::fflush(stdout);
    g_replaying = path.c_str();
    runOne(d, o.timeout);
    g_replaying = nullptr;
    std::printf("Executed %s\n", path.c_str());
  }
  return 0;
}

int dumpSeeds(const Options& o) {
  ::mkdir(o.dumpSeeds.c_str(), 0755);
  const auto seeds = ucxb::udp::fuzz::seedInputs();
  for (size_t i = 0; i < seeds.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "/seed-%03zu", i);
    std::ofstream f(o.dumpSeeds + name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(seeds[i].data()),
            static_cast<std::streamsize>(seeds[i].size()));
    if (!f) usage("cannot write to " + o.dumpSeeds);
  }
  std::printf("udp_fuzz: wrote %zu seeds to %s\n", seeds.size(), o.dumpSeeds.c_str());
  return 0;
}

// Runs `d` and says whether it reached an edge that no earlier input reached.
bool execute(const Input& d, unsigned timeout) {
  g_newEdges = 0;
  g_previous = 0;
  runOne(d, timeout);
  g_totalEdges += g_newEdges;
  return g_newEdges > 0;
}

int merge(const Options& o) {
  for (const auto& s : ucxb::udp::fuzz::seedInputs()) execute(s, o.timeout);
  std::vector<Input> inputs;
  for (size_t i = 1; i < o.dirs.size(); ++i) {
    for (auto& d : readDir(o.dirs[i], o.maxLen)) inputs.push_back(std::move(d));
  }
  std::stable_sort(inputs.begin(), inputs.end(),
                   [](const Input& a, const Input& b) { return a.size() < b.size(); });
  size_t kept = 0;
  for (const Input& d : inputs) {
    if (execute(d, o.timeout)) {
      writeToDir(o.dirs[0], d);
      ++kept;
    }
  }
  std::printf("udp_fuzz: merge: kept %zu of %zu inputs in %s, edges %zu\n", kept, inputs.size(),
              o.dirs[0].c_str(), g_totalEdges);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  installCrashHandlers();
  if (!o.dumpSeeds.empty()) return dumpSeeds(o);
  if (!o.files.empty()) return replay(o);
  if (o.merge) return merge(o);

  const uint64_t seed = o.seedGiven
                            ? o.seed
                            : static_cast<uint64_t>(
                                  std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("udp_fuzz: seed %llu (rerun with -seed=%llu)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  Rng rng(seed);
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  std::vector<Input> corpus;
  uint64_t runs = 0;
  const auto run = [&](const Input& d) {
    ++runs;
    return execute(d, o.timeout);
  };
  for (auto& s : ucxb::udp::fuzz::seedInputs()) {
    if (s.size() > o.maxLen) s.resize(o.maxLen);
    run(s);
    corpus.push_back(std::move(s));
  }
  for (const std::string& dir : o.dirs) {
    for (auto& d : readDir(dir, o.maxLen)) {
      run(d);
      corpus.push_back(std::move(d));
    }
  }
  std::printf("#%llu\tINITED cov: %zu corp: %zu\n", static_cast<unsigned long long>(runs),
              g_totalEdges, corpus.size());
  std::fflush(stdout);

  uint64_t nextReport = 1024;
  Input d;
  const auto more = [&] {
    return (o.runs < 0 || runs < static_cast<uint64_t>(o.runs)) &&
           (o.maxTotalTime == 0 || elapsed() < o.maxTotalTime);
  };
  while (more()) {
    d = corpus[rng.below(corpus.size())];
    for (size_t k = 1 + rng.below(4); k > 0; --k) mutateOnce(d, corpus, rng);
    if (d.size() > o.maxLen) d.resize(o.maxLen);
    if (run(d)) {
      corpus.push_back(d);
      if (!o.dirs.empty()) writeToDir(o.dirs[0], d);
      std::printf("#%llu\tNEW cov: %zu corp: %zu len: %zu\n",
                  static_cast<unsigned long long>(runs), g_totalEdges, corpus.size(), d.size());
    }
    if (runs >= nextReport) {
      nextReport *= 2;
      std::printf("#%llu\tpulse cov: %zu corp: %zu exec/s: %.0f\n",
                  static_cast<unsigned long long>(runs), g_totalEdges, corpus.size(),
                  static_cast<double>(runs) / elapsed());
      std::fflush(stdout);
    }
  }
  const double seconds = elapsed();
  std::printf(
      "udp_fuzz: done: %llu runs in %.1f s (%.0f exec/s), seed %llu, corpus %zu, edges %zu, "
      "cpu %.1f s\n",
      static_cast<unsigned long long>(runs), seconds,
      seconds > 0 ? static_cast<double>(runs) / seconds : 0.0,
      static_cast<unsigned long long>(seed), corpus.size(), g_totalEdges, cpuSeconds());
  return 0;
}
