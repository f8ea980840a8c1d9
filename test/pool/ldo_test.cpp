// LDO handles: layout, wire header, refcounting, resize, clone, regions,
// and user memory with lazy registration.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "regpool/ldo.hpp"
#include "regpool/pool.hpp"
#include "support/fake_domain.hpp"

using namespace regpool;
using regpool::test::FakeDomain;

namespace {

PoolConfig cfg2() {
  PoolConfig c;
  c.arena_size = std::size_t{2} << 20;
  return c;
}

}  // namespace

TEST_CASE("wire header is little-endian and matches the sections", "[ldo]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, cfg2());
  auto r = pool.allocate(LdoShape{1000, 13, 0xA1B2C3D4, 0});
  REQUIRE(r.ok());
  Ldo o = std::move(*r);
  const std::byte* h = o.base();
  const unsigned char expect[] = {0xD4, 0xC3, 0xB2, 0xA1, 0, 0, 0, 0, 13, 0, 0, 0, 0, 0, 0, 0, 0xE8, 0x03, 0, 0, 0, 0, 0, 0};
  for (std::size_t i = 0; i < sizeof expect; ++i) CHECK(std::to_integer<unsigned>(h[i]) == expect[i]);
  const WireHeader w = WireHeader::decode(h);
  CHECK(w.type_id == 0xA1B2C3D4);
  CHECK(w.meta_size == 13);
  CHECK(w.data_size == 1000);
  CHECK(o.meta().data() == o.base() + kWireHeaderSize);
  CHECK(o.data_offset() == kWireHeaderSize + 16);  // meta padded to 8
  CHECK(o.data().data() == o.base() + o.data_offset());
  CHECK(o.wire_size() == kWireHeaderSize + 16 + 1000);
  o.set_type_id(7);
  CHECK(WireHeader::decode(o.base()).type_id == 7);
  CHECK(o.type_id() == 7);
}

TEST_CASE("64-bit sizes survive the header", "[ldo]") {
  WireHeader w{1, 0, (std::uint64_t{1} << 40) + 3, (std::uint64_t{1} << 33) + 5};
  std::byte buf[kWireHeaderSize];
  w.encode(buf);
  const WireHeader back = WireHeader::decode(buf);
  CHECK(back.meta_size == w.meta_size);
  CHECK(back.data_size == w.data_size);

  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, cfg2());
  const std::uint64_t five_gib = std::uint64_t{5} << 30;
  auto big = pool.allocate(five_gib);  // a dedicated arena; pages are touched lazily
  REQUIRE(big.ok());
  CHECK(big->data_size() == five_gib);
  CHECK(WireHeader::decode(big->base()).data_size == five_gib);
  big->data()[five_gib - 1] = std::byte{1};
}

TEST_CASE("copies share, the last drop releases", "[ldo]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, cfg2());
  Ldo a = *pool.allocate(100);
  CHECK(a.use_count() == 1);
  Ldo b = a;
  Ldo c;
  c = b;
  CHECK(a.use_count() == 3);
  CHECK(b.base() == a.base());
  Ldo m = std::move(c);
  CHECK_FALSE(c);  // NOLINT(bugprone-use-after-move)
  CHECK(a.use_count() == 3);
  a.reset();
  b.reset();
  CHECK(pool.stats().live_objects == 1);
  // Self-assignment is harmless. Through a reference, because clang rejects
  // the literal `m = m` (-Wself-assign-overloaded).
  const Ldo& same = m;
  m = same;
  CHECK(m.use_count() == 1);
  CHECK(pool.stats().live_objects == 1);
  m.reset();
  CHECK(pool.stats().live_objects == 0);
  Ldo empty;
  CHECK(empty.data().empty());
  CHECK(empty.use_count() == 0);
  CHECK(empty.resize(1, 0) == Status::invalid_argument);
}

TEST_CASE("the handle carries its object's address; moved-from and failed handles are empty", "[ldo]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, cfg2());
  Ldo a = *pool.allocate(LdoShape{100, 16, 7, 0});
  std::byte* const base = a.base();
  REQUIRE(base != nullptr);
  CHECK(a.wire().data() == base);
  CHECK(a.meta().data() == base + kWireHeaderSize);
  CHECK(a.data().data() == base + data_offset_for(16));
  // A resize through one handle moves the data section for every handle:
  // only the address, which never changes, is kept in the handle.
  Ldo b = a;
  REQUIRE(b.resize(50, 40) == Status::ok);
  CHECK(a.data().data() == base + data_offset_for(40));
  CHECK(a.data().size() == 50);
  Ldo m = std::move(b);
  CHECK(m.base() == base);
  CHECK(b.base() == nullptr);  // NOLINT(bugprone-use-after-move)
  m.reset();
  CHECK(m.base() == nullptr);
  CHECK_FALSE(m);
  // A failed allocation's Result (which keeps an empty handle) moves and
  // destroys without touching the pool.
  const auto live = pool.stats().live_objects;
  Result<Ldo> bad = pool.allocate(kMaxObjectBytes + 1);
  CHECK(bad.status() == Status::invalid_argument);
  Result<Ldo> moved = std::move(bad);
  CHECK(moved.status() == Status::invalid_argument);
  moved = pool.allocate(64);
  REQUIRE(moved.ok());
  CHECK(pool.stats().live_objects == live + 1);
  moved = Result<Ldo>(Status::closed);
  CHECK(pool.stats().live_objects == live);
}

