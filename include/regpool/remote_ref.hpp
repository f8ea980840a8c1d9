#pragma once
// Remote references: what one process sends another so that the peer can
// put to, get from, or run atomics on a slice of its memory.
//
// Encoded form: fixed kEncodedSize bytes, little-endian, versioned and
// checksummed, so a peer can validate bytes that arrived from anywhere:
//   0  u32 magic "RPRF"      4  u16 version        6  u8 backend   7 u8 access
//   8  u8 address mode       9  u8 flags           10 u16 reserved (0)
//   12 u32 reserved (0)      16 u64 remote key     24 u64 address (of the slice's
//   first byte, per mode)    32 u64 length         40 u64 exposure id
//   48 u64 reserved (0)      56 u32 reserved (0)   60 u32 CRC-32C of bytes 0..59
// decode() checks every field and never crashes on any input. The checksum
// catches corruption and truncation, not forgery: a peer that wants to lie
// can compute it too. What protects the owner is its scoped key (and, where
// the provider checks nothing, the initiator's own checks).

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "regpool/domain.hpp"
#include "regpool/error.hpp"

namespace regpool {

enum class RemoteAccess : std::uint8_t {
  read_only = 1,   // get
  read_write = 2,  // get, put, fetch_add, compare_swap
  write_only = 3,
};

// The registration rights an export with `access` needs: atomics come with
// read-write, as the enum says.
constexpr Access registration_access(RemoteAccess access) noexcept {
  return access == RemoteAccess::read_write ? (Access::remote_read | Access::remote_write | Access::remote_atomic)
                                            : Access::remote_read;
}

enum class Backend : std::uint8_t { fabric = 1, verbs = 2 };

// A plain value: copy it freely, share const instances between threads.
// It owns nothing; the exposure it came from decides how long it works.
struct RemoteRef {
  static constexpr std::size_t kEncodedSize = 64;
  static constexpr std::uint16_t kVersion = 1;
  static constexpr std::uint32_t kMagic = 0x46525052;  // "RPRF" little-endian

  Backend backend = Backend::fabric;
  RemoteAccess access = RemoteAccess::read_only;
  AddressMode mode = AddressMode::virtual_address;
  std::uint64_t key = 0;
  std::uint64_t address = 0;
  std::uint64_t length = 0;
  std::uint64_t exposure_id = 0;
  std::uint8_t flags = 0;  // kFlag* bits

  // Byte 0 of the referenced range is 8-byte aligned in the owner's memory,
  // so atomics at 8-byte multiples of offset hit aligned words (needed in
  // offset mode, where the address says nothing about alignment).
  static constexpr std::uint8_t kFlagAligned8 = 1u << 0;
  static constexpr std::uint8_t kKnownFlags = kFlagAligned8;

  bool allows_write() const noexcept { return access == RemoteAccess::read_write; }
  // An 8-byte word at `offset` is aligned in the owner's memory.
  bool aligned_word(std::uint64_t offset) const noexcept {
    if (offset % 8 != 0) return false;
    return mode == AddressMode::virtual_address ? address % 8 == 0 : (flags & kFlagAligned8) != 0;
  }
  // Address of byte `offset` of the referenced range (no bounds check).
  std::uint64_t address_at(std::uint64_t offset) const noexcept { return address + offset; }
  // True when [offset, offset+len) lies inside the referenced range.
  bool contains(std::uint64_t offset, std::uint64_t len) const noexcept {
    return offset <= length && len <= length - offset;
  }

  // The field rules decode() applies: known backend, access, mode and flags,
  // a non-empty range that does not wrap, a non-zero exposure id. Endpoints
  // refuse a reference that breaks them (Status::malformed), so one built
  // or altered by hand is held to the same rules as one that was decoded.
  bool well_formed() const noexcept;

  std::array<std::byte, kEncodedSize> encode() const noexcept;
  // Status::malformed for wrong size, magic, checksum, enum values, unknown
  // flags, reserved bits, or an address range that wraps; Status::unsupported
  // for a foreign version (with a valid magic).
  static Result<RemoteRef> decode(std::span<const std::byte> bytes) noexcept;
};

// CRC-32C (Castagnoli), software; used for remote references.
std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept;

}  // namespace regpool
