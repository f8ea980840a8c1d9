// The pool: size classes, spans, dedicated arenas, growth, the hard cap,
// trimming, registration counting, coexistence of pools.
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "regpool/host_domain.hpp"
#include "regpool/pool.hpp"
#include "pool/size_classes.hpp"
#include "regpool/telemetry.hpp"
#include "regpool_config.h"
#include "support/fake_domain.hpp"
#if REGPOOL_HAVE_NUMA
#include <numaif.h>  // MPOL_* constants only
#endif

using namespace regpool;
using regpool::test::FakeDomain;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

PoolConfig small_config(std::size_t arena_mib = 2) {
  PoolConfig c;
  c.arena_size = arena_mib * kMiB;
  return c;
}

}  // namespace

TEST_CASE("objects of every size class are distinct, aligned and writable", "[pool]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, small_config(4));
  std::vector<Ldo> objs;
  std::set<std::byte*> bases;
  for (std::uint64_t size : {0ULL, 1ULL, 40ULL, 100ULL, 1000ULL, 4000ULL, 20000ULL, 32744ULL, 32745ULL, 100000ULL}) {
    for (int i = 0; i < 20; ++i) {
      auto r = pool.allocate(size);
      REQUIRE(r.ok());
      Ldo o = std::move(*r);
      CHECK(o.data_size() == size);
      CHECK(o.capacity() >= size);
      CHECK(reinterpret_cast<std::uintptr_t>(o.base()) % 64 == 0);
      CHECK(reinterpret_cast<std::uintptr_t>(o.data().data()) % 8 == 0);
      std::memset(o.data().data(), i, o.data().size());
      CHECK(bases.insert(o.base()).second);
      objs.push_back(std::move(o));
    }
  }
  // No object overlaps another: the pattern written survives.
  std::size_t k = 0;
  for (const Ldo& o : objs) {
    const auto want = static_cast<std::byte>(k++ % 20);
    for (std::byte b : o.data()) REQUIRE(b == want);
  }
  const auto s = pool.stats();
  CHECK(s.live_objects == objs.size());
  CHECK(s.large_live == 40);  // 32745 + header and 100000 exceed the largest class
}

TEST_CASE("a small object reserving a large capacity gets all of it from a warm cache", "[pool]") {
  // The cached allocation path picks a bin from the larger of the sections
  // and the capacity; one that looked at the sections alone took an 8-byte
  // object with a 200 KiB capacity for a small class (and read past its
  // class table, which UBSan reported). Each shape is allocated and
  // dropped first so that the second allocation takes the cached path.
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, small_config(4));
  for (std::uint64_t cap : {std::uint64_t{4000}, std::uint64_t{32744}, std::uint64_t{32745}, std::uint64_t{65536},
                            std::uint64_t{200} << 10, std::uint64_t{1} << 20}) {
    INFO("capacity " << cap);
    const LdoShape shape{.data_size = 8, .capacity = cap};
    { REQUIRE(pool.allocate(shape).ok()); }
    auto a = pool.allocate(shape);
    auto b = pool.allocate(shape);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->capacity() >= cap);
    CHECK(b->capacity() >= cap);
    REQUIRE(a->resize_data(a->capacity()) == Status::ok);
    REQUIRE(b->resize_data(b->capacity()) == Status::ok);
    std::memset(a->data().data(), 0x11, a->data().size());
    std::memset(b->data().data(), 0x22, b->data().size());
    for (std::byte x : a->data()) REQUIRE(x == std::byte{0x11});
  }
}

TEST_CASE("allocation never registers after the first arenas exist", "[pool][registration]") {
  auto a = std::make_shared<FakeDomain>("a");
  auto b = std::make_shared<FakeDomain>("b", AddressMode::offset);
  PoolConfig cfg = small_config(8);
  cfg.initial_arenas = 2;
  Pool pool({a, b}, cfg);
  CHECK(a->calls() == 2);
  CHECK(b->calls() == 2);
  for (int round = 0; round < 50; ++round) {
    std::vector<Ldo> v;
    for (int i = 0; i < 200; ++i) v.push_back(*pool.allocate(static_cast<std::uint64_t>(i * 37 % 9000)));
  }
  const auto s = pool.stats();
  CHECK(s.allocations == 10000);
  CHECK(s.registrations == 4);
  CHECK(a->calls() == 2);
  CHECK(b->calls() == 2);
  REQUIRE(s.domains.size() == 2);
  CHECK(s.domains[0].registrations == 2);
  CHECK(s.domains[1].registrations == 2);
}

