// Yielding the core in a polling wait, and when to stop polling. Torch-free.
//
// The waits of this backend poll with sched_yield() between polls for `spin_us`, then sleep
// (docs/architecture.md#progress-and-sleeping). Next to a thread that polls too, or that
// blocks soon, a yield costs a microsecond or the other thread's short turn. Next to one that
// keeps the core (a compiler, a training step's compute thread, another job), it costs that
// thread's whole slice: on an EEVDF kernel (Linux 6.6 and later) the yielder goes behind it and
// gets the core back at the next tick that ends the slice, 4-6 ms at HZ=250 (measured on this
// project's host, 6.18: ten yields next to a spinning thread took 64 ms). A wait that polls
// for 250 us then loses milliseconds at every poll: a 16 MB all_reduce (dozens of waits) took
// a median of 205 ms on the loaded host, against 14-55 ms with waits that sleep at once
// (docs/performance.md#issue-23-stalls).
//
// So every polling wait yields through yieldCore(): a yield that kept this thread off its
// core for longer than kLostYield marks the process crowded for kCrowdedFor, and while it is
// crowded() waits sleep (the progress thread), block (Work.wait) or hand over (an inline
// caller) instead of polling. A sleeping thread is woken by the event it waits for, not by a
// tick. Process-wide: the crowding is the host's, not a group's.
#pragma once

#include <chrono>
#include <cstdint>

namespace ucxb {

// sched_yield(), timed: a yield that returned later than kLostYield marks the process
// crowded. Returns whether it did.
bool yieldCore();
// The same, timed from `before`, the caller's clock reading taken just before (the inline
// wait reads the clock once a pass, and two more readings per yield cost it about 0.4 us an
// 8-byte op): returns the clock after the yield.
std::chrono::steady_clock::time_point yieldCoreFrom(std::chrono::steady_clock::time_point before);

// Whether a yield lost the core within the last kCrowdedFor: polling waits should sleep.
bool crowded();

// A polling wait that sleeps instead of yielding: counted, with whether the sleep ended by
// its timeout rather than by an event (for wait_stats()).
void countSleep(bool timedOut);

// This process's counts since it started (any thread): yields, yields that lost the core
// (each starts or extends a crowded spell), yields begun while crowded() (none but a race:
// waits check it first), sleeps of the waits in ops and of the idle progress thread, and
// sleeps that ended by their timeout with no event.
struct WaitCounts {
  uint64_t yields = 0;
  uint64_t lostYields = 0;
  uint64_t yieldsWhenCrowded = 0;
  uint64_t sleeps = 0;
  uint64_t sleepTimeouts = 0;
};
WaitCounts waitCounts();

}  // namespace ucxb
