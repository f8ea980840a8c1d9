#pragma once
// Little-endian integers in byte buffers: the one encoding every wire format
// of regpool uses (endpoint names, control messages, bootstrap frames).
// Through memcpy, so alignment never matters, byte-swapped on a big-endian
// host. Not byte by byte: gcc -O2 left those loops as single-byte loads and
// stores, and encoding one 64-byte Messenger header took about 310
// instructions (callgrind), parsing it as many again, on every message.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace regpool::le {

namespace detail {
// v in little-endian byte order (the identity on a little-endian host).
template <class T>
constexpr T to_little(T v) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    return v;
  } else {
    T r = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      r = static_cast<T>((r << 8) | (v & 0xff));
      v = static_cast<T>(v >> 8);
    }
    return r;
  }
}
template <class T>
inline void put(std::byte* p, T v) noexcept {
  v = to_little(v);
  std::memcpy(p, &v, sizeof v);
}
template <class T>
inline T get(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return to_little(v);  // its own inverse
}
}  // namespace detail

inline void put_u16(std::byte* p, std::uint16_t v) noexcept { detail::put(p, v); }
inline void put_u32(std::byte* p, std::uint32_t v) noexcept { detail::put(p, v); }
inline void put_u64(std::byte* p, std::uint64_t v) noexcept { detail::put(p, v); }
inline std::uint16_t get_u16(const std::byte* p) noexcept { return detail::get<std::uint16_t>(p); }
inline std::uint32_t get_u32(const std::byte* p) noexcept { return detail::get<std::uint32_t>(p); }
inline std::uint64_t get_u64(const std::byte* p) noexcept { return detail::get<std::uint64_t>(p); }

}  // namespace regpool::le
