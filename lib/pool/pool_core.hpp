#pragma once
// Layer 4 internals: the pool behind the Pool handle.
//
// Locking (always acquired in this order, never the reverse):
//   registry_->mutex  (thread-cache registration, thread exit, close)
//   central_[c].mutex (ascending c when several are held)
//   mutex_            (arenas, spans, large objects)
//   arenas_rw_        (arena list for address lookups; held briefly)
// span_central_[b].mutex is a leaf: held only around a few array
// operations, never together with another pool lock.
// The fast path (thread cache hit) takes no lock at all.
//
// Arena release: an arena that goes idle is only noted (release_pending_);
// it is taken out of the pool under mutex_ and deregistered and unmapped
// after every lock is dropped, by the next allocation slow path, trim() or
// close. A drop never deregisters (it may run while the caller holds its
// own locks, and ibv_dereg_mr of a big arena takes milliseconds).
//
// Close against concurrent drops: a drop marks its thread cache busy
// (plain store), then reads its cache's closed marks (its bin's end or the
// span limit, which its room test reads anyway; or detached_, without a
// cache). close() sets both, runs an asymmetric fence (membarrier: every
// running thread executes a full barrier) and waits until no cache is busy
// and no uncached drop is in flight. So each drop either finished before
// close counts the live objects (and is counted) or sees detached_ and
// takes free_detached(), which only counts. The fast path pays two plain
// stores and no fence.

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
// instead of a locked add keeps the fast path free of atomic RMWs. On
// x86-64 the load+store is one add to memory without a lock prefix (GCC
// emits three instructions for the two atomic accesses): with one writer
// it is the same thing, and the store half of an aligned 8-byte add is
// atomic, so a reader on another thread sees the old or the new value.
struct OwnerCounter {
  std::atomic<std::uint64_t> v{0};
  static_assert(sizeof(v) == sizeof(std::uint64_t) && std::atomic<std::uint64_t>::is_always_lock_free);
  [[gnu::always_inline]] void add(std::uint64_t n) noexcept {
#if defined(__x86_64__) && defined(__GNUC__)
    asm("addq %1, %0" : "+m"(*reinterpret_cast<std::uint64_t*>(&v)) : "er"(n));
#else
    v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
#endif
  }
  std::uint64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
};

struct Counters {
  // Size classes: used by the pool's shared counters only (a thread
  // cache's bins count their own, see ThreadCache::Bin).
  std::array<OwnerCounter, kNumSizeClasses> allocs;
  std::array<OwnerCounter, kNumSizeClasses> frees;
  OwnerCounter large_allocs, large_frees, large_bytes_alloc, large_bytes_free;
  // Zero on allocate (PoolStats::zero*).
  OwnerCounter zeroed, zero_memset, zero_madvise, zero_fresh;
};

class PoolCore;

// Recently freed large spans kept per thread, so a message loop that
// allocates and drops the same large size never touches the pool lock.
inline constexpr std::size_t kSpanCacheEntries = 4;
inline constexpr std::uint64_t kSpanCacheMaxObject = std::uint64_t{16} << 20;

// Central span lists: free spans (up to kSpanCacheMaxObject) that overflow
// a thread's span cache wait here, by size bucket, for any thread's next
// allocation of that size. This is what lets a span released on another
// thread than the one that allocated it (the completion pattern) get back
// to the allocating side without the pool mutex and the best-fit search.
// Buckets are geometric in pages, four per power of two, like the slab
// classes: a bucket's spans differ by less than 25%, the slack a cached
// span may have.
inline constexpr std::size_t kSpanBuckets = 4 * 13;  // up to 2^13 pages
inline constexpr std::uint32_t kCentralSpanEntries = 32;
// Bytes all buckets together may hold: bounds what sits unused (an arena
// with a parked span is not idle, so auto-trim cannot release it; trim()
// and an allocation that hits max_bytes empty the lists).
inline constexpr std::uint64_t kCentralSpanBytes = std::uint64_t{64} << 20;
constexpr std::size_t span_bucket(std::uint64_t pages) noexcept {
  if (pages < 4) return static_cast<std::size_t>(pages);  // 1..3 pages: buckets 1..3
  const auto k = static_cast<std::size_t>(63 - __builtin_clzll(pages));
  return 4 * (k - 1) + static_cast<std::size_t>((pages >> (k - 2)) & 3);
}
static_assert(span_bucket(kSpanCacheMaxObject / platform::kPageSize) < kSpanBuckets);

