// The Domain base: counters, RAII deregistration, addressing modes, errors.
#include <catch2/catch.hpp>

#include <array>

#include "support/fake_domain.hpp"

using namespace regpool;
using regpool::test::FakeDomain;

TEST_CASE("registration counts and deregisters on destruction", "[domain]") {
  auto d = std::make_shared<FakeDomain>();
  std::array<std::byte, 4096> buf{};
  {
    Registration r = d->register_memory(buf.data(), buf.size(), Access::all);
    REQUIRE(r);
    CHECK(r.domain() == d.get());
    CHECK(r.base() == buf.data());
    CHECK(r.length() == buf.size());
    CHECK(r.remote_key() >= 100);
    auto s = d->stats();
    CHECK(s.registrations == 1);
    CHECK(s.live_registrations == 1);
    CHECK(s.bytes_registered_live == buf.size());
  }
  auto s = d->stats();
  CHECK(s.deregistrations == 1);
  CHECK(s.live_registrations == 0);
  CHECK(s.bytes_registered_live == 0);
  CHECK(s.bytes_registered_total == buf.size());
}

TEST_CASE("registration is move-only and deregisters exactly once", "[domain]") {
  auto d = std::make_shared<FakeDomain>();
  std::array<std::byte, 256> buf{};
  Registration a = d->register_memory(buf.data(), buf.size(), Access::local);
  Registration b = std::move(a);
  CHECK_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  CHECK(b);
  b.reset();
  b.reset();
  CHECK(d->stats().deregistrations == 1);
}

TEST_CASE("a registration keeps its domain alive", "[domain]") {
  std::array<std::byte, 64> buf{};
  Registration r;
  std::weak_ptr<FakeDomain> weak;
  {
    auto d = std::make_shared<FakeDomain>();
    weak = d;
    r = d->register_memory(buf.data(), buf.size(), Access::all);
  }
  CHECK_FALSE(weak.expired());
  r.reset();
  CHECK(weak.expired());
}

TEST_CASE("remote addresses follow the addressing mode", "[domain]") {
  std::array<std::byte, 1024> buf{};
  auto va = std::make_shared<FakeDomain>("va", AddressMode::virtual_address);
  auto off = std::make_shared<FakeDomain>("off", AddressMode::offset);
  Registration a = va->register_memory(buf.data() + 16, 1000, Access::all);
  Registration b = off->register_memory(buf.data() + 16, 1000, Access::all);
  CHECK(a.remote_address(buf.data() + 116) == reinterpret_cast<std::uintptr_t>(buf.data() + 116));
  CHECK(b.remote_address(buf.data() + 116) == 100);
  CHECK(a.contains(buf.data() + 1000, 16));
  CHECK_FALSE(a.contains(buf.data() + 1000, 17));
  CHECK_FALSE(a.contains(buf.data() + 15, 1));
}

TEST_CASE("failures surface as Error on setup and as Status on the data path", "[domain]") {
  auto d = std::make_shared<FakeDomain>();
  std::array<std::byte, 64> buf{};
  d->fail_next(2);
  try {
    (void)d->register_memory(buf.data(), buf.size(), Access::all);
    FAIL("register_memory should have thrown");
  } catch (const Error& e) {
    CHECK(e.status() == Status::registration_failed);
    CHECK(e.provider_code() == -1234);
    CHECK(std::string(e.what()).find("told to fail") != std::string::npos);
  }
  auto r = d->try_register(buf.data(), buf.size(), Access::all);
  CHECK_FALSE(r.ok());
  CHECK(r.status() == Status::registration_failed);
  CHECK(d->stats().failed_registrations == 2);
  CHECK(d->stats().registrations == 0);
}

TEST_CASE("a domain not owned by shared_ptr is refused", "[domain]") {
  FakeDomain d;
  std::array<std::byte, 64> buf{};
  CHECK_THROWS_AS(d.register_memory(buf.data(), buf.size(), Access::all), Error);
}

TEST_CASE("access rights compose", "[domain]") {
  CHECK(grants(Access::all, Access::remote_write));
  CHECK(grants(Access::local | Access::remote_read, Access::remote_read));
  CHECK_FALSE(grants(Access::local | Access::remote_read, Access::remote_write));
  CHECK(to_string(Status::memlock_limit) != std::string("unknown status"));
}
