// The one check header of the C++ tests: counted checks that print where they failed, and a
// main() that runs named groups of them. No framework, so a test compiles in seconds with g++.
//
//   CHECK(cond)             counts a check; on failure prints the expression, file and line
//   CHECK_MSG(cond, msg)    the same with a message built at run time (a std::string)
//   CHECK_EQ(a, b)          a == b, printing both values when they differ
//   CHECK_THROWS(expr, T, part)  expr throws a T whose what() contains `part`
//
// A test program defines its groups and hands them to runGroups from main():
//
//   const ucxb::check::Group kGroups[] = {{"basic", testBasic, true}, {"slow", testSlow, false}};
//   int main(int argc, char** argv) { return ucxb::check::runGroups("my_test", kGroups, argc, argv); }
//
//   my_test               every group marked as default
//   my_test NAME...       the named groups
//   my_test --list        the names, one a line
//
// It exits 0 when every check passed, 1 when one failed, 2 on a bad argument; a group that
// throws counts as a failed check. The last line is "<program>: N checks, M failed, ...".
#pragma once

#include <chrono>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace ucxb::check {

struct State {
  int checks = 0;
  int failures = 0;
  std::string group;
};

inline State& state() {
  static State s;
  return s;
}

// Printed failures stop at this many, so a broken loop does not flood the log.
inline constexpr int kMaxPrinted = 60;

inline void report(bool ok, const std::string& what, const char* file, int line) {
  State& s = state();
  ++s.checks;
  if (ok) return;
  ++s.failures;
  if (s.failures <= kMaxPrinted) {
    std::fprintf(stderr, "FAIL [%s] %s:%d: %s\n", s.group.c_str(), file, line, what.c_str());
  }
}

template <typename T>
std::string show(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_enum_v<T>) {
    return std::to_string(static_cast<long long>(v));
  } else if constexpr (std::is_arithmetic_v<T>) {
    return std::to_string(v);
  } else if constexpr (std::is_convertible_v<T, std::string>) {
    return std::string(v);
  } else {
    return "?";
  }
}

template <typename A, typename B>
void checkEq(const A& a, const B& b, const char* ea, const char* eb, const char* file, int line) {
  const bool ok = a == b;
  std::string what = std::string(ea) + " == " + eb;
  if (!ok) what += "  (" + show(a) + " vs " + show(b) + ")";
  report(ok, what, file, line);
}

// The what() of the exception of type E that `f` throws; "" when it throws none. Any other
// exception propagates (and fails the group).
template <typename E = std::exception, typename F>
std::string thrownMessage(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

inline double wallMs(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since)
      .count();
}

struct Group {
  const char* name;
  void (*run)();
  bool inDefault;  // run when no group is named on the command line
};

inline int runGroups(const char* program, std::span<const Group> groups, int argc, char** argv) {
  std::vector<const Group*> selected;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--list") {
      for (const auto& g : groups) std::printf("%s\n", g.name);
      return 0;
    }
    const Group* found = nullptr;
    for (const auto& g : groups) {
      if (arg == g.name) found = &g;
    }
    if (found == nullptr) {
      std::fprintf(stderr, "%s: unknown group '%s' (--list shows them)\n", program, arg.c_str());
      return 2;
    }
    selected.push_back(found);
  }
  if (selected.empty()) {
    for (const auto& g : groups) {
      if (g.inDefault) selected.push_back(&g);
    }
  }
  State& s = state();
  const auto start = std::chrono::steady_clock::now();
  for (const Group* g : selected) {
    s.group = g->name;
    const int failuresBefore = s.failures;
    const int checksBefore = s.checks;
    const auto t0 = std::chrono::steady_clock::now();
    std::printf("[%s]\n", g->name);
    std::fflush(stdout);
    try {
      g->run();
    } catch (const std::exception& e) {
      report(false, std::string("uncaught exception: ") + e.what(), __FILE__, __LINE__);
    }
    std::printf("[%s] %s: %d checks, %d failed, %.0f ms\n", g->name,
                s.failures == failuresBefore ? "ok" : "FAILED", s.checks - checksBefore,
                s.failures - failuresBefore, wallMs(t0));
    std::fflush(stdout);
  }
  std::printf("%s: %d checks, %d failed, %zu groups, %.0f ms\n", program, s.checks, s.failures,
              selected.size(), wallMs(start));
  return s.failures == 0 ? 0 : 1;
}

}  // namespace ucxb::check

#define CHECK(cond) ::ucxb::check::report(static_cast<bool>(cond), #cond, __FILE__, __LINE__)
#define CHECK_MSG(cond, msg)                                                                    \
  ::ucxb::check::report(static_cast<bool>(cond), std::string(#cond) + "  -- " + (msg), __FILE__, \
                        __LINE__)
#define CHECK_EQ(a, b) ::ucxb::check::checkEq((a), (b), #a, #b, __FILE__, __LINE__)
#define CHECK_THROWS(expr, E, part)                                                          \
  do {                                                                                       \
    const std::string thrown_ = ::ucxb::check::thrownMessage<E>([&] { (void)(expr); });      \
    ::ucxb::check::report(!thrown_.empty() && ::ucxb::check::contains(thrown_, part),        \
                          std::string(#expr " throws " #E " containing '") + (part) +        \
                              "', got '" + thrown_ + "'",                                    \
                          __FILE__, __LINE__);                                               \
  } while (0)
