#include "pool/arena.hpp"

#include <algorithm>
#include <chrono>
#include <new>

namespace regpool::detail {

Result<Arena*> Arena::create(PoolCore* pool, std::uint64_t pool_id, std::size_t bytes, bool dedicated,
                             const PoolConfig& config,
                             std::span<const std::shared_ptr<Domain>> domains,
                             std::exception_ptr* error) noexcept {
  platform::MapOptions opts;
  opts.transparent_huge_pages = config.transparent_huge_pages;
  opts.numa_node = config.numa_node;
  opts.prefault = config.prefault;
  opts.huge_page_size = config.huge_page_size;
  const std::size_t mapped = platform::Mapping::mapped_size(bytes, opts);
  const std::size_t npages = mapped / platform::kPageSize;
  if (npages > UINT32_MAX || mapped > SIZE_MAX / 4) return Status::invalid_argument;

  platform::MapOptions side;
  side.transparent_huge_pages = false;
  side.noreserve = true;
  // The control-block table right after the memory: see block_distance().
  auto both = platform::Mapping::create_adjacent(bytes, opts, table_bytes(mapped), side);
  if (!both) return both.status();
  auto pages = platform::Mapping::create(npages * sizeof(PageDesc), side);
  if (!pages) return pages.status();

  auto* a = new (std::nothrow) Arena();
  if (!a) return Status::out_of_memory;
  a->pool_ = pool;
  a->pool_id_ = pool_id;
  a->dedicated_ = dedicated;
  a->memory_ = std::move(both->first);
  a->page_map_ = std::move(*pages);
  a->block_map_ = std::move(both->second);
  a->npages_ = static_cast<std::uint32_t>(npages);
  // Side tables are zero pages until touched; constructing a descriptor
  // would touch them all, so only boundary pages are ever constructed.
  a->pages_ = reinterpret_cast<PageDesc*>(a->page_map_.data());
  a->blocks_ = reinterpret_cast<ControlBlock*>(a->block_map_.data() + kBlockTableOffset);
  a->block_to_object_ = block_distance(mapped);
  new (&a->pages_[0]) PageDesc();
  if (npages > 1) new (&a->pages_[npages - 1]) PageDesc();
  a->set_span(0, a->npages_, PageState::free);
  a->free_spans_.insert(a->pages_[0]);

  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < domains.size(); ++i) {
    try {
      a->registrations_[i] = domains[i]->register_memory(a->base(), a->size(), config.access);
    } catch (const Error& e) {
      if (error) *error = std::current_exception();
      delete a;  // undoes the registrations made so far
      return e.status();
    } catch (...) {
      if (error) *error = std::current_exception();
      delete a;
      return Status::registration_failed;
    }
  }
  a->register_ns_ = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  return a;
}

Arena::~Arena() {
  // Registrations first: a NIC must never keep a mapping to unmapped pages.
  for (auto& r : registrations_) r.reset();
  free_spans_.clear();
}

void Arena::set_span(std::uint32_t first, std::uint32_t n, PageState state) noexcept {
  PageDesc& f = pages_[first];
  f.npages = n;
  f.state = state;
  PageDesc& l = pages_[first + n - 1];
  l.first = first;
  l.state = state;
}

std::optional<std::uint32_t> Arena::allocate_span(std::uint32_t n, PageState state,
                                                  std::uint32_t* dirty_pages) noexcept {
  if (n == 0 || n > npages_) return std::nullopt;
  // Best fit: the smallest free span that holds n pages.
  auto it = free_spans_.lower_bound(n, [](const PageDesc& d, std::uint32_t k) { return d.npages < k; });
  if (it == free_spans_.end()) return std::nullopt;
  PageDesc& d = *it;
  free_spans_.erase(it);
  const auto first = static_cast<std::uint32_t>(&d - pages_);
  const std::uint32_t have = d.npages;
  if (have > n) {
    const std::uint32_t rest = first + n;
    new (&pages_[rest]) PageDesc();
    if (have - n > 1) new (&pages_[first + have - 1]) PageDesc();
    set_span(rest, have - n, PageState::free);
    free_spans_.insert(pages_[rest]);
  }
  if (n > 1) new (&pages_[first + n - 1]) PageDesc();
  set_span(first, n, state);
  pages_[first].slab_slots = 0;
  pages_[first].slab_central = 0;
  used_pages_ += n;
  if (dirty_pages) *dirty_pages = touched_pages_ > first ? std::min(touched_pages_ - first, n) : 0;
  touched_pages_ = std::max(touched_pages_, first + n);
  return first;
}

std::uint32_t Arena::free_span(std::uint32_t first) noexcept {
  std::uint32_t n = pages_[first].npages;
  used_pages_ -= n;
  // Coalesce forward: the page after the span is the first page of the next.
  const std::uint32_t next = first + n;
  if (next < npages_ && pages_[next].state == PageState::free) {
    PageDesc& nd = pages_[next];
    free_spans_.erase(free_spans_.iterator_to(nd));
    n += nd.npages;
  }
  // Coalesce backward: the page before is the last page of the previous span.
  if (first > 0 && pages_[first - 1].state == PageState::free) {
    const std::uint32_t prev = pages_[first - 1].first;
    PageDesc& pd = pages_[prev];
    free_spans_.erase(free_spans_.iterator_to(pd));
    n += pd.npages;
    first = prev;
  }
  set_span(first, n, PageState::free);
  free_spans_.insert(pages_[first]);
  return first;
}

}  // namespace regpool::detail
