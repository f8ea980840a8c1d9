#include "membership/membership_wire.hpp"

#include <algorithm>
#include <cstring>

#include "transport/hmac.hpp"
#include "transport/wire_le.hpp"

namespace regpool::memwire {
namespace {

using le::get_u16;
using le::get_u32;
using le::get_u64;
using le::put_u16;
using le::put_u32;
using le::put_u64;

bool zero(const Mac& m) noexcept {
  return std::all_of(m.begin(), m.end(), [](std::byte x) { return x == std::byte{0}; });
}

// Shared checks of a join or welcome payload: version, flags, name length
// against the payload's size. Returns the name length.
std::optional<std::size_t> check_head(std::span<const std::byte> b, std::size_t fixed, std::size_t name_at,
                                      std::size_t max_name, const char* what, std::string& why) {
  if (b.size() < fixed) {
    why = std::string(what) + " of " + std::to_string(b.size()) + " bytes (at least " + std::to_string(fixed) +
          " expected)";
    return std::nullopt;
  }
  const std::uint16_t version = get_u16(b.data());
  if (version != kVersion) {
    why = std::string(what) + " of protocol version " + std::to_string(version) + " (this side speaks " +
          std::to_string(kVersion) + ": mixed regpool versions?)";
    return std::nullopt;
  }
  const std::uint16_t flags = get_u16(b.data() + 2);
  if ((flags & ~1u) != 0) {
    why = std::string(what) + " with unknown flags " + std::to_string(flags);
    return std::nullopt;
  }
  const std::uint32_t n = get_u32(b.data() + name_at);
  if (n == 0 || n > max_name) {
    why = std::string(what) + " with a name of " + std::to_string(n) + " bytes (1.." + std::to_string(max_name) +
          " allowed)";
    return std::nullopt;
  }
  if (b.size() != fixed + n) {
    why = std::string(what) + " of " + std::to_string(b.size()) + " bytes for a name of " + std::to_string(n) +
          " (expected " + std::to_string(fixed + n) + ")";
    return std::nullopt;
  }
  return n;
}

}  // namespace

const char* to_string(WelcomeCode c) noexcept {
  switch (c) {
    case WelcomeCode::accepted: return "accepted";
    case WelcomeCode::bad_key: return "the job key does not match";
    case WelcomeCode::missing_key: return "the server requires the job key and the client has none";
    case WelcomeCode::unexpected_key: return "the client has a job key and the server has none";
    case WelcomeCode::bad_version: return "protocol version mismatch";
    case WelcomeCode::full: return "the server has reached its member limit";
    case WelcomeCode::bad_name: return "the server's endpoint refused the client's endpoint name";
  }
  return "unknown welcome code";
}

std::vector<std::byte> encode(const Join& j) {
  std::vector<std::byte> out(kJoinFixed + j.name.size());
  std::byte* p = out.data();
  put_u16(p, kVersion);
  put_u16(p + 2, j.has_mac ? 1 : 0);
  put_u32(p + 4, static_cast<std::uint32_t>(j.name.size()));
  put_u64(p + 8, j.client_id);
  std::memcpy(p + 16, j.nonce.data(), j.nonce.size());
  if (!j.name.empty()) std::memcpy(p + 48, j.name.data(), j.name.size());
  std::memcpy(p + 48 + j.name.size(), j.mac.data(), j.mac.size());
  return out;
}

std::vector<std::byte> encode(const Welcome& w) {
  std::vector<std::byte> out(kWelcomeFixed + w.name.size());
  std::byte* p = out.data();
  put_u16(p, kVersion);
  put_u16(p + 2, w.has_mac ? 1 : 0);
  put_u32(p + 4, static_cast<std::uint32_t>(w.code));
  put_u32(p + 8, w.detail);
  put_u32(p + 12, w.peer);
  put_u64(p + 16, w.epoch);
  put_u32(p + 24, w.liveness_ms);
  put_u32(p + 28, static_cast<std::uint32_t>(w.name.size()));
  if (!w.name.empty()) std::memcpy(p + 32, w.name.data(), w.name.size());
  std::memcpy(p + 32 + w.name.size(), w.mac.data(), w.mac.size());
  return out;
}

std::array<std::byte, kByeSize> encode_bye(std::uint64_t epoch) noexcept {
  std::array<std::byte, kByeSize> out{};
  put_u64(out.data(), epoch);
  return out;
}

std::optional<std::uint16_t> payload_version(std::span<const std::byte> payload) noexcept {
  if (payload.size() < 2) return std::nullopt;
  return get_u16(payload.data());
}

std::optional<Join> parse_join(std::span<const std::byte> b, std::size_t max_name, std::string& why) {
  const auto n = check_head(b, kJoinFixed, 4, max_name, "join", why);
  if (!n) return std::nullopt;
  Join j;
  j.has_mac = (get_u16(b.data() + 2) & 1u) != 0;
  j.client_id = get_u64(b.data() + 8);
  std::memcpy(j.nonce.data(), b.data() + 16, j.nonce.size());
  j.name.assign(b.begin() + 48, b.begin() + 48 + static_cast<std::ptrdiff_t>(*n));
  std::memcpy(j.mac.data(), b.data() + 48 + *n, j.mac.size());
  if (!j.has_mac && !zero(j.mac)) {
    // One encoding per meaning: no proof means a zero MAC field.
    why = "join without a proof but with a non-zero MAC field";
    return std::nullopt;
  }
  return j;
}

std::optional<Welcome> parse_welcome(std::span<const std::byte> b, std::size_t max_name, std::string& why) {
  // A refusal carries no server name: give it a length of at least 1 all
  // the same (the server sends its name in every welcome), so the format
  // has one shape.
  const auto n = check_head(b, kWelcomeFixed, 28, max_name, "welcome", why);
  if (!n) return std::nullopt;
  Welcome w;
  w.has_mac = (get_u16(b.data() + 2) & 1u) != 0;
  const std::uint32_t code = get_u32(b.data() + 4);
  if (code > kMaxWelcomeCode) {
    why = "welcome with unknown code " + std::to_string(code);
    return std::nullopt;
  }
  w.code = static_cast<WelcomeCode>(code);
  w.detail = get_u32(b.data() + 8);
  w.peer = get_u32(b.data() + 12);
  w.epoch = get_u64(b.data() + 16);
  w.liveness_ms = get_u32(b.data() + 24);
  w.name.assign(b.begin() + 32, b.begin() + 32 + static_cast<std::ptrdiff_t>(*n));
  std::memcpy(w.mac.data(), b.data() + 32 + *n, w.mac.size());
  if (!w.has_mac && !zero(w.mac)) {
    why = "welcome without a proof but with a non-zero MAC field";
    return std::nullopt;
  }
  if (w.code == WelcomeCode::accepted && w.epoch == 0) {
    why = "welcome admitting the client with epoch 0 (epochs start at 1)";
    return std::nullopt;
  }
  return w;
}

std::optional<std::uint64_t> parse_bye(std::span<const std::byte> b, std::string& why) {
  if (b.size() != kByeSize) {
    why = "bye of " + std::to_string(b.size()) + " bytes (expected " + std::to_string(kByeSize) + ")";
    return std::nullopt;
  }
  return get_u64(b.data());
}

Mac join_mac(std::span<const std::byte> key, const Nonce& server, const Join& j) noexcept {
  Mac out{};
  if (key.empty()) return out;
  detail::HmacSha256 h(key);
  h.update(kJoinContext);
  h.update(server);
  h.update(j.nonce);
  std::byte b[12];
  put_u64(b, j.client_id);
  put_u32(b + 8, static_cast<std::uint32_t>(j.name.size()));
  h.update(b);
  h.update(j.name);
  return h.finish();
}

Mac welcome_mac(std::span<const std::byte> key, const Nonce& server, const Nonce& client, const Welcome& w) {
  Mac out{};
  if (key.empty()) return out;
  const std::vector<std::byte> body = encode(w);
  detail::HmacSha256 h(key);
  h.update(kWelcomeContext);
  h.update(server);
  h.update(client);
  // Everything before the MAC field, as sent.
  h.update(std::span<const std::byte>(body.data(), body.size() - out.size()));
  return h.finish();
}

}  // namespace regpool::memwire
