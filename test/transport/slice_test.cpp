// Slices: bounds at construction, sub-slices, and the reference they hold.

#include <catch2/catch.hpp>
#include <memory>

#include "regpool/pool.hpp"
#include "regpool/slice.hpp"
#include "support/fake_domain.hpp"

using regpool::Ldo;
using regpool::Slice;
using regpool::Status;

namespace {

regpool::Pool make_pool() {
  regpool::PoolConfig c;
  c.arena_size = std::size_t{4} << 20;
  return regpool::Pool({std::make_shared<regpool::test::FakeDomain>()}, c);
}

}  // namespace

TEST_CASE("data slices are bounded by the data section", "[unit]") {
  auto pool = make_pool();
  auto ldo = pool.allocate(100, 5);
  REQUIRE(ldo.ok());
  auto whole = Slice::data(*ldo);
  REQUIRE(whole.ok());
  CHECK(whole->offset() == ldo->data_offset());
  CHECK(whole->length() == 100);
  CHECK(whole->address() == ldo->data().data());

  CHECK(Slice::data(*ldo, 0, 100).ok());
  CHECK(Slice::data(*ldo, 100, 0).ok());
  CHECK(Slice::data(*ldo, 99, 2).status() == Status::out_of_bounds);
  CHECK(Slice::data(*ldo, 101, 0).status() == Status::out_of_bounds);
  CHECK(Slice::data(*ldo, 1, ~std::uint64_t{0}).status() == Status::out_of_bounds);  // no overflow
  CHECK(Slice::data(Ldo{}, 0, 0).status() == Status::invalid_argument);
}

TEST_CASE("wire and raw slices", "[unit]") {
  auto pool = make_pool();
  auto ldo = pool.allocate(regpool::LdoShape{64, 3, 7, 4096});
  REQUIRE(ldo.ok());
  auto wire = Slice::wire(*ldo);
  REQUIRE(wire.ok());
  CHECK(wire->offset() == 0);
  CHECK(wire->length() == ldo->wire_size());
  const auto owned = regpool::kWireHeaderSize + ldo->capacity();
  CHECK(Slice::raw(*ldo, 0, owned).ok());
  CHECK(Slice::raw(*ldo, 1, owned).status() == Status::out_of_bounds);
  CHECK(Slice::raw(*ldo, owned, 0).ok());
}

TEST_CASE("select narrows a slice and checks its own bounds", "[unit]") {
  auto pool = make_pool();
  auto ldo = pool.allocate(1000);
  REQUIRE(ldo.ok());
  auto s = Slice::data(*ldo, 100, 500);
  REQUIRE(s.ok());
  auto sub = s->select(10, 20);
  REQUIRE(sub.ok());
  CHECK(sub->offset() == s->offset() + 10);
  CHECK(sub->length() == 20);
  CHECK(s->select(490, 11).status() == Status::out_of_bounds);
  CHECK(s->select(501, 0).status() == Status::out_of_bounds);
  CHECK(Slice{}.select(0, 0).status() == Status::invalid_argument);
  CHECK(sub->within_object());
}

TEST_CASE("a slice keeps its object alive", "[unit]") {
  auto pool = make_pool();
  Slice s;
  {
    auto ldo = pool.allocate(64);
    REQUIRE(ldo.ok());
    auto r = Slice::data(*ldo);
    REQUIRE(r.ok());
    s = std::move(*r);
    CHECK(ldo->use_count() == 2);
  }
  CHECK(pool.stats().live_objects == 1);
  CHECK(s.ldo().use_count() == 1);
  s = Slice{};
  CHECK(pool.stats().live_objects == 0);
}
