#pragma once
// Layer 1: a cheap look at the monotonic clock, for the data path's
// deadline and gate checks.
//
// steady_clock::now() (CLOCK_MONOTONIC) reads the clocksource; on a VM with
// kvm-clock that costs about 90-115 ns, and the transport's spin-wait used
// to read it several times per round. CLOCK_MONOTONIC_COARSE returns the
// same clock as of the kernel's last tick, copied into the vDSO page: about
// 12 ns, no clocksource read. It is the same time base as steady_clock on
// Linux (libstdc++'s steady_clock is CLOCK_MONOTONIC), truncated to the
// tick: never ahead of steady_clock::now() and behind it by less than one
// tick (clock_getres reports it: 4 ms with CONFIG_HZ=250) while the kernel
// ticks, which it does whenever a CPU runs something - the caller's does
// (a tick the hypervisor delays delays the coarse clock by as much).
//
// So a coarse reading is good enough to decide whether a deadline *may*
// have passed (then read the precise clock: reached()), as the start of a
// deadline that may be up to one tick late but never early (now() + tick()),
// or as a rate limit for periodic checks. Where the kernel reports a tick
// coarser than kMaxTick (or none), now() is steady_clock::now() and tick()
// is zero, so every use stays exact.
//
// Thread-safe (no state besides the tick, computed once).

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
    if (tick() == Duration::zero()) return std::chrono::steady_clock::now();
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return TimePoint(std::chrono::duration_cast<Duration>(std::chrono::seconds(ts.tv_sec) +
                                                          std::chrono::nanoseconds(ts.tv_nsec)));
  }

  // The most now() can be behind steady_clock::now(); zero when now() is
  // steady_clock::now().
  static Duration tick() noexcept {
    static const Duration t = probe();
    return t;
  }

  // Exactly steady_clock::now() >= deadline, reading the precise clock only
  // within one tick of the deadline (coarse now + tick is past the precise
  // now, so while it is before the deadline, so is the precise one).
  static bool reached(TimePoint deadline) noexcept {
    const TimePoint coarse = now();
    if (coarse < deadline - tick()) return false;
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
    return t;
  }
};

// The end of a wait of `timeout` starting now (saturating; a negative
// timeout is a wait that has already ended), for CoarseClock::reached().
// Waits of at least kCoarseWaitMin start from the coarse clock (up to one
// tick late, never early: under 0.4 % of the wait with a 4 ms tick);
// shorter ones pay for a precise reading.
inline constexpr std::chrono::seconds kCoarseWaitMin{1};
inline std::chrono::steady_clock::time_point wait_deadline(std::chrono::milliseconds timeout) noexcept {
  if (timeout.count() <= 0) return std::chrono::steady_clock::now();
  // Clamped so the conversion to the clock's nanoseconds cannot overflow.
  constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365 * 100);
  const CoarseClock::Duration span = std::min(timeout, kForever);
  if (timeout >= kCoarseWaitMin) return CoarseClock::after(CoarseClock::now() + CoarseClock::tick(), span);
  return CoarseClock::after(std::chrono::steady_clock::now(), span);
}

}  // namespace regpool::platform