TEST_CASE("growth registers each new arena once with every domain", "[pool][registration]") {
  auto a = std::make_shared<FakeDomain>("a");
  auto b = std::make_shared<FakeDomain>("b");
  Pool pool({a, b}, small_config(2));
  std::vector<Ldo> v;
  for (int i = 0; i < 40; ++i) v.push_back(*pool.allocate(256 * 1024));  // 10 MiB > one arena
  const auto s = pool.stats();
  CHECK(s.arenas >= 5);
  CHECK(a->calls() == s.arenas_created);
  CHECK(b->calls() == s.arenas_created);
  CHECK(s.registrations == 2 * s.arenas_created);
}

TEST_CASE("zero and huge sizes", "[pool][bad-input]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, small_config());
  auto z = pool.allocate(0, 0);
  REQUIRE(z.ok());
  CHECK(z->data().empty());
  CHECK(z->meta().empty());
  CHECK(z->wire_size() == kWireHeaderSize);

  auto huge = pool.allocate(std::uint64_t{1} << 62);
  CHECK(huge.status() == Status::invalid_argument);
  auto overflow = pool.allocate(LdoShape{UINT64_MAX, UINT64_MAX, 0, 0});
  CHECK(overflow.status() == Status::invalid_argument);
  CHECK(pool.allocate(std::uint64_t{1} << 47).status() == Status::invalid_argument);  // > kMaxObjectBytes
  // Plausible but unmappable: 8 TiB is more than this machine will map.
  auto unmappable = pool.allocate(std::uint64_t{1} << 43);
  CHECK_FALSE(unmappable.ok());
  CHECK(unmappable.status() == Status::out_of_memory);
  CHECK(pool.stats().failed_allocations == 4);
  // The pool is unharmed.
  CHECK(pool.allocate(100).ok());
}

TEST_CASE("an exhausted pool at its cap fails with a clear status and recovers", "[pool][cap]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg = small_config(2);
  cfg.max_bytes = 4 * kMiB;
  Pool pool({d}, cfg);
  std::vector<Ldo> v;
  Status last = Status::ok;
  for (int i = 0; i < 1000; ++i) {
    auto r = pool.allocate(60 * 1024);
    if (!r) {
      last = r.status();
      break;
    }
    v.push_back(std::move(*r));
  }
  CHECK(last == Status::pool_exhausted);
  CHECK(v.size() >= 60);
  CHECK(pool.stats().bytes_mapped <= cfg.max_bytes);
  // Bigger than the cap at all: fails at once, maps nothing.
  CHECK(pool.allocate(8 * kMiB).status() == Status::pool_exhausted);
  v.pop_back();
  CHECK(pool.allocate(60 * 1024).ok());
  CHECK(std::string(to_string(Status::pool_exhausted)).find("cap") != std::string::npos);
}

TEST_CASE("initial arenas beyond the cap are a setup error", "[pool][cap]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg = small_config(2);
  cfg.initial_arenas = 3;
  cfg.max_bytes = 4 * kMiB;
  CHECK_THROWS_AS(Pool({d}, cfg), Error);
  CHECK(d->calls() == 0);
}

TEST_CASE("objects larger than an arena get a dedicated arena, released when idle", "[pool][dedicated]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, small_config(2));
  {
    auto big = pool.allocate(5 * kMiB);
    REQUIRE(big.ok());
    CHECK(big->capacity() >= 5 * kMiB);
    std::memset(big->data().data(), 0xab, big->data().size());
    const auto s = pool.stats();
    CHECK(s.dedicated_arenas == 1);
    CHECK(s.arenas == 2);
  }
  // auto_trim releases it at the next allocation slow path, not in the drop.
  CHECK(pool.stats().idle_arenas == 2);
  CHECK(pool.allocate(100000).ok());
  const auto s = pool.stats();
  CHECK(s.dedicated_arenas == 0);
  CHECK(s.arenas_released == 1);
  CHECK(d->stats().live_registrations == 1);
}

