// Fuzzes the membership protocol's parsers (lib/membership/membership_wire.*:
// what a client sends a Listener before it is authenticated, and what a
// server sends connect()). Properties checked on every input, not only "no
// crash":
//  - whatever parses re-encodes to exactly the input bytes (one encoding
//    per meaning), and a failed parse always says why;
//  - a parsed join or welcome respects the name limit it was parsed with,
//    and a keyless one carries the all-zero MAC;
//  - an admitting welcome never carries epoch 0;
//  - MACs are deterministic, never zero with a key, bound to the server
//    nonce, and a join MAC never verifies as a welcome MAC;
//  - the server's path (a bootstrap FrameReader bounded by the join limit,
//    fed in pieces, then parse_join) never buffers more than it received.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "membership/membership_wire.hpp"
#include "transport/hmac.hpp"

namespace mw = regpool::memwire;
namespace bw = regpool::bootwire;

namespace {

void same_bytes(const std::vector<std::byte>& a, std::span<const std::byte> b) {
  if (a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size()) != 0) std::abort();
}

bool zero(const mw::Mac& m) {
  for (std::byte x : m) {
    if (x != std::byte{0}) return false;
  }
  return true;
}

void check_join(std::span<const std::byte> in, std::size_t max_name) {
  std::string why;
  auto j = mw::parse_join(in, max_name, why);
  if (!j) {
    if (why.empty()) std::abort();
    return;
  }
  if (j->name.empty() || j->name.size() > max_name) std::abort();
  if (!j->has_mac && !zero(j->mac)) std::abort();
  same_bytes(mw::encode(*j), in);
  // Key and server nonce from the input itself, so the fuzzer varies them.
  const std::span<const std::byte> key(j->nonce.data(), 1 + std::to_integer<std::size_t>(j->nonce[0]) % 31);
  bw::Nonce server = j->nonce;
  const auto m1 = mw::join_mac(key, server, *j);
  if (m1 != mw::join_mac(key, server, *j) || zero(m1)) std::abort();
  if (!zero(mw::join_mac({}, server, *j))) std::abort();
  server[31] ^= std::byte{1};
  if (regpool::detail::equal_constant_time(m1, mw::join_mac(key, server, *j))) std::abort();
  // Never valid as a welcome MAC over related fields (distinct contexts).
  mw::Welcome w;
  w.name = j->name;
  w.epoch = j->client_id;
  if (regpool::detail::equal_constant_time(m1, mw::welcome_mac(key, j->nonce, j->nonce, w))) std::abort();
}

void check_welcome(std::span<const std::byte> in, std::size_t max_name) {
  std::string why;
  auto w = mw::parse_welcome(in, max_name, why);
  if (!w) {
    if (why.empty()) std::abort();
    return;
  }
  if (w->name.empty() || w->name.size() > max_name) std::abort();
  if (!w->has_mac && !zero(w->mac)) std::abort();
  if (w->code == mw::WelcomeCode::accepted && w->epoch == 0) std::abort();
  if (static_cast<std::uint32_t>(w->code) > mw::kMaxWelcomeCode) std::abort();
  same_bytes(mw::encode(*w), in);
  const std::span<const std::byte> key(w->name.data(), w->name.size());
  const bw::Nonce n{};
  const auto m1 = mw::welcome_mac(key, n, n, *w);
  if (m1 != mw::welcome_mac(key, n, n, *w) || zero(m1)) std::abort();
  // The MAC covers every field: another epoch gives another MAC.
  mw::Welcome other = *w;
  other.epoch ^= 1;
  if (regpool::detail::equal_constant_time(m1, mw::welcome_mac(key, n, n, other))) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  check_join(in, mw::kMaxName);
  check_join(in, 16);
  check_welcome(in, mw::kMaxName);
  check_welcome(in, 16);
  std::string why;
  if (auto e = mw::parse_bye(in, why)) {
    const auto again = mw::encode_bye(*e);
    same_bytes({again.begin(), again.end()}, in);
  } else if (why.empty()) {
    std::abort();
  }
  // The server's path: a join frame arriving in pieces of varying size.
  bw::FrameReader reader(mw::kJoin, mw::max_join_payload(64));
  std::size_t pos = 0, step = 1, fed = 0;
  while (pos < in.size() && reader.wanted() > 0) {
    const std::size_t n = std::min(step, in.size() - pos);
    const std::size_t took = reader.feed(in.subspan(pos, n));
    if (took > n) std::abort();
    fed += took;
    pos += n;
    step = step * 3 % 97 + 1;
    if (reader.state() == bw::FrameReader::State::failed) break;
  }
  if (reader.received() > fed || reader.capacity() > 2 * reader.received() + 4096) std::abort();
  if (reader.state() == bw::FrameReader::State::done) {
    const std::vector<std::byte> payload = reader.take();
    if (payload.size() > mw::max_join_payload(64)) std::abort();
    check_join(payload, 64);
  }
  return 0;
}
