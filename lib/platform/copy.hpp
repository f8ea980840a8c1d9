#pragma once
// Copies of message bytes between processes' shared memory (shm rings) and
// local buffers.
//
// glibc copies more than 2112 bytes (x86_rep_movsb_threshold on this AMD
// EPYC guest with FSRM) with `rep movsb`. Between two processes on nearby
// cores that made a 4 KiB ring ping-pong 1.5x slower than glibc's own
// vector loop (0.40 against 0.26 us a half round trip, both copies of a
// plain send; bench/RESULTS.md, "message copies without rep movsb"),
// while from 8 KiB up, and for processes the host places far apart,
// `rep movsb` is as fast or faster (2x at 16 KiB far apart). So a copy of
// up to kVectorCopyMax bytes goes through memcpy in pieces below that
// threshold, which glibc copies with its vector loop for this CPU (AVX2
// here), and a larger one goes to memcpy whole.

#include <cstddef>
#include <cstring>

namespace regpool::platform {

inline constexpr std::size_t kVectorCopyMax = 4096;
// Below glibc's smallest default rep movsb threshold (2048 x vector
// bytes / 16 for AVX2 and wider; 2112 with FSRM).
inline constexpr std::size_t kVectorCopyPiece = 2048;

[[gnu::always_inline]] inline void copy_message(void* dst, const void* src, std::size_t n) noexcept {
  if (n <= kVectorCopyPiece || n > kVectorCopyMax) {
    std::memcpy(dst, src, n);
    return;
  }
  std::memcpy(dst, src, kVectorCopyPiece);
  std::memcpy(static_cast<std::byte*>(dst) + kVectorCopyPiece, static_cast<const std::byte*>(src) + kVectorCopyPiece,
              n - kVectorCopyPiece);
}

}  // namespace regpool::platform