TEST_CASE("an object just over the arena size fits the dedicated arena made for it", "[pool][dedicated]") {
  // A fresh dedicated arena is rounded up to 2 MiB: for 3 MiB that is 4 MiB,
  // more slack than a quarter of the object, which the reuse rule refused.
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, small_config(2));
  for (std::uint64_t size : {3 * kMiB, 2 * kMiB + 1, 5 * kMiB}) {
    auto big = pool.allocate(size);
    REQUIRE(big.ok());
    CHECK(big->capacity() >= size);
    CHECK(pool.stats().dedicated_arenas == 1);
  }
  // Each dropped dedicated arena was reused or released: none piles up.
  CHECK(pool.stats().arenas <= 3);
}

TEST_CASE("registration failure while growing is a status, and the pool stays usable", "[pool][registration]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, small_config(2));
  std::vector<Ldo> v;
  for (int i = 0; i < 7; ++i) v.push_back(*pool.allocate(256 * 1024));  // fills most of the arena
  d->fail_next(1);
  auto r = pool.allocate(1536 * 1024);
  CHECK(r.status() == Status::registration_failed);
  CHECK(pool.stats().arenas == 1);
  auto again = pool.allocate(1536 * 1024);
  CHECK(again.ok());
}

TEST_CASE("registration failure at construction throws the domain's error", "[pool][registration]") {
  auto good = std::make_shared<FakeDomain>("good");
  auto bad = std::make_shared<FakeDomain>("bad");
  bad->fail_next(1);
  try {
    Pool pool({good, bad}, small_config());
    FAIL("expected an Error");
  } catch (const Error& e) {
    CHECK(e.status() == Status::registration_failed);
    CHECK(e.provider_code() == -1234);
  }
  // The registration with the good domain was undone.
  CHECK(good->stats().live_registrations == 0);
}

TEST_CASE("bad pool configurations are refused at setup", "[pool][bad-input]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig zero;
  zero.arena_size = 0;
  CHECK_THROWS_AS(Pool({d}, zero), Error);
  CHECK_THROWS_AS(Pool({d, d}, small_config()), Error);
  CHECK_THROWS_AS(Pool({nullptr}, small_config()), Error);
  std::vector<std::shared_ptr<Domain>> many;
  for (std::size_t i = 0; i <= kMaxPoolDomains; ++i) many.push_back(std::make_shared<FakeDomain>());
  CHECK_THROWS_AS(Pool(many, small_config()), Error);
}

TEST_CASE("trim returns idle arenas and deregisters them", "[pool][trim]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg = small_config(2);
  cfg.auto_trim = false;
  Pool pool({d}, cfg);
  {
    std::vector<Ldo> v;
    for (int i = 0; i < 2000; ++i) v.push_back(*pool.allocate(2000));  // ~5 MiB of small objects
    for (int i = 0; i < 10; ++i) v.push_back(*pool.allocate(300 * 1024));
    CHECK(pool.stats().arenas >= 4);
  }
  const auto before = pool.stats();
  CHECK(before.live_objects == 0);
  const std::size_t released = pool.trim();
  const auto after = pool.stats();
  CHECK(released == before.bytes_mapped - after.bytes_mapped);
  CHECK(after.arenas == 1);
  CHECK(d->stats().live_registrations == 1);
  CHECK(after.deregistrations == after.arenas_released);
  // The retained arena still serves objects.
  CHECK(pool.allocate(2000).ok());
}

TEST_CASE("several pools coexist; destroying one leaves the other intact", "[pool]") {
  auto da = std::make_shared<FakeDomain>("a");
  auto db = std::make_shared<FakeDomain>("b");
  auto pa = std::make_unique<Pool>(std::vector<std::shared_ptr<Domain>>{da}, small_config());
  Pool pb({db}, small_config());
  Ldo from_b = *pb.allocate(500);
  std::memset(from_b.data().data(), 7, 500);
  Ldo from_a = *pa->allocate(500);
  CHECK(from_a.region(*da).ok());
  CHECK(from_a.region(*db).status() == Status::unsupported);
  from_a.reset();
  pa.reset();
  CHECK(da->stats().live_registrations == 0);
  CHECK(db->stats().live_registrations == 1);
  for (std::byte b : from_b.data()) REQUIRE(b == std::byte{7});
  CHECK(pb.allocate(500).ok());
}

