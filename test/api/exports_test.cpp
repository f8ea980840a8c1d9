// The public API through the shared library's export table, as a consumer
// sees it. Unlike the other tests, this one links libregpool.so (not the
// library's objects) and includes only installed headers, and it is compiled
// with -fvisibility=hidden itself: the exceptions, typeinfo and vtables the
// library exports must still work across the boundary (catching
// regpool::Error, dynamic_cast between domains, a consumer's own Domain
// subclass, PoolResource behind std::pmr). test/api/check-exports.py checks
// the export table itself.
#include <catch2/catch.hpp>

#include <cstddef>
#include <memory>
#include <memory_resource>
#include <stdexcept>
#include <string>
#include <vector>

#include "regpool/regpool.hpp"

using namespace regpool;

namespace {

// A consumer-defined backend: its vtable refers to Domain's typeinfo and
// protected members, which live in the library.
class CountingDomain final : public Domain {
 public:
  std::string name() const override { return "counting"; }
  bool remote_capable() const noexcept override { return false; }
  int live = 0;

 protected:
  Native do_register(void* addr, std::size_t, Access) override {
    ++live;
    return Native{addr, nullptr, 0, 0, AddressMode::virtual_address};
  }
  void do_deregister(const Native&, void*, std::size_t) noexcept override { --live; }
};

PoolConfig small() {
  PoolConfig c;
  c.arena_size = std::size_t{2} << 20;
  return c;
}

}  // namespace

TEST_CASE("regpool::Error thrown inside the library is caught by its type", "[api]") {
  UserMemory too_small;  // no memory at all
  try {
    (void)Ldo::wrap(std::move(too_small));
    FAIL("Ldo::wrap accepted empty memory");
  } catch (const Error& e) {
    CHECK(e.status() == Status::invalid_argument);
    CHECK(std::string(e.what()).find("wire header") != std::string::npos);
  }
  // And as its standard base.
  auto d = std::make_shared<CountingDomain>();
  Pool pool({d}, small());
  Pool moved(std::move(pool));
  CHECK_THROWS_AS(pool.stats(), std::runtime_error);  // pool is moved-from on purpose
  try {
    (void)pool.stats();
    FAIL("stats() on a moved-from pool did not throw");
  } catch (const Error& e) {
    CHECK(e.status() == Status::closed);
  }
}

TEST_CASE("a consumer's Domain subclass serves a pool; dynamic_cast sees the library's classes", "[api]") {
  auto counting = std::make_shared<CountingDomain>();
  {
    Pool pool({counting}, small());
    CHECK(counting->live == 1);  // one arena, registered once
    auto ldo = pool.allocate(1000);
    REQUIRE(ldo.ok());
    CHECK(ldo->data().size() == 1000);
    CHECK(pool.stats().registrations == 1);
    CHECK(counting->stats().live_registrations == 1);
  }
  CHECK(counting->live == 0);

  std::shared_ptr<Domain> host = HostDomain::open({.lock_pages = false});
  CHECK(std::dynamic_pointer_cast<HostDomain>(host) != nullptr);
  CHECK(std::dynamic_pointer_cast<CountingDomain>(host) == nullptr);
  std::shared_ptr<Domain> mine = counting;
  CHECK(std::dynamic_pointer_cast<HostDomain>(mine) == nullptr);
}

TEST_CASE("PoolResource works behind std::pmr from outside the library", "[api]") {
  auto d = std::make_shared<CountingDomain>();
  Pool pool({d}, small());
  PoolResource res(pool);
  std::pmr::memory_resource* base = &res;  // calls go through the exported vtable
  {
    std::pmr::vector<std::uint64_t> v(base);
    for (std::uint64_t i = 0; i < 10000; ++i) v.push_back(i);
    CHECK(v[9999] == 9999);
    CHECK(pool.stats().live_objects >= 1);
  }
  CHECK(pool.stats().live_objects == 0);
  CHECK(base->is_equal(res));
  PoolResource other(pool);
  CHECK(base->is_equal(other));
}
