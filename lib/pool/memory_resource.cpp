#include "regpool/memory_resource.hpp"

#include <new>

#include "pool/access.hpp"
#include "pool/pool_core.hpp"

namespace regpool {
namespace {

// Offset of the data section chosen for an alignment: the smallest
// data_offset_for(meta) that is a multiple of the alignment. Objects start
// 64-byte aligned (slots) or page aligned (spans, forced for big alignments).
// data_offset_for(meta) steps by 8 from kWireHeaderSize, and alignments are
// powers of two, so that is kWireHeaderSize rounded up to max(alignment, 8).
constexpr std::uint64_t data_offset_for_alignment(std::size_t alignment) noexcept {
  const std::uint64_t a = alignment < 8 ? 8 : alignment;
  return (data_offset_for(0) + a - 1) & ~(a - 1);
}
static_assert(data_offset_for_alignment(1) == 24 && data_offset_for_alignment(8) == 24 &&
              data_offset_for_alignment(16) == 32 && data_offset_for_alignment(64) == 64 &&
              data_offset_for_alignment(4096) == 4096);

}  // namespace

void* PoolResource::do_allocate(std::size_t bytes, std::size_t alignment) {
  if (alignment > platform::kPageSize || (alignment & (alignment - 1)) != 0) throw std::bad_alloc();
  const std::uint64_t off = data_offset_for_alignment(alignment);
  LdoShape shape{bytes, off - kWireHeaderSize, 0, 0};
  // Alignments beyond a cache line need a page-aligned span.
  if (alignment > detail::kGranule && off - kWireHeaderSize + bytes <= kMaxSmallObject)
    shape.capacity = kMaxSmallObject + 1;
  auto r = pool_->allocate(shape);
  if (!r) throw std::bad_alloc();
  // The container owns the reference now; do_deallocate gives it back.
  std::byte* const base = r->base();
  detail::LdoAccess::release(*r);
  return base + off;
}

void PoolResource::do_deallocate(void* p, std::size_t /*bytes*/, std::size_t alignment) {
  const std::uint64_t off = data_offset_for_alignment(alignment);
  detail::PoolCore* core = detail::PoolAccess::core(*pool_);
  std::byte* const base = static_cast<std::byte*>(p) - off;
  detail::ControlBlock* cb = core ? core->block_at(base) : nullptr;
  if (cb) detail::LdoAccess::adopt(cb, base);  // drops the reference taken in do_allocate
}

bool PoolResource::do_is_equal(const std::pmr::memory_resource& other) const noexcept {
  auto* o = dynamic_cast<const PoolResource*>(&other);
  return o && o->pool_ == pool_;
}

}  // namespace regpool
