#pragma once
// A cheap timestamp for timing copies of microseconds (shm rings' choice
// of path per peer: transport/shm_rings.hpp, "costs") and for
// regpool-perf's latency samples, which it converts with the rate it
// measures against steady_clock. Only differences
// between two readings, and ratios of such differences taken on the same
// machine, mean anything: the unit is the CPU's (x86's invariant TSC,
// the same on every core and in every process; AArch64's virtual counter)
// or nanoseconds elsewhere. A clock_gettime through the vDSO costs about
// 20 ns here; rdtsc a few.

#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace regpool::platform {

[[gnu::always_inline]] inline std::uint64_t ticks() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#elif defined(__aarch64__)
  std::uint64_t v = 0;
  asm volatile("mrs %0, cntvct_el0" : "=r"(v));
  return v;
#else
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
#endif
}

}  // namespace regpool::platform
