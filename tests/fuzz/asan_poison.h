// ASAN_(UN)POISON_MEMORY_REGION where AddressSanitizer is there, no-ops where it is not, so the
// fuzz targets can fence their buffers in every build; and UDP_FUZZ_NO_COVERAGE, which keeps
// a function out of the coverage feedback.
#pragma once

#if defined(__has_include)
#if __has_include(<sanitizer/asan_interface.h>)
#include <sanitizer/asan_interface.h>
#endif
#endif
#ifndef ASAN_POISON_MEMORY_REGION
#define ASAN_POISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif

// For the harness's byte loops (patterns, hashes): an edge of theirs says nothing about the
// code under test, and a coverage callback on every byte would take a fifth of the run.
#if defined(__clang__)
#define UDP_FUZZ_NO_COVERAGE __attribute__((no_sanitize("coverage")))
#elif defined(__GNUC__) && __GNUC__ >= 12
#define UDP_FUZZ_NO_COVERAGE __attribute__((no_sanitize_coverage))
#else
#define UDP_FUZZ_NO_COVERAGE
#endif
