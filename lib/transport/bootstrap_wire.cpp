#include "transport/bootstrap_wire.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "transport/wire_le.hpp"

namespace regpool::bootwire {
namespace {

using detail::HmacSha256;

using le::get_u16;
using le::get_u32;
using le::get_u64;
using le::put_u16;
using le::put_u32;
using le::put_u64;

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

bool check_size(std::span<const std::byte> b, std::size_t want, const char* what, std::string& why) {
  if (b.size() == want) return true;
  why = std::string(what) + " of " + std::to_string(b.size()) + " bytes (expected " + std::to_string(want) + ")";
  return false;
}

// Magic and version shared by challenge and hello.
bool check_head(std::span<const std::byte> b, std::uint32_t magic, const char* what, std::string& why) {
  if (get_u32(b.data()) != magic) {
    why = std::string(what) + " with bad magic " + hex32(get_u32(b.data())) + " (not a regpool bootstrap peer?)";
    return false;
  }
  const std::uint16_t version = get_u16(b.data() + 4);
  if (version != kVersion) {
    why = std::string(what) + " of protocol version " + std::to_string(version) + " (this side speaks " +
          std::to_string(kVersion) + ": mixed regpool versions?)";
    return false;
  }
  return true;
}

void put_le32(HmacSha256& h, std::uint32_t v) noexcept {
  std::byte b[4];
  put_u32(b, v);
  h.update(b);
}

}  // namespace

const char* to_string(VerdictCode c) noexcept {
  switch (c) {
    case VerdictCode::accepted: return "accepted";
    case VerdictCode::bad_key: return "the job key does not match";
    case VerdictCode::missing_key: return "rank 0 requires the job key and this rank has none";
    case VerdictCode::unexpected_key: return "this rank has a job key and rank 0 has none";
    case VerdictCode::duplicate_rank: return "the rank is already taken";
    case VerdictCode::rank_out_of_range: return "rank out of range";
    case VerdictCode::size_mismatch: return "job size mismatch";
    case VerdictCode::bad_version: return "protocol version mismatch";
  }
  return "unknown verdict";
}

std::array<std::byte, kChallengeSize> encode(const Challenge& c) noexcept {
  std::array<std::byte, kChallengeSize> out{};
  put_u32(out.data(), kChallengeMagic);
  put_u16(out.data() + 4, kVersion);
  put_u16(out.data() + 6, c.key_required ? 1 : 0);
  std::memcpy(out.data() + 8, c.nonce.data(), kNonceSize);
  return out;
}

std::array<std::byte, kHelloSize> encode(const Hello& h) noexcept {
  std::array<std::byte, kHelloSize> out{};
  put_u32(out.data(), kHelloMagic);
  put_u16(out.data() + 4, kVersion);
  put_u16(out.data() + 6, h.has_mac ? 1 : 0);
  put_u32(out.data() + 8, h.rank);
  put_u32(out.data() + 12, h.size);
  std::memcpy(out.data() + 16, h.nonce.data(), kNonceSize);
  std::memcpy(out.data() + 48, h.mac.data(), kMacSize);
  return out;
}

std::array<std::byte, kVerdictSize> encode(const Verdict& v) noexcept {
  std::array<std::byte, kVerdictSize> out{};
  put_u32(out.data(), kVerdictMagic);
  put_u32(out.data() + 4, static_cast<std::uint32_t>(v.code));
  put_u32(out.data() + 8, v.detail);
  std::memcpy(out.data() + 12, v.mac.data(), kMacSize);
  return out;
}

std::array<std::byte, kFrameHeaderSize> encode(const FrameHeader& f) noexcept {
  std::array<std::byte, kFrameHeaderSize> out{};
  put_u32(out.data(), kFrameMagic);
  put_u32(out.data() + 4, f.sequence);
  put_u64(out.data() + 8, f.length);
  return out;
}

std::optional<Challenge> parse_challenge(std::span<const std::byte> b, std::string& why) {
  if (!check_size(b, kChallengeSize, "challenge", why) || !check_head(b, kChallengeMagic, "challenge", why)) {
    return std::nullopt;
  }
  const std::uint16_t flags = get_u16(b.data() + 6);
  if ((flags & ~1u) != 0) {
    why = "challenge with unknown flags " + hex32(flags);
    return std::nullopt;
  }
  Challenge c;
  c.key_required = (flags & 1u) != 0;
  std::memcpy(c.nonce.data(), b.data() + 8, kNonceSize);
  return c;
}

std::optional<Hello> parse_hello(std::span<const std::byte> b, std::string& why) {
  if (!check_size(b, kHelloSize, "hello", why) || !check_head(b, kHelloMagic, "hello", why)) return std::nullopt;
  const std::uint16_t flags = get_u16(b.data() + 6);
  if ((flags & ~1u) != 0) {
    why = "hello with unknown flags " + hex32(flags);
    return std::nullopt;
  }
  Hello h;
  h.has_mac = (flags & 1u) != 0;
  h.rank = get_u32(b.data() + 8);
  h.size = get_u32(b.data() + 12);
  std::memcpy(h.nonce.data(), b.data() + 16, kNonceSize);
  std::memcpy(h.mac.data(), b.data() + 48, kMacSize);
  if (!h.has_mac && std::any_of(h.mac.begin(), h.mac.end(), [](std::byte x) { return x != std::byte{0}; })) {
    // One encoding per meaning: no proof means a zero MAC field.
    why = "hello without a proof but with a non-zero MAC field";
    return std::nullopt;
  }
  return h;
}

std::optional<Verdict> parse_verdict(std::span<const std::byte> b, std::string& why) {
  if (!check_size(b, kVerdictSize, "verdict", why)) return std::nullopt;
  if (get_u32(b.data()) != kVerdictMagic) {
    why = "verdict with bad magic " + hex32(get_u32(b.data()));
    return std::nullopt;
  }
  const std::uint32_t code = get_u32(b.data() + 4);
  if (code > kMaxVerdictCode) {
    why = "verdict with unknown code " + std::to_string(code);
    return std::nullopt;
  }
  Verdict v;
  v.code = static_cast<VerdictCode>(code);
  v.detail = get_u32(b.data() + 8);
  std::memcpy(v.mac.data(), b.data() + 12, kMacSize);
  return v;
}

std::optional<FrameHeader> parse_frame_header(std::span<const std::byte> b, std::uint32_t expected_sequence,
                                              std::uint64_t max_length, std::string& why) {
  if (!check_size(b, kFrameHeaderSize, "frame header", why)) return std::nullopt;
  if (get_u32(b.data()) != kFrameMagic) {
    why = "frame header with bad magic " + hex32(get_u32(b.data()));
    return std::nullopt;
  }
  FrameHeader f;
  f.sequence = get_u32(b.data() + 4);
  f.length = get_u64(b.data() + 8);
  if (f.sequence != expected_sequence) {
    why = "frame for collective #" + std::to_string(f.sequence) + " while in collective #" +
          std::to_string(expected_sequence) + " (ranks calling different numbers of collectives?)";
    return std::nullopt;
  }
  if (f.length > max_length) {
    why = "frame header announcing " + std::to_string(f.length) + " bytes (limit " + std::to_string(max_length) +
          ", TcpBootstrapConfig::max_blob)";
    return std::nullopt;
  }
  return f;
}

bool plausible_prefix(std::span<const std::byte> prefix, std::uint32_t magic) noexcept {
  std::byte want[6];
  put_u32(want, magic);
  put_u16(want + 4, kVersion);
  const std::size_t n = std::min<std::size_t>(prefix.size(), sizeof want);
  return std::memcmp(prefix.data(), want, n) == 0;
}

Mac hello_mac(std::span<const std::byte> key, const Nonce& server, const Nonce& client, std::uint32_t rank,
              std::uint32_t size) noexcept {
  Mac out{};
  if (key.empty()) return out;
  HmacSha256 h(key);
  h.update(kHelloContext);
  h.update(server);
  h.update(client);
  put_le32(h, rank);
  put_le32(h, size);
  return h.finish();
}

Mac verdict_mac(std::span<const std::byte> key, const Nonce& server, const Nonce& client, std::uint32_t rank,
                std::uint32_t size, VerdictCode code) noexcept {
  Mac out{};
  if (key.empty()) return out;
  HmacSha256 h(key);
  h.update(kVerdictContext);
  h.update(server);
  h.update(client);
  put_le32(h, rank);
  put_le32(h, size);
  put_le32(h, static_cast<std::uint32_t>(code));
  return h.finish();
}

std::size_t FrameReader::wanted() const noexcept {
  switch (state_) {
    case State::header: return kFrameHeaderSize - head_len_;
    case State::payload: return static_cast<std::size_t>(header_.length - payload_.size());
    default: return 0;
  }
}

std::size_t FrameReader::feed(std::span<const std::byte> bytes) {
  std::size_t used = 0;
  if (state_ == State::header && !bytes.empty()) {
    const std::size_t take = std::min(bytes.size(), kFrameHeaderSize - head_len_);
    std::memcpy(head_.data() + head_len_, bytes.data(), take);
    head_len_ += take;
    used = take;
    if (head_len_ < kFrameHeaderSize) return used;
    auto h = parse_frame_header(head_, sequence_, max_, error_);
    if (!h) {
      state_ = State::failed;
      return used;
    }
    header_ = *h;
    state_ = header_.length == 0 ? State::done : State::payload;
  }
  if (state_ == State::payload && used < bytes.size()) {
    const std::size_t take = std::min(bytes.size() - used, wanted());
    // insert() grows the vector geometrically from what has arrived, never
    // to the announced length.
    payload_.insert(payload_.end(), bytes.begin() + static_cast<std::ptrdiff_t>(used),
                    bytes.begin() + static_cast<std::ptrdiff_t>(used + take));
    used += take;
    if (payload_.size() == header_.length) state_ = State::done;
  }
  return used;
}

std::vector<std::byte> pack_gathered(const std::vector<std::vector<std::byte>>& all) {
  std::size_t total = 4;
  for (const auto& b : all) total += 8 + b.size();
  std::vector<std::byte> out(total);
  put_u32(out.data(), static_cast<std::uint32_t>(all.size()));
  std::size_t pos = 4;
  for (const auto& b : all) {
    put_u64(out.data() + pos, b.size());
    pos += 8;
    if (!b.empty()) std::memcpy(out.data() + pos, b.data(), b.size());
    pos += b.size();
  }
  return out;
}

std::optional<std::vector<std::vector<std::byte>>> unpack_gathered(std::span<const std::byte> b,
                                                                   std::size_t expected_count, std::string& why) {
  if (b.size() < 4) {
    why = "allgather reply of " + std::to_string(b.size()) + " bytes, too short for its count";
    return std::nullopt;
  }
  const std::uint32_t count = get_u32(b.data());
  if (count != expected_count) {
    why = "allgather reply with " + std::to_string(count) + " blobs for a job of " + std::to_string(expected_count);
    return std::nullopt;
  }
  std::vector<std::vector<std::byte>> all;
  all.reserve(count);
  std::size_t pos = 4;
  for (std::uint32_t r = 0; r < count; ++r) {
    if (b.size() - pos < 8) {
      why = "allgather reply truncated in the length of rank " + std::to_string(r) + "'s blob";
      return std::nullopt;
    }
    const std::uint64_t len = get_u64(b.data() + pos);
    pos += 8;
    if (len > b.size() - pos) {
      why = "allgather reply announcing " + std::to_string(len) + " bytes for rank " + std::to_string(r) +
            " with only " + std::to_string(b.size() - pos) + " left";
      return std::nullopt;
    }
    all.emplace_back(b.begin() + static_cast<std::ptrdiff_t>(pos),
                     b.begin() + static_cast<std::ptrdiff_t>(pos + static_cast<std::size_t>(len)));
    pos += static_cast<std::size_t>(len);
  }
  if (pos != b.size()) {
    why = "allgather reply with " + std::to_string(b.size() - pos) + " trailing bytes";
    return std::nullopt;
  }
  return all;
}

}  // namespace regpool::bootwire
