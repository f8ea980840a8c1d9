#pragma once
// Futex waits and wakes on a 32-bit word. The first two are for a word that
// may live in memory shared between processes (the shm doorbell:
// transport/fabric_shm.hpp): the shared (not FUTEX_PRIVATE) operations,
// since the word is mapped by other processes at other addresses. The
// _private ones are for a word only this process maps (the futex mutex
// below, the endpoint's and the Messenger's), which the kernel finds
// without a shared-mapping lookup.

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

// A process-private mutex in one futex word, in the classic three-state
// protocol (U. Drepper, "Futexes Are Tricky", mutex 2): 0 free, 1 held, 2
// held with possible sleepers. Taking it free is one compare-exchange,
// giving it back one exchange and, only when someone may sleep on it, a
// FUTEX_WAKE. Acquire on every taking, release on the giving back, so what
// one holder wrote is seen by the next (and by ThreadSanitizer, which
// follows the atomics). No fairness: callers that need it build it on top
// (Endpoint::lock_fair). pthread's lock and unlock run about 60
// instructions per round, out of line; these, a few, inline.
// The word is the caller's, so a type in a public header (Endpoint::Mutex)
// can hold it without including this one.
inline bool futex_mutex_try_lock(std::atomic<std::uint32_t>& word) noexcept {
  std::uint32_t expected = 0;
  return word.compare_exchange_strong(expected, 1, std::memory_order_acquire, std::memory_order_relaxed);
}

[[gnu::cold, gnu::noinline]] inline void futex_mutex_lock_contended(std::atomic<std::uint32_t>& word) noexcept {
  // Mark it contended (2) and sleep until it was free when we marked it.
  // Marking 2 when we may be the only waiter costs the next unlock one
  // spurious wake at most.
  while (word.exchange(2, std::memory_order_acquire) != 0) futex_wait_private(word, 2);
}

inline void futex_mutex_lock(std::atomic<std::uint32_t>& word) noexcept {
  if (!futex_mutex_try_lock(word)) futex_mutex_lock_contended(word);
}

[[gnu::cold, gnu::noinline]] inline void futex_mutex_wake(std::atomic<std::uint32_t>& word) noexcept {
  futex_wake_one_private(word);
}

inline void futex_mutex_unlock(std::atomic<std::uint32_t>& word) noexcept {
  if (word.exchange(0, std::memory_order_release) == 2) futex_mutex_wake(word);
}

// The same as a BasicLockable type for code inside the library
// (std::unique_lock<FutexMutex>). A sleeper only waits for a holder, so a
// holder must never wait for the network or for another thread's progress.
class FutexMutex {
 public:
  bool try_lock() noexcept { return futex_mutex_try_lock(state_); }
  void lock() noexcept { futex_mutex_lock(state_); }
  void unlock() noexcept { futex_mutex_unlock(state_); }

 private:
  std::atomic<std::uint32_t> state_{0};
};

}  // namespace regpool::platform