TEST_CASE("objects outliving their pool keep its arenas registered until the last drop", "[pool]") {
  auto d = std::make_shared<FakeDomain>();
  Ldo survivor;
  Ldo large;
  {
    Pool pool({d}, small_config());
    survivor = *pool.allocate(100);
    large = *pool.allocate(100000);
  }
  CHECK(d->stats().live_registrations == 1);
  std::memset(survivor.data().data(), 1, 100);
  Ldo copy = survivor;
  survivor.reset();
  large.reset();
  CHECK(d->stats().live_registrations == 1);
  copy.reset();
  CHECK(d->stats().live_registrations == 0);
}

TEST_CASE("without thread caches the pool still balances", "[pool]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg = small_config();
  cfg.thread_cache = false;
  Pool pool({d}, cfg);
  {
    std::vector<Ldo> v;
    for (int i = 0; i < 3000; ++i) v.push_back(*pool.allocate(static_cast<std::uint64_t>(i % 3000)));
    for (int i = 0; i < 20; ++i) v.push_back(*pool.allocate(50000));
  }
  const auto s = pool.stats();
  CHECK(s.live_objects == 0);
  CHECK(s.allocations == 3020);
  CHECK(s.releases == 3020);
  CHECK(s.bytes_in_use == 0);
}

TEST_CASE("telemetry adds up and prints", "[pool][telemetry]") {
  auto d = std::make_shared<FakeDomain>("fake0");
  Pool pool({d}, small_config());
  std::vector<Ldo> v;
  for (int i = 0; i < 10; ++i) v.push_back(*pool.allocate(40));  // 64-byte class
  for (int i = 0; i < 3; ++i) v.push_back(*pool.allocate(10000));
  v.push_back(*pool.allocate(100000));
  const auto s = pool.stats();
  CHECK(s.size_classes[0].object_size == 64);
  CHECK(s.size_classes[0].allocations == 10);
  CHECK(s.size_classes[0].live == 10);
  CHECK(s.large_allocations == 1);
  CHECK(s.live_objects == 14);
  std::uint64_t expect = 10 * 64;
  for (const auto& c : s.size_classes)
    if (c.object_size >= 10024 && c.live == 3) expect += 3 * c.object_size;
  expect += 25 * 4096;  // 100000 + header, rounded up to pages
  CHECK(s.bytes_in_use == expect);
  CHECK(s.bytes_mapped == 2 * kMiB);
  const std::string text = to_string(s);
  CHECK(text.find("fake0") != std::string::npos);
  CHECK(text.find("14 live") != std::string::npos);
  const std::string json = to_json(s);
  CHECK(json.front() == '{');
  CHECK(json.find("\"live_objects\":14") != std::string::npos);
}

