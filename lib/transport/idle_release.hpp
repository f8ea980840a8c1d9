#pragma once
// Idle release of on-demand connections, independent of the provider.
//
// A backend that makes a connection per peer on first use (verbs: an RC
// queue pair) may give it back once neither side has used it for
// EndpointConfig::idle_release. One side cannot decide alone: the peer's
// one-sided operations (RDMA write/read/atomics into our exposures) reach
// our memory without our CPU seeing them, so only the peer knows whether it
// is still using the connection. Release is therefore proposed by the side
// that has been idle for the full time and granted by the other only when it
// has nothing in flight and has itself been idle for at least half that
// time (its last use is usually the receipt of the proposer's last message,
// a little later than the proposer's); a busy peer refuses and the proposer
// waits another full period before asking again.
//
// IdleTimer keeps the data path free of clock reads: posts and completions
// only count (touch); the backend's housekeeping, which reads the clock
// anyway, turns a changed count into "used now" (observe). So a use is seen
// at the latest one housekeeping round late, which only delays a release.
//
// Not thread-safe: a backend calls it under the endpoint's serialisation.

#include <chrono>
#include <cstdint>

namespace regpool::idle {

using Clock = std::chrono::steady_clock;

class IdleTimer {
 public:
  // A post or a completion on the connection (data path: no clock read).
  void touch() noexcept { ++uses_; }
  // Housekeeping: a use since the last look counts as a use at `now`.
  void observe(Clock::time_point now) noexcept {
    if (uses_ != seen_) {
      seen_ = uses_;
      last_use_ = now;
    }
  }
  // Counts as used at `now` (connection made, a release refused).
  void restart(Clock::time_point now) noexcept {
    seen_ = uses_;
    last_use_ = now;
  }
  Clock::duration idle(Clock::time_point now) const noexcept { return now - last_use_; }

 private:
  std::uint64_t uses_ = 0;
  std::uint64_t seen_ = 0;
  Clock::time_point last_use_{};
};

// `after` is EndpointConfig::idle_release (0 = never release).
struct Policy {
  std::chrono::milliseconds after{0};

  bool enabled() const noexcept { return after.count() > 0; }
  // Ask the peer to release: idle for the full time, nothing of ours in
  // flight (operations, window binds, exposures bound to the connection).
  bool propose(const IdleTimer& t, bool busy, Clock::time_point now) const noexcept {
    return enabled() && !busy && t.idle(now) >= after;
  }
  // Grant a peer's request: nothing in flight here and idle for half the
  // time. An endpoint with idle release off never grants.
  bool grant(const IdleTimer& t, bool busy, Clock::time_point now) const noexcept {
    return enabled() && !busy && t.idle(now) >= after / 2;
  }
};

}  // namespace regpool::idle
