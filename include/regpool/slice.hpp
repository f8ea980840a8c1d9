#pragma once
// A Slice is an LDO handle plus a byte range of it: the only thing the
// transport accepts as local memory, so nothing unregistered reaches the
// wire. Bounds are checked when the slice is made, never later.

#include <cstdint>
#include <span>
#include <utility>

#include "regpool/error.hpp"
#include "regpool/ldo.hpp"

namespace regpool {

// Ownership: a Slice holds one reference to its object, so the bytes live at
// least as long as the slice (the transport relies on this for in-flight
// operations). Data slices are bounded by the data size at construction; a
// later resize does not move them, they stay inside the object's capacity.
// Thread-safety: as Ldo (the slice holds one reference to the object).
class REGPOOL_API Slice {
 public:
  Slice() noexcept = default;

  // Bytes [offset, offset + length) of the data section.
  static Result<Slice> data(Ldo ldo, std::uint64_t offset, std::uint64_t length) noexcept;
  // The whole data section.
  static Result<Slice> data(Ldo ldo) noexcept;
  // Header + meta + data: the object's wire image.
  static Result<Slice> wire(Ldo ldo) noexcept;
  // Bytes [offset, offset + length) counted from the wire header, bounded by
  // the object's capacity (receive buffers, raw protocols).
  static Result<Slice> raw(Ldo ldo, std::uint64_t offset, std::uint64_t length) noexcept;

  // A sub-range of this slice (offsets relative to this slice).
  Result<Slice> select(std::uint64_t offset, std::uint64_t length) const noexcept;

  explicit operator bool() const noexcept { return static_cast<bool>(ldo_); }
  const Ldo& ldo() const noexcept { return ldo_; }
  // Offset of the first byte from the object's wire header.
  std::uint64_t offset() const noexcept { return offset_; }
  std::uint64_t length() const noexcept { return length_; }
  std::byte* address() const noexcept { return ldo_.base() + offset_; }
  std::span<std::byte> bytes() const noexcept { return {address(), static_cast<std::size_t>(length_)}; }
  // Still inside the bytes the object owns (header + capacity). Always true
  // for a slice made by the factories, since capacity never shrinks; the
  // transport re-checks it anyway because it is one comparison.
  bool within_object() const noexcept;

 private:
  Slice(Ldo ldo, std::uint64_t offset, std::uint64_t length) noexcept
      : ldo_(std::move(ldo)), offset_(offset), length_(length) {}
  Ldo ldo_;
  std::uint64_t offset_ = 0;
  std::uint64_t length_ = 0;
};

}  // namespace regpool
