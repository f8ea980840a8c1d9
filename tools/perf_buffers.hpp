// regpool-perf's buffer sets and payload checks (tools/regpool-perf.cpp).
//
// Hot: every operation of a bandwidth test uses the same source and
// destination bytes, so above a few KiB both sit in the caches and a shm
// copy (process_vm_writev/readv) runs cache to cache. Cold (--cold): the
// operations rotate over slots of a span several times the last-level cache,
// so every operation reads and writes memory that is not cached.
// The payload pattern is a function of a byte's offset in the span and of a
// seed, so initiator and target compute it alike and a stale or misplaced
// slot fails the check.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace regpool_tools {

// The largest cache's size in bytes: sysfs (cpu0's index*/size), else
// sysconf's L3/L2; 0 when neither knows.
inline std::uint64_t last_level_cache_bytes() {
  std::uint64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string s;
    if (!(in >> s) || s.empty()) continue;
    std::uint64_t v = std::strtoull(s.c_str(), nullptr, 10);
    const char unit = s.back();
    if (unit == 'K') v <<= 10;
    if (unit == 'M') v <<= 20;
    best = std::max(best, v);
  }
  if (best != 0) return best;
  for (const int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = ::sysconf(name);
    if (v > 0) return static_cast<std::uint64_t>(v);
  }
  return 0;
}

// The pattern's 8 bytes for word `w` (offsets 8w..8w+7) under `seed`
// (splitmix64: neighbouring words and seeds differ in every byte).
inline std::uint64_t pattern_word(std::uint64_t w, std::uint64_t seed) {
  std::uint64_t z = w + seed * 0x9E3779B97F4A7C15ULL + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Writes the pattern of offsets [begin, begin + len) to `out`.
inline void pattern_fill(std::byte* out, std::uint64_t begin, std::uint64_t len, std::uint64_t seed) {
  std::uint64_t o = begin;
  const std::uint64_t end = begin + len;
  while (o < end) {
    const std::uint64_t w = o / 8, in_word = o % 8;
    const std::uint64_t n = std::min<std::uint64_t>(8 - in_word, end - o);
    const std::uint64_t v = pattern_word(w, seed);
    std::memcpy(out + (o - begin), reinterpret_cast<const std::byte*>(&v) + in_word, n);
    o += n;
  }
}

// Whether `got` holds the pattern of offsets [begin, begin + len).
inline bool pattern_matches(const std::byte* got, std::uint64_t begin, std::uint64_t len, std::uint64_t seed) {
  std::vector<std::byte> want(len);
  pattern_fill(want.data(), begin, len, seed);
  return std::memcmp(got, want.data(), len) == 0;
}

}  // namespace regpool_tools