TEST_CASE("arena occupancy and fragmentation follow the page spans", "[pool][telemetry]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg = small_config(2);  // one arena of 512 pages
  // No thread caches (freed spans go straight back to the arena) and no
  // automatic trimming (slabs stay carved until trim()).
  cfg.thread_cache = false;
  cfg.auto_trim = false;
  Pool pool({d}, cfg);
  constexpr std::uint64_t kKiB = 1024;

  auto s = pool.stats();
  REQUIRE(s.arena_detail.size() == 1);
  CHECK(s.arena_capacity == 2 * kMiB);
  CHECK(s.arena_bytes_in_use == 0);
  CHECK(s.free_span_bytes == 2 * kMiB);
  CHECK(s.largest_free_span == 2 * kMiB);
  CHECK(s.arena_occupancy == 0.0);
  CHECK(s.fragmentation == 0.0);
  CHECK(s.arena_detail[0].free_spans == 1);

  // Eight 64 KiB objects (header included: exactly 16 pages each) pack
  // toward the start of the arena.
  std::vector<Ldo> big;
  for (int i = 0; i < 8; ++i) big.push_back(*pool.allocate(64 * kKiB - kWireHeaderSize));
  s = pool.stats();
  CHECK(s.arena_bytes_in_use == 512 * kKiB);
  CHECK(s.free_span_bytes == 1536 * kKiB);
  CHECK(s.fragmentation == 0.0);
  CHECK(s.arena_occupancy == Approx(0.25));

  // Dropping every other one leaves four 64 KiB holes before the 1.5 MiB
  // tail: of 1792 KiB free, only the tail (1536 KiB) serves one request.
  for (int i = 0; i < 8; i += 2) big[static_cast<std::size_t>(i)].reset();
  s = pool.stats();
  CHECK(s.arena_bytes_in_use == 256 * kKiB);
  CHECK(s.free_span_bytes == 1792 * kKiB);
  CHECK(s.largest_free_span == 1536 * kKiB);
  CHECK(s.arena_detail[0].free_spans == 5);
  CHECK(s.fragmentation == Approx(1.0 - 1536.0 / 1792.0));
  CHECK(s.arena_occupancy == Approx(0.125));

  // One small object carves a whole slab of its class (best fit: the first
  // hole); the slab's other slots are free, not in use.
  Ldo small = *pool.allocate(40);
  const std::uint64_t slab = detail::slab_bytes(0);
  const std::uint64_t slots = slab / detail::kClassSize[0];
  s = pool.stats();
  CHECK(s.slab_free_bytes == (slots - 1) * detail::kClassSize[0]);
  CHECK(s.arena_bytes_in_use == 256 * kKiB + slab - s.slab_free_bytes);
  CHECK(s.free_span_bytes == 1792 * kKiB - slab);

  const std::string text = to_string(s);
  CHECK(text.find("occupancy:") != std::string::npos);
  CHECK(text.find("fragmentation") != std::string::npos);
  CHECK(text.find("arena 0:") != std::string::npos);
  const std::string json = to_json(s);
  CHECK(json.find("\"arena_bytes_in_use\":" + std::to_string(s.arena_bytes_in_use)) != std::string::npos);
  CHECK(json.find("\"largest_free_span\":" + std::to_string(1536 * kKiB)) != std::string::npos);
  CHECK(json.find("\"arena_detail\":[{\"capacity\":" + std::to_string(2 * kMiB)) != std::string::npos);

  // Everything dropped and trimmed: one free span again.
  small.reset();
  big.clear();
  pool.trim();
  s = pool.stats();
  CHECK(s.arena_bytes_in_use == 0);
  CHECK(s.slab_free_bytes == 0);
  CHECK(s.free_span_bytes == 2 * kMiB);
  CHECK(s.fragmentation == 0.0);
}

TEST_CASE("dedicated arenas are listed but kept out of the aggregates", "[pool][telemetry]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, small_config(2));
  Ldo huge = *pool.allocate(5 * kMiB);  // larger than an arena
  const auto s = pool.stats();
  REQUIRE(s.arena_detail.size() == 2);
  CHECK_FALSE(s.arena_detail[0].dedicated);
  CHECK(s.arena_detail[1].dedicated);
  CHECK(s.arena_detail[1].capacity == 6 * kMiB);
  CHECK(s.arena_detail[1].bytes_in_use == 5 * kMiB + 4096);  // 5 MiB + header, in pages
  CHECK(s.arena_capacity == 2 * kMiB);
  CHECK(s.arena_bytes_in_use == 0);
}

TEST_CASE("endpoint, domain and pool counters print and serialise every field", "[telemetry]") {
  EndpointStats e;
  e.posted = 101;
  e.completed = 97;
  e.failed = 3;
  e.rejected = 5;
  e.timeouts = 2;
  e.post_retries = 7;
  e.in_flight = 4;
  e.reconnects = 1;
  e.unknown_source = 6;
  e.sleeps = 8;
  const std::string text = to_string(e);
  for (const char* want : {"101 posted", "97 completed", "3 failed", "5 rejected", "2 timed out", "4 in flight",
                           "7 post retries", "1 reconnects", "6 receives from unknown senders", "8 sleeps"})
    CHECK(text.find(want) != std::string::npos);
  CHECK(to_json(e) ==
        "{\"posted\":101,\"completed\":97,\"failed\":3,\"rejected\":5,\"timeouts\":2,\"post_retries\":7,"
        "\"in_flight\":4,\"reconnects\":1,\"unknown_source\":6,\"sleeps\":8}");
  std::ostringstream o;
  print(o, e);
  CHECK(o.str() == text);

  DomainStats dstats;
  dstats.name = "a\"b";
  dstats.registrations = 9;
  const std::string dj = to_json(dstats);
  CHECK(dj.find("\"name\":\"a\\\"b\"") != std::string::npos);
  CHECK(dj.find("\"registrations\":9") != std::string::npos);
  CHECK(to_string(dstats).find("9 registrations") != std::string::npos);
}

