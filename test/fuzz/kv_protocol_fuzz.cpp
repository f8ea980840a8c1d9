// Fuzzes the key-value example's decoders (examples/kv/protocol.hpp): what a
// kv server parses from any client, and a client from the server (joining is
// regpool's membership protocol, fuzzed by membership_wire_fuzz.cpp). The
// first input byte picks the decoder, the rest is the message. Properties checked
// on every input, not just "no crash":
//  - fixed-size messages decode only at exactly kMessageSize bytes;
//  - whatever decodes re-encodes to exactly the same bytes (every byte is
//    either a field or a checked-zero reserved byte, so two encodings never
//    mean the same message);
//  - decoded keys are at most kMaxKey bytes.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "../../examples/kv/protocol.hpp"

namespace {

void check_same(std::span<const std::byte> want, std::span<const std::byte> got) {
  if (want.size() != got.size() || std::memcmp(want.data(), got.data(), want.size()) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  std::array<std::byte, kv::kMessageSize> out{};
  switch (data[0] % 2) {
    case 0:
      if (auto r = kv::decode_request(in)) {
        if (in.size() != kv::kMessageSize || r->key.size() > kv::kMaxKey) std::abort();
        kv::encode(*r, out);
        check_same(in, out);
      }
      break;
    case 1:
      if (auto r = kv::decode_reply(in)) {
        if (in.size() != kv::kMessageSize) std::abort();
        kv::encode(*r, out);
        check_same(in, out);
      }
      break;
  }
  return 0;
}