TEST_CASE("resize within capacity keeps data; beyond capacity fails", "[ldo]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, cfg2());
  Ldo o = *pool.allocate(LdoShape{100, 0, 0, 4000});
  CHECK(o.capacity() >= 4000);
  for (int i = 0; i < 100; ++i) o.data()[static_cast<std::size_t>(i)] = static_cast<std::byte>(i);
  REQUIRE(o.resize(3000, 0) == Status::ok);
  CHECK(o.data_size() == 3000);
  REQUIRE(o.resize(100, 50) == Status::ok);  // meta grows: data moves, keeps its bytes
  CHECK(o.meta_size() == 50);
  for (int i = 0; i < 100; ++i) CHECK(o.data()[static_cast<std::size_t>(i)] == static_cast<std::byte>(i));
  CHECK(WireHeader::decode(o.base()).meta_size == 50);
  CHECK(o.resize(o.capacity() + 1, 0) == Status::capacity_exceeded);
  CHECK(o.resize(o.capacity() - 8, 16) == Status::capacity_exceeded);
  CHECK(o.resize(UINT64_MAX, UINT64_MAX) == Status::capacity_exceeded);
  CHECK(o.data_size() == 100);  // failed resizes change nothing
  CHECK(o.resize(o.capacity(), 0) == Status::ok);
}

TEST_CASE("clone is deep", "[ldo]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, cfg2());
  Pool other({d}, cfg2());
  Ldo o = *pool.allocate(LdoShape{64, 8, 42, 0});
  std::memset(o.meta().data(), 'm', 8);
  std::memset(o.data().data(), 'd', 64);
  Ldo c = *o.clone();
  Ldo c2 = *o.clone(other);
  CHECK(c.base() != o.base());
  CHECK(c.type_id() == 42);
  CHECK(std::memcmp(c.wire().data(), o.wire().data(), o.wire().size()) == 0);
  CHECK(std::memcmp(c2.wire().data(), o.wire().data(), o.wire().size()) == 0);
  c.data()[0] = std::byte{'x'};
  CHECK(o.data()[0] == std::byte{'d'});
  CHECK(other.stats().live_objects == 1);
}

TEST_CASE("regions describe the arena registration per domain", "[ldo]") {
  auto va = std::make_shared<FakeDomain>("va", AddressMode::virtual_address);
  auto off = std::make_shared<FakeDomain>("off", AddressMode::offset);
  Pool pool({va, off}, cfg2());
  Ldo o = *pool.allocate(1000);
  auto rv = o.region(*va);
  auto ro = o.region(*off);
  REQUIRE(rv.ok());
  REQUIRE(ro.ok());
  CHECK(rv->remote_base == reinterpret_cast<std::uintptr_t>(o.base()));
  CHECK(rv->registration->contains(o.base(), o.wire_size()));
  CHECK(ro->mode == AddressMode::offset);
  CHECK(ro->remote_base == static_cast<std::uint64_t>(o.base() - ro->registration->base()));
  CHECK(rv->registration != ro->registration);
  CHECK(rv->access == Access::all);
  auto stranger = std::make_shared<FakeDomain>("stranger");
  CHECK(o.region(*stranger).status() == Status::unsupported);
}

TEST_CASE("user memory: eager registration, cleanup after deregistration", "[ldo][user]") {
  auto d = std::make_shared<FakeDomain>("eager");
  std::vector<std::byte> mem(4096);
  int cleanups = 0;
  {
    UserMemory um;
    um.memory = mem;
    um.data_size = 1000;
    um.meta_size = 10;
    um.type_id = 9;
    um.eager_domains = {d};
    um.cleanup = [&](std::span<std::byte> m) {
      ++cleanups;
      CHECK(m.data() == mem.data());
      // Deregistration happened before the memory came back.
      CHECK(d->stats().live_registrations == 0);
      d->log("cleanup");
    };
    Ldo o = Ldo::wrap(std::move(um));
    CHECK(o.is_user_memory());
    CHECK(o.base() == mem.data());
    CHECK(o.data().size() == 1000);
    CHECK(WireHeader::decode(mem.data()).type_id == 9);
    CHECK(d->stats().live_registrations == 1);
    auto r = o.region(*d);
    REQUIRE(r.ok());
    CHECK(r->registration->length() == 4096);
    Ldo copy = o;
    o.reset();
    CHECK(cleanups == 0);
    CHECK(copy.clone().status() == Status::unsupported);
  }
  CHECK(cleanups == 1);
  const auto ev = d->events();
  REQUIRE(ev.size() == 3);
  CHECK(ev[1] == "deregister 4096");
  CHECK(ev[2] == "cleanup");
}

