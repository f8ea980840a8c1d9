#pragma once
// Futex waits and wakes on a 32-bit word. The first two are for a word that
// may live in memory shared between processes (the shm doorbell:
// transport/fabric_shm.hpp): the shared (not FUTEX_PRIVATE) operations,
// since the word is mapped by other processes at other addresses. The
// _private ones are for a word only this process maps (the endpoint's
// mutex), which the kernel finds without a shared-mapping lookup.

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

// Sleeps while *word == expected, until woken. Only for a lock word, whose
// holder lets go within its own call (Endpoint::Mutex): there the caller
// loops until it takes the lock, so a spurious return is harmless.
inline void futex_wait_private(std::atomic<std::uint32_t>& word, std::uint32_t expected) noexcept {
  (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr,
                  0);
}

// Wakes one thread sleeping on `word` (this process only).
inline void futex_wake_one_private(std::atomic<std::uint32_t>& word) noexcept {
  (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

}  // namespace regpool::platform
