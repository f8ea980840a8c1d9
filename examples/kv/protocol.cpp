#include "protocol.hpp"

#include <cstring>

namespace kv {
namespace {

constexpr std::uint32_t kRequestMagic = 0x5152564b;  // "KVRQ"
constexpr std::uint32_t kReplyMagic = 0x5052564b;    // "KVRP"

void put_u32(std::byte* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put_u64(std::byte* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint16_t get_u16(const std::byte* p) noexcept {
  return static_cast<std::uint16_t>(std::to_integer<unsigned>(p[0]) | std::to_integer<unsigned>(p[1]) << 8);
}
std::uint32_t get_u32(const std::byte* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{std::to_integer<std::uint8_t>(p[i])} << (8 * i);
  return v;
}
std::uint64_t get_u64(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{std::to_integer<std::uint8_t>(p[i])} << (8 * i);
  return v;
}
bool all_zero(const std::byte* p, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != std::byte{0}) return false;
  return true;
}

}  // namespace

const char* to_string(Result r) noexcept {
  switch (r) {
    case Result::ok: return "ok";
    case Result::not_found: return "not found";
    case Result::too_large: return "value too large";
    case Result::busy: return "server busy";
    case Result::bad_request: return "bad request";
  }
  return "unknown";
}

void encode(const Request& r, std::span<std::byte, kMessageSize> out) noexcept {
  std::byte* p = out.data();
  std::memset(p, 0, kMessageSize);
  const std::size_t klen = r.key.size() < kMaxKey ? r.key.size() : kMaxKey;
  put_u32(p, kRequestMagic);
  p[4] = static_cast<std::byte>(r.op);
  p[5] = static_cast<std::byte>(klen);
  put_u32(p + 12, r.request_id);
  put_u64(p + 16, r.epoch);
  put_u64(p + 24, r.argument);
  std::memcpy(p + 32, r.key.data(), klen);
}

std::optional<Request> decode_request(std::span<const std::byte> in) noexcept {
  if (in.size() != kMessageSize) return std::nullopt;
  const std::byte* p = in.data();
  if (get_u32(p) != kRequestMagic || get_u16(p + 6) != 0 || get_u32(p + 8) != 0) return std::nullopt;
  const auto op = std::to_integer<std::uint8_t>(p[4]);
  if (op < static_cast<std::uint8_t>(Op::put) || op > static_cast<std::uint8_t>(Op::done)) return std::nullopt;
  const auto klen = std::to_integer<std::uint8_t>(p[5]);
  if (klen > kMaxKey || !all_zero(p + 32 + klen, kMaxKey - klen)) return std::nullopt;
  Request r;
  r.op = static_cast<Op>(op);
  r.request_id = get_u32(p + 12);
  r.epoch = get_u64(p + 16);
  r.argument = get_u64(p + 24);
  try {
    r.key.assign(reinterpret_cast<const char*>(p + 32), klen);
  } catch (...) {
    return std::nullopt;
  }
  return r;
}

void encode(const Reply& r, std::span<std::byte, kMessageSize> out) noexcept {
  std::byte* p = out.data();
  std::memset(p, 0, kMessageSize);
  put_u32(p, kReplyMagic);
  p[4] = static_cast<std::byte>(r.result);
  put_u32(p + 8, r.request_id);
  put_u64(p + 16, r.value_size);
  put_u64(p + 24, r.lease);
  std::memcpy(p + 32, r.ref.data(), kRefSize);
}

std::optional<Reply> decode_reply(std::span<const std::byte> in) noexcept {
  if (in.size() != kMessageSize) return std::nullopt;
  const std::byte* p = in.data();
  if (get_u32(p) != kReplyMagic || !all_zero(p + 5, 3) || get_u32(p + 12) != 0) return std::nullopt;
  const auto res = std::to_integer<std::uint8_t>(p[4]);
  if (res > static_cast<std::uint8_t>(Result::bad_request)) return std::nullopt;
  Reply r;
  r.result = static_cast<Result>(res);
  r.request_id = get_u32(p + 8);
  r.value_size = get_u64(p + 16);
  r.lease = get_u64(p + 24);
  std::memcpy(r.ref.data(), p + 32, kRefSize);
  return r;
}

}  // namespace kv
