// The provider-independent idle-release rule (lib/transport/idle_release.hpp):
// uses are counted without the clock and dated by the next observe; the
// proposer needs the full idle time and nothing in flight, the granter half
// of it; 0 disables both.
#include <catch2/catch.hpp>

#include "transport/idle_release.hpp"

using namespace std::chrono_literals;
namespace idle = regpool::idle;

TEST_CASE("idle release: propose after the full time, grant after half, never when busy or off", "[unit]") {
  const auto t0 = idle::Clock::time_point{} + 1h;
  idle::IdleTimer t;
  t.restart(t0);
  const idle::Policy p{100ms};
  CHECK_FALSE(p.propose(t, false, t0 + 99ms));
  CHECK(p.propose(t, false, t0 + 100ms));
  CHECK_FALSE(p.propose(t, true, t0 + 100ms));
  CHECK_FALSE(p.grant(t, false, t0 + 49ms));
  CHECK(p.grant(t, false, t0 + 50ms));
  CHECK_FALSE(p.grant(t, true, t0 + 1s));

  const idle::Policy off{0ms};
  CHECK_FALSE(off.enabled());
  CHECK_FALSE(off.propose(t, false, t0 + 1h));
  CHECK_FALSE(off.grant(t, false, t0 + 1h));
}

TEST_CASE("idle release: a use counts from the observe that sees it", "[unit]") {
  const auto t0 = idle::Clock::time_point{} + 1h;
  idle::IdleTimer t;
  t.restart(t0);
  const idle::Policy p{100ms};
  t.touch();
  // Not yet observed: still idle since t0.
  CHECK(t.idle(t0 + 150ms) == 150ms);
  t.observe(t0 + 150ms);
  CHECK_FALSE(p.propose(t, false, t0 + 200ms));
  CHECK(p.propose(t, false, t0 + 250ms));
  // Observing without a new use changes nothing.
  t.observe(t0 + 240ms);
  CHECK(t.idle(t0 + 250ms) == 100ms);
  // A refused release starts the period again.
  t.restart(t0 + 250ms);
  CHECK_FALSE(p.propose(t, false, t0 + 300ms));
}
