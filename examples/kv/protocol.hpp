#pragma once
// Wire format of the key-value example. Every message that crosses a
// process boundary has a fixed size and is little-endian, and every decoder
// here is a pure function that validates each field before the server or
// client uses it: a peer may send anything.
//
// Joining (over a plain TCP connection to the server's port, then closed):
//   client -> server   Hello   "KVH1" | u32 name length | endpoint name
//   server -> client   Welcome "KVW1" | u32 client id | u64 session token |
//                              u32 name length | server endpoint name
// Requests and replies (regpool send/post_recv, kMessageSize bytes each):
//   Request "KVRQ" | u8 op | u8 key length | u16 0 | u32 client id |
//           u32 request id | u64 session token | u64 argument | key[64]
//   Reply   "KVRP" | u8 result | u8 0 | u16 0 | u32 request id | u32 0 |
//           u64 value size | u64 lease id | encoded RemoteRef (64 bytes)
// The argument is the value size (put) or the lease id (commit, done).

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kv {

inline constexpr std::size_t kMaxKey = 64;
inline constexpr std::size_t kMessageSize = 96;
inline constexpr std::size_t kRefSize = 64;  // regpool::RemoteRef::kEncodedSize
inline constexpr std::size_t kMaxName = 4096;  // endpoint names are far smaller

enum class Op : std::uint8_t {
  put = 1,     // argument: value size; reply: a write lease (exposure) for it
  commit = 2,  // argument: lease id; the written value becomes the key's value
  get = 3,     // reply: value size and a read lease on the current value
  done = 4,    // argument: lease id; the client finished reading
  ping = 5,    // keep the client's membership lease alive
  bye = 6,     // leave; the server releases everything the client holds
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
  Op op = Op::ping;
  std::uint32_t client_id = 0;
  std::uint32_t request_id = 0;
  std::uint64_t token = 0;
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

struct Welcome {
  std::uint32_t client_id = 0;
  std::uint64_t token = 0;
  std::vector<std::byte> server_name;
};

// Encoders write exactly kMessageSize bytes; keys longer than kMaxKey are
// the caller's bug and are truncated.
void encode(const Request& r, std::span<std::byte, kMessageSize> out) noexcept;
void encode(const Reply& r, std::span<std::byte, kMessageSize> out) noexcept;
// nullopt for a wrong size or magic, an unknown op or result, a key length
// above kMaxKey, or non-zero reserved bytes.
std::optional<Request> decode_request(std::span<const std::byte> in) noexcept;
std::optional<Reply> decode_reply(std::span<const std::byte> in) noexcept;

std::vector<std::byte> encode_hello(std::span<const std::byte> endpoint_name);
std::vector<std::byte> encode_welcome(const Welcome& w);
// Length prefixes are checked against kMaxName and the bytes present.
std::optional<std::vector<std::byte>> decode_hello(std::span<const std::byte> in);
std::optional<Welcome> decode_welcome(std::span<const std::byte> in);

}  // namespace kv
