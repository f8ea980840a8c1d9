#pragma once
// Small-object size classes: 32 classes from 64 B to 32 KiB, four per
// power of two above 512 B, so internal waste stays under 25%. Every class
// is a multiple of 64 B, which keeps slots cache-line aligned and lets a
// slot's control block be found by (offset / 64).

#include <array>
#include <cstddef>
#include <cstdint>

#include "regpool/pool.hpp"

namespace regpool::detail {

inline constexpr std::size_t kGranule = 64;

inline constexpr std::array<std::uint32_t, kNumSizeClasses> kClassSize = {
    64,    128,   192,   256,   320,   384,   448,   512,   640,   768,   896,
    1024,  1280,  1536,  1792,  2048,  2560,  3072,  3584,  4096,  5120,  6144,
    7168,  8192,  10240, 12288, 14336, 16384, 20480, 24576, 28672, 32768};
static_assert(kClassSize.back() == kMaxSmallObject);

// Lookup by granule count: O(1) on the fast path, no branches on size.
inline constexpr auto kClassByGranule = [] {
  std::array<std::uint8_t, kMaxSmallObject / kGranule + 1> t{};
  std::size_t c = 0;
  for (std::size_t g = 0; g < t.size(); ++g) {
    while (kClassSize[c] < g * kGranule) ++c;
    t[g] = static_cast<std::uint8_t>(c);
  }
  return t;
}();

constexpr std::size_t class_of(std::size_t bytes) noexcept {
  return kClassByGranule[(bytes + kGranule - 1) / kGranule];
}

// Slabs hold at least eight slots and are at least 64 KiB.
constexpr std::size_t slab_bytes(std::size_t cls) noexcept {
  const std::size_t want = std::size_t{8} * kClassSize[cls];
  const std::size_t min = std::size_t{64} << 10;
  const std::size_t b = want > min ? want : min;
  return (b + 4095) / 4096 * 4096;
}

// Per-thread cache depth: about 64 KiB of objects, between 8 and 256 slots.
constexpr std::uint32_t cache_limit(std::size_t cls) noexcept {
  const std::size_t n = (std::size_t{64} << 10) / kClassSize[cls];
  return static_cast<std::uint32_t>(n < 8 ? 8 : (n > 256 ? 256 : n));
}

}  // namespace regpool::detail
