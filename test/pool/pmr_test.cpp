// std::pmr adapter: standard containers living in registered memory.
#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <memory_resource>
#include <string>
#include <vector>

#include "regpool/memory_resource.hpp"
#include "support/fake_domain.hpp"

using namespace regpool;
using regpool::test::FakeDomain;

namespace {

// Bytes from the resource must lie inside a range the domain registered.
bool inside_registration(FakeDomain& d, const void* p, std::size_t n) {
  for (const auto& r : d.ranges())
    if (r.first <= p && static_cast<const std::byte*>(p) + n <= r.first + r.second) return true;
  return false;
}

}  // namespace

TEST_CASE("pmr containers allocate from the pool and give everything back", "[pmr]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg;
  cfg.arena_size = std::size_t{4} << 20;
  Pool pool({d}, cfg);
  PoolResource res(pool);
  {
    std::pmr::vector<int> v(&res);
    for (int i = 0; i < 100000; ++i) v.push_back(i);
    for (int i = 0; i < 100000; ++i) REQUIRE(v[static_cast<std::size_t>(i)] == i);
    CHECK(inside_registration(*d, v.data(), v.size() * sizeof(int)));
    std::pmr::map<int, std::pmr::string> m(&res);
    for (int i = 0; i < 1000; ++i) m.emplace(i, std::pmr::string(100, 'x'));
    CHECK(pool.stats().live_objects > 1000);
  }
  const auto s = pool.stats();
  CHECK(s.live_objects == 0);
  CHECK(s.allocations == s.releases);
  CHECK(d->calls() == s.arenas_created);
}

TEST_CASE("pmr honours alignment up to a page", "[pmr]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, PoolConfig{});
  PoolResource res(pool);
  for (std::size_t align : {1, 2, 8, 16, 32, 64, 128, 256, 4096}) {
    for (std::size_t bytes : {1, 24, 100, 5000, 70000}) {
      void* p = res.allocate(bytes, align);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % align == 0);
      std::memset(p, 0x5a, bytes);
      res.deallocate(p, bytes, align);
    }
  }
  CHECK(pool.stats().live_objects == 0);
  CHECK_THROWS_AS(res.allocate(10, 8192), std::bad_alloc);
  CHECK(res.is_equal(res));
  PoolResource other(pool);
  CHECK(res.is_equal(other));
  CHECK_FALSE(res.is_equal(*std::pmr::new_delete_resource()));
}

TEST_CASE("pmr allocation failure is std::bad_alloc", "[pmr]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg;
  cfg.arena_size = std::size_t{2} << 20;
  cfg.max_bytes = std::size_t{2} << 20;
  Pool pool({d}, cfg);
  PoolResource res(pool);
  CHECK_THROWS_AS(res.allocate(std::size_t{3} << 20, 8), std::bad_alloc);
}