TEST_CASE("numa binding to a node that does not exist fails at setup", "[pool][numa]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg = small_config();
  cfg.numa_node = 1000;
  try {
    Pool pool({d}, cfg);
    FAIL("a pool bound to node 1000 was created");
  } catch (const Error& e) {
    INFO(e.what());
    // mbind refuses the node; a build without libnuma refuses any binding.
    CHECK(e.status() == (REGPOOL_HAVE_NUMA ? Status::invalid_argument : Status::unsupported));
  }
  CHECK(d->stats().live_registrations == 0);
}

TEST_CASE("numa binding puts the arena under a bind policy for the node", "[pool][numa]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg = small_config();
  cfg.numa_node = 0;  // exists on every Linux machine
#if REGPOOL_HAVE_NUMA
  Pool pool({d}, cfg);
  auto obj = pool.allocate(10);
  REQUIRE(obj.ok());
  // Asked of the kernel for the object's own address (get_mempolicy with
  // MPOL_F_ADDR; raw syscall so the test needs no libnuma of its own).
  int mode = -1;
  unsigned long nodes[16] = {};
  REQUIRE(::syscall(SYS_get_mempolicy, &mode, nodes, sizeof(nodes) * 8, obj->data().data(), MPOL_F_ADDR) == 0);
  CHECK(mode == MPOL_BIND);
  CHECK(nodes[0] == 1ul);  // node 0 and no other
  // Without a binding the same question answers the default policy.
  Pool unbound({d}, small_config());
  auto other = unbound.allocate(10);
  REQUIRE(other.ok());
  REQUIRE(::syscall(SYS_get_mempolicy, &mode, nodes, sizeof(nodes) * 8, other->data().data(), MPOL_F_ADDR) == 0);
  CHECK(mode == MPOL_DEFAULT);
#else
  try {
    Pool pool({d}, cfg);
    FAIL("built without libnuma, yet a NUMA-bound pool was created");
  } catch (const Error& e) {
    CHECK(e.status() == Status::unsupported);
  }
#endif
}

// A thread cache's bins count drops and refills/flushes and derive their
// allocations (ThreadCache::Bin): the totals must stay exact across bins
// that fill and empty many times, on several threads, before and after the
// threads exit.
TEST_CASE("allocation counts stay exact across refills, flushes and threads", "[pool][telemetry]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, small_config(8));
  constexpr std::size_t kLive = 3000;  // beyond any bin's depth: refills and flushes
  auto round = [&](std::size_t size) {
    std::vector<Ldo> live;
    for (std::size_t i = 0; i < kLive; ++i) live.push_back(*pool.allocate(size));
    return live;
  };
  {
    auto live = round(100);
    PoolStats s = pool.stats();
    CHECK(s.allocations == kLive);
    CHECK(s.live_objects == kLive);
    CHECK(s.releases == 0);
  }
  PoolStats s = pool.stats();
  CHECK(s.allocations == kLive);
  CHECK(s.releases == kLive);
  CHECK(s.live_objects == 0);

  // Another thread allocates, this one drops half (cross-thread frees), the
  // stats seen while that thread still holds its cache, then after it exits.
  std::vector<Ldo> from_other;
  std::atomic<int> phase{0};
  std::thread other([&] {
    from_other = round(100);
    for (int i = 0; i < 100; ++i) (void)pool.allocate(3000);  // another class, dropped at once
    phase.store(1);
    while (phase.load() != 2) std::this_thread::yield();
  });
  while (phase.load() != 1) std::this_thread::yield();
  from_other.resize(kLive / 2);
  s = pool.stats();
  CHECK(s.allocations == 2 * kLive + 100);
  CHECK(s.live_objects == kLive / 2);
  phase.store(2);
  other.join();
  s = pool.stats();
  CHECK(s.allocations == 2 * kLive + 100);
  CHECK(s.live_objects == kLive / 2);
  std::size_t class_live = 0;
  for (const auto& c : s.size_classes) class_live += c.live;
  CHECK(class_live == kLive / 2);
  from_other.clear();
  s = pool.stats();
  CHECK(s.live_objects == 0);
  CHECK(s.releases == s.allocations);
}

