#pragma once
// regpool-perf's expose-test result, sent by the server (which owns the
// object and times expose + revoke) to the client over the bootstrap. Pure
// functions, so test/fuzz/perf_expose_fuzz.cpp can reach the decoder: the
// server is another process and every byte of it is checked before use.
//
// Layout: kExposeWords little-endian 64-bit words
//   magic, ok (1) or failed (0), iterations, server domain registrations,
//   median, min, max, p99 (nanoseconds);
// a failed result has zeros in words 2..7 and is followed by its error
// message: 1..kMaxExposeError printable ASCII bytes. Exactly one byte string
// encodes each result, so decode(encode(r)) == r and encode(decode(b)) == b.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "transport/wire_le.hpp"

namespace regpool_tools::perf_wire {

inline constexpr std::uint64_t kExposeMagic = 0x31505845'46524552ull;  // "RERFEXP1"
inline constexpr std::size_t kExposeWords = 8;
inline constexpr std::size_t kMaxExposeError = 512;

struct ExposeResult {
  bool ok = true;
  std::uint64_t iters = 0;
  std::uint64_t registrations = 0;
  std::uint64_t median_ns = 0, min_ns = 0, max_ns = 0, p99_ns = 0;
  std::string error;  // failed results only
};

inline bool printable(unsigned char c) noexcept { return c >= 0x20 && c < 0x7f; }

// A failed result's message is cut to kMaxExposeError bytes, non-printable
// bytes become '?', and an empty one becomes "unknown error".
inline std::vector<std::byte> encode_expose(const ExposeResult& r) {
  std::string err;
  if (!r.ok) {
    err = r.error.substr(0, kMaxExposeError);
    for (char& c : err) {
      if (!printable(static_cast<unsigned char>(c))) c = '?';
    }
    if (err.empty()) err = "unknown error";
  }
  std::vector<std::byte> b(kExposeWords * 8 + err.size());
  const std::uint64_t words[kExposeWords] = {kExposeMagic,
                                             r.ok ? 1u : 0u,
                                             r.ok ? r.iters : 0,
                                             r.ok ? r.registrations : 0,
                                             r.ok ? r.median_ns : 0,
                                             r.ok ? r.min_ns : 0,
                                             r.ok ? r.max_ns : 0,
                                             r.ok ? r.p99_ns : 0};
  for (std::size_t i = 0; i < kExposeWords; ++i) regpool::le::put_u64(b.data() + 8 * i, words[i]);
  if (!err.empty()) std::memcpy(b.data() + kExposeWords * 8, err.data(), err.size());
  return b;
}

// nullopt (malformed) unless `b` is exactly one encoding above, with the
// figures in order (min <= median <= max, min <= p99 <= max) and, for a
// successful result, `iters` iterations (what the client asked for).
inline std::optional<ExposeResult> decode_expose(std::span<const std::byte> b, std::uint64_t iters) {
  if (b.size() < kExposeWords * 8 || b.size() > kExposeWords * 8 + kMaxExposeError) return std::nullopt;
  std::uint64_t w[kExposeWords];
  for (std::size_t i = 0; i < kExposeWords; ++i) w[i] = regpool::le::get_u64(b.data() + 8 * i);
  if (w[0] != kExposeMagic || w[1] > 1) return std::nullopt;
  ExposeResult r;
  r.ok = w[1] == 1;
  if (!r.ok) {
    if (b.size() == kExposeWords * 8) return std::nullopt;  // a failure names its cause
    if (std::any_of(w + 2, w + kExposeWords, [](std::uint64_t v) { return v != 0; })) return std::nullopt;
    for (std::size_t i = kExposeWords * 8; i < b.size(); ++i) {
      const auto c = std::to_integer<unsigned char>(b[i]);
      if (!printable(c)) return std::nullopt;
      r.error += static_cast<char>(c);
    }
    return r;
  }
  r.iters = w[2];
  r.registrations = w[3];
  r.median_ns = w[4];
  r.min_ns = w[5];
  r.max_ns = w[6];
  r.p99_ns = w[7];
  if (b.size() != kExposeWords * 8 || r.iters != iters || r.min_ns > r.median_ns || r.median_ns > r.max_ns ||
      r.p99_ns > r.max_ns || r.p99_ns < r.min_ns) {
    return std::nullopt;
  }
  return r;
}

}  // namespace regpool_tools::perf_wire