TEST_CASE("user memory: lazy registration happens exactly once under races", "[ldo][user]") {
  auto d = std::make_shared<FakeDomain>("lazy");
  std::vector<std::byte> mem(8192);
  std::atomic<int> cleanups{0};
  {
    UserMemory um;
    um.memory = mem;
    um.data_size = 8000;
    um.cleanup = [&](std::span<std::byte>) { cleanups.fetch_add(1); };
    Ldo o = Ldo::wrap(std::move(um));
    CHECK(d->calls() == 0);
    std::atomic<bool> go{false};
    std::vector<std::thread> ts;
    std::vector<std::uint64_t> keys(8);
    for (int t = 0; t < 8; ++t) {
      ts.emplace_back([&, t, copy = o] {
        while (!go.load()) std::this_thread::yield();
        auto r = copy.region(*d);
        keys[static_cast<std::size_t>(t)] = r.ok() ? r->remote_key : 0;
      });
    }
    go.store(true);
    for (auto& t : ts) t.join();
    CHECK(d->calls() == 1);
    for (auto k : keys) CHECK(k == keys[0]);
    CHECK(keys[0] != 0);
  }
  CHECK(cleanups.load() == 1);
  CHECK(d->stats().live_registrations == 0);
}

TEST_CASE("user memory: a failed lazy registration is a status and can be retried", "[ldo][user]") {
  auto d = std::make_shared<FakeDomain>();
  std::vector<std::byte> mem(256);
  UserMemory um;
  um.memory = mem;
  um.data_size = 100;
  Ldo o = Ldo::wrap(std::move(um));
  d->fail_next(1);
  CHECK(o.region(*d).status() == Status::registration_failed);
  CHECK(o.region(*d).ok());
}

TEST_CASE("user memory: bad input and failed eager registration", "[ldo][user][bad-input]") {
  auto d = std::make_shared<FakeDomain>();
  std::vector<std::byte> mem(100);
  UserMemory tiny;
  tiny.memory = std::span<std::byte>(mem.data(), 10);
  CHECK_THROWS_AS(Ldo::wrap(tiny), Error);
  UserMemory too_big;
  too_big.memory = mem;
  too_big.data_size = 77;
  CHECK_THROWS_AS(Ldo::wrap(too_big), Error);

  int cleanups = 0;
  UserMemory fails;
  fails.memory = mem;
  fails.data_size = 50;
  fails.eager_domains = {d};
  fails.cleanup = [&](std::span<std::byte>) { ++cleanups; };
  d->fail_next(1);
  try {
    (void)Ldo::wrap(fails);
    FAIL("expected an Error");
  } catch (const Error& e) {
    CHECK(e.status() == Status::registration_failed);
  }
  CHECK(cleanups == 0);  // the caller still owns its memory
}

// A free pool block keeps one reference (the sole owner's drop does not
// write the count; the last drop of a shared object puts the 1 back), so
// allocation from a thread cache does not write it. Whichever way an object
// went, its slot's next object must start with exactly one reference.
TEST_CASE("a reused object starts with one reference however the last one was dropped", "[ldo]") {
  auto d = std::make_shared<FakeDomain>();
  Pool pool({d}, cfg2());
  std::byte* first = nullptr;
  {
    Ldo a = *pool.allocate(100);
    first = a.base();
    Ldo b = a;  // shared: the last drop takes the decrement
    a.reset();
    CHECK(b.use_count() == 1);
  }
  Ldo again = *pool.allocate(100);
  CHECK(again.base() == first);  // the same slot, from this thread's cache
  CHECK(again.use_count() == 1);
  again.reset();
  CHECK(pool.stats().live_objects == 0);

  // Copies dropped on two threads at once: either may take the last
  // decrement (and the drop), every reused slot still starts at one.
  constexpr int kRounds = 2000;
  std::vector<Ldo> handed(kRounds);
  for (auto& h : handed) h = *pool.allocate(64);
  std::vector<Ldo> copies(handed);
  std::atomic<int> go{0};
  std::thread other([&] {
    go.fetch_add(1);
    while (go.load() < 2) {
    }
    for (auto& c : copies) c.reset();
    for (int i = 0; i < kRounds; ++i) {
      Ldo r = *pool.allocate(64);
      CHECK(r.use_count() == 1);
      Ldo copy = r;
      CHECK(r.use_count() == 2);
    }
  });
  go.fetch_add(1);
  while (go.load() < 2) {
  }
  for (auto& h : handed) h.reset();
  other.join();
  for (int i = 0; i < kRounds; ++i) {
    Ldo r = *pool.allocate(64);
    CHECK(r.use_count() == 1);
  }
  CHECK(pool.stats().live_objects == 0);
}
