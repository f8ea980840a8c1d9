// Remote references: encoding round trips, every validation rule, and a
// fuzz loop over random and mutated bytes (decode must never crash and must
// never accept corrupted input).

#include <array>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "regpool/remote_ref.hpp"

using regpool::Access;
using regpool::registration_access;
using regpool::AddressMode;
using regpool::Backend;
using regpool::RemoteAccess;
using regpool::RemoteRef;
using regpool::Status;

namespace {

RemoteRef sample() {
  RemoteRef r;
  r.backend = Backend::fabric;
  r.access = RemoteAccess::read_write;
  r.mode = AddressMode::offset;
  r.key = 0x1122334455667788ull;
  r.address = 0x1000;
  r.length = 4096;
  r.exposure_id = 0xabcdef0000000001ull;
  r.flags = RemoteRef::kFlagAligned8;
  return r;
}

// Re-seal bytes 0..59 with a valid checksum, so a test reaches the field
// checks behind the CRC.
void reseal(std::array<std::byte, RemoteRef::kEncodedSize>& b) {
  const std::uint32_t c = regpool::crc32c({b.data(), 60});
  for (int i = 0; i < 4; ++i) b[60 + i] = static_cast<std::byte>((c >> (8 * i)) & 0xff);
}

}  // namespace

TEST_CASE("crc32c matches the Castagnoli check value", "[unit]") {
  const char* s = "123456789";
  CHECK(regpool::crc32c({reinterpret_cast<const std::byte*>(s), 9}) == 0xE3069283u);
  CHECK(regpool::crc32c({}) == 0u);
}

TEST_CASE("remote ref round trips every field", "[unit]") {
  for (auto mode : {AddressMode::virtual_address, AddressMode::offset}) {
    for (auto access : {RemoteAccess::read_only, RemoteAccess::read_write, RemoteAccess::write_only}) {
      for (auto backend : {Backend::fabric, Backend::verbs}) {
        RemoteRef r = sample();
        r.mode = mode;
        r.access = access;
        r.backend = backend;
        auto enc = r.encode();
        auto d = RemoteRef::decode(enc);
        REQUIRE(d.ok());
        CHECK(d->mode == mode);
        CHECK(d->access == access);
        CHECK(d->backend == backend);
        CHECK(d->key == r.key);
        CHECK(d->address == r.address);
        CHECK(d->length == r.length);
        CHECK(d->exposure_id == r.exposure_id);
        CHECK(d->flags == r.flags);
      }
    }
  }
}

TEST_CASE("remote ref encoding is fixed little-endian", "[unit]") {
  auto enc = sample().encode();
  CHECK(enc[0] == std::byte{'R'});
  CHECK(enc[1] == std::byte{'P'});
  CHECK(enc[2] == std::byte{'R'});
  CHECK(enc[3] == std::byte{'F'});
  CHECK(enc[4] == std::byte{1});
  CHECK(enc[16] == std::byte{0x88});  // key, least significant byte first
}

TEST_CASE("remote ref decode rejects truncated and oversized input", "[unit]") {
  auto enc = sample().encode();
  for (std::size_t n = 0; n < RemoteRef::kEncodedSize; ++n) {
    CHECK(RemoteRef::decode({enc.data(), n}).status() == Status::malformed);
  }
  std::vector<std::byte> longer(enc.begin(), enc.end());
  longer.push_back(std::byte{0});
  CHECK(RemoteRef::decode(longer).status() == Status::malformed);
}

TEST_CASE("remote ref decode names each malformation", "[unit]") {
  const auto good = sample().encode();
  SECTION("bad magic") {
    auto b = good;
    b[0] = std::byte{'X'};
    reseal(b);
    CHECK(RemoteRef::decode(b).status() == Status::malformed);
  }
  SECTION("foreign version") {
    auto b = good;
    b[4] = std::byte{2};
    reseal(b);
    CHECK(RemoteRef::decode(b).status() == Status::unsupported);
  }
  SECTION("checksum") {
    auto b = good;
    b[20] ^= std::byte{1};  // key bit flip, CRC not updated
    CHECK(RemoteRef::decode(b).status() == Status::malformed);
  }
  SECTION("enum values") {
    for (std::size_t at : {6u, 7u, 8u}) {
      auto b = good;
      b[at] = std::byte{0x7f};
      reseal(b);
      CHECK(RemoteRef::decode(b).status() == Status::malformed);
    }
  }
  SECTION("unknown flags and reserved bytes") {
    for (std::size_t at : {9u, 10u, 11u, 12u, 15u, 48u, 55u, 56u, 59u}) {
      auto b = good;
      b[at] = std::byte{0x80};
      reseal(b);
      INFO("byte " << at);
      CHECK(RemoteRef::decode(b).status() == Status::malformed);
    }
  }
  SECTION("empty, wrapping range or zero exposure id") {
    RemoteRef r = sample();
    r.length = 0;
    CHECK(RemoteRef::decode(r.encode()).status() == Status::malformed);
    r = sample();
    r.address = ~std::uint64_t{0} - 10;
    r.length = 100;
    CHECK(RemoteRef::decode(r.encode()).status() == Status::malformed);
    r = sample();
    r.exposure_id = 0;
    CHECK(RemoteRef::decode(r.encode()).status() == Status::malformed);
  }
}

