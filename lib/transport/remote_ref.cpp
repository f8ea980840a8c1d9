#include "regpool/remote_ref.hpp"

#include <array>
#include <cstring>

namespace regpool {
namespace {

// Table-driven CRC-32C (reflected polynomial 0x82F63B78). Built at compile
// time so no static-initialisation order or locking question arises.
constexpr std::array<std::uint32_t, 256> make_table() noexcept {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<std::uint32_t, 256> kCrcTable = make_table();

// Explicit little-endian stores/loads: the encoding must mean the same on
// every host, whatever its byte order.
template <class T>
void put_le(std::byte* out, T v) noexcept {
  for (std::size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<std::byte>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff);
}
template <class T>
T get_le(const std::byte* in) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return static_cast<T>(v);
}

constexpr std::size_t kCrcOffset = 60;

}  // namespace

std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept {
  std::uint32_t c = ~0u;
  for (std::byte b : bytes) c = kCrcTable[(c ^ static_cast<std::uint32_t>(b)) & 0xffu] ^ (c >> 8);
  return ~c;
}

std::array<std::byte, RemoteRef::kEncodedSize> RemoteRef::encode() const noexcept {
  std::array<std::byte, kEncodedSize> out{};  // reserved bytes stay zero
  std::byte* p = out.data();
  put_le<std::uint32_t>(p + 0, kMagic);
  put_le<std::uint16_t>(p + 4, kVersion);
  put_le<std::uint8_t>(p + 6, static_cast<std::uint8_t>(backend));
  put_le<std::uint8_t>(p + 7, static_cast<std::uint8_t>(access));
  put_le<std::uint8_t>(p + 8, static_cast<std::uint8_t>(mode));
  put_le<std::uint8_t>(p + 9, flags);
  put_le<std::uint64_t>(p + 16, key);
  put_le<std::uint64_t>(p + 24, address);
  put_le<std::uint64_t>(p + 32, length);
  put_le<std::uint64_t>(p + 40, exposure_id);
  put_le<std::uint32_t>(p + kCrcOffset, crc32c({p, kCrcOffset}));
  return out;
}

bool RemoteRef::well_formed() const noexcept {
  if (backend != Backend::fabric && backend != Backend::verbs) return false;
  if (!known_access(access)) return false;
  if (mode != AddressMode::virtual_address && mode != AddressMode::offset) return false;
  if ((flags & ~kKnownFlags) != 0) return false;
  // An empty or wrapping range cannot come from an honest exposure, and
  // address_at() arithmetic must never overflow for in-range offsets.
  if (length == 0 || address > ~std::uint64_t{0} - length) return false;
  return exposure_id != 0;
}

Result<RemoteRef> RemoteRef::decode(std::span<const std::byte> bytes) noexcept {
  // Every check reads only within `bytes`, whose size is checked first.
  if (bytes.size() != kEncodedSize) return Status::malformed;
  const std::byte* p = bytes.data();
  if (get_le<std::uint32_t>(p + 0) != kMagic) return Status::malformed;
  // Version before checksum: a future version may move or widen fields, and
  // "foreign version" is the more useful answer for it.
  if (get_le<std::uint16_t>(p + 4) != kVersion) return Status::unsupported;
  if (get_le<std::uint32_t>(p + kCrcOffset) != crc32c({p, kCrcOffset})) return Status::malformed;

  const auto backend = get_le<std::uint8_t>(p + 6);
  const auto access = get_le<std::uint8_t>(p + 7);
  const auto mode = get_le<std::uint8_t>(p + 8);
  const auto flags = get_le<std::uint8_t>(p + 9);
  if (backend != static_cast<std::uint8_t>(Backend::fabric) && backend != static_cast<std::uint8_t>(Backend::verbs)) {
    return Status::malformed;
  }
  if (!known_access(static_cast<RemoteAccess>(access))) return Status::malformed;
  if (mode != static_cast<std::uint8_t>(AddressMode::virtual_address) &&
      mode != static_cast<std::uint8_t>(AddressMode::offset)) {
    return Status::malformed;
  }
  if ((flags & ~kKnownFlags) != 0) return Status::malformed;
  if (get_le<std::uint16_t>(p + 10) != 0 || get_le<std::uint32_t>(p + 12) != 0 || get_le<std::uint64_t>(p + 48) != 0 ||
      get_le<std::uint32_t>(p + 56) != 0) {
    return Status::malformed;
  }

  RemoteRef r;
  r.backend = static_cast<Backend>(backend);
  r.access = static_cast<RemoteAccess>(access);
  r.mode = static_cast<AddressMode>(mode);
  r.flags = flags;
  r.key = get_le<std::uint64_t>(p + 16);
  r.address = get_le<std::uint64_t>(p + 24);
  r.length = get_le<std::uint64_t>(p + 32);
  r.exposure_id = get_le<std::uint64_t>(p + 40);
  if (!r.well_formed()) return Status::malformed;
  return r;
}

}  // namespace regpool
