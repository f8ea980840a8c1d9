#pragma once
// Wire format of the key-value example. Every message that crosses a
// process boundary has a fixed size and is little-endian, and every decoder
// here is a pure function that validates each field before the server or
// client uses it: a peer may send anything.
//
// Joining is regpool's (regpool::Listener / regpool::connect, with its own
// fuzzed wire format); this file is only what the service itself says.
// Requests and replies (regpool send/post_recv, kMessageSize bytes each):
//   Request "KVRQ" | u8 op | u8 key length | u16 0 | u32 0 |
//           u32 request id | u64 epoch | u64 argument | key[64]
//   Reply   "KVRP" | u8 result | u8 0 | u16 0 | u32 request id | u32 0 |
//           u64 value size | u64 lease id | encoded RemoteRef (64 bytes)
// The argument is the value size (put) or the lease id (commit, done). The
// epoch is the client's incarnation (regpool::Connection::epoch()): the
// server knows who sent a request from the transport (Completion::peer),
// and the epoch lets it refuse one sent by an earlier incarnation of a
// client whose PeerId was reused.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace kv {

inline constexpr std::size_t kMaxKey = 64;
inline constexpr std::size_t kMessageSize = 96;
inline constexpr std::size_t kRefSize = 64;  // regpool::RemoteRef::kEncodedSize

enum class Op : std::uint8_t {
  put = 1,     // argument: value size; reply: a write lease (exposure) for it
  commit = 2,  // argument: lease id; the written value becomes the key's value
  get = 3,     // reply: value size and a read lease on the current value
  done = 4,    // argument: lease id; the client finished reading
};

enum class Result : std::uint8_t {
  ok = 0,
  not_found = 1,
  too_large = 2,    // value above the server's --max-value
  busy = 3,         // too many leases held, or the server's pool is full
  bad_request = 4,  // unknown lease, wrong state
};
const char* to_string(Result r) noexcept;

struct Request {
  Op op = Op::get;
  std::uint32_t request_id = 0;
  std::uint64_t epoch = 0;
  std::uint64_t argument = 0;
  std::string key;  // at most kMaxKey bytes
};

struct Reply {
  Result result = Result::ok;
  std::uint32_t request_id = 0;
  std::uint64_t value_size = 0;
  std::uint64_t lease = 0;
  std::array<std::byte, kRefSize> ref{};  // zero unless a lease was granted
};

// Encoders write exactly kMessageSize bytes; keys longer than kMaxKey are
// the caller's bug and are truncated.
void encode(const Request& r, std::span<std::byte, kMessageSize> out) noexcept;
void encode(const Reply& r, std::span<std::byte, kMessageSize> out) noexcept;
// nullopt for a wrong size or magic, an unknown op or result, a key length
// above kMaxKey, or non-zero reserved bytes.
std::optional<Request> decode_request(std::span<const std::byte> in) noexcept;
std::optional<Reply> decode_reply(std::span<const std::byte> in) noexcept;

}  // namespace kv