TEST_CASE("well_formed holds a hand-built reference to decode's field rules", "[unit]") {
  CHECK(sample().well_formed());
  std::vector<RemoteRef> bad(9, sample());
  bad[0].length = 0;
  bad[1].address = ~std::uint64_t{0} - 10;  // length 4096: wraps
  bad[2].exposure_id = 0;
  bad[3].access = static_cast<RemoteAccess>(0);
  bad[4].mode = static_cast<AddressMode>(2);
  bad[5].backend = static_cast<Backend>(3);
  bad[6].flags = 0x02;
  bad[7].flags = RemoteRef::kFlagAligned8 | 0x80;
  bad[8].access = static_cast<RemoteAccess>(4);  // one past write_only
  for (std::size_t i = 0; i < bad.size(); ++i) {
    INFO("variant " << i);
    CHECK_FALSE(bad[i].well_formed());
    CHECK(RemoteRef::decode(bad[i].encode()).status() == Status::malformed);
  }
  // The largest range that just fits is fine.
  RemoteRef edge = sample();
  edge.address = ~std::uint64_t{0} - edge.length;
  CHECK(edge.well_formed());
  CHECK(RemoteRef::decode(edge.encode()).ok());
}

TEST_CASE("remote access rights: what each access allows and registers", "[unit]") {
  RemoteRef r = sample();
  r.access = RemoteAccess::read_only;
  CHECK(r.allows_read());
  CHECK_FALSE(r.allows_write());
  CHECK_FALSE(r.allows_atomics());
  CHECK(registration_access(r.access) == Access::remote_read);
  r.access = RemoteAccess::write_only;
  CHECK_FALSE(r.allows_read());
  CHECK(r.allows_write());
  CHECK_FALSE(r.allows_atomics());
  CHECK(registration_access(r.access) == Access::remote_write);
  r.access = RemoteAccess::read_write;
  CHECK(r.allows_read());
  CHECK(r.allows_write());
  CHECK(r.allows_atomics());
  CHECK(registration_access(r.access) == (Access::remote_read | Access::remote_write | Access::remote_atomic));
  // Byte 7 carries it on the wire.
  r.access = RemoteAccess::write_only;
  CHECK(static_cast<std::uint8_t>(r.encode()[7]) == 3);
}

TEST_CASE("remote ref range and alignment helpers", "[unit]") {
  RemoteRef r = sample();
  CHECK(r.contains(0, 4096));
  CHECK(r.contains(4096, 0));
  CHECK_FALSE(r.contains(1, 4096));
  CHECK_FALSE(r.contains(4097, 0));
  CHECK_FALSE(r.contains(8, ~std::uint64_t{0}));  // no overflow
  CHECK(r.aligned_word(8));
  CHECK_FALSE(r.aligned_word(4));
  r.flags = 0;
  CHECK_FALSE(r.aligned_word(8));  // offset mode without the flag: unknown alignment
  r.mode = AddressMode::virtual_address;
  r.address = 0x1000;
  CHECK(r.aligned_word(16));
  r.address = 0x1004;
  CHECK_FALSE(r.aligned_word(16));
}

TEST_CASE("remote ref decode survives random and mutated bytes", "[unit][fuzz]") {
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<int> byte(0, 255);
  std::size_t accepted = 0;
  // Pure noise of every length up to a bit past the encoded size.
  for (int iter = 0; iter < 200000; ++iter) {
    std::vector<std::byte> b(static_cast<std::size_t>(iter % 70));
    for (auto& x : b) x = static_cast<std::byte>(byte(rng));
    if (RemoteRef::decode(b).ok()) ++accepted;
  }
  CHECK(accepted == 0);  // 2^-32 CRC odds on top of the magic: never here
  // Valid references with random bit flips: either rejected or, when the
  // flip is undone by a reseal, decoded to the mutated values (never garbage).
  const auto good = sample().encode();
  for (int iter = 0; iter < 200000; ++iter) {
    auto b = good;
    const int flips = 1 + iter % 4;
    for (int f = 0; f < flips; ++f) {
      const auto at = static_cast<std::size_t>(rng() % RemoteRef::kEncodedSize);
      b[at] ^= static_cast<std::byte>(1u << (rng() % 8));
    }
    const bool resealed = iter % 2 == 0;
    if (resealed) reseal(b);
    auto d = RemoteRef::decode(b);
    if (!resealed && b != good) {
      CHECK_FALSE(d.ok());
    }
    if (d.ok()) {
      // Whatever was accepted re-encodes to exactly the same bytes.
      CHECK(d->encode() == b);
    }
  }
}
