// std::pmr adapter: standard containers living in registered memory.
#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <memory_resource>
#include <string>
#include <thread>
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

// Deallocation finds an object from its address without a lock (the pool's
// address map) when its arena covers whole 2 MiB chunks, and by a scan of
// the arenas otherwise (an arena without THP alignment). Both must give
// every object back, across arenas that come and go, and from threads other
// than the allocating one.
TEST_CASE("pmr deallocation finds objects with and without the address map, on any thread", "[pmr]") {
  for (const bool thp : {true, false}) {
    INFO("transparent_huge_pages " << thp);
    auto d = std::make_shared<FakeDomain>();
    PoolConfig cfg;
    cfg.arena_size = std::size_t{2} << 20;
    cfg.transparent_huge_pages = thp;
    cfg.retain_idle_arenas = 0;
    Pool pool({d}, cfg);
    PoolResource res(pool);
    std::pmr::memory_resource& r = res;
    for (int round = 0; round < 3; ++round) {
      std::vector<void*> objects;
      // 3 MiB of 64 KiB objects: more than one arena, so growth and release
      // (and with it the map's entries) change every round.
      for (int i = 0; i < 48; ++i) objects.push_back(r.allocate(64 << 10, 16));
      for (int i = 0; i < 64; ++i) objects.push_back(r.allocate(100, 8));
      REQUIRE(pool.stats().live_objects == objects.size());
      auto give_back = [&](std::size_t i) {
        r.deallocate(objects[i], i < 48 ? 64 << 10 : 100, i < 48 ? 16 : 8);
      };
      std::thread other([&] {
        for (std::size_t i = 0; i < objects.size(); i += 2) give_back(i);
      });
      other.join();
      for (std::size_t i = 1; i < objects.size(); i += 2) give_back(i);
      CHECK(pool.stats().live_objects == 0);
      pool.trim();
    }
    const auto s = pool.stats();
    CHECK(s.allocations == s.releases);
    CHECK(s.arenas_released > 0);
  }
}
