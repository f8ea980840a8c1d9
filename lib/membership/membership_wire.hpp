#pragma once
// The membership protocol's wire format (Listener / connect, see
// include/regpool/membership.hpp and docs/membership.md), as pure functions
// over bytes, so every parser of bytes from a client or a server is
// reachable from a fuzzer (test/fuzz/membership_wire_fuzz.cpp) and from
// unit tests without sockets. Internal.
//
// It reuses the bootstrap's pieces rather than copying them: the server's
// first message is the bootstrap Challenge (bootwire::Challenge, 40 B), and
// every later message is a bootstrap frame (bootwire::FrameHeader: magic
// "RFRM", u32 "sequence", u64 length) whose sequence field names the
// message kind. All integers little-endian.
//
//   server -> client  Challenge (bootwire), fresh 32-byte server nonce
//   client -> server  frame kJoin, payload:
//                       u16 version, u16 flags (bit 0: MAC is a proof),
//                       u32 name length n, u64 client id,
//                       32-byte client nonce, n bytes endpoint name,
//                       32-byte MAC = HMAC-SHA256(key, kJoinContext ||
//                       server nonce || client nonce || client id ||
//                       n || name)                              80 + n B
//   server -> client  frame kWelcome, payload:
//                       u16 version, u16 flags (bit 0: MAC is a proof),
//                       u32 code, u32 detail, u32 peer (the client's
//                       PeerId at the server), u64 epoch, u32 liveness
//                       bound in ms, u32 name length n, n bytes server
//                       endpoint name, 32-byte MAC = HMAC-SHA256(key,
//                       kWelcomeContext || server nonce || client nonce ||
//                       the payload before the MAC)            64 + n B
//   either way        frame kBye, payload: u64 epoch (a clean leave)
// The contexts differ from each other and from the bootstrap's, so no
// message of one kind or protocol can be replayed as another.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/bootstrap_wire.hpp"

namespace regpool::memwire {

using bootwire::Mac;
using bootwire::Nonce;

constexpr std::uint32_t kJoin = 0x4e494f4a;     // "JOIN"
constexpr std::uint32_t kWelcome = 0x4d434c57;  // "WLCM"
constexpr std::uint32_t kBye = 0x21455942;      // "BYE!"
constexpr std::uint16_t kVersion = 1;
constexpr std::size_t kJoinFixed = 80;     // everything but the name
constexpr std::size_t kWelcomeFixed = 64;                         // everything but the name
constexpr std::size_t kByeSize = 8;
// Names are endpoint names (tens of bytes); anything longer is garbage.
constexpr std::size_t kMaxName = 4096;
constexpr std::string_view kJoinContext = "regpool-membership-v1 join";
constexpr std::string_view kWelcomeContext = "regpool-membership-v1 welcome";

struct Join {
  bool has_mac = false;
  std::uint64_t client_id = 0;
  Nonce nonce{};
  std::vector<std::byte> name;
  Mac mac{};
};

enum class WelcomeCode : std::uint32_t {
  accepted = 0,
  bad_key = 1,         // the join's MAC is wrong
  missing_key = 2,     // the server requires a key; the join has no proof
  unexpected_key = 3,  // the join has a proof; the server has no key
  bad_version = 4,     // detail: the server's version
  full = 5,            // detail: the server's member limit
  bad_name = 6,        // the endpoint could not insert the name
};
constexpr std::uint32_t kMaxWelcomeCode = 6;
const char* to_string(WelcomeCode c) noexcept;

struct Welcome {
  bool has_mac = false;
  WelcomeCode code = WelcomeCode::accepted;
  std::uint32_t detail = 0;
  std::uint32_t peer = 0;
  std::uint64_t epoch = 0;
  std::uint32_t liveness_ms = 0;
  std::vector<std::byte> name;
  Mac mac{};
};

std::vector<std::byte> encode(const Join& j);
std::vector<std::byte> encode(const Welcome& w);
std::array<std::byte, kByeSize> encode_bye(std::uint64_t epoch) noexcept;

// Version field of a join or welcome payload (so that a peer of another
// version gets an answer saying so), or nullopt when too short.
std::optional<std::uint16_t> payload_version(std::span<const std::byte> payload) noexcept;
// Each parser takes exactly one frame's payload. On failure: nullopt, and
// `why` says what was wrong in words fit for a log line. Names are checked
// for length only (1..max_name); the endpoint validates their contents.
std::optional<Join> parse_join(std::span<const std::byte> payload, std::size_t max_name, std::string& why);
std::optional<Welcome> parse_welcome(std::span<const std::byte> payload, std::size_t max_name, std::string& why);
std::optional<std::uint64_t> parse_bye(std::span<const std::byte> payload, std::string& why);

// Largest join / welcome payload for a name limit (frame length bound).
constexpr std::uint64_t max_join_payload(std::size_t max_name) noexcept { return kJoinFixed + max_name; }
constexpr std::uint64_t max_welcome_payload(std::size_t max_name) noexcept { return kWelcomeFixed + max_name; }

// MACs; `key` empty: all-zero MAC (no proof).
Mac join_mac(std::span<const std::byte> key, const Nonce& server, const Join& j) noexcept;
Mac welcome_mac(std::span<const std::byte> key, const Nonce& server, const Nonce& client, const Welcome& w);

}  // namespace regpool::memwire
