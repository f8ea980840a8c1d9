// SHA-256 and HMAC-SHA256 behind the bootstrap's job key, against the
// published test vectors: FIPS 180-2 appendix B (SHA-256) and RFC 4231
// (HMAC-SHA256, test cases 1-7), plus incremental feeding across block
// boundaries and the constant-time compare.

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "transport/hmac.hpp"

namespace {

using regpool::detail::Digest;

std::vector<std::byte> bytes(const std::string& s) {
  std::vector<std::byte> out(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) out[i] = static_cast<std::byte>(s[i]);
  return out;
}

std::vector<std::byte> unhex(const std::string& h) {
  std::vector<std::byte> out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<std::byte>(std::stoul(h.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string hex(std::span<const std::byte> d) {
  std::string s;
  char buf[3];
  for (auto b : d) {
    std::snprintf(buf, sizeof buf, "%02x", std::to_integer<unsigned>(b));
    s += buf;
  }
  return s;
}

std::vector<std::byte> repeat(std::uint8_t v, std::size_t n) { return std::vector<std::byte>(n, std::byte{v}); }

}  // namespace

TEST_CASE("sha256 matches the FIPS 180-2 examples", "[unit]") {
  using regpool::detail::sha256;
  CHECK(hex(sha256(bytes("abc"))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(sha256(bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(hex(sha256({})) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // One million 'a', fed in uneven pieces (buffering across blocks).
  regpool::detail::Sha256 s;
  const auto chunk = bytes(std::string(997, 'a'));
  std::size_t left = 1000000;
  while (left > 0) {
    const std::size_t n = std::min(left, chunk.size());
    s.update(std::span<const std::byte>(chunk.data(), n));
    left -= n;
  }
  CHECK(hex(s.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256 gives the same digest however the input is split", "[unit]") {
  std::vector<std::byte> msg(300);
  for (std::size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<std::byte>(i * 7 + 3);
  for (std::size_t len : {0u, 1u, 55u, 56u, 63u, 64u, 65u, 119u, 120u, 128u, 300u}) {
    const std::span<const std::byte> m(msg.data(), len);
    const Digest whole = regpool::detail::sha256(m);
    for (std::size_t cut = 0; cut <= len; cut += 13) {
      regpool::detail::Sha256 s;
      s.update(m.first(cut));
      s.update(m.subspan(cut));
      INFO("len " << len << " cut " << cut);
      CHECK(s.finish() == whole);
    }
  }
}

TEST_CASE("hmac-sha256 matches RFC 4231 test cases 1-7", "[unit]") {
  using regpool::detail::hmac_sha256;
  // 1
  CHECK(hex(hmac_sha256(repeat(0x0b, 20), bytes("Hi There"))) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // 2: a key shorter than the output
  CHECK(hex(hmac_sha256(bytes("Jefe"), bytes("what do ya want for nothing?"))) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // 3
  CHECK(hex(hmac_sha256(repeat(0xaa, 20), repeat(0xdd, 50))) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  // 4
  CHECK(hex(hmac_sha256(unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), repeat(0xcd, 50))) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // 5: truncated to 128 bits
  CHECK(hex(hmac_sha256(repeat(0x0c, 20), bytes("Test With Truncation"))).substr(0, 32) ==
        "a3b6167473100ee06e0c796c2955552b");
  // 6: a key longer than the block (hashed first)
  CHECK(hex(hmac_sha256(repeat(0xaa, 131), bytes("Test Using Larger Than Block-Size Key - Hash Key First"))) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // 7
  CHECK(hex(hmac_sha256(repeat(0xaa, 131),
                        bytes("This is a test using a larger than block-size key and a larger than block-size "
                              "data. The key needs to be hashed before being used by the HMAC algorithm."))) ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  // Incremental use gives the one-shot result.
  regpool::detail::HmacSha256 h(bytes("Jefe"));
  h.update(bytes("what do ya "));
  h.update(bytes("want for nothing?"));
  CHECK(hex(h.finish()) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST_CASE("the constant-time compare and the random source", "[unit]") {
  using regpool::detail::equal_constant_time;
  const auto a = repeat(1, 32);
  auto b = a;
  CHECK(equal_constant_time(a, b));
  for (std::size_t i : {0u, 17u, 31u}) {
    b = a;
    b[i] ^= std::byte{0x80};
    CHECK_FALSE(equal_constant_time(a, b));
  }
  CHECK_FALSE(equal_constant_time(a, std::span<const std::byte>(a.data(), 31)));
  std::array<std::byte, 32> r1{}, r2{};
  REQUIRE(regpool::detail::random_bytes(r1));
  REQUIRE(regpool::detail::random_bytes(r2));
  CHECK(r1 != r2);  // 2^-256 chance of a false failure
}
