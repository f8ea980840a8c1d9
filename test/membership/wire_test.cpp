// The membership wire format without sockets: round trips, MACs bound to
// the key, the nonces and every field, and each rejection with its reason.
#include <catch2/catch.hpp>
#include <string>

#include "membership/membership_wire.hpp"
#include "transport/hmac.hpp"
#include "transport/wire_le.hpp"

namespace mw = regpool::memwire;
namespace bw = regpool::bootwire;

namespace {

std::vector<std::byte> bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size()};
}

mw::Join sample_join(const std::vector<std::byte>& key, const bw::Nonce& server) {
  mw::Join j;
  j.has_mac = !key.empty();
  j.client_id = 0x1122334455667788ull;
  j.nonce.fill(std::byte{0x5a});
  j.name = bytes("client-endpoint-name");
  j.mac = mw::join_mac(key, server, j);
  return j;
}

std::string reason_of_join(const std::vector<std::byte>& b, std::size_t max_name = mw::kMaxName) {
  std::string why;
  REQUIRE_FALSE(mw::parse_join(b, max_name, why).has_value());
  return why;
}

}  // namespace

TEST_CASE("a join round-trips and its MAC binds key, nonces and fields", "[membership]") {
  const auto key = bytes("job key");
  bw::Nonce server;
  server.fill(std::byte{1});
  const mw::Join j = sample_join(key, server);
  const auto wire = mw::encode(j);
  CHECK(wire.size() == mw::kJoinFixed + j.name.size());
  std::string why;
  const auto back = mw::parse_join(wire, mw::kMaxName, why);
  REQUIRE(back.has_value());
  CHECK(back->client_id == j.client_id);
  CHECK(back->name == j.name);
  CHECK(regpool::detail::equal_constant_time(back->mac, mw::join_mac(key, server, *back)));
  CHECK_FALSE(regpool::detail::equal_constant_time(back->mac, mw::join_mac(bytes("other key"), server, *back)));
  bw::Nonce other = server;
  other[0] = std::byte{2};
  CHECK_FALSE(regpool::detail::equal_constant_time(back->mac, mw::join_mac(key, other, *back)));
  mw::Join renamed = *back;
  renamed.name.back() = std::byte{'X'};
  CHECK_FALSE(regpool::detail::equal_constant_time(back->mac, mw::join_mac(key, server, renamed)));
}

TEST_CASE("malformed joins are rejected with a reason", "[membership]") {
  const bw::Nonce server{};
  const auto good = mw::encode(sample_join({}, server));
  CHECK(reason_of_join({good.begin(), good.begin() + 10}).find("at least 80") != std::string::npos);
  auto b = good;
  regpool::le::put_u16(b.data(), 9);
  CHECK(reason_of_join(b).find("protocol version 9") != std::string::npos);
  CHECK(mw::payload_version(b) == std::optional<std::uint16_t>(9));
  b = good;
  regpool::le::put_u16(b.data() + 2, 6);
  CHECK(reason_of_join(b).find("unknown flags") != std::string::npos);
  b = good;
  regpool::le::put_u32(b.data() + 4, 0);
  CHECK(reason_of_join(b).find("name of 0 bytes") != std::string::npos);
  CHECK(reason_of_join(good, 8).find("(1..8 allowed)") != std::string::npos);
  b = good;
  b.push_back(std::byte{0});
  CHECK(reason_of_join(b).find("expected") != std::string::npos);
  b = good;
  b.back() = std::byte{1};  // keyless, yet a MAC byte set
  CHECK(reason_of_join(b).find("non-zero MAC") != std::string::npos);
}

TEST_CASE("a welcome round-trips; refusals and bad welcomes are told apart", "[membership]") {
  const auto key = bytes("job key");
  bw::Nonce s, c;
  s.fill(std::byte{3});
  c.fill(std::byte{4});
  mw::Welcome w;
  w.has_mac = true;
  w.peer = 3;
  w.epoch = 42;
  w.liveness_ms = 5000;
  w.name = bytes("server-endpoint");
  w.mac = mw::welcome_mac(key, s, c, w);
  std::string why;
  const auto back = mw::parse_welcome(mw::encode(w), mw::kMaxName, why);
  REQUIRE(back.has_value());
  CHECK(back->epoch == 42);
  CHECK(back->peer == 3);
  CHECK(regpool::detail::equal_constant_time(back->mac, mw::welcome_mac(key, s, c, *back)));
  // The MAC covers the epoch: a server-side epoch changed in transit fails.
  mw::Welcome forged = *back;
  forged.epoch = 43;
  CHECK_FALSE(regpool::detail::equal_constant_time(back->mac, mw::welcome_mac(key, s, c, forged)));

  auto b = mw::encode(w);
  regpool::le::put_u32(b.data() + 4, mw::kMaxWelcomeCode + 1);
  CHECK_FALSE(mw::parse_welcome(b, mw::kMaxName, why).has_value());
  CHECK(why.find("unknown code") != std::string::npos);
  mw::Welcome zero_epoch = w;
  zero_epoch.epoch = 0;
  CHECK_FALSE(mw::parse_welcome(mw::encode(zero_epoch), mw::kMaxName, why).has_value());
  CHECK(why.find("epoch 0") != std::string::npos);
  mw::Welcome refusal;
  refusal.code = mw::WelcomeCode::full;
  refusal.detail = 16;
  refusal.name.assign(1, std::byte{0});
  const auto r = mw::parse_welcome(mw::encode(refusal), mw::kMaxName, why);
  REQUIRE(r.has_value());
  CHECK(r->code == mw::WelcomeCode::full);
  CHECK(r->detail == 16);
}

TEST_CASE("a bye carries exactly its epoch", "[membership]") {
  std::string why;
  const auto b = mw::encode_bye(77);
  CHECK(mw::parse_bye(b, why) == std::optional<std::uint64_t>(77));
  CHECK_FALSE(mw::parse_bye(std::span(b).first(7), why).has_value());
  CHECK(why.find("expected 8") != std::string::npos);
}
