#pragma once
// Statistics counters written by one thread at a time (under the owner's
// mutex) and read by any thread (relaxed): bumped with a load and a store
// instead of a locked read-modify-write. On x86 even a relaxed fetch_add
// is a locked instruction, which also waits for every earlier store to
// leave the store buffer; on the path of every message that cost a few
// nanoseconds per counter (bench/RESULTS.md, "counters without locked
// instructions").

#include <atomic>
#include <cstdint>

namespace regpool::platform {

inline void bump_locked(std::atomic<std::uint64_t>& counter) noexcept {
  counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

}  // namespace regpool::platform
