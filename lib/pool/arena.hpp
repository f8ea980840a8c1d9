#pragma once
// Layer 3: an arena is one large mapping, registered once with every domain
// its pool serves and deregistered only when the arena is released (never
// while the pool's locks are held: see pool_core.hpp). It hands
// out page spans (best fit, coalescing on free); the pool turns spans into
// slabs of small objects or into large objects.
//
// Bookkeeping is kept in two unregistered, lazily-touched side mappings:
//  - one PageDesc per 4 KiB page (span boundaries and the free-span tree);
//  - one ControlBlock per 64 B granule (an object's control block is found
//    from its offset alone, with no lookup structure to maintain).
// Not thread-safe on its own: the pool's mutex guards span operations.

#include <array>
#include <boost/intrusive/set.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <vector>

#include "platform/mapping.hpp"
#include "pool/control_block.hpp"
#include "regpool/domain.hpp"
#include "regpool/pool.hpp"

namespace regpool::detail {

class PoolCore;

enum class PageState : std::uint8_t { free, large, slab };

struct PageDesc {
  std::uint32_t npages = 0;        // valid on a span's first page
  std::uint32_t first = 0;         // valid on a span's last page
  PageState state = PageState::free;
  std::uint8_t size_class = 0;     // slabs
  std::uint32_t slab_slots = 0;    // slabs: slots carved
  std::uint32_t slab_central = 0;  // slabs: slots sitting in the central list
  bi::set_member_hook<bi::link_mode<bi::normal_link>, bi::optimize_size<true>> tree_hook;
};

struct SpanOrder {
  // Smallest span first; among equals the lowest address, so allocation
  // packs toward the start of the arena and its tail can go idle.
  bool operator()(const PageDesc& a, const PageDesc& b) const noexcept {
    return a.npages != b.npages ? a.npages < b.npages : &a < &b;
  }
};

using SpanTree = bi::set<PageDesc, bi::member_hook<PageDesc, decltype(PageDesc::tree_hook), &PageDesc::tree_hook>,
                         bi::compare<SpanOrder>, bi::constant_time_size<false>>;

class Arena {
 public:
  // Maps and registers. Returns a status rather than throwing so the pool
  // can grow from the (no-throw) allocation path.
  // With `error` non-null a failed registration's exception is kept there
  // so the pool constructor can rethrow it with the provider's message.
  static Result<Arena*> create(PoolCore* pool, std::uint64_t pool_id, std::size_t bytes, bool dedicated,
                               const PoolConfig& config,
                               std::span<const std::shared_ptr<Domain>> domains,
                               std::exception_ptr* error = nullptr) noexcept;
  ~Arena();  // deregisters, then unmaps
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  std::byte* base() const noexcept { return memory_.data(); }
  std::size_t size() const noexcept { return memory_.size(); }
  bool dedicated() const noexcept { return dedicated_; }
  bool idle() const noexcept { return used_pages_ == 0; }
  bool contains(const void* p) const noexcept {
    auto* b = static_cast<const std::byte*>(p);
    return b >= base() && b < base() + size();
  }
  PoolCore* pool() const noexcept { return pool_; }
  // The owning pool's id (PoolCore::id()), next to pool_ so a drop can match
  // it against the thread's cache without first loading the pool.
  std::uint64_t pool_id() const noexcept { return pool_id_; }