// Slots of all of a thread cache's bins together (each bin holds up to
// cache_limit(c) pointers).
inline constexpr std::size_t kCacheSlots = [] {
  std::size_t n = 0;
  for (std::size_t c = 0; c < kNumSizeClasses; ++c) n += cache_limit(c);
  return n;
}();

// Owned by one thread (its `owner`), which alone touches the bins and the
// span cache while the pool is open; close() and thread exit take them over
// under the registry lock once no drop can reach them (see the notes above).
struct ThreadCache {
  // A bin is an array stack of free slots of one size class: push and pop
  // touch only the bin, never the neighbouring control blocks (a
  // doubly-linked list would write into the next block on every operation).
  // The top (top[-1]) is the most recently freed, cache-hot slot.
  //
  // Each size class counts its own traffic so that a cache hit updates one
  // counter, not two: drops onto the bin (Bin::frees) and slots moved
  // between the bin and the central list (moved[c]: refills minus
  // flushes). Every change of the bin's size is one of these or an
  // allocation from the bin, so the allocations are derived: moved + frees
  // - size (allocations()).
  // The stack is kept as pointers (its top and the end of its storage), not
  // as a count and a limit: a cache hit's pop is then a load of the top, a
  // compare with `slots`, a load below it and a store, and a drop's push
  // the same against `end`, with no index to scale and no base to load.
  // A Bin is 32 bytes (moved lives apart, off the hit path), so finding a
  // class's bin is one shift. top is read by stats() on other threads,
  // hence atomic (relaxed loads and stores by the owner: plain moves).
  // end doubles as the cache's closed flag: close() sets it to `slots`
  // (before its fence), so the drop's one compare `top < end` both finds
  // room and sees the pool open, and a closed cache's drops all take
  // free_busy. Its real capacity is cache_limit(class), fixed.
  struct Bin {
    ControlBlock** slots = nullptr;  // cache_limit(c) entries in `storage`
    std::atomic<ControlBlock**> top{nullptr};  // one past the newest; == slots when empty
    // slots + cache_limit(c) while the pool is open; slots once closed.
    // Written only by the constructor and close(), read by the owner.
    std::atomic<ControlBlock**> end{nullptr};
    OwnerCounter frees;  // drops pushed onto this bin

    std::uint32_t size() const noexcept {
      return static_cast<std::uint32_t>(top.load(std::memory_order_relaxed) - slots);
    }
    void set_size(std::uint32_t n) noexcept { top.store(slots + n, std::memory_order_relaxed); }
  };
  static_assert(sizeof(Bin) == 32);
  // Allocations served from bin c: exact on the owning thread or once it is
  // quiescent; elsewhere a snapshot whose parts may be read at slightly
  // different moments (as all of stats()).
  std::uint64_t allocations(std::size_t c) const noexcept {
    return moved[c].get() + bins[c].frees.get() - bins[c].size();
  }
  ThreadCache() noexcept {
    ControlBlock** next = storage.data();
    for (std::size_t c = 0; c < kNumSizeClasses; ++c) {
      bins[c].slots = next;
      bins[c].top.store(next, std::memory_order_relaxed);
      next += cache_limit(c);
      bins[c].end.store(next, std::memory_order_relaxed);
    }
  }
  ThreadCache(const ThreadCache&) = delete;
  ThreadCache& operator=(const ThreadCache&) = delete;

