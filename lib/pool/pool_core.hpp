#pragma once
// Layer 4 internals: the pool behind the Pool handle.
//
// Locking (always acquired in this order, never the reverse):
//   registry_->mutex  (thread-cache registration, thread exit, close)
//   central_[c].mutex (ascending c when several are held)
//   mutex_            (arenas, spans, large objects)
//   arenas_rw_        (arena list for address lookups; held briefly)
// The fast path (thread cache hit) takes no lock at all.

#include <array>
#include <atomic>
#include <boost/intrusive/list.hpp>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "pool/arena.hpp"
#include "pool/control_block.hpp"
#include "pool/size_classes.hpp"
#include "regpool/pool.hpp"

namespace regpool::detail {

// A counter written by one thread and read by others: a relaxed load+store
// instead of a locked add keeps the fast path free of atomic RMWs.
struct OwnerCounter {
  std::atomic<std::uint64_t> v{0};
  void add(std::uint64_t n) noexcept { v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  std::uint64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
};

struct Counters {
  std::array<OwnerCounter, kNumSizeClasses> allocs;
  std::array<OwnerCounter, kNumSizeClasses> frees;
  OwnerCounter large_allocs, large_frees, large_bytes_alloc, large_bytes_free;
};

class PoolCore;

// Recently freed large spans kept per thread, so a message loop that
// allocates and drops the same large size never touches the pool lock.
inline constexpr std::size_t kSpanCacheEntries = 4;
inline constexpr std::uint64_t kSpanCacheMaxObject = std::uint64_t{16} << 20;

struct ThreadCache {
  struct Bin {
    FreeList list;
    std::uint32_t limit = 0;
  };
  PoolCore* core = nullptr;
  std::array<Bin, kNumSizeClasses> bins;
  std::array<ControlBlock*, kSpanCacheEntries> spans{};
  Counters counters;
  bi::list_member_hook<> registry_hook;
};

using CacheList = bi::list<ThreadCache, bi::member_hook<ThreadCache, bi::list_member_hook<>, &ThreadCache::registry_hook>>;

// Shared by a pool and the threads that cache its objects, so that a thread
// exiting and a pool closing can meet safely whichever goes first.
struct CacheRegistry {
  std::mutex mutex;
  PoolCore* core = nullptr;  // nullptr once the pool has closed
  CacheList caches;
};

// The fast path reads only this: trivially destructible (no TLS guard or
// wrapper call) and initial-exec (no __tls_get_addr), which together halve
// the cost of a cache hit. initial-exec is what malloc replacements use too;
// it needs the library loaded at startup or into glibc's static TLS surplus,
// which a few dozen bytes always fit.
struct TlsFast {
  std::uint64_t last_id = 0;
  ThreadCache* last = nullptr;
  bool dead = false;  // set during thread exit, after the directory is gone
};
extern constinit thread_local TlsFast tls_fast [[gnu::tls_model("initial-exec")]];

class PoolCore {
 public:
  PoolCore(std::vector<std::shared_ptr<Domain>> domains, PoolConfig config);  // throws Error
  ~PoolCore();

  Result<ControlBlock*> allocate(const LdoShape& shape) noexcept;
  void free(ControlBlock* cb) noexcept;

  // Fast paths, inline so a cache hit is a handful of instructions with no
  // lock and no atomic RMW. They decline (nullptr / false) whenever anything
  // needs the slow path: empty or full bin, large object, closing pool.
  ControlBlock* allocate_cached(std::size_t cls) noexcept {
    ThreadCache* tc = thread_cache();
    if (!tc) return nullptr;
    auto& bin = tc->bins[cls];
    if (bin.list.empty()) return nullptr;
    ControlBlock& cb = bin.list.front();
    bin.list.pop_front();
    tc->counters.allocs[cls].add(1);
    return &cb;
  }
  bool free_cached(ControlBlock* cb) noexcept {
    if (cb->kind != BlockKind::slab_slot || detached_.load(std::memory_order_acquire)) return false;
    ThreadCache* tc = thread_cache();
    if (!tc) return false;
    auto& bin = tc->bins[cb->size_class];
    if (bin.list.size() >= bin.limit) return false;
    bin.list.push_front(*cb);
    tc->counters.frees[cb->size_class].add(1);
    return true;
  }
  std::size_t trim() noexcept;
  PoolStats stats() const;
  // Called by Pool's destructor; deletes the core now or when the last
  // live object drops.
  void close() noexcept;