  ControlBlock* block_at(std::size_t offset) noexcept { return &blocks_[offset / kGranuleBytes]; }
  std::size_t offset_of(const ControlBlock* cb) const noexcept {
    return static_cast<std::size_t>(cb - blocks_) * kGranuleBytes;
  }
  // The object bytes of the block at `cb`. A control block is exactly one
  // granule long, so the object lies at a fixed distance from its block:
  // one load and one add instead of the base, the table and a subtraction.
  std::byte* object_of(const ControlBlock* cb) const noexcept { return object_at(cb, block_to_object_); }
  static std::byte* object_at(const ControlBlock* cb, std::uintptr_t distance) noexcept {
    static_assert(sizeof(ControlBlock) == kGranuleBytes);
    return reinterpret_cast<std::byte*>(reinterpret_cast<std::uintptr_t>(cb) + distance);
  }
  // object_of()'s distance for an arena of `mapped_bytes`: the table is
  // mapped right after the memory (Mapping::create_adjacent), so the
  // distance depends on the size alone. Every regular arena of a pool has
  // the same size, so the allocation fast path takes the distance from the
  // pool (which it has at hand) instead of loading cb->arena and then the
  // arena's field: two dependent loads off the hit path, about 5% of a
  // 64 B allocate + release (bench/RESULTS.md, issue 15).
  static std::uintptr_t block_distance(std::size_t mapped_bytes) noexcept {
    return std::uintptr_t{0} - (mapped_bytes + kBlockTableOffset);
  }
  PageDesc& page(std::uint32_t index) noexcept { return pages_[index]; }

  // Best-fit span of n pages; returns its first page. *dirty_pages (when
  // given) receives how many of the span's leading pages may hold earlier
  // contents; the pages after them have never been handed out since the
  // arena was mapped, so they still read as zero.
  std::optional<std::uint32_t> allocate_span(std::uint32_t n, PageState state,
                                             std::uint32_t* dirty_pages = nullptr) noexcept;
  // Frees the span starting at `first`, coalescing with free neighbours;
  // returns the first page of the resulting free span.
  std::uint32_t free_span(std::uint32_t first) noexcept;

  const Registration& registration(std::size_t domain_index) const noexcept { return registrations_[domain_index]; }
  std::uint64_t register_ns() const noexcept { return register_ns_; }
  std::uint32_t npages() const noexcept { return npages_; }

  // Links arenas taken out of their pool and waiting to be deregistered
  // after the pool's locks are dropped (no allocation needed to collect them).
  Arena* next_released = nullptr;

 private:
  static constexpr std::size_t kGranuleBytes = 64;
  // The control-block table starts half a page into its mapping, so an
  // object and its control block never share an address modulo 4096: the
  // allocation stores the wire header and the drop then loads the block's
  // first words, and with equal low 12 bits the CPU takes the load for a
  // possible alias of the store and delays it (4K aliasing). Measured
  // 2-4% per allocate + release (bench/RESULTS.md, issue 15, 13:05).
  static constexpr std::size_t kBlockTableOffset = 2048;
  static_assert(kBlockTableOffset % alignof(ControlBlock) == 0);
  static std::size_t table_bytes(std::size_t mapped_bytes) noexcept {
    return mapped_bytes / kGranuleBytes * sizeof(ControlBlock) + kBlockTableOffset;
  }
  Arena() = default;
  void set_span(std::uint32_t first, std::uint32_t n, PageState state) noexcept;

  PoolCore* pool_ = nullptr;
  std::uint64_t pool_id_ = 0;
  // base() - blocks_ as an unsigned offset (it wraps: the table lies above
  // the arena): object_of()'s distance, block_distance(size()).
  std::uintptr_t block_to_object_ = 0;
  platform::Mapping memory_;
  platform::Mapping page_map_;
  platform::Mapping block_map_;
  PageDesc* pages_ = nullptr;
  ControlBlock* blocks_ = nullptr;
  std::uint32_t npages_ = 0;
  std::uint32_t used_pages_ = 0;
  // Pages at or above this index have never been handed out (as a slab or
  // a large object) since the arena was mapped: still zero-fill-on-demand
  // (or prefaulted with zeros). Best fit takes the low end of a free span,
  // so a high-water mark tracks this exactly enough: a span straddling it
  // is dirty only below it.
  std::uint32_t touched_pages_ = 0;
  bool dedicated_ = false;
  std::uint64_t register_ns_ = 0;
  SpanTree free_spans_;
  std::array<Registration, kMaxPoolDomains> registrations_;
};

inline std::byte* base_of(const ControlBlock* cb) noexcept {
  if (cb->kind == BlockKind::user) [[unlikely]]
    return static_cast<const UserBlock*>(cb)->memory.data();
  return cb->arena->object_of(cb);
}

}  // namespace regpool::detail