  // First, so that a class's bin is at tc + 32 * class (no offset to add).
  std::array<Bin, kNumSizeClasses> bins;
  // The hit paths' way to a bin: its address in one register, which every
  // access then uses as its base. Left to itself GCC re-derives tc + 32 *
  // class for each access of the bin's atomics (an lea each, two extra
  // instructions on the drop's hit path); the empty asm only hides that
  // the pointer is that sum.
  [[gnu::always_inline]] Bin& hot_bin(std::size_t cls) noexcept {
    Bin* b = &bins[cls];
    asm("" : "+r"(b));
    return *b;
  }
  // The same from a byte offset (kBinOffsetByGranule), which spares the
  // allocation the class-to-offset shift.
  [[gnu::always_inline]] Bin& hot_bin_at(std::size_t offset) noexcept {
    auto* b = reinterpret_cast<Bin*>(reinterpret_cast<std::byte*>(bins.data()) + offset);
    asm("" : "+r"(b));
    return *b;
  }

  PoolCore* core = nullptr;
  // Non-zero while the owning thread is inside a drop of this pool's
  // objects; written by the owner only, read by close().
  std::atomic<std::uint32_t> busy{0};
  // How many spans a drop may add to `spans` without free_busy:
  // kSpanCacheEntries while the pool is open, 0 once close() has taken the
  // cache over (set before its fence, like the bins' ends), so the span
  // drop's room test is also its closed test.
  std::atomic<std::uint32_t> span_limit{kSpanCacheEntries};
  // Per class: slots in from the central list minus slots out (wraps).
  std::array<OwnerCounter, kNumSizeClasses> moved;
  // Recently freed spans, oldest first; span_count of them are valid.
  std::uint32_t span_count = 0;
  std::array<ControlBlock*, kSpanCacheEntries> spans{};
  Counters counters;
  bi::list_member_hook<> registry_hook;
  std::array<ControlBlock*, kCacheSlots> storage{};
};

