#include "regpool/slice.hpp"

namespace regpool {
namespace {

// [offset, offset + length) inside [0, limit), without overflow.
constexpr bool fits(std::uint64_t offset, std::uint64_t length, std::uint64_t limit) noexcept {
  return offset <= limit && length <= limit - offset;
}

}  // namespace

Result<Slice> Slice::data(Ldo ldo, std::uint64_t offset, std::uint64_t length) noexcept {
  if (!ldo) return Status::invalid_argument;
  if (!fits(offset, length, ldo.data_size())) return Status::out_of_bounds;
  const std::uint64_t start = ldo.data_offset() + offset;
  return Slice(std::move(ldo), start, length);
}

Result<Slice> Slice::data(Ldo ldo) noexcept {
  if (!ldo) return Status::invalid_argument;
  const std::uint64_t start = ldo.data_offset();
  const std::uint64_t length = ldo.data_size();
  return Slice(std::move(ldo), start, length);
}

Result<Slice> Slice::wire(Ldo ldo) noexcept {
  if (!ldo) return Status::invalid_argument;
  const std::uint64_t length = ldo.wire_size();
  return Slice(std::move(ldo), 0, length);
}

Result<Slice> Slice::raw(Ldo ldo, std::uint64_t offset, std::uint64_t length) noexcept {
  if (!ldo) return Status::invalid_argument;
  // Ldo::capacity() excludes the header; the object owns header + capacity.
  if (!fits(offset, length, kWireHeaderSize + ldo.capacity())) return Status::out_of_bounds;
  return Slice(std::move(ldo), offset, length);
}

Result<Slice> Slice::select(std::uint64_t offset, std::uint64_t length) const noexcept {
  if (!ldo_) return Status::invalid_argument;
  if (!fits(offset, length, length_)) return Status::out_of_bounds;
  return Slice(ldo_, offset_ + offset, length);
}

bool Slice::within_object() const noexcept {
  return ldo_ && fits(offset_, length_, kWireHeaderSize + ldo_.capacity());
}

}  // namespace regpool
