#include "transport/hmac.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace regpool::detail {
namespace {

constexpr std::array<std::uint32_t, 64> kK = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

constexpr std::uint32_t rotr(std::uint32_t x, int n) noexcept { return (x >> n) | (x << (32 - n)); }

}  // namespace

void Sha256::reset() noexcept {
  h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  buf_len_ = 0;
  total_ = 0;
}

void Sha256::block(const std::byte* p) noexcept {
  std::uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = std::uint32_t{std::to_integer<std::uint8_t>(p[4 * i])} << 24 |
           std::uint32_t{std::to_integer<std::uint8_t>(p[4 * i + 1])} << 16 |
           std::uint32_t{std::to_integer<std::uint8_t>(p[4 * i + 2])} << 8 |
           std::uint32_t{std::to_integer<std::uint8_t>(p[4 * i + 3])};
  }
  for (int i = 16; i < 64; ++i) {
    const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  std::uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (std::size_t i = 0; i < 64; ++i) {
    const std::uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const std::uint32_t ch = (e & f) ^ (~e & g);
    const std::uint32_t t1 = h + s1 + ch + kK[i] + w[i];
    const std::uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const std::uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    const std::uint32_t t2 = s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a;
  h_[1] += b;
  h_[2] += c;
  h_[3] += d;
  h_[4] += e;
  h_[5] += f;
  h_[6] += g;
  h_[7] += h;
}

void Sha256::update(std::span<const std::byte> data) noexcept {
  total_ += data.size();
  std::size_t i = 0;
  if (buf_len_ > 0) {
    const std::size_t take = std::min(data.size(), buf_.size() - buf_len_);
    std::memcpy(buf_.data() + buf_len_, data.data(), take);
    buf_len_ += take;
    i = take;
    if (buf_len_ < buf_.size()) return;
    block(buf_.data());
    buf_len_ = 0;
  }
  for (; data.size() - i >= 64; i += 64) block(data.data() + i);
  if (i < data.size()) {
    std::memcpy(buf_.data(), data.data() + i, data.size() - i);
    buf_len_ = data.size() - i;
  }
}

Digest Sha256::finish() noexcept {
  const std::uint64_t bits = total_ * 8;
  std::byte pad[72] = {};
  pad[0] = std::byte{0x80};
  // Pad to 56 mod 64, then the 64-bit big-endian bit length.
  const std::size_t pad_len = (buf_len_ < 56 ? 56 - buf_len_ : 120 - buf_len_);
  for (int k = 0; k < 8; ++k) pad[pad_len + static_cast<std::size_t>(k)] = static_cast<std::byte>(bits >> (56 - 8 * k));
  const std::uint64_t keep = total_;
  update(std::span<const std::byte>(pad, pad_len + 8));
  total_ = keep;
  Digest out;
  for (std::size_t k = 0; k < 8; ++k) {
    for (std::size_t j = 0; j < 4; ++j) out[4 * k + j] = static_cast<std::byte>(h_[k] >> (24 - 8 * j));
  }
  return out;
}

Digest sha256(std::span<const std::byte> data) noexcept {
  Sha256 s;
  s.update(data);
  return s.finish();
}

HmacSha256::HmacSha256(std::span<const std::byte> key) noexcept {
  std::array<std::byte, 64> k{};
  if (key.size() > k.size()) {
    const Digest d = sha256(key);
    std::memcpy(k.data(), d.data(), d.size());
  } else if (!key.empty()) {
    std::memcpy(k.data(), key.data(), key.size());
  }
  std::array<std::byte, 64> ipad_key;
  for (std::size_t i = 0; i < k.size(); ++i) {
    ipad_key[i] = k[i] ^ std::byte{0x36};
    opad_key_[i] = k[i] ^ std::byte{0x5c};
  }
  inner_.update(ipad_key);
  secure_wipe(k.data(), k.size());
  secure_wipe(ipad_key.data(), ipad_key.size());
}

HmacSha256::~HmacSha256() { secure_wipe(opad_key_.data(), opad_key_.size()); }

Digest HmacSha256::finish() noexcept {
  const Digest inner = inner_.finish();
  Sha256 outer;
  outer.update(opad_key_);
  outer.update(inner);
  return outer.finish();
}

Digest hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> data) noexcept {
  HmacSha256 h(key);
  h.update(data);
  return h.finish();
}

bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b) noexcept {
  if (a.size() != b.size()) return false;  // lengths are public (fixed-size MACs)
  unsigned diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= std::to_integer<unsigned>(a[i] ^ b[i]);
  return diff == 0;
}

bool random_bytes(std::span<std::byte> out) noexcept {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::getrandom(out.data() + done, out.size() - done, 0);
    if (r > 0) {
      done += static_cast<std::size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  if (done == out.size()) return true;
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  while (done < out.size()) {
    const ssize_t r = ::read(fd, out.data() + done, out.size() - done);
    if (r > 0) {
      done += static_cast<std::size_t>(r);
    } else if (!(r < 0 && errno == EINTR)) {
      break;
    }
  }
  ::close(fd);
  return done == out.size();
}

void secure_wipe(void* p, std::size_t n) noexcept {
  volatile unsigned char* v = static_cast<volatile unsigned char*>(p);
  while (n-- > 0) *v++ = 0;
}

}  // namespace regpool::detail