namespace {
// Allocates `n` objects of `size` on this thread and drops them on another
// (the completion pattern), which overflows that thread's span cache into
// the pool's central span lists.
void hand_off_and_drop(Pool& pool, std::size_t n, std::size_t size) {
  std::vector<Ldo> v;
  for (std::size_t i = 0; i < n; ++i) {
    auto r = pool.allocate(size);
    REQUIRE(r.ok());
    std::memset(r->data().data(), static_cast<int>(i), 64);
    v.push_back(std::move(*r));
  }
  std::thread([&] { v.clear(); }).join();
}
}  // namespace

TEST_CASE("only spans up to 16 MiB outside dedicated arenas stay in the thread's span cache", "[pool][spans]") {
  // The drop decides this from a flag set when the span is carved
  // (kCacheableSpan), not from the span's size and arena: check both sides.
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, small_config(64));
  auto free_bytes = [&] { return pool.stats().arena_detail.at(0).bytes_free; };
  const auto all_free = free_bytes();
  { auto small = pool.allocate(kMiB); REQUIRE(small.ok()); }
  CHECK(free_bytes() < all_free);  // kept in this thread's span cache
  pool.trim();  // flushes this thread's caches
  CHECK(free_bytes() == all_free);
  { auto big = pool.allocate(20 * kMiB); REQUIRE(big.ok()); }
  CHECK(free_bytes() == all_free);  // above kSpanCacheMaxObject: straight back
  {
    auto huge = pool.allocate(80 * kMiB);  // larger than the arena: dedicated
    REQUIRE(huge.ok());
    CHECK(pool.stats().dedicated_arenas == 1);
  }
  CHECK(pool.stats().idle_arenas == 2);  // the dedicated one was not cached
  const auto s = pool.stats();
  CHECK(s.live_objects == 0);
  CHECK(s.large_allocations == 3);
}

TEST_CASE("large objects dropped on another thread are reused through the central span lists", "[pool][handoff]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg = small_config(8);
  cfg.auto_trim = false;
  Pool pool({d}, cfg);
  hand_off_and_drop(pool, 40, 64 * 1024);
  const PoolStats first = pool.stats();
  CHECK(first.live_objects == 0);
  CHECK(first.large_allocations == 40);
  CHECK(first.bytes_in_use == 0);
  // Later rounds reuse the parked spans: nothing new is mapped, and the
  // counts stay exact whichever list an object came from.
  for (int round = 0; round < 20; ++round) hand_off_and_drop(pool, 40, 64 * 1024);
  const PoolStats later = pool.stats();
  CHECK(later.bytes_mapped == first.bytes_mapped);
  CHECK(later.large_allocations == 21 * 40);
  CHECK(later.large_live == 0);
  CHECK(later.bytes_in_use == 0);
  // A size in another bucket is not served a span that does not fit.
  auto big = pool.allocate(200 * 1024);
  REQUIRE(big.ok());
  CHECK(big->capacity() >= 200 * 1024);
  big->reset();
  // trim gives the parked spans back: every arena but the retained one goes.
  pool.trim();
  CHECK(pool.stats().arenas == 1);
  CHECK(d->stats().live_registrations == 1);
}

TEST_CASE("spans parked on the central lists do not make a capped pool fail", "[pool][handoff][cap]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg = small_config(2);
  cfg.max_bytes = 4 * kMiB;
  cfg.auto_trim = false;
  Pool pool({d}, cfg);
  hand_off_and_drop(pool, 20, 64 * 1024);  // about 1 MiB of the first arena parked
  std::vector<Ldo> v;
  for (int i = 0; i < 2; ++i) {
    auto r = pool.allocate(1536 * 1024);
    REQUIRE(r.ok());
    v.push_back(std::move(*r));
  }
  CHECK(pool.stats().bytes_mapped <= cfg.max_bytes);
}
