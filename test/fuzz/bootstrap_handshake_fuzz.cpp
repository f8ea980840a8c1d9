// Fuzzes the bootstrap handshake parsers (challenge, hello, verdict: the
// bytes rank 0 and the other ranks send each other before anything is
// authenticated). Properties checked on every input, not only "no crash":
//  - a parser accepts only inputs of exactly its message size;
//  - whatever parses re-encodes to exactly the input bytes (one encoding per
//    meaning, no field silently normalised);
//  - a failed parse always says why;
//  - plausible_prefix (rank 0's early rejection after 4 bytes) never rejects
//    a prefix of a hello that parses;
//  - a hello's MAC check is deterministic and rejects the all-zero MAC that
//    a keyless hello carries.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "transport/bootstrap_wire.hpp"

namespace bw = regpool::bootwire;

namespace {

template <class Msg, class Parse>
void check_round_trip(std::span<const std::byte> in, std::size_t size, Parse parse) {
  std::string why;
  auto m = parse(in, why);
  if (!m) {
    if (why.empty()) std::abort();
    return;
  }
  if (in.size() != size) std::abort();
  const auto again = bw::encode(Msg(*m));
  if (again.size() != in.size() || std::memcmp(again.data(), in.data(), in.size()) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  check_round_trip<bw::Challenge>(in, bw::kChallengeSize,
                                  [](auto b, std::string& w) { return bw::parse_challenge(b, w); });
  check_round_trip<bw::Hello>(in, bw::kHelloSize, [](auto b, std::string& w) { return bw::parse_hello(b, w); });
  check_round_trip<bw::Verdict>(in, bw::kVerdictSize, [](auto b, std::string& w) { return bw::parse_verdict(b, w); });

  std::string why;
  if (auto h = bw::parse_hello(in, why)) {
    for (std::size_t n = 0; n <= 8; ++n) {
      if (!bw::plausible_prefix(in.first(n), bw::kHelloMagic)) std::abort();
    }
    // The key is the input's own nonce bytes: varied by the fuzzer.
    const std::span<const std::byte> key(h->nonce.data(), 1 + std::to_integer<std::size_t>(h->nonce[0]) % 31);
    const bw::Nonce server = h->nonce;
    const auto m1 = bw::hello_mac(key, server, h->nonce, h->rank, h->size);
    const auto m2 = bw::hello_mac(key, server, h->nonce, h->rank, h->size);
    if (m1 != m2) std::abort();
    const bw::Mac zero{};
    if (regpool::detail::equal_constant_time(m1, zero)) std::abort();
    // The verdict MAC over the same inputs differs (no reflection).
    if (bw::verdict_mac(key, server, h->nonce, h->rank, h->size, bw::VerdictCode::accepted) == m1) std::abort();
  }
  return 0;
}
