#pragma once
// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the bootstrap's
// challenge-response authentication. Internal: not part of the public API,
// and not a general-purpose crypto library (no streaming of secrets out of
// process, no side-channel hardening beyond a constant-time compare; the
// inputs it sees are a job key and public nonces).
//
// Thread-safety: Sha256 and HmacSha256 objects are single-threaded values;
// the free functions are pure.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace regpool::detail {

using Digest = std::array<std::byte, 32>;

class Sha256 {
 public:
  Sha256() noexcept { reset(); }
  void reset() noexcept;
  void update(std::span<const std::byte> data) noexcept;
  void update(std::string_view s) noexcept {
    update(std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()));
  }
  // Finishes the hash; the object must be reset() before reuse.
  Digest finish() noexcept;

 private:
  void block(const std::byte* p) noexcept;
  std::array<std::uint32_t, 8> h_{};
  std::array<std::byte, 64> buf_{};
  std::size_t buf_len_ = 0;
  std::uint64_t total_ = 0;  // bytes hashed so far
};

Digest sha256(std::span<const std::byte> data) noexcept;

// HMAC-SHA256 over several pieces, fed with update().
class HmacSha256 {
 public:
  explicit HmacSha256(std::span<const std::byte> key) noexcept;
  ~HmacSha256();  // wipes the padded key
  HmacSha256(const HmacSha256&) = delete;
  HmacSha256& operator=(const HmacSha256&) = delete;
  void update(std::span<const std::byte> data) noexcept { inner_.update(data); }
  void update(std::string_view s) noexcept { inner_.update(s); }
  Digest finish() noexcept;

 private:
  Sha256 inner_;
  std::array<std::byte, 64> opad_key_{};
};

Digest hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> data) noexcept;

// Compares without an early exit, so the time taken does not tell an
// attacker how many leading bytes of a forged MAC were right.
bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b) noexcept;

// Fills `out` from the kernel's CSPRNG (getrandom, else /dev/urandom).
// Returns false when neither is available.
bool random_bytes(std::span<std::byte> out) noexcept;

// Overwrites memory in a way the compiler may not elide.
void secure_wipe(void* p, std::size_t n) noexcept;

}  // namespace regpool::detail