// class_of() as the byte offset of the class's bin in a ThreadCache, by
// granule count: the allocation's table load then yields the bin's address
// with one add.
inline constexpr auto kBinOffsetByGranule = [] {
  std::array<std::uint16_t, kClassByGranule.size()> t{};
  for (std::size_t g = 0; g < t.size(); ++g)
    t[g] = static_cast<std::uint16_t>(kClassByGranule[g] * sizeof(ThreadCache::Bin));
  return t;
}();

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
  static constexpr std::uint64_t kPage = platform::kPageSize;
  PoolCore(std::vector<std::shared_ptr<Domain>> domains, PoolConfig config);  // throws Error
  ~PoolCore();

  // Any allocation: the cache fast path, then the slow path. Failures are
  // counted in failed_allocations_.
  Result<ControlBlock*> allocate(const LdoShape& shape) noexcept {
    std::byte* base;
    if (ControlBlock* cb = allocate_cached(shape, &base)) [[likely]]
      return cb;
    return allocate_slow_path(shape);
  }
  // Everything allocate_cached declines: validation and its errors, the
  // thread cache's first use, refills, large objects, zeroing.
  [[gnu::noinline]] Result<ControlBlock*> allocate_slow_path(const LdoShape& shape) noexcept;

  // Fast paths, inline so a cache hit is a few dozen instructions with no
  // lock and no atomic RMW.
  //
  // allocate_cached: a slot (or a recently freed span) from this thread's
  // cache, initialised and with its wire header written, or nullptr when
  // the cache cannot serve the request (empty bin or no fitting span, no
  // cache, invalid sizes, zeroing: allocate_slow_path sorts those out).
  // On success *base receives the object's address (base_of(cb)), which
  // the wire header's write has computed anyway.
  // Always nullptr once the pool has closed: close empties the caches and
  // later drops bypass them. It calls nothing, so callers can keep their
  // fast path free of register saves and reach the slow path by a tail call.
  ControlBlock* allocate_cached(const LdoShape& shape, std::byte** base) noexcept {
    return allocate_cached(shape.data_size, shape.meta_size, shape.type_id, shape.capacity, shape.zeroing, base);
  }
  [[gnu::always_inline]] ControlBlock* allocate_cached(std::uint64_t data, std::uint64_t meta, std::uint32_t type_id,
                                                       std::uint64_t cap, Zeroing zeroing, std::byte** base) noexcept {
    // One test for all three sizes and the zeroing: each size is below
    // kMaxObjectBytes (a power of two) iff their OR is, so the sums below
    // cannot overflow; a zeroed allocation's limit is 0, so it always fails.
    if ((meta | data | cap) >= fast_limit_[static_cast<std::uint8_t>(zeroing) & 3]) [[unlikely]]
      return nullptr;
    const std::uint64_t sections = ((meta + 7) & ~std::uint64_t{7}) + data;
    // cap first: with a constant 0 (Pool::allocate(data, meta)) the max
    // folds away instead of becoming a branch on sections == 0.
    const std::uint64_t body = cap > sections ? cap : sections;
    const std::uint64_t total = kWireHeaderSize + body;
    // tls_fast.last is set whenever last_id is, so a match needs no null test.
    const TlsFast& f = tls_fast;
    if (f.last_id != id_) [[unlikely]]
      return nullptr;
    ThreadCache* tc = f.last;
    ControlBlock* cb;
    // total <= kMaxSmallObject, tested on body (one add less). Not on
    // sections alone: a small object reserving a large capacity is a span,
    // and its granule count would index past kBinOffsetByGranule.
    if (body <= kMaxSmallObject - kWireHeaderSize) [[likely]] {
      auto& bin = tc->hot_bin_at(kBinOffsetByGranule[(total + kGranule - 1) / kGranule]);
      ControlBlock** const top = bin.top.load(std::memory_order_relaxed);
      if (top == bin.slots) [[unlikely]]
        return nullptr;
      cb = top[-1];
      bin.top.store(top - 1, std::memory_order_relaxed);
    } else {
      // Only the newest cached span here (the loop that drops and
      // reallocates one size); allocate_slow_path searches them all.
      if (tc->span_count == 0) [[unlikely]]
        return nullptr;
      cb = tc->spans[tc->span_count - 1];
      const std::uint64_t capacity = (total + kPage - 1) & ~(kPage - 1);
      if (cb->capacity < capacity || cb->capacity - capacity > capacity / 4) [[unlikely]]
        return nullptr;
      tc->span_count -= 1;
      tc->counters.large_allocs.add(1);
      tc->counters.large_bytes_alloc.add(cb->capacity);
    }
    // Cached slots and spans all lie in regular arenas (dedicated arenas'
    // spans are never cached), whose object distance is the pool's.
    *base = init_object(cb, Arena::object_at(cb, regular_block_to_object_), data, meta, type_id);
    return cb;
  }

  // The drop of a pool object (its last reference), by kind: a slab slot
  // (the common case) or a span. Never deregisters and never waits for
  // anything but the pool's short-held locks. Static: the cache hit needs
  // only the arena (its pool id) and the thread's cache, not the pool.
  // free_slot takes the block's size class from the caller, which has read
  // it already (kind_word).
  [[gnu::always_inline]] static void free_slot(ControlBlock* cb, std::size_t cls) noexcept {
    Arena* const a = cb->arena;
    ThreadCache* tc = busy_cache(cb, a);
    if (!tc) [[unlikely]]
      return;
    // Full, or closed (end == slots; Bin): free_busy sorts out which.
    auto& bin = tc->hot_bin(cls);
    ControlBlock** const top = bin.top.load(std::memory_order_relaxed);
    if (top < bin.end.load(std::memory_order_relaxed)) [[likely]] {
      *top = cb;
      bin.top.store(top + 1, std::memory_order_relaxed);
      bin.frees.add(1);
      tc->busy.store(0, std::memory_order_release);
      return;
    }
    a->pool()->free_busy(cb, tc);
  }
  // cacheable: the span has kCacheableSpan (the caller has read its flags).
  [[gnu::always_inline]] static void free_span(ControlBlock* cb, bool cacheable) noexcept {
    Arena* const a = cb->arena;
    ThreadCache* tc = busy_cache(cb, a);
    if (!tc) [[unlikely]]
      return;
    // Full, closed (span_limit 0) or not cacheable: free_busy. The limit
    // is tested on its own first: a drop that finds the cache closed must
    // not read span_count, which close() empties once it has taken the
    // cache over (a race ThreadSanitizer reported in pool-concurrency).
    const std::uint32_t limit = tc->span_limit.load(std::memory_order_relaxed);
    if (limit != 0 && tc->span_count < limit && cacheable) [[likely]] {
      tc->spans[tc->span_count++] = cb;
      tc->counters.large_frees.add(1);
      tc->counters.large_bytes_free.add(cb->capacity);
      tc->busy.store(0, std::memory_order_release);
      return;
    }
    a->pool()->free_busy(cb, tc);
  }
  bool closed() const noexcept { return detached_.load(std::memory_order_acquire); }
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
  // For a live object of this pool it takes no lock (the arena map below);
  // other addresses fall back to a scan of the arenas under arenas_rw_.
  ControlBlock* block_at(const void* base) const noexcept;

  // Thread exit: move a cache's objects back and fold its counters in.
  void retire_cache(ThreadCache* tc) noexcept;

 private:
  struct alignas(64) Central {
    std::mutex mutex;
    FreeList list;
  };
  // One bucket of free spans, newest last (see kSpanBuckets).
  struct alignas(64) SpanCentral {
    std::mutex mutex;
    std::uint32_t count = 0;
    std::array<ControlBlock*, kCentralSpanEntries> spans{};
  };

  // The start of a drop of `cb` (in arena `a`): this thread's cache for the
  // pool, marked busy, or nullptr when the thread has none in tls_fast and
  // the drop has been done without it. busy before closed: close() pairs
  // its stores of closed (and detached_) and an asymmetric fence with this
  // (see the locking notes above); a compiler barrier is all this side
  // needs.
  [[gnu::always_inline]] static ThreadCache* busy_cache(ControlBlock* cb, Arena* a) noexcept {
    const TlsFast& f = tls_fast;
    if (f.last_id != a->pool_id()) [[unlikely]] {
      a->pool()->free_without_fast_cache(cb);
      return nullptr;
    }
    ThreadCache* tc = f.last;
    // Never null when last_id matched (TlsFast); saying so spares the
    // caller's null test.
    if (!tc) __builtin_unreachable();
    tc->busy.store(1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    return tc;
  }
  // This thread's cache if it is the one tls_fast remembers (ids are never
  // reused, so never stale), else nullptr: no lookup, no registration.
  ThreadCache* cached_thread_cache() const noexcept {
    const TlsFast& f = tls_fast;
    return f.last_id == id_ ? f.last : nullptr;  // last is non-null whenever last_id is set
  }
  // A cached span that fits `total` bytes with at most 25% slack (newest
  // first), taken out of the cache, or nullptr.
  ControlBlock* take_cached_span(ThreadCache* tc, std::uint64_t total) noexcept {
    const std::uint64_t capacity = platform::round_up(total, kPage);
    for (std::uint32_t i = tc->span_count; i-- > 0;) {
      ControlBlock* cb = tc->spans[i];
      if (cb->capacity >= capacity && cb->capacity - capacity <= capacity / 4) {
        for (std::uint32_t j = i + 1; j < tc->span_count; ++j) tc->spans[j - 1] = tc->spans[j];
        tc->span_count -= 1;
        tc->counters.large_allocs.add(1);
        tc->counters.large_bytes_alloc.add(cb->capacity);
        return cb;
      }
    }
    return nullptr;
  }
  // A span from the central lists that fits `total` bytes with at most 25%
  // slack, or nullptr. With a cache, further fitting spans of the bucket
  // move into its free span slots (one lock for several allocations).
  ControlBlock* take_central_span(ThreadCache* tc, std::uint64_t total) noexcept;
  // Puts the free spans spans[0..n), n <= kSpanCacheEntries (already
  // counted as freed) on their central lists, one lock per run of the same
  // bucket; spans that do not fit (bucket full, kCentralSpanBytes reached)
  // go back to their arenas.
  // Never holds a bucket's lock together with another pool lock.
  void push_central_spans(ControlBlock* const* spans, std::uint32_t n) noexcept;
  // Empties the central span lists into the arenas (trim, max_bytes
  // reached). Returns whether there was anything. Caller holds no pool lock.
  bool flush_central_spans() noexcept;
  // What every allocation does last: the control block's fields and the
  // wire header at `base`, the object's address (base_of(cb)), returned.
  static std::byte* init_object(ControlBlock* cb, std::byte* base, std::uint64_t data, std::uint64_t meta,
                                std::uint32_t type_id) noexcept {
    // kFreshSlot stays set while a slot's first object lives and is
    // cleared by its drop (destroy() in ldo.cpp): the only reader is the
    // allocation that may zero the slot, and a live slot is never
    // allocated. refs is already 1 (ControlBlock::refs).
    cb->type_id = type_id;
    cb->meta_size = meta;
    cb->data_size = data;
    write_wire_header(base, type_id, meta, data);
    return base;
  }

  ThreadCache* thread_cache() noexcept {
    if (ThreadCache* tc = cached_thread_cache()) return tc;
    return thread_cache_slow();
  }
  [[gnu::noinline]] ThreadCache* thread_cache_slow() noexcept;
  // Allocation slow path (empty cache bin, large objects): allocates, then
  // releases idle arenas if some are pending, after its locks are dropped.
  // *dirty receives how many bytes from the object's start may hold
  // earlier contents (large objects; slab slots carry kFreshSlot instead).
  [[gnu::noinline]] Result<ControlBlock*> allocate_slow(std::uint64_t total, std::uint64_t* dirty) noexcept;
  Result<ControlBlock*> allocate_small(std::size_t cls) noexcept;
  Result<ControlBlock*> allocate_large(std::uint64_t bytes, std::uint64_t* dirty) noexcept;  // no span cache
  // Clears bytes [kWireHeaderSize, dirty) of a freshly allocated object
  // (the rest of its capacity is known zero) and counts the work. Called
  // with no lock held: the object belongs to the caller alone.
  [[gnu::noinline, gnu::cold]] void zero_object(ControlBlock* cb, std::uint64_t dirty) noexcept;
  // Drop paths: the cache is marked busy (free_busy clears it), or there is
  // no cache for this pool in tls_fast (look one up, or go uncached).
  [[gnu::noinline]] void free_busy(ControlBlock* cb, ThreadCache* tc) noexcept;
  [[gnu::noinline]] void free_without_fast_cache(ControlBlock* cb) noexcept;
  void free_uncached(ControlBlock* cb) noexcept;
  // Central list refill for class c: carve a slab. Caller holds central_[c].
  Status carve_slab(std::size_t cls) noexcept;
  // Moves the `count` oldest (bottom) slots of tc's bin of class cls to the central list.
  void push_central(ThreadCache* tc, std::size_t cls, std::uint32_t count) noexcept;  // locks central
  void push_central_locked(std::size_t cls, ControlBlock* cb) noexcept;
  void pop_central_locked(std::size_t cls, ControlBlock* cb) noexcept;
  void free_large_locked(ControlBlock* cb) noexcept;  // caller holds mutex_
  void maybe_release_slab_locked(std::size_t cls, ControlBlock* any_slot) noexcept;  // holds central_[cls]
  // Maps and registers new arenas; caller holds mutex_. With `error` set,
  // a registration failure's exception is stored there (constructor path).
  Status grow_locked(std::uint64_t min_bytes, bool dedicated, std::exception_ptr* error = nullptr) noexcept;
  void free_span_locked(Arena* arena, std::uint32_t first) noexcept;  // caller holds mutex_
  void free_detached(ControlBlock* cb) noexcept;
  // True when more arenas are idle than the retention counts keep.
  bool idle_beyond_retention_locked(std::size_t keep) const noexcept;  // caller holds mutex_
  // Takes idle arenas beyond `keep` (and retain_idle_dedicated) out of the
  // pool under mutex_, then deregisters and unmaps them with no lock held.
  // Returns the bytes unmapped. Caller holds no pool lock.
  std::size_t release_idle_arenas(std::size_t keep) noexcept;
  void flush_cache(ThreadCache* tc) noexcept;
  std::uint64_t live_objects() const noexcept;
  // PoolStats' arena occupancy and fragmentation fields (see pool.hpp).
  void occupancy_stats(PoolStats& s) const;

  const std::uint64_t id_;
  PoolConfig config_;
  // Whether an allocation is zeroed, by LdoShape::zeroing (pool_default,
  // zeroed, uninitialized; the fourth entry catches out-of-range values).
  std::array<bool, 4> zero_by_mode_{};
  // allocate_cached's size limit by the same index: kMaxObjectBytes, or 0
  // where zeroing applies (the slow path zeroes).
  std::array<std::uint64_t, 4> fast_limit_{};
  // Arena::block_distance(config_.arena_size): object_of()'s distance in
  // every regular arena, for the fast path.
  std::uintptr_t regular_block_to_object_ = 0;
  std::vector<std::shared_ptr<Domain>> domains_;

  // mutable: stats() locks them to read slab occupancy.
  mutable std::array<Central, kNumSizeClasses> central_;
  std::array<SpanCentral, kSpanBuckets> span_central_;
  std::atomic<std::uint64_t> span_central_bytes_{0};  // capacity parked in span_central_

  mutable std::mutex mutex_;
  std::vector<Arena*> arenas_;  // guarded by mutex_ (writes also by arenas_rw_)
  mutable std::shared_mutex arenas_rw_;

  // Address -> arena map for block_at: one entry per 2 MiB chunk of the
  // address space (two levels, leaves allocated on demand under mutex_),
  // naming the arena that covers the whole chunk. Arenas are 2 MiB aligned
  // when THP advice is on (the default); chunks an arena covers only in
  // part are left out and found by the scan. Entries are set before an
  // arena's first object is handed out and cleared (under mutex_) when the
  // arena is released, i.e. idle: a lookup for a live object always finds
  // its arena's entry current. Readers take no lock.
  static constexpr unsigned kChunkShift = 21;
  static constexpr unsigned kLeafBits = 14;
  static constexpr unsigned kRootBits = 47 - kChunkShift - kLeafBits;  // 47-bit user addresses
  struct ArenaLeaf {
    std::array<std::atomic<Arena*>, std::size_t{1} << kLeafBits> entry{};
  };
  std::array<std::atomic<ArenaLeaf*>, std::size_t{1} << kRootBits> arena_map_{};
  // Sets (or with nullptr clears) the entries of the chunks `a` covers
  // whole. Caller holds mutex_. Returns false if a leaf could not be
  // allocated (those chunks then go through the scan).
  bool map_arena_locked(Arena* a, Arena* value) noexcept;
  Arena* arena_of(const void* p) const noexcept;
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

  // Set (under mutex_) when an arena went idle beyond the retention counts,
  // cleared by the release pass that takes such arenas out. Arenas being
  // deregistered right now are out of arenas_ but still in bytes_mapped_.
  std::atomic<bool> release_pending_{false};

  std::shared_ptr<CacheRegistry> registry_;
  // Thread caches need close()'s asymmetric fence; without membarrier the
  // pool runs uncached (correct, slower).
  int fence_cmd_ = 0;  // membarrier command, 0 = none
  bool caches_enabled_ = true;
  // Zeroing may use madvise(MADV_DONTNEED): no served domain pins memory,
  // no hugetlbfs pages, no prefault (PoolConfig::zero_madvise_min).
  bool madvise_zero_ = false;
  std::atomic<bool> detached_{false};
  // Drops without a busy-marked cache that are between their check of
  // detached_ and the end of their work (close waits for zero).
  std::atomic<std::uint32_t> uncached_frees_{0};
  // After close: objects still live when close counted them, and drops
  // seen since detached_ was set. Both guarded by mutex_; the core is
  // deleted when close is done and the two are equal.
  bool close_done_ = false;
  std::uint64_t live_at_close_ = 0;
  std::uint64_t detached_frees_ = 0;
};

}  // namespace regpool::detail
