#pragma once
// Futex waits and wakes on a 32-bit word that may live in memory shared
// between processes (the shm doorbell: transport/fabric_shm.hpp). The
// shared (not FUTEX_PRIVATE) operations, since the word is mapped by other
// processes at other addresses.

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <ctime>

namespace regpool::platform {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                  std::atomic<std::uint32_t>::is_always_lock_free,
              "a futex word must be a plain lock-free 32-bit word");

// Sleeps while *word == expected, for at most `bound`; returns true when
// it ended because the word changed or someone woke it (not by the bound
// or a signal).
inline bool futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                       std::chrono::microseconds bound) noexcept {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(bound.count() / 1000000);
  ts.tv_nsec = static_cast<long>((bound.count() % 1000000) * 1000);
  const long rc = ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
  if (rc == 0) return true;
  // EAGAIN: the word had changed before we slept.
  return errno == EAGAIN;
}

// Wakes every thread sleeping on `word` (in any process).
inline void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
  (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace regpool::platform
