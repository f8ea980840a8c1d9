#pragma once
// The TCP bootstrap's wire format, as pure functions over bytes, so every
// parser of bytes from another process is reachable from a fuzzer
// (test/fuzz/bootstrap_*_fuzz.cpp) and from unit tests without sockets.
// Internal: lib/transport/bootstrap.cpp is the only user in the library.
//
// Handshake (version 2), all integers little-endian:
//   rank 0 -> rank r  Challenge  magic "RBCH", u16 version, u16 flags
//                                (bit 0: rank 0 requires the job key),
//                                32-byte server nonce                  40 B
//   rank r -> rank 0  Hello      magic "RBHL", u16 version, u16 flags
//                                (bit 0: the MAC field is a proof), u32 rank,
//                                u32 size, 32-byte client nonce, 32-byte MAC
//                                = HMAC-SHA256(key, kHelloContext || server
//                                nonce || client nonce || rank || size)  80 B
//   rank 0 -> rank r  Verdict    magic "RBVD", u32 code, u32 detail, 32-byte
//                                MAC = HMAC-SHA256(key, kVerdictContext ||
//                                server nonce || client nonce || rank ||
//                                size || code) when rank 0 has a key    44 B
// The two contexts differ, so a hello can never be reflected as a verdict.
// Frames after the handshake: magic "RFRM", u32 collective sequence, u64
// payload length, payload. Rank 0's reply to an allgather is one frame whose
// payload is u32 count, then (u64 length, bytes) per rank.
//
// Thread-safety: pure functions; a FrameReader is a single-threaded value.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/hmac.hpp"

namespace regpool::bootwire {

constexpr std::uint32_t kChallengeMagic = 0x48434252;  // "RBCH"
constexpr std::uint32_t kHelloMagic = 0x4c484252;      // "RBHL"
constexpr std::uint32_t kVerdictMagic = 0x44564252;    // "RBVD"
constexpr std::uint32_t kFrameMagic = 0x4d524652;      // "RFRM"
constexpr std::uint16_t kVersion = 2;
constexpr std::size_t kNonceSize = 32;
constexpr std::size_t kMacSize = 32;
constexpr std::size_t kChallengeSize = 40;
constexpr std::size_t kHelloSize = 80;
constexpr std::size_t kVerdictSize = 44;
constexpr std::size_t kFrameHeaderSize = 16;
constexpr std::string_view kHelloContext = "regpool-bootstrap-v2 hello";
constexpr std::string_view kVerdictContext = "regpool-bootstrap-v2 verdict";

using Nonce = std::array<std::byte, kNonceSize>;
using Mac = std::array<std::byte, kMacSize>;

struct Challenge {
  bool key_required = false;
  Nonce nonce{};
};

struct Hello {
  bool has_mac = false;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  Nonce nonce{};
  Mac mac{};
};

enum class VerdictCode : std::uint32_t {
  accepted = 0,
  bad_key = 1,            // the hello's MAC is wrong
  missing_key = 2,        // rank 0 requires a key; the hello carries no proof
  unexpected_key = 3,     // the hello carries a proof; rank 0 has no key
  duplicate_rank = 4,     // detail: the rank
  rank_out_of_range = 5,  // detail: rank 0's size
  size_mismatch = 6,      // detail: rank 0's size
  bad_version = 7,        // detail: rank 0's version
};
constexpr std::uint32_t kMaxVerdictCode = 7;
const char* to_string(VerdictCode c) noexcept;

struct Verdict {
  VerdictCode code = VerdictCode::accepted;
  std::uint32_t detail = 0;
  Mac mac{};
};

struct FrameHeader {
  std::uint32_t sequence = 0;
  std::uint64_t length = 0;
};

std::array<std::byte, kChallengeSize> encode(const Challenge& c) noexcept;
std::array<std::byte, kHelloSize> encode(const Hello& h) noexcept;
std::array<std::byte, kVerdictSize> encode(const Verdict& v) noexcept;
std::array<std::byte, kFrameHeaderSize> encode(const FrameHeader& f) noexcept;

// Each parser takes exactly the message's bytes. On failure it returns
// nullopt and says in `why` what was wrong (magic, version, flags, ...), in
// words fit for a log line. Nothing is trusted beyond the format here:
// ranks and sizes are checked against the job by the caller.
std::optional<Challenge> parse_challenge(std::span<const std::byte> b, std::string& why);
std::optional<Hello> parse_hello(std::span<const std::byte> b, std::string& why);
std::optional<Verdict> parse_verdict(std::span<const std::byte> b, std::string& why);
// Checks magic, sequence and length <= max_length.
std::optional<FrameHeader> parse_frame_header(std::span<const std::byte> b, std::uint32_t expected_sequence,
                                              std::uint64_t max_length, std::string& why);

// Early rejection: true while `prefix` (the first bytes of a message
// received so far) can still be the start of a message with this magic and
// version; lets rank 0 drop garbage at its first wrong byte instead of
// waiting for 80 (rank 0 passes at most the 4 magic bytes, so that another
// version still gets a verdict saying so).
bool plausible_prefix(std::span<const std::byte> prefix, std::uint32_t magic) noexcept;

// MACs. `key` empty: all-zero MAC (no proof).
Mac hello_mac(std::span<const std::byte> key, const Nonce& server, const Nonce& client, std::uint32_t rank,
              std::uint32_t size) noexcept;
Mac verdict_mac(std::span<const std::byte> key, const Nonce& server, const Nonce& client, std::uint32_t rank,
                std::uint32_t size, VerdictCode code) noexcept;

// Reads one frame from bytes that arrive in pieces. Memory grows with the
// bytes actually received (geometric growth of one vector, so capacity stays
// below twice what arrived plus one read), never with the length a header
// announces: a header claiming 64 MiB followed by silence costs 16 bytes.
class FrameReader {
 public:
  enum class State { header, payload, done, failed };
  FrameReader(std::uint32_t expected_sequence, std::uint64_t max_length) noexcept
      : sequence_(expected_sequence), max_(max_length) {}
  // Bytes the reader still wants (never reads past its frame, so the next
  // frame's bytes stay in the socket).
  std::size_t wanted() const noexcept;
  // Consumes min(bytes.size(), wanted()) bytes and returns how many.
  std::size_t feed(std::span<const std::byte> bytes);
  State state() const noexcept { return state_; }
  const std::string& error() const noexcept { return error_; }
  // Announced length, valid once the header is read.
  std::uint64_t length() const noexcept { return header_.length; }
  std::size_t received() const noexcept { return payload_.size(); }
  std::size_t capacity() const noexcept { return payload_.capacity(); }
  std::vector<std::byte> take() noexcept { return std::move(payload_); }

 private:
  std::uint32_t sequence_;
  std::uint64_t max_;
  State state_ = State::header;
  std::array<std::byte, kFrameHeaderSize> head_{};
  std::size_t head_len_ = 0;
  FrameHeader header_{};
  std::vector<std::byte> payload_;
  std::string error_;
};

// Rank 0's allgather reply. pack_gathered is the inverse of unpack_gathered.
std::vector<std::byte> pack_gathered(const std::vector<std::vector<std::byte>>& all);
std::optional<std::vector<std::vector<std::byte>>> unpack_gathered(std::span<const std::byte> b,
                                                                   std::size_t expected_count, std::string& why);

}  // namespace regpool::bootwire
