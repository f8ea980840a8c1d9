#pragma once
// Layers 3-4: arenas and the pool, the user-facing allocator.
//
// A pool maps large arenas once and registers each arena once with every
// domain it serves; it then carves them into LDOs:
//  - small objects (wire size <= kMaxSmallObject) come from size-class slabs
//    with intrusive free lists and per-thread caches;
//  - larger ones from best-fit page spans with coalescing;
//  - objects larger than an arena get a dedicated arena of their own.
// All bookkeeping lives outside the registered bytes and never calls malloc
// on the allocation path (Boost.Intrusive lists and trees over control blocks
// kept in unregistered side mappings).
//
// Several pools may coexist, each with its own domains; there is no global
// pool.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "regpool/domain.hpp"
#include "regpool/error.hpp"
#include "regpool/ldo.hpp"

namespace regpool {

namespace detail {
class PoolCore;
struct PoolAccess;  // the library's own way in (lib/pool/access.hpp)
}

inline constexpr std::size_t kNumSizeClasses = 32;
inline constexpr std::size_t kMaxSmallObject = 32 * 1024;
// Largest object (header + sections) a pool will try to map: 16 TiB. Bigger
// requests fail with Status::invalid_argument before any arithmetic.
inline constexpr std::uint64_t kMaxObjectBytes = std::uint64_t{1} << 44;
// Domains one pool can serve at once (each arena holds one registration per
// domain in a fixed array, so serving a domain never allocates).
inline constexpr std::size_t kMaxPoolDomains = 8;

struct PoolConfig {
  std::string name = "pool";
  // Bytes per regular arena (rounded up to 2 MiB so THP can back it).
  std::size_t arena_size = std::size_t{64} << 20;
  // Arenas mapped and registered at construction: the warm-up.
  std::size_t initial_arenas = 1;
  // Arenas added at once when the pool runs out of room.
  std::size_t growth_arenas = 1;
  // Hard cap on mapped bytes (0 = none). At the cap allocate() fails with
  // Status::pool_exhausted; it never blocks and never overcommits.
  std::size_t max_bytes = 0;
  // Idle regular arenas kept mapped when trimming (auto or trim()).
  std::size_t retain_idle_arenas = 1;
  // Idle dedicated arenas (objects larger than arena_size) kept for reuse.
  std::size_t retain_idle_dedicated = 0;
  // Release idle arenas beyond the retention counts without waiting for
  // trim(). An arena that goes idle (its last object dropped) is only noted
  // at the drop; it is deregistered and unmapped by the next allocation
  // that takes the slow path (a thread-cache refill, a large object, a
  // growth; after that allocation, so it can reuse the idle arena instead),
  // by trim(), or when the pool is destroyed. A drop therefore never waits
  // for a deregistration (ibv_dereg_mr of a 64 MiB arena takes
  // milliseconds), and deregistration never runs under a lock that
  // allocation or free need. Until then PoolStats::idle_arenas counts it.
  bool auto_trim = true;
  // madvise(MADV_HUGEPAGE) on arenas.
  bool transparent_huge_pages = true;
  // Back arenas with hugetlbfs pages of this many bytes (MAP_HUGETLB; 0 =
  // ordinary pages). Must be a size the kernel offers (a directory
  // /sys/kernel/mm/hugepages/hugepages-<kB>kB), else the constructor throws
  // Error(Status::unsupported). Arena sizes are rounded up to it. The pages
  // must be reserved beforehand (vm.nr_hugepages or that directory's
  // nr_hugepages): when they run out the constructor throws
  // Error(Status::out_of_memory) naming how many pages are reserved and free,
  // and later growth returns Status::out_of_memory from allocate().
  // transparent_huge_pages is ignored for such arenas.
  std::size_t huge_page_size = 0;
  // Bind arenas to this NUMA node (-1 = no binding). Needs the numa feature.
  int numa_node = -1;
  // Touch every page at arena creation so registration and first use do not
  // take page faults later.
  bool prefault = false;
  // Per-thread caches of small objects (and recently freed spans).
  bool thread_cache = true;
  // Rights granted by the arena registrations.
  Access access = Access::all;
  // Zero on allocate: the default for allocations whose LdoShape::zeroing
  // is Zeroing::pool_default (a shape can override it either way). When
  // zeroing applies, every byte of the new object after its wire header
  // reads as zero when allocate() returns: the meta section, its padding,
  // the data section and the rest of the capacity that resize() may grow
  // into. The wire header (kWireHeaderSize bytes) is not user data: the
  // pool writes it on every allocation. Without zeroing an object may hold
  // any earlier object's bytes, which a peer given read access to it (e.g.
  // the target of a put exposed read-write) can read.
  // Bytes are cleared by the allocating thread before allocate() returns,
  // never on free: memset for small objects, madvise(MADV_DONTNEED) for
  // large spans where that is allowed (zero_madvise_min), and nothing for
  // pages no object has used since the arena was mapped (they are still
  // the kernel's zero pages). Only what this process and the network write
  // into objects it handed out is accounted for: a peer that writes outside
  // its exposure on a provider that enforces nothing (shm; see
  // docs/bad-input.md) can change any arena byte at any time.
  bool zero_on_allocate = false;
  // Zeroing of at least this many bytes of a large span gives its whole
  // pages back to the kernel with madvise(MADV_DONTNEED) (the next touch of
  // each page then maps a fresh zero page) instead of writing zeros; the
  // partial first page is still memset. Only done where it is safe: no
  // served domain pins memory (Domain::pins_memory(): a pinned registration
  // such as ibv_reg_mr keeps the old pages, so the NIC and the CPU would
  // see different memory), no hugetlbfs pages (huge_page_size == 0: a
  // freed huge page goes back to the reserved pool and a later fault could
  // find none) and no prefault (the point of prefault is no page faults
  // later). Falls back to memset if madvise fails. 0 (the default) = always
  // memset: MADV_DONTNEED only defers the clearing to the page faults of
  // the next touch, which bench-zeroing measured at 2x to 500x the cost of
  // memset once the object is written (docs/allocation.md). Worth setting
  // (e.g. 256 KiB) for large objects that are mostly left untouched.
  std::size_t zero_madvise_min = 0;
};

struct SizeClassStats {
  std::uint64_t object_size = 0;  // slot bytes (header + sections)
  std::uint64_t allocations = 0;
  std::uint64_t live = 0;
};

// One arena, as seen by Pool::stats(). "Handed out" means pages given to a
// slab or a large object; a slab counts in full once carved, so
// bytes_in_use subtracts the slots of carved slabs that sit in the pool's
// central free lists (slots and large spans parked in per-thread caches
// count as in use: only their thread can hand them out). docs/telemetry.md
// has the details.
struct ArenaStats {
  std::uint64_t capacity = 0;       // bytes mapped (and registered)
  std::uint64_t bytes_in_use = 0;   // handed-out bytes minus central free slots
  std::uint64_t bytes_free = 0;     // bytes in free page spans
  std::uint64_t largest_free = 0;   // largest free page span, bytes
  std::uint64_t free_spans = 0;     // number of free page spans
  bool dedicated = false;           // holds one object larger than arena_size
};

struct PoolStats {
  std::string name;
  std::uint64_t allocations = 0;
  std::uint64_t releases = 0;
  std::uint64_t failed_allocations = 0;
  std::uint64_t live_objects = 0;
  std::uint64_t bytes_in_use = 0;   // capacity of live objects incl. headers
  std::uint64_t bytes_mapped = 0;   // all arenas
  std::uint64_t arenas = 0;
  std::uint64_t dedicated_arenas = 0;
  // Arenas holding no object: retained ones, and (auto_trim) those waiting
  // for the next release point. bytes_mapped also counts arenas being
  // deregistered at this moment.
  std::uint64_t idle_arenas = 0;
  std::uint64_t arenas_created = 0;
  std::uint64_t arenas_released = 0;
  // Registrations this pool made (arenas x domains); after warm-up these
  // stay flat while allocations climb: the point of the library.
  std::uint64_t registrations = 0;
  std::uint64_t deregistrations = 0;
  std::uint64_t register_ns = 0;
  std::uint64_t large_allocations = 0;
  std::uint64_t large_live = 0;
  // Zero on allocate (PoolConfig::zero_on_allocate, LdoShape::zeroing).
  std::uint64_t zeroed_allocations = 0;  // allocations that were zeroed
  std::uint64_t zero_memset_bytes = 0;   // bytes cleared with memset
  std::uint64_t zero_madvise_bytes = 0;  // bytes given back with MADV_DONTNEED
  std::uint64_t zero_fresh_bytes = 0;    // bytes never used since mapped: no work
  std::array<SizeClassStats, kNumSizeClasses> size_classes{};
  std::vector<DomainStats> domains;  // one per served domain

