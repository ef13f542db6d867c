// The coverage callback of objects built with -fsanitize-coverage=trace-pc (cpp_build.COVERAGE),
// as a no-op, for a program that shares those objects with the fuzzer but is not the fuzzer
// (whose driver, tests/fuzz/standalone_driver.cpp, defines the real one).
extern "C" void __sanitizer_cov_trace_pc() {}
