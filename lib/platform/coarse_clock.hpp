#pragma once
// Layer 1: a cheap look at the monotonic clock, for the data path's
// deadline and gate checks.
//
// steady_clock::now() (CLOCK_MONOTONIC) reads the clocksource; on a VM with
// kvm-clock that costs about 90-115 ns, and the transport's spin-wait used
// to read it several times per round. CLOCK_MONOTONIC_COARSE returns the
// same clock as of the kernel's last timekeeping update, copied into the
// vDSO page: about 12 ns, no clocksource read. It is the same time base as
// steady_clock on Linux (libstdc++'s steady_clock is CLOCK_MONOTONIC) and
// never ahead of it, but behind it by more than its resolution
// (clock_getres: 4 ms with CONFIG_HZ=250): measured on a VM
// (docs/progress.md), a reading taken between two precise ones lagged the
// first by 3.3 to 7.3 ms, idle and with every CPU busy. The bound used here,
// max_lag(), is three resolutions: that plus margin for a late tick. It
// holds while the kernel ticks, which it does whenever a CPU runs something
// (the caller's does); a tick the hypervisor delays by more than the margin
// delays the coarse clock past it.
//
// So a coarse reading is good enough to decide whether a deadline *may*
// have passed (then read the precise clock: reached()), as the start of a
// deadline that may be up to max_lag() late but never early (now() +
// max_lag()), or as a rate limit for periodic checks. Where the kernel
// reports a resolution coarser than kMaxTick (or none), now() is
// steady_clock::now() and max_lag() is zero, so every use stays exact.
//
// Thread-safe (no state besides the bound, computed once).

#include <time.h>

#include <algorithm>
#include <chrono>

namespace regpool::platform {

class CoarseClock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;
  // A coarser clock would make the gated checks too late to be useful.
  static constexpr Duration kMaxTick = std::chrono::milliseconds(10);

  static TimePoint now() noexcept {
    if (max_lag() == Duration::zero()) return std::chrono::steady_clock::now();
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return TimePoint(std::chrono::duration_cast<Duration>(std::chrono::seconds(ts.tv_sec) +
                                                          std::chrono::nanoseconds(ts.tv_nsec)));
  }

  // The most now() can be behind steady_clock::now(): three times the
  // coarse clock's resolution (see the top of this file); zero when now()
  // is steady_clock::now().
  static Duration max_lag() noexcept {
    static const Duration t = probe();
    return t;
  }

  // Exactly steady_clock::now() >= deadline, reading the precise clock only
  // within max_lag() of the deadline (coarse now + max_lag is past the
  // precise now, so while it is before the deadline, so is the precise one).
  static bool reached(TimePoint deadline) noexcept {
    const TimePoint coarse = now();
    if (coarse < deadline - max_lag()) return false;
    return std::chrono::steady_clock::now() >= deadline;
  }

  // `from + d`, saturating at TimePoint::max() (d >= 0).
  static TimePoint after(TimePoint from, Duration d) noexcept {
    if (from > TimePoint::max() - d) return TimePoint::max();
    return from + d;
  }

 private:
  static Duration probe() noexcept {
    timespec res{};
    if (::clock_getres(CLOCK_MONOTONIC_COARSE, &res) != 0) return Duration::zero();
    const auto t = std::chrono::duration_cast<Duration>(std::chrono::seconds(res.tv_sec) +
                                                        std::chrono::nanoseconds(res.tv_nsec));
    if (t <= Duration::zero() || t > kMaxTick) return Duration::zero();
    // One resolution is not enough: measured, the coarse clock lagged by
    // up to 1.83 of it (the top of this file); the third is margin.
    return 3 * t;
  }
};

// The end of a wait of `timeout` starting now (saturating; a negative
// timeout is a wait that has already ended), for CoarseClock::reached().
// Waits of at least kCoarseWaitMin start from the coarse clock (up to
// max_lag() late, never early: under 1.2 % of the wait with a 4 ms
// resolution); shorter ones pay for a precise reading.
inline constexpr std::chrono::seconds kCoarseWaitMin{1};
inline std::chrono::steady_clock::time_point wait_deadline(std::chrono::milliseconds timeout) noexcept {
  if (timeout.count() <= 0) return std::chrono::steady_clock::now();
  // Clamped so the conversion to the clock's nanoseconds cannot overflow.
  constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365 * 100);
  const CoarseClock::Duration span = std::min(timeout, kForever);
  if (timeout >= kCoarseWaitMin) return CoarseClock::after(CoarseClock::now() + CoarseClock::max_lag(), span);
  return CoarseClock::after(std::chrono::steady_clock::now(), span);
}

// Whether a periodic check (a deadline scan, a peer check) should read the
// clock on this poll of a busy loop. A poll that found work skips the
// reading when the poll before it read: that poll is the one a message's
// latency runs through, and a coarse reading costs 11-20 ns on an AMD EPYC
// guest. So the check runs at most one poll later than it would have, and
// a loop that keeps finding work still reads on every other poll.
// `skipped_last` is the caller's memory of the last decision; the flag
// lives in the caller because the callers are members of public classes.
[[nodiscard]] inline bool clock_read_due(bool found_work, bool& skipped_last) noexcept {
  skipped_last = found_work && !skipped_last;
  return !skipped_last;
}

}  // namespace regpool::platform
