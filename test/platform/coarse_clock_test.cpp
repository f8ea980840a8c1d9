// platform::CoarseClock (lib/platform/coarse_clock.hpp): the bounds the
// data path's deadlines rely on (docs/progress.md, "Deadlines and the
// clock"): the coarse clock is never ahead of steady_clock and lags it by
// at most max_lag(); waits started from it never end early; a busy loop
// skips a clock reading on at most every other poll (clock_read_due).

#include <time.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "platform/coarse_clock.hpp"

using regpool::platform::CoarseClock;
using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

TEST_CASE("the coarse clock is never ahead of steady_clock and lags it by at most max_lag()", "[unit]") {
  if (CoarseClock::max_lag() == CoarseClock::Duration::zero()) {
    // No usable coarse clock: now() is steady_clock::now() (checked below).
    const auto before = SteadyClock::now();
    CHECK(CoarseClock::now() >= before);
    return;
  }
  timespec res{};
  REQUIRE(::clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0);
  const auto resolution = std::chrono::seconds(res.tv_sec) + std::chrono::nanoseconds(res.tv_nsec);
  CHECK(CoarseClock::max_lag() >= 2 * resolution);

  // Each coarse reading between two precise ones: it cannot be later than
  // the second (never ahead), and the first minus it is at most its lag (a
  // preemption between the reads only makes that smaller). Spinning and
  // after short sleeps (an idle CPU may stop ticking), over several ticks.
  CoarseClock::Duration worst{};
  std::uint64_t ahead = 0, samples = 0;
  const auto sample = [&] {
    const auto p1 = SteadyClock::now();
    const auto c = CoarseClock::now();
    const auto p2 = SteadyClock::now();
    if (c > p2) ++ahead;
    worst = std::max(worst, p1 - c);
    ++samples;
  };
  const auto spin_until = SteadyClock::now() + 10 * resolution;
  while (SteadyClock::now() < spin_until) sample();
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(700 + 130 * i));
    sample();
  }
  const auto us = [](CoarseClock::Duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  INFO("largest lag " << us(worst) << " us over " << samples << " samples; bound " << us(CoarseClock::max_lag())
                      << " us");
  CHECK(ahead == 0);
  CHECK(worst <= CoarseClock::max_lag());
}

TEST_CASE("waits of a second or more started from the coarse clock never end early", "[unit]") {
  for (int i = 0; i < 200; ++i) {
    const auto before = SteadyClock::now();
    const auto end = regpool::platform::wait_deadline(1s);
    CHECK(end >= before + 1s);
    std::this_thread::sleep_for(std::chrono::microseconds(50 * (i % 20)));
  }
  // Short waits start from the precise clock.
  const auto before = SteadyClock::now();
  CHECK(regpool::platform::wait_deadline(10ms) >= before + 10ms);
  CHECK(regpool::platform::wait_deadline(0ms) >= before);
}

TEST_CASE("reached() is exactly steady_clock's answer", "[unit]") {
  const auto soon = SteadyClock::now() + 30ms;
  CHECK_FALSE(CoarseClock::reached(soon + 1h));
  while (!CoarseClock::reached(soon)) {
  }
  CHECK(SteadyClock::now() >= soon);
  CHECK(CoarseClock::after(CoarseClock::TimePoint::max() - 1s, 2s) == CoarseClock::TimePoint::max());
}

TEST_CASE("a busy loop reads the clock on at least every other poll", "[unit]") {
  using regpool::platform::clock_read_due;
  bool skipped = false;
  // Idle polls always read.
  for (int i = 0; i < 3; ++i) {
    CHECK(clock_read_due(false, skipped));
    CHECK_FALSE(skipped);
  }
  // Polls that keep finding work alternate: skip, read, skip, read.
  std::vector<bool> reads;
  for (int i = 0; i < 6; ++i) reads.push_back(clock_read_due(true, skipped));
  CHECK(reads == std::vector<bool>{false, true, false, true, false, true});
  // An idle poll after a skipped one reads, and the next busy poll may skip
  // again.
  CHECK_FALSE(clock_read_due(true, skipped));
  CHECK(clock_read_due(false, skipped));
  CHECK_FALSE(clock_read_due(true, skipped));
}