  const PoolConfig& config() const noexcept { return config_; }
  std::span<const std::shared_ptr<Domain>> domains() const noexcept { return domains_; }
  std::uint64_t id() const noexcept { return id_; }
  // Index of `d` among the served domains, or -1.
  int domain_index(const Domain* d) const noexcept {
    for (std::size_t i = 0; i < domains_.size(); ++i)
      if (domains_[i].get() == d) return static_cast<int>(i);
    return -1;
  }
  // Control block of the object whose wire header is at `base`, or nullptr.
  ControlBlock* block_at(const void* base) const noexcept;

  // Thread exit: move a cache's objects back and fold its counters in.
  void retire_cache(ThreadCache* tc) noexcept;

 private:
  struct alignas(64) Central {
    std::mutex mutex;
    FreeList list;
  };

  ThreadCache* thread_cache() noexcept {
    TlsFast& f = tls_fast;
    if (f.last_id == id_) return f.last;  // ids are never reused, so never stale
    return thread_cache_slow();
  }
  [[gnu::noinline]] ThreadCache* thread_cache_slow() noexcept;
  Result<ControlBlock*> allocate_small(std::size_t cls) noexcept;
  Result<ControlBlock*> allocate_large(std::uint64_t bytes) noexcept;
  // Central list refill for class c: carve a slab. Caller holds central_[c].
  Status carve_slab(std::size_t cls) noexcept;
  void push_central(std::size_t cls, FreeList& from, std::uint32_t count) noexcept;  // locks central
  void push_central_locked(std::size_t cls, ControlBlock* cb) noexcept;
  void pop_central_locked(std::size_t cls, ControlBlock* cb) noexcept;
  void free_large_locked(ControlBlock* cb) noexcept;  // caller holds mutex_
  void maybe_release_slab_locked(std::size_t cls, ControlBlock* any_slot) noexcept;  // holds central_[cls]
  // Maps and registers new arenas; caller holds mutex_. With `error` set,
  // a registration failure's exception is stored there (constructor path).
  Status grow_locked(std::uint64_t min_bytes, bool dedicated, std::exception_ptr* error = nullptr) noexcept;
  void free_span_locked(Arena* arena, std::uint32_t first) noexcept;  // caller holds mutex_
  void free_detached(ControlBlock* cb) noexcept;
  void release_idle_arenas_locked(std::size_t keep) noexcept;  // caller holds mutex_
  void flush_cache(ThreadCache* tc) noexcept;
  std::uint64_t live_objects() const noexcept;
  // PoolStats' arena occupancy and fragmentation fields (see pool.hpp).
  void occupancy_stats(PoolStats& s) const;

  const std::uint64_t id_;
  PoolConfig config_;
  std::vector<std::shared_ptr<Domain>> domains_;

  // mutable: stats() locks them to read slab occupancy.
  mutable std::array<Central, kNumSizeClasses> central_;

  mutable std::mutex mutex_;
  std::vector<Arena*> arenas_;  // guarded by mutex_ (writes also by arenas_rw_)
  mutable std::shared_mutex arenas_rw_;
  std::uint64_t bytes_mapped_ = 0;
  std::uint64_t arenas_created_ = 0;
  std::uint64_t arenas_released_ = 0;
  std::uint64_t registrations_ = 0;
  std::uint64_t deregistrations_ = 0;
  std::uint64_t register_ns_ = 0;

  // Counters of work done without a thread cache, and of retired caches.
  // Written from many threads, so always with fetch_add (slow paths only).
  Counters shared_counters_;
  std::atomic<std::uint64_t> failed_allocations_{0};

  std::shared_ptr<CacheRegistry> registry_;
  std::atomic<bool> detached_{false};
  std::uint64_t detached_live_ = 0;  // guarded by mutex_
};

}  // namespace regpool::detail
