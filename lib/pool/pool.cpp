#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>
#include <thread>

#include "pool/access.hpp"
#include "pool/pool_core.hpp"

namespace regpool {
namespace detail {

constinit thread_local TlsFast tls_fast [[gnu::tls_model("initial-exec")]];

namespace {

// Objects beyond kMaxObjectBytes are rejected up front, so size arithmetic
// can never overflow and page counts fit in 32 bits. (kPage is
// PoolCore::kPage.)

std::atomic<std::uint64_t> g_next_pool_id{1};  // identity only; no pool state is global

// Per-thread directory of caches, one per pool this thread has touched.
struct TlsDirectory {
  struct Entry {
    std::uint64_t id;
    ThreadCache* tc;
    std::shared_ptr<CacheRegistry> registry;
  };
  std::vector<Entry> entries;
  ~TlsDirectory();
};

thread_local TlsDirectory tls_dir;  // slow path only

TlsDirectory::~TlsDirectory() {
  tls_fast.dead = true;
  tls_fast.last_id = 0;
  tls_fast.last = nullptr;
  for (auto& e : entries) {
    {
      std::lock_guard g(e.registry->mutex);
      if (e.registry->core) e.registry->core->retire_cache(e.tc);
    }
    delete e.tc;
  }
}

// Arenas are multiples of 2 MiB (so THP can back them) or of the hugetlbfs
// page size when that is larger.
std::size_t arena_alignment(const PoolConfig& c) noexcept {
  return std::max(platform::kHugePageSize, c.huge_page_size);
}

// PoolConfig::huge_page_size: refuse sizes the kernel does not offer before
// mapping anything, so the error names the cause rather than "cannot map".
void check_huge_pages(const PoolConfig& c) {
  if (!c.huge_page_size) return;
  if (!platform::huge_page_info(c.huge_page_size).supported)
    throw Error(Status::unsupported, EINVAL,
                "pool '" + c.name + "': huge_page_size " + std::to_string(c.huge_page_size) +
                    " is not a hugetlbfs page size this kernel offers (see /sys/kernel/mm/hugepages)");
}

void shared_add(OwnerCounter& c, std::uint64_t n) noexcept { c.v.fetch_add(n, std::memory_order_relaxed); }

// The heavy half of the asymmetric fence close() needs (the light half is a
// compiler barrier in PoolCore::free). Private expedited membarrier (Linux
// 4.14) interrupts only the CPUs running this process's threads, about a
// microsecond; registering for it is per process and idempotent. The
// global command is the older, slower fallback. Returns 0 when neither is
// available: the pool then runs without thread caches.
int asymmetric_fence_command() noexcept {
  const long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (cmds < 0) return 0;
  if ((cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
    return MEMBARRIER_CMD_PRIVATE_EXPEDITED;
  if (cmds & MEMBARRIER_CMD_GLOBAL) return MEMBARRIER_CMD_GLOBAL;
  return 0;
}

// A cache's size-class counts live in its bins (ThreadCache::Bin); its
// Counters hold the rest.
void fold(Counters& into, const ThreadCache& tc) noexcept {
  const Counters& from = tc.counters;
  for (std::size_t c = 0; c < kNumSizeClasses; ++c) {
    shared_add(into.allocs[c], tc.allocations(c));
    shared_add(into.frees[c], tc.bins[c].frees.get());
  }
  shared_add(into.large_allocs, from.large_allocs.get());
  shared_add(into.large_frees, from.large_frees.get());
  shared_add(into.large_bytes_alloc, from.large_bytes_alloc.get());
  shared_add(into.large_bytes_free, from.large_bytes_free.get());
  shared_add(into.zeroed, from.zeroed.get());
  shared_add(into.zero_memset, from.zero_memset.get());
  shared_add(into.zero_madvise, from.zero_madvise.get());
  shared_add(into.zero_fresh, from.zero_fresh.get());
}

}  // namespace

PoolCore::PoolCore(std::vector<std::shared_ptr<Domain>> domains, PoolConfig config)
    : id_(g_next_pool_id.fetch_add(1, std::memory_order_relaxed)),
      config_(std::move(config)),
      domains_(std::move(domains)),
      registry_(std::make_shared<CacheRegistry>()) {
  if (domains_.size() > kMaxPoolDomains) {
    throw Error(Status::invalid_argument, 0,
                "pool '" + config_.name + "': serves at most " + std::to_string(kMaxPoolDomains) + " domains, got " +
                    std::to_string(domains_.size()));
  }
  for (std::size_t i = 0; i < domains_.size(); ++i) {
    if (!domains_[i]) throw Error(Status::invalid_argument, 0, "pool '" + config_.name + "': null domain");
    for (std::size_t j = 0; j < i; ++j)
      if (domains_[j] == domains_[i])
        throw Error(Status::invalid_argument, 0, "pool '" + config_.name + "': domain '" + domains_[i]->name() +
                                                    "' listed twice");
  }
  if (config_.arena_size == 0) throw Error(Status::invalid_argument, 0, "pool '" + config_.name + "': arena_size is 0");
  check_huge_pages(config_);
  config_.arena_size = platform::round_up(config_.arena_size, arena_alignment(config_));
  // A regular arena maps exactly arena_size bytes: it is a multiple of
  // every page size the mapping may round to.
  regular_block_to_object_ = Arena::block_distance(config_.arena_size);
  if (config_.max_bytes && config_.initial_arenas * config_.arena_size > config_.max_bytes) {
    throw Error(Status::invalid_argument, 0,
                "pool '" + config_.name + "': initial arenas (" + std::to_string(config_.initial_arenas) + " x " +
                    std::to_string(config_.arena_size) + " bytes) exceed max_bytes " +
                    std::to_string(config_.max_bytes));
  }
  // Giving pages back with MADV_DONTNEED is only sound where nothing holds
  // on to the old pages: a pinned registration (ibv_reg_mr, mlock) would
  // keep them (and madvise refuses mlocked ranges anyway), a hugetlbfs
  // page would go back to the reserved pool, and prefault asked for no
  // page faults after setup.
  madvise_zero_ = config_.zero_madvise_min != 0 && config_.huge_page_size == 0 && !config_.prefault &&
                  std::none_of(domains_.begin(), domains_.end(), [](const auto& d) { return d->pins_memory(); });
  zero_by_mode_ = {config_.zero_on_allocate, true, false, false};
  for (std::size_t m = 0; m < fast_limit_.size(); ++m) fast_limit_[m] = zero_by_mode_[m] ? 0 : kMaxObjectBytes;
  static_assert(static_cast<int>(Zeroing::pool_default) == 0 && static_cast<int>(Zeroing::zeroed) == 1 &&
                static_cast<int>(Zeroing::uninitialized) == 2);
  fence_cmd_ = asymmetric_fence_command();
  caches_enabled_ = config_.thread_cache && fence_cmd_ != 0;
  registry_->core = this;
  std::lock_guard g(mutex_);
  for (std::size_t i = 0; i < config_.initial_arenas; ++i) {
    std::exception_ptr err;
    const Status s = grow_locked(config_.arena_size, false, &err);
    if (s != Status::ok) {
      for (Arena* a : arenas_) delete a;
      arenas_.clear();
      // The destructor does not run for a constructor that throws.
      for (auto& leaf : arena_map_) delete leaf.exchange(nullptr, std::memory_order_relaxed);
      if (err) std::rethrow_exception(err);
      if (config_.huge_page_size && s == Status::out_of_memory)
        throw Error(s, ENOMEM, "pool '" + config_.name + "': " +
                                   platform::huge_page_advice(config_.huge_page_size, config_.arena_size));
      throw Error(s, 0, "pool '" + config_.name + "': cannot map an arena of " + std::to_string(config_.arena_size) +
                            " bytes");
    }
  }
}

PoolCore::~PoolCore() {
  for (auto& c : central_) c.list.clear();
  for (Arena* a : arenas_) delete a;
  for (auto& leaf : arena_map_) delete leaf.load(std::memory_order_relaxed);
}

bool PoolCore::map_arena_locked(Arena* a, Arena* value) noexcept {
  constexpr std::uintptr_t kChunk = std::uintptr_t{1} << kChunkShift;
  const auto begin = reinterpret_cast<std::uintptr_t>(a->base());
  const std::uintptr_t end = begin + a->size();
  const std::uintptr_t first = (begin + kChunk - 1) >> kChunkShift;
  const std::uintptr_t last = end >> kChunkShift;  // exclusive
  bool ok = true;
  for (std::uintptr_t c = first; c < last; ++c) {
    const std::uintptr_t root = c >> kLeafBits;
    if (root >= arena_map_.size()) return false;
    ArenaLeaf* leaf = arena_map_[root].load(std::memory_order_relaxed);
    if (!leaf) {
      if (!value) continue;
      leaf = new (std::nothrow) ArenaLeaf();
      if (!leaf) {
        ok = false;
        continue;
      }
      arena_map_[root].store(leaf, std::memory_order_release);
    }
    leaf->entry[c & ((std::uintptr_t{1} << kLeafBits) - 1)].store(value, std::memory_order_release);
  }
  return ok;
}

Arena* PoolCore::arena_of(const void* p) const noexcept {
  const std::uintptr_t c = reinterpret_cast<std::uintptr_t>(p) >> kChunkShift;
  const std::uintptr_t root = c >> kLeafBits;
  if (root >= arena_map_.size()) return nullptr;
  const ArenaLeaf* leaf = arena_map_[root].load(std::memory_order_acquire);
  if (!leaf) return nullptr;
  return leaf->entry[c & ((std::uintptr_t{1} << kLeafBits) - 1)].load(std::memory_order_acquire);
}

ThreadCache* PoolCore::thread_cache_slow() noexcept {
  TlsFast& f = tls_fast;
  if (!caches_enabled_ || f.dead) return nullptr;
  TlsDirectory& d = tls_dir;
  for (auto& e : d.entries) {
    if (e.id == id_) {
      f.last_id = id_;
      f.last = e.tc;
      return e.tc;
    }
  }
  // First touch of this pool by this thread (not a hot path). Drop entries
  // of pools that have closed meanwhile.
  std::erase_if(d.entries, [](TlsDirectory::Entry& e) {
    std::lock_guard g(e.registry->mutex);
    if (e.registry->core) return false;
    delete e.tc;
    return true;
  });
  f.last_id = 0;
  f.last = nullptr;
  auto* tc = new (std::nothrow) ThreadCache();
  if (!tc) return nullptr;
  tc->core = this;
  try {
    d.entries.push_back({id_, tc, registry_});
  } catch (...) {
    delete tc;
    return nullptr;
  }
  {
    std::lock_guard g(registry_->mutex);
    // A closed pool takes no new caches: close() would never see them.
    if (!registry_->core) {
      d.entries.pop_back();
      delete tc;
      return nullptr;
    }
    registry_->caches.push_back(*tc);
  }
  f.last_id = id_;
  f.last = tc;
  return tc;
}

void PoolCore::pop_central_locked(std::size_t /*cls*/, ControlBlock* cb) noexcept {
  cb->arena->page(cb->span_page).slab_central -= 1;
}

void PoolCore::push_central_locked(std::size_t cls, ControlBlock* cb) noexcept {
  central_[cls].list.push_front(*cb);
  cb->arena->page(cb->span_page).slab_central += 1;
}

Status PoolCore::carve_slab(std::size_t cls) noexcept {
  const std::size_t bytes = slab_bytes(cls);
  const auto npages = static_cast<std::uint32_t>(bytes / kPage);
  std::lock_guard g(mutex_);
  Arena* arena = nullptr;
  std::optional<std::uint32_t> first;
  std::uint32_t dirty_pages = npages;
  for (int attempt = 0; attempt < 2 && !first; ++attempt) {
    for (Arena* a : arenas_) {
      if (a->dedicated()) continue;
      first = a->allocate_span(npages, PageState::slab, &dirty_pages);
      if (first) {
        arena = a;
        break;
      }
    }
    if (!first && attempt == 0) {
      const Status s = grow_locked(config_.arena_size, false);
      if (s != Status::ok) return s;
    }
  }
  if (!first) return Status::pool_exhausted;
  PageDesc& pd = arena->page(*first);
  pd.size_class = static_cast<std::uint8_t>(cls);
  const std::size_t size = kClassSize[cls];
  const auto slots = static_cast<std::uint32_t>(bytes / size);
  pd.slab_slots = slots;
  pd.slab_central = slots;
  const std::size_t start = std::size_t{*first} * kPage;
  // Slots that begin past the span's dirty pages lie wholly in pages no
  // object has used: zero on allocate can skip them (once).
  const std::size_t clean_from = std::size_t{dirty_pages} * kPage;
  FreeList& list = central_[cls].list;
  for (std::uint32_t i = 0; i < slots; ++i) {
    ControlBlock* cb = new (arena->block_at(start + i * size)) ControlBlock();
    cb->refs.store(1, std::memory_order_relaxed);  // a free block's count (ControlBlock::refs)
    cb->flags = std::size_t{i} * size >= clean_from ? kFreshSlot : 0;
    cb->kind = BlockKind::slab_slot;
    cb->size_class = static_cast<std::uint8_t>(cls);
    cb->span_page = *first;
    cb->capacity = size;
    cb->arena = arena;
    list.push_back(*cb);
  }
  return Status::ok;
}

Result<ControlBlock*> PoolCore::allocate_small(std::size_t cls) noexcept {
  ThreadCache* tc = thread_cache();
  Central& central = central_[cls];
  if (tc) {
    auto& bin = tc->bins[cls];
    if (bin.size() == 0) {
      std::lock_guard g(central.mutex);
      const std::uint32_t batch = std::max<std::uint32_t>(1, cache_limit(cls) / 2);
      Status s = Status::ok;
      // The central list's front ends on top of the stack: allocated first.
      std::uint32_t n = 0;
      while (n < batch) {
        if (central.list.empty()) {
          s = carve_slab(cls);
          if (s != Status::ok) break;
        }
        ControlBlock& cb = central.list.front();
        central.list.pop_front();
        pop_central_locked(cls, &cb);
        ++n;
        bin.slots[batch - n] = &cb;
      }
      if (n == 0) return s;
      if (n < batch) std::copy(bin.slots + (batch - n), bin.slots + batch, bin.slots);
      bin.set_size(n);
      tc->moved[cls].add(n);
    }
    // Counted by the bin (Bin::allocations).
    const std::uint32_t left = bin.size() - 1;
    bin.set_size(left);
    return bin.slots[left];
  }
  std::lock_guard g(central.mutex);
  if (central.list.empty()) {
    const Status s = carve_slab(cls);
    if (s != Status::ok) return s;
  }
  ControlBlock& cb = central.list.front();
  central.list.pop_front();
  pop_central_locked(cls, &cb);
  shared_add(shared_counters_.allocs[cls], 1);
  return &cb;
}

Result<ControlBlock*> PoolCore::allocate_large(std::uint64_t bytes, std::uint64_t* dirty) noexcept {
  const std::uint64_t capacity = platform::round_up(bytes, kPage);
  const bool dedicated = capacity > config_.arena_size;
  std::lock_guard g(mutex_);
  const auto npages = static_cast<std::uint32_t>(capacity / kPage);
  Arena* arena = nullptr;
  std::optional<std::uint32_t> first;
  std::uint32_t dirty_pages = npages;
  for (int attempt = 0; attempt < 2 && !first; ++attempt) {
    for (Arena* a : arenas_) {
      if (a->dedicated() != dedicated) continue;
      // An idle dedicated arena is reused only when it is not wildly larger:
      // slack within a quarter of the object, or within the 2 MiB rounding
      // of a fresh dedicated arena (which must always fit its own object).
      if (dedicated && (!a->idle() || a->size() - capacity > std::max<std::uint64_t>(capacity / 4,
                                                                                    platform::kHugePageSize)))
        continue;
      first = a->allocate_span(npages, PageState::large, &dirty_pages);
      if (first) {
        arena = a;
        break;
      }
    }
    if (!first && attempt == 0) {
      const Status s = grow_locked(capacity, dedicated);
      if (s != Status::ok) return s;
    }
  }
  if (!first) return Status::pool_exhausted;
  ControlBlock* cb = new (arena->block_at(std::size_t{*first} * kPage)) ControlBlock();
  cb->refs.store(1, std::memory_order_relaxed);  // a free block's count (ControlBlock::refs)
  cb->kind = BlockKind::span;
  cb->span_page = *first;
  cb->capacity = std::uint64_t{arena->page(*first).npages} * kPage;
  cb->flags = cb->capacity <= kSpanCacheMaxObject && !arena->dedicated() ? kCacheableSpan : 0;
  cb->arena = arena;
  *dirty = std::uint64_t{dirty_pages} * kPage;
  shared_add(shared_counters_.large_allocs, 1);
  shared_add(shared_counters_.large_bytes_alloc, cb->capacity);
  return cb;
}

Result<ControlBlock*> PoolCore::allocate_slow_path(const LdoShape& shape) noexcept {
  if (shape.meta_size > kMaxObjectBytes || shape.data_size > kMaxObjectBytes || shape.capacity > kMaxObjectBytes) {
    failed_allocations_.fetch_add(1, std::memory_order_relaxed);
    return Status::invalid_argument;
  }
  const std::uint64_t sections = data_offset_for(shape.meta_size) - kWireHeaderSize + shape.data_size;
  const std::uint64_t total = kWireHeaderSize + std::max(sections, shape.capacity);
  if (total > kMaxObjectBytes || (config_.max_bytes && total > config_.max_bytes)) {
    failed_allocations_.fetch_add(1, std::memory_order_relaxed);
    return total > kMaxObjectBytes ? Status::invalid_argument : Status::pool_exhausted;
  }
  const bool small = total <= kMaxSmallObject;
  // allocate_cached declined (or was not tried); the cache may still hold
  // a fitting span (a request the fast path's size test sent here).
  // Bytes from the object's start that may hold an earlier object's
  // contents: all of a span from the thread's span cache.
  std::uint64_t dirty = UINT64_MAX;
  ControlBlock* cb = nullptr;
  if (!small) {
    ThreadCache* tc = thread_cache();
    if (tc) cb = take_cached_span(tc, total);
    if (!cb) cb = take_central_span(tc, total);
  }
  if (!cb) {
    auto r = allocate_slow(total, &dirty);
    if (!r) {
      failed_allocations_.fetch_add(1, std::memory_order_relaxed);
      return r;
    }
    cb = *r;
  }
  if (zero_by_mode_[static_cast<std::uint8_t>(shape.zeroing) & 3]) [[unlikely]]
    zero_object(cb, small && (cb->flags & kFreshSlot) ? 0 : dirty);
  init_object(cb, base_of(cb), shape.data_size, shape.meta_size, shape.type_id);
  return cb;
}

void PoolCore::zero_object(ControlBlock* cb, std::uint64_t dirty) noexcept {
  std::byte* const base = base_of(cb);
  const std::uint64_t end = std::min(dirty, cb->capacity);
  std::uint64_t begin = kWireHeaderSize;
  std::uint64_t memset_bytes = 0;
  std::uint64_t madvise_bytes = 0;
  if (end > begin && madvise_zero_ && cb->kind == BlockKind::span && end - begin >= config_.zero_madvise_min) {
    // Spans start on a page, so their whole pages are [kPage, end rounded
    // down); the header's page keeps its header and is cleared by hand.
    const std::uint64_t whole_end = end / kPage * kPage;
    if (whole_end > kPage && ::madvise(base + kPage, whole_end - kPage, MADV_DONTNEED) == 0) {
      madvise_bytes = whole_end - kPage;
      std::memset(base + begin, 0, kPage - begin);
      std::memset(base + whole_end, 0, end - whole_end);
      memset_bytes = (kPage - begin) + (end - whole_end);
      begin = end;
    }
  }
  if (end > begin) {
    std::memset(base + begin, 0, end - begin);
    memset_bytes += end - begin;
  }
  const std::uint64_t fresh = cb->capacity - std::max<std::uint64_t>(end, kWireHeaderSize);
  if (ThreadCache* tc = thread_cache()) {
    tc->counters.zeroed.add(1);
    tc->counters.zero_memset.add(memset_bytes);
    tc->counters.zero_madvise.add(madvise_bytes);
    tc->counters.zero_fresh.add(fresh);
  } else {
    shared_add(shared_counters_.zeroed, 1);
    shared_add(shared_counters_.zero_memset, memset_bytes);
    shared_add(shared_counters_.zero_madvise, madvise_bytes);
    shared_add(shared_counters_.zero_fresh, fresh);
  }
}

Result<ControlBlock*> PoolCore::allocate_slow(std::uint64_t total, std::uint64_t* dirty) noexcept {
  // Only Ldo::clone() can get here after close (Pool::allocate needs the
  // Pool); the arenas then belong to the objects still alive.
  if (detached_.load(std::memory_order_acquire)) return Status::closed;
  auto attempt = [&] {
    return total <= kMaxSmallObject ? allocate_small(class_of(total)) : allocate_large(total, dirty);
  };
  auto r = attempt();
  // Spans parked on the central lists count against max_bytes: give them
  // back to their arenas and try again.
  if (!r && r.status() == Status::pool_exhausted && flush_central_spans()) [[unlikely]]
    r = attempt();
  // Idle arenas are released here, after the allocation (which may reuse
  // one instead of registering a new arena) and with no lock held. At the
  // cap, releasing them may make room: try once more.
  if (release_pending_.load(std::memory_order_relaxed)) [[unlikely]] {
    const bool retry = !r && r.status() == Status::pool_exhausted;
    release_idle_arenas(config_.retain_idle_arenas);
    if (retry) r = attempt();
  }
  return r;
}

void PoolCore::push_central(ThreadCache* tc, std::size_t cls, std::uint32_t count) noexcept {
  ThreadCache::Bin& from = tc->bins[cls];
  count = std::min(count, from.size());
  {
    std::lock_guard g(central_[cls].mutex);
    for (std::uint32_t i = 0; i < count; ++i) {
      ControlBlock* cb = from.slots[i];
      push_central_locked(cls, cb);
      maybe_release_slab_locked(cls, cb);
    }
  }
  // The newest slots (the cache-hot ones) stay, at the bottom now.
  std::copy(from.slots + count, from.slots + from.size(), from.slots);
  from.set_size(from.size() - count);
  tc->moved[cls].add(-std::uint64_t{count});  // unsigned wrap: moved is in minus out
}

void PoolCore::maybe_release_slab_locked(std::size_t cls, ControlBlock* any_slot) noexcept {
  if (!config_.auto_trim) return;
  Arena* arena = any_slot->arena;
  const std::uint32_t first = any_slot->span_page;
  PageDesc& pd = arena->page(first);
  // Keep slabs while the class has little free room, so a workload hovering
  // around a slab boundary does not carve and release the same slab forever.
  if (pd.slab_central != pd.slab_slots || central_[cls].list.size() < 3 * std::size_t{pd.slab_slots}) return;
  const std::size_t size = kClassSize[cls];
  const std::size_t start = std::size_t{first} * kPage;
  FreeList& list = central_[cls].list;
  for (std::uint32_t i = 0; i < pd.slab_slots; ++i) {
    ControlBlock* cb = arena->block_at(start + i * size);
    list.erase(list.iterator_to(*cb));
  }
  pd.slab_central = 0;
  std::lock_guard g(mutex_);
  free_span_locked(arena, first);
}

void PoolCore::free_span_locked(Arena* arena, std::uint32_t first) noexcept {
  arena->free_span(first);
  // Releasing the arena now would deregister it under the locks our caller
  // holds (and inside an Ldo drop): only note it for the next release point.
  if (config_.auto_trim && arena->idle() && idle_beyond_retention_locked(config_.retain_idle_arenas))
    release_pending_.store(true, std::memory_order_relaxed);
}

bool PoolCore::idle_beyond_retention_locked(std::size_t keep) const noexcept {
  std::size_t idle_regular = 0;
  std::size_t idle_dedicated = 0;
  for (const Arena* a : arenas_)
    if (a->idle()) ++(a->dedicated() ? idle_dedicated : idle_regular);
  return idle_regular > keep || idle_dedicated > config_.retain_idle_dedicated;
}

std::size_t PoolCore::release_idle_arenas(std::size_t keep) noexcept {
  Arena* doomed = nullptr;
  std::uint64_t count = 0;
  {
    std::lock_guard g(mutex_);
    release_pending_.store(false, std::memory_order_relaxed);
    // Dedicated arenas have their own (usually zero) retention: keeping a
    // huge idle mapping registered only pays off if the same size returns.
    for (bool dedicated : {true, false}) {
      const std::size_t retain = dedicated ? config_.retain_idle_dedicated : keep;
      std::size_t idle = 0;
      for (Arena* a : arenas_) idle += (a->idle() && a->dedicated() == dedicated) ? 1 : 0;
      // Newest first, so the oldest arenas (and their warm pages) stay.
      for (std::size_t i = arenas_.size(); i-- > 0 && idle > retain;) {
        Arena* a = arenas_[i];
        if (!a->idle() || a->dedicated() != dedicated) continue;
        {
          std::unique_lock w(arenas_rw_);
          arenas_.erase(arenas_.begin() + static_cast<std::ptrdiff_t>(i));
        }
        map_arena_locked(a, nullptr);
        // Idle and out of arenas_: no object, free list, thread cache or
        // address lookup refers to it any more, so it can go unlocked.
        a->next_released = doomed;
        doomed = a;
        ++count;
        --idle;
      }
    }
  }
  if (!doomed) return 0;
  std::size_t bytes = 0;
  while (doomed) {
    Arena* next = doomed->next_released;
    bytes += doomed->size();
    delete doomed;  // deregisters, then unmaps
    doomed = next;
  }
  // Counted once done, so stats never show a deregistration that has not
  // happened, and the cap keeps counting the bytes until they are unmapped.
  std::lock_guard g(mutex_);
  bytes_mapped_ -= bytes;
  arenas_released_ += count;
  deregistrations_ += count * domains_.size();
  return bytes;
}

Status PoolCore::grow_locked(std::uint64_t min_bytes, bool dedicated, std::exception_ptr* error) noexcept {
  const std::uint64_t size =
      dedicated ? platform::round_up(min_bytes, arena_alignment(config_)) : config_.arena_size;
  const std::size_t count = dedicated ? 1 : std::max<std::size_t>(1, config_.growth_arenas);
  for (std::size_t i = 0; i < count; ++i) {
    if (config_.max_bytes && bytes_mapped_ + size > config_.max_bytes) return i == 0 ? Status::pool_exhausted : Status::ok;
    auto a = Arena::create(this, id_, size, dedicated, config_, domains_, error);
    if (!a) return i == 0 ? a.status() : Status::ok;
    try {
      std::unique_lock w(arenas_rw_);
      arenas_.push_back(*a);
    } catch (...) {
      delete *a;
      return i == 0 ? Status::out_of_memory : Status::ok;
    }
    // A leaf that cannot be allocated only sends those lookups to the scan.
    (void)map_arena_locked(*a, *a);
    bytes_mapped_ += (*a)->size();
    arenas_created_ += 1;
    registrations_ += domains_.size();
    register_ns_ += (*a)->register_ns();
  }
  return Status::ok;
}

void PoolCore::free_large_locked(ControlBlock* cb) noexcept {
  shared_add(shared_counters_.large_frees, 1);
  shared_add(shared_counters_.large_bytes_free, cb->capacity);
  free_span_locked(cb->arena, cb->span_page);
}

void PoolCore::free_without_fast_cache(ControlBlock* cb) noexcept {
  // Looking up (or registering) the cache may take the registry lock, so it
  // happens before the cache is marked busy: close() waits for busy caches
  // while holding that lock. The object being dropped is live, so the core
  // cannot be deleted meanwhile.
  ThreadCache* tc = thread_cache();
  if (!tc) {
    free_uncached(cb);
    return;
  }
  tc->busy.store(1, std::memory_order_relaxed);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  free_busy(cb, tc);
}

void PoolCore::free_busy(ControlBlock* cb, ThreadCache* tc) noexcept {
  // tc is marked busy; every path below clears it once the pool's state no
  // longer depends on this drop. The locks taken here are held briefly
  // (no registration work happens under them), which bounds close()'s wait.
  if (detached_.load(std::memory_order_relaxed)) {
    tc->busy.store(0, std::memory_order_release);
    free_detached(cb);
    return;
  }
  if (cb->kind == BlockKind::slab_slot) {
    const std::size_t cls = cb->size_class;
    auto& bin = tc->bins[cls];
    // The real capacity: a closed bin's end no longer says (Bin::end).
    if (bin.size() == cache_limit(cls)) push_central(tc, cls, std::max<std::uint32_t>(1, cache_limit(cls) / 2));
    bin.slots[bin.size()] = cb;
    bin.set_size(bin.size() + 1);
    bin.frees.add(1);
  } else if (cb->flags & kCacheableSpan) {
    tc->counters.large_frees.add(1);
    tc->counters.large_bytes_free.add(cb->capacity);
    if (tc->span_count == kSpanCacheEntries) {
      // Full: the oldest half goes to the central lists, where the thread
      // that allocates this size (often another one) finds it without the
      // pool mutex. Those spans were counted as freed when they were cached.
      constexpr std::uint32_t kOut = kSpanCacheEntries / 2;
      push_central_spans(tc->spans.data(), kOut);
      std::copy(tc->spans.begin() + kOut, tc->spans.end(), tc->spans.begin());
      tc->span_count -= kOut;
    }
    tc->spans[tc->span_count++] = cb;
  } else {
    std::lock_guard g(mutex_);
    free_large_locked(cb);
  }
  tc->busy.store(0, std::memory_order_release);
}

void PoolCore::free_uncached(ControlBlock* cb) noexcept {
  // No cache to mark busy: announce the drop on a shared counter instead.
  // seq_cst on both sides (here and in close) makes one of them see the other.
  uncached_frees_.fetch_add(1, std::memory_order_seq_cst);
  if (detached_.load(std::memory_order_seq_cst)) {
    uncached_frees_.fetch_sub(1, std::memory_order_release);
    free_detached(cb);
    return;
  }
  if (cb->kind == BlockKind::slab_slot) {
    const std::size_t cls = cb->size_class;
    std::lock_guard g(central_[cls].mutex);
    push_central_locked(cls, cb);
    shared_add(shared_counters_.frees[cls], 1);
    maybe_release_slab_locked(cls, cb);
  } else {
    std::lock_guard g(mutex_);
    free_large_locked(cb);
  }
  uncached_frees_.fetch_sub(1, std::memory_order_release);
}

void PoolCore::free_detached(ControlBlock* cb) noexcept {
  // The object's bytes stay where they are (its arena goes with the core);
  // only count, so the last drop can delete the core.
  (void)cb;
  bool last = false;
  {
    std::lock_guard g(mutex_);
    ++detached_frees_;
    last = close_done_ && detached_frees_ == live_at_close_;
  }
  if (last) delete this;
}

void PoolCore::flush_cache(ThreadCache* tc) noexcept {
  for (std::size_t c = 0; c < kNumSizeClasses; ++c) {
    auto& bin = tc->bins[c];
    if (bin.size()) push_central(tc, c, bin.size());
  }
  std::lock_guard g(mutex_);
  for (std::uint32_t i = 0; i < tc->span_count; ++i) free_span_locked(tc->spans[i]->arena, tc->spans[i]->span_page);
  tc->span_count = 0;
}

void PoolCore::retire_cache(ThreadCache* tc) noexcept {
  // Caller holds registry_->mutex.
  flush_cache(tc);
  fold(shared_counters_, *tc);
  registry_->caches.erase(registry_->caches.iterator_to(*tc));
  tc->core = nullptr;
}

ControlBlock* PoolCore::take_central_span(ThreadCache* tc, std::uint64_t total) noexcept {
  if (span_central_bytes_.load(std::memory_order_relaxed) == 0) return nullptr;
  // Closed (only Ldo::clone() allocates then): the lists still hold spans,
  // but an object handed out now would escape close()'s count of the live
  // ones; allocate_slow says Status::closed.
  if (detached_.load(std::memory_order_acquire)) return nullptr;
  const std::uint64_t capacity = platform::round_up(total, kPage);
  if (capacity > kSpanCacheMaxObject) return nullptr;
  auto fits = [capacity](const ControlBlock* s) {
    return s->capacity >= capacity && s->capacity - capacity <= capacity / 4;
  };
  // A fitting span has at most 25% more pages: its own bucket or the next two.
  const std::size_t first = span_bucket(capacity / kPage);
  for (std::size_t b = first; b < std::min(first + 3, kSpanBuckets); ++b) {
    SpanCentral& sc = span_central_[b];
    ControlBlock* got = nullptr;
    std::uint64_t bytes = 0;
    {
      std::lock_guard g(sc.mutex);
      for (std::uint32_t i = sc.count; i-- > 0;) {
        ControlBlock* s = sc.spans[i];
        if (!fits(s)) continue;
        if (!got) {
          got = s;
        } else if (tc && tc->span_count < kSpanCacheEntries) {
          tc->spans[tc->span_count++] = s;
        } else {
          continue;
        }
        bytes += s->capacity;
        sc.spans[i] = sc.spans[--sc.count];
      }
    }
    if (!got) continue;
    span_central_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    // The spans moved into the cache are counted when they are allocated.
    if (tc) {
      tc->counters.large_allocs.add(1);
      tc->counters.large_bytes_alloc.add(got->capacity);
    } else {
      shared_add(shared_counters_.large_allocs, 1);
      shared_add(shared_counters_.large_bytes_alloc, got->capacity);
    }
    return got;
  }
  return nullptr;
}

void PoolCore::push_central_spans(ControlBlock* const* spans, std::uint32_t n) noexcept {
  std::array<ControlBlock*, kSpanCacheEntries> rejected{};
  std::uint32_t nrejected = 0;
  for (std::uint32_t i = 0; i < n;) {
    const std::size_t b = span_bucket(spans[i]->capacity / kPage);
    SpanCentral& sc = span_central_[b];
    std::lock_guard g(sc.mutex);
    for (; i < n && span_bucket(spans[i]->capacity / kPage) == b; ++i) {
      ControlBlock* s = spans[i];
      // The byte budget is reserved before the span is published, so the
      // lists never hold more than kCentralSpanBytes.
      if (sc.count < kCentralSpanEntries &&
          span_central_bytes_.fetch_add(s->capacity, std::memory_order_relaxed) + s->capacity <= kCentralSpanBytes) {
        sc.spans[sc.count++] = s;
        continue;
      }
      if (sc.count < kCentralSpanEntries) span_central_bytes_.fetch_sub(s->capacity, std::memory_order_relaxed);
      if (nrejected < rejected.size()) rejected[nrejected++] = s;
    }
  }
  if (!nrejected) return;
  std::lock_guard g(mutex_);
  for (std::uint32_t i = 0; i < nrejected; ++i) free_span_locked(rejected[i]->arena, rejected[i]->span_page);
}

bool PoolCore::flush_central_spans() noexcept {
  bool any = false;
  for (SpanCentral& sc : span_central_) {
    std::array<ControlBlock*, kCentralSpanEntries> out{};
    std::uint32_t n = 0;
    std::uint64_t bytes = 0;
    {
      std::lock_guard g(sc.mutex);
      n = sc.count;
      std::copy_n(sc.spans.begin(), n, out.begin());
      sc.count = 0;
    }
    if (!n) continue;
    any = true;
    for (std::uint32_t i = 0; i < n; ++i) bytes += out[i]->capacity;
    span_central_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    std::lock_guard g(mutex_);
    for (std::uint32_t i = 0; i < n; ++i) free_span_locked(out[i]->arena, out[i]->span_page);
  }
  return any;
}

std::size_t PoolCore::trim() noexcept {
  if (ThreadCache* tc = thread_cache()) flush_cache(tc);
  flush_central_spans();
  for (std::size_t c = 0; c < kNumSizeClasses; ++c) {
    std::lock_guard gc(central_[c].mutex);
    std::lock_guard g(mutex_);
    const std::size_t size = kClassSize[c];
    FreeList& list = central_[c].list;
    for (Arena* a : arenas_) {
      // Spans tile the arena, so walking first pages visits every span.
      std::uint32_t p = 0;
      while (p < a->npages()) {
        PageDesc& pd = a->page(p);
        if (pd.state == PageState::slab && pd.size_class == c && pd.slab_central == pd.slab_slots) {
          const std::size_t start = std::size_t{p} * kPage;
          for (std::uint32_t i = 0; i < pd.slab_slots; ++i)
            list.erase(list.iterator_to(*a->block_at(start + i * size)));
          pd.slab_central = 0;
          // The freed span may merge with its neighbours; continue after the
          // merged span, never from a page that is now interior.
          p = a->free_span(p);
        }
        p += a->page(p).npages;
      }
    }
  }
  return release_idle_arenas(config_.retain_idle_arenas);
}

std::uint64_t PoolCore::live_objects() const noexcept {
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  auto add = [&](const Counters& k) {
    for (std::size_t c = 0; c < kNumSizeClasses; ++c) {
      allocs += k.allocs[c].get();
      frees += k.frees[c].get();
    }
    allocs += k.large_allocs.get();
    frees += k.large_frees.get();
  };
  add(shared_counters_);
  for (const ThreadCache& tc : registry_->caches) {
    add(tc.counters);
    for (std::size_t c = 0; c < kNumSizeClasses; ++c) {
      allocs += tc.allocations(c);
      frees += tc.bins[c].frees.get();
    }
  }
  return allocs - frees;
}

void PoolCore::close() noexcept {
  std::uint64_t live = 0;
  bool fenced = true;
  {
    std::lock_guard g(registry_->mutex);
    registry_->core = nullptr;  // no thread registers a cache from now on
    // Close every cache for drops: no bin has room (end == slots) and no
    // span fits (span_limit 0), so each drop goes to free_busy.
    for (ThreadCache& tc : registry_->caches) {
      for (auto& bin : tc.bins) bin.end.store(bin.slots, std::memory_order_relaxed);
      tc.span_limit.store(0, std::memory_order_relaxed);
    }
    detached_.store(true, std::memory_order_seq_cst);
    // A drop marks its cache busy and then reads the cache's closed marks
    // (set above) with no fence of its own; the fence here makes each such
    // drop either visible as busy below or see the marks (and, in
    // free_busy, detached_: free_detached, which only counts). A drop that
    // saw the marks but not yet detached_ finishes as an ordinary drop while
    // busy, which the wait below covers like any drop before close.
    if (!registry_->caches.empty()) fenced = syscall(SYS_membarrier, fence_cmd_, 0, 0) == 0;
    // Drops already past their check finish their work (a few list
    // operations under the pool's short-held locks); wait for them so their
    // counts are in before live objects are counted.
    for (ThreadCache& tc : registry_->caches)
      while (tc.busy.load(std::memory_order_acquire)) std::this_thread::yield();
    while (uncached_frees_.load(std::memory_order_seq_cst)) std::this_thread::yield();
    // Other threads' caches hold only free objects and no drop touches them
    // any more: fold their counters and forget them. Those threads find the
    // registry closed when they exit.
    while (!registry_->caches.empty()) {
      ThreadCache& tc = registry_->caches.front();
      registry_->caches.pop_front();
      fold(shared_counters_, tc);
      // Emptied after the fold (the bins' derived allocation counts read
      // their sizes); the free slots stay with the arenas, which the core
      // owns.
      for (auto& bin : tc.bins) bin.set_size(0);
      tc.span_count = 0;
      tc.core = nullptr;
    }
    live = live_objects();
  }
  // Without the fence (membarrier failing after it was set up: not seen in
  // practice) a drop could still be writing into a cache: keep the core
  // and its arenas for ever rather than risk freeing them under it.
  if (!fenced) return;
  bool last = false;
  {
    std::lock_guard g(mutex_);
    live_at_close_ = live;
    close_done_ = true;
    last = detached_frees_ == live;
  }
  // Deregistration happens here (no lock held) or at the last drop of an
  // object that outlived the pool.
  if (last) delete this;
}

ControlBlock* PoolCore::block_at(const void* base) const noexcept {
  if (Arena* a = arena_of(base)) {
    const auto off = static_cast<std::size_t>(static_cast<const std::byte*>(base) - a->base());
    if (off % kGranule) return nullptr;
    return a->block_at(off);
  }
  std::shared_lock r(arenas_rw_);
  for (Arena* a : arenas_) {
    if (a->contains(base)) {
      const auto off = static_cast<std::size_t>(static_cast<const std::byte*>(base) - a->base());
      if (off % kGranule) return nullptr;
      return a->block_at(off);
    }
  }
  return nullptr;
}

PoolStats PoolCore::stats() const {
  PoolStats s;
  s.name = config_.name;
  Counters sum;
  auto add = [&](const Counters& k) {
    for (std::size_t c = 0; c < kNumSizeClasses; ++c) {
      sum.allocs[c].add(k.allocs[c].get());
      sum.frees[c].add(k.frees[c].get());
    }
    sum.large_allocs.add(k.large_allocs.get());
    sum.large_frees.add(k.large_frees.get());
    sum.large_bytes_alloc.add(k.large_bytes_alloc.get());
    sum.large_bytes_free.add(k.large_bytes_free.get());
    sum.zeroed.add(k.zeroed.get());
    sum.zero_memset.add(k.zero_memset.get());
    sum.zero_madvise.add(k.zero_madvise.get());
    sum.zero_fresh.add(k.zero_fresh.get());
  };
  {
    std::lock_guard g(registry_->mutex);
    add(shared_counters_);
    for (const ThreadCache& tc : registry_->caches) {
      add(tc.counters);
      for (std::size_t c = 0; c < kNumSizeClasses; ++c) {
        sum.allocs[c].add(tc.allocations(c));
        sum.frees[c].add(tc.bins[c].frees.get());
      }
    }
  }
  for (std::size_t c = 0; c < kNumSizeClasses; ++c) {
    auto& sc = s.size_classes[c];
    sc.object_size = kClassSize[c];
    sc.allocations = sum.allocs[c].get();
    // Counters from different threads are read at slightly different
    // moments; never report a negative live count.
    const auto f = sum.frees[c].get();
    sc.live = sc.allocations > f ? sc.allocations - f : 0;
    s.allocations += sc.allocations;
    s.releases += f;
    s.live_objects += sc.live;
    s.bytes_in_use += sc.live * sc.object_size;
  }
  s.large_allocations = sum.large_allocs.get();
  s.large_live = s.large_allocations > sum.large_frees.get() ? s.large_allocations - sum.large_frees.get() : 0;
  s.allocations += s.large_allocations;
  s.releases += sum.large_frees.get();
  s.live_objects += s.large_live;
  const auto lb = sum.large_bytes_alloc.get();
  const auto lf = sum.large_bytes_free.get();
  s.bytes_in_use += lb > lf ? lb - lf : 0;
  s.zeroed_allocations = sum.zeroed.get();
  s.zero_memset_bytes = sum.zero_memset.get();
  s.zero_madvise_bytes = sum.zero_madvise.get();
  s.zero_fresh_bytes = sum.zero_fresh.get();
  s.failed_allocations = failed_allocations_.load(std::memory_order_relaxed);
  {
    std::lock_guard g(mutex_);
    s.bytes_mapped = bytes_mapped_;
    s.arenas = arenas_.size();
    for (Arena* a : arenas_) {
      s.dedicated_arenas += a->dedicated() ? 1 : 0;
      s.idle_arenas += a->idle() ? 1 : 0;
    }
    s.arenas_created = arenas_created_;
    s.arenas_released = arenas_released_;
    s.registrations = registrations_;
    s.deregistrations = deregistrations_;
    s.register_ns = register_ns_;
  }
  for (const auto& d : domains_) s.domains.push_back(d->stats());
  occupancy_stats(s);
  return s;
}

// ---------------------------------------------------------------------------
// Arena occupancy and fragmentation (PoolStats::arena_detail and the
// aggregates after it). Spans tile every arena, so walking span heads visits
// each span once: O(spans) per arena, all under the pool's locks. Free slots
// of a carved slab are counted from PageDesc::slab_central, which changes
// under central_[cls].mutex; spans change under mutex_. Both are taken, in
// the documented order (centrals ascending, then mutex_), so the figures are
// one consistent snapshot. Not a fast path: allocations that miss their
// thread cache wait for the walk.
// ---------------------------------------------------------------------------
void PoolCore::occupancy_stats(PoolStats& s) const {
  std::array<std::unique_lock<std::mutex>, kNumSizeClasses> centrals;
  for (std::size_t c = 0; c < kNumSizeClasses; ++c) centrals[c] = std::unique_lock(central_[c].mutex);
  std::lock_guard g(mutex_);
  s.arena_detail.clear();
  s.arena_detail.reserve(arenas_.size());
  for (Arena* a : arenas_) {
    ArenaStats as;
    as.capacity = a->size();
    as.dedicated = a->dedicated();
    std::uint64_t handed_out = 0;
    std::uint64_t slab_free = 0;
    for (std::uint32_t p = 0; p < a->npages();) {
      const PageDesc& pd = a->page(p);
      if (pd.npages == 0) break;  // never for a well-formed arena; do not spin
      const std::uint64_t bytes = std::uint64_t{pd.npages} * kPage;
      if (pd.state == PageState::free) {
        as.bytes_free += bytes;
        as.free_spans += 1;
        as.largest_free = std::max(as.largest_free, bytes);
      } else {
        handed_out += bytes;
        if (pd.state == PageState::slab) slab_free += std::uint64_t{pd.slab_central} * kClassSize[pd.size_class];
      }
      p += pd.npages;
    }
    as.bytes_in_use = handed_out - slab_free;
    if (!as.dedicated) {
      s.arena_capacity += as.capacity;
      s.arena_bytes_in_use += as.bytes_in_use;
      s.free_span_bytes += as.bytes_free;
      s.largest_free_span = std::max(s.largest_free_span, as.largest_free);
      s.slab_free_bytes += slab_free;
    }
    s.arena_detail.push_back(as);
  }
  s.arena_occupancy =
      s.arena_capacity ? static_cast<double>(s.arena_bytes_in_use) / static_cast<double>(s.arena_capacity) : 0.0;
  s.fragmentation = s.free_span_bytes ? 1.0 - static_cast<double>(s.largest_free_span) /
                                                  static_cast<double>(s.free_span_bytes)
                                      : 0.0;
}

}  // namespace detail

Pool::Pool(std::vector<std::shared_ptr<Domain>> domains, PoolConfig config)
    : core_(new detail::PoolCore(std::move(domains), std::move(config))) {}

Pool::Pool(Pool&& o) noexcept : core_(o.core_) { o.core_ = nullptr; }

Pool& Pool::operator=(Pool&& o) noexcept {
  if (this != &o) {
    if (core_) core_->close();
    core_ = o.core_;
    o.core_ = nullptr;
  }
  return *this;
}

Pool::~Pool() {
  if (core_) core_->close();
}

namespace {
// Everything but a cache hit, out of line. Each takes the pool and the
// arguments of the Pool::allocate overload that calls it in the same order,
// so the hit path keeps its arguments where they arrived and GCC, which
// does not turn a call returning through memory into a tail call, saves
// the return slot only on the way here (shrink-wrapped): the hit path
// pushes no register.
[[gnu::noinline]] Result<Ldo> allocate_miss(const Pool& pool, const LdoShape& shape) noexcept {
  detail::PoolCore* core = detail::PoolAccess::core(pool);
  if (!core) return Status::closed;
  auto r = core->allocate_slow_path(shape);
  if (!r) return r.status();
  return detail::LdoAccess::adopt(*r, detail::base_of(*r));
}
[[gnu::noinline]] Result<Ldo> allocate_miss_sized(const Pool& pool, std::uint64_t data_size,
                                                  std::uint64_t meta_size) noexcept {
  return allocate_miss(pool, LdoShape{data_size, meta_size, 0, 0});
}
}  // namespace

Result<Ldo> Pool::allocate(const LdoShape& shape) noexcept {
  std::byte* base;
  if (core_) [[likely]]
    if (detail::ControlBlock* cb = core_->allocate_cached(shape, &base)) [[likely]]
      return detail::LdoAccess::adopt(cb, base);
  return allocate_miss(*this, shape);
}

Result<Ldo> Pool::allocate(std::uint64_t data_size, std::uint64_t meta_size) noexcept {
  std::byte* base;
  if (core_) [[likely]]
    if (detail::ControlBlock* cb = core_->allocate_cached(data_size, meta_size, 0, 0, Zeroing::pool_default, &base))
        [[likely]]
      return detail::LdoAccess::adopt(cb, base);
  return allocate_miss_sized(*this, data_size, meta_size);
}

std::size_t Pool::trim() noexcept { return core_ ? core_->trim() : 0; }

PoolStats Pool::stats() const {
  if (!core_) throw Error(Status::closed, 0, "pool: stats() on a moved-from pool");
  return core_->stats();
}

const PoolConfig& Pool::config() const noexcept { return core_->config(); }

std::span<const std::shared_ptr<Domain>> Pool::domains() const noexcept {
  if (!core_) return {};
  return core_->domains();
}

}  // namespace regpool