  // Arena occupancy and fragmentation (computed by walking the arenas' page
  // spans under the pool's locks: stats() briefly stalls allocations that
  // miss the thread caches). Regular arenas only in the aggregates below;
  // dedicated arenas appear in `arena_detail`.
  std::vector<ArenaStats> arena_detail;  // one per arena, oldest first
  std::uint64_t arena_capacity = 0;      // bytes of regular arenas
  std::uint64_t arena_bytes_in_use = 0;  // sum of their bytes_in_use
  std::uint64_t free_span_bytes = 0;     // bytes in free page spans
  std::uint64_t largest_free_span = 0;   // largest free span of any regular arena
  std::uint64_t slab_free_bytes = 0;     // free slots of carved slabs (central lists)
  // arena_bytes_in_use / arena_capacity (0 without regular arenas).
  double arena_occupancy = 0;
  // 1 - largest_free_span / free_span_bytes: the share of free page-span
  // bytes that a single large allocation cannot use. 0 when the free space
  // is one span (or there is none); near 1 when it is scattered in pieces.
  double fragmentation = 0;
};

// The allocator. Move-only RAII owner of its arenas.
// Thread-safety: allocate(), Ldo drops, stats() and trim() may run from any
// threads concurrently. Destroying the pool must not race with other calls
// on it (nor with Ldo::clone() of its objects, which allocates from it), but
// may race with drops and copies of its objects on other threads, and with
// those threads exiting: each such drop is either counted before the pool
// closes or sees it closed. Objects still alive at destruction keep the
// arenas (and registrations) alive until their last handle drops; the last
// drop then deregisters and unmaps them. Ldo::clone() after destruction
// returns Status::closed.
class REGPOOL_API Pool {
 public:
  // Maps and registers the initial arenas. Throws Error (setup path).
  explicit Pool(std::vector<std::shared_ptr<Domain>> domains, PoolConfig config = {});
  Pool(Pool&&) noexcept;
  Pool& operator=(Pool&&) noexcept;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool();

  // A cache hit (the common case once a thread has allocated a few objects
  // of a size) takes no lock and no atomic read-modify-write.
  REGPOOL_HOT Result<Ldo> allocate(const LdoShape& shape) noexcept;
  // LdoShape{data_size, meta_size}: type id 0, exact capacity, pool-default
  // zeroing. Out of line so the sizes travel in registers.
  REGPOOL_HOT Result<Ldo> allocate(std::uint64_t data_size, std::uint64_t meta_size = 0) noexcept;

  // Returns idle arenas beyond retain_idle_arenas (and
  // retain_idle_dedicated) to the OS, deregistering them after the pool's
  // locks are dropped, once the calling thread's cache has been flushed.
  // Returns the bytes unmapped.
  std::size_t trim() noexcept;

  PoolStats stats() const;
  const PoolConfig& config() const noexcept;
  std::span<const std::shared_ptr<Domain>> domains() const noexcept;

 private:
  friend struct detail::PoolAccess;
  detail::PoolCore* core_ = nullptr;
};

}  // namespace regpool
