// Zero on allocate (PoolConfig::zero_on_allocate, LdoShape::zeroing): an
// object handed out with zeroing never shows an earlier object's bytes.
//  - Every size class, large spans (thread span cache and arena), dedicated
//    arenas: objects are filled with a pattern over their whole capacity,
//    dropped, and allocated again with zeroing; the test requires that the
//    same bytes came back (otherwise it would prove nothing) and that every
//    byte after the wire header reads as zero.
//  - Without zeroing the same reuse happens: documented by the addresses
//    and by the zeroing counters staying flat, never by asserting garbage.
//  - The per-allocation override beats the pool default both ways.
//  - Thread caches, the central lists (no thread cache), other threads.
//  - MADV_DONTNEED only where no served domain pins memory, and never with
//    prefault; pages known zero (never handed out) are not cleared again.
// Hugetlbfs arenas are covered in pool-hugetlb (it reserves the pages).
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "pool/size_classes.hpp"
#include "regpool/pool.hpp"
#include "regpool/telemetry.hpp"
#include "support/fake_domain.hpp"

using namespace regpool;
using regpool::test::FakeDomain;

namespace {

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = kKiB * 1024;
constexpr std::uint64_t kPage = 4096;
constexpr std::uint64_t kNone = UINT64_MAX;

// The bytes an object owns after its wire header: meta, padding, data and
// the room resize() may grow into.
std::span<std::byte> owned(const Ldo& o) {
  return {o.base() + kWireHeaderSize, static_cast<std::size_t>(o.capacity())};
}

// Offset (within owned()) of the first non-zero byte, or kNone.
std::uint64_t first_nonzero(const Ldo& o) {
  const auto b = owned(o);
  for (std::size_t i = 0; i < b.size(); ++i)
    if (b[i] != std::byte{0}) return i;
  return kNone;
}

std::shared_ptr<FakeDomain> domain(bool pins) {
  auto d = std::make_shared<FakeDomain>();
  d->set_pins_memory(pins);
  return d;
}

PoolConfig zeroing_config(bool zero_default) {
  PoolConfig c;
  c.name = "zeroing";
  c.arena_size = 32 * kMiB;
  c.retain_idle_dedicated = 1;  // so a dedicated arena can come back
  c.zero_on_allocate = zero_default;
  return c;
}

LdoShape shape(std::uint64_t data, Zeroing z, std::uint64_t meta = 0) {
  return LdoShape{.data_size = data, .meta_size = meta, .zeroing = z};
}

// Allocates `n` objects without zeroing, fills all they own with 0xA5,
// drops them, then allocates `n` with `again` and checks each one reuses
// one of the dirtied objects. Returns the new objects.
std::vector<Ldo> dirty_then_reallocate(Pool& pool, std::uint64_t size, std::uint64_t meta, Zeroing again,
                                       int n) {
  std::set<std::byte*> dirtied;
  {
    std::vector<Ldo> dirty;
    for (int i = 0; i < n; ++i) {
      auto r = pool.allocate(shape(size, Zeroing::uninitialized, meta));
      REQUIRE(r.ok());
      std::memset(owned(*r).data(), 0xA5, owned(*r).size());
      dirtied.insert(r->base());
      dirty.push_back(std::move(*r));
    }
  }
  std::vector<Ldo> out;
  for (int i = 0; i < n; ++i) {
    auto r = pool.allocate(shape(size, again, meta));
    REQUIRE(r.ok());
    INFO("size " << size << " meta " << meta << ", object " << i);
    // The bytes of a dropped object came back: without this, a clean result
    // would say nothing about zeroing.
    REQUIRE(dirtied.count(r->base()) == 1);
    CHECK(r->data_size() == size);
    CHECK(r->meta_size() == meta);
    out.push_back(std::move(*r));
  }
  return out;
}

// Sizes: every small class filled to the brim and half full (the slack
// must be clean too), then large spans (span cache up to 16 MiB, the arena
// beyond) and a dedicated arena (larger than the 32 MiB arenas).
std::vector<std::uint64_t> sizes() {
  std::vector<std::uint64_t> v;
  for (std::uint32_t c : detail::kClassSize) {
    v.push_back(c - kWireHeaderSize);
    v.push_back(c / 2);
  }
  for (std::uint64_t s : {40 * kKiB, 100 * kKiB, 1 * kMiB, 5 * kMiB, 17 * kMiB, 40 * kMiB}) v.push_back(s);
  return v;
}

int objects_for(std::uint64_t size) { return size <= kMaxSmallObject ? 3 : (size <= 16 * kMiB ? 2 : 1); }

// Pages of [p, p + n) resident in memory, by mincore().
std::size_t resident_pages(const std::byte* p, std::size_t n) {
  std::vector<unsigned char> vec((n + kPage - 1) / kPage);
  REQUIRE(::mincore(const_cast<std::byte*>(p), n, vec.data()) == 0);
  std::size_t r = 0;
  for (unsigned char c : vec) r += c & 1;
  return r;
}

}  // namespace

TEST_CASE("zero on allocate: reused objects of every size read as zero after the header", "[zeroing]") {
  const bool cached = GENERATE(true, false);
  auto d = domain(true);
  PoolConfig c = zeroing_config(true);
  c.thread_cache = cached;
  Pool pool({d}, c);
  INFO((cached ? "thread caches" : "no thread cache"));
  std::uint64_t zeroed = 0;
  for (std::uint64_t size : sizes()) {
    for (std::uint64_t meta : {std::uint64_t{0}, std::uint64_t{13}}) {
      const int n = objects_for(size);
      auto objs = dirty_then_reallocate(pool, size, meta, Zeroing::pool_default, n);
      for (const Ldo& o : objs) {
        INFO("size " << size << " meta " << meta << " capacity " << o.capacity());
        CHECK(first_nonzero(o) == kNone);
        // The header is the pool's, not user bytes: it says what was asked.
        CHECK(WireHeader::decode(o.base()).data_size == size);
        CHECK(WireHeader::decode(o.base()).meta_size == meta);
      }
      zeroed += static_cast<std::uint64_t>(n);
    }
  }
  const PoolStats s = pool.stats();
  CHECK(s.zeroed_allocations == zeroed);
  CHECK(s.zero_memset_bytes > 0);
  CHECK(s.zero_madvise_bytes == 0);  // the domain pins: memset only
  INFO(to_string(s));
}

TEST_CASE("zero on allocate: resize grows into zeros", "[zeroing]") {
  auto d = domain(true);
  Pool pool({d}, zeroing_config(true));
  for (std::uint64_t cap : {std::uint64_t{4000}, 200 * kKiB}) {
    {
      auto dirty = pool.allocate(LdoShape{.data_size = 8, .capacity = cap, .zeroing = Zeroing::uninitialized});
      REQUIRE(dirty.ok());
      std::memset(owned(*dirty).data(), 0x77, owned(*dirty).size());
    }
    auto r = pool.allocate(LdoShape{.data_size = 8, .capacity = cap});
    REQUIRE(r.ok());
    REQUIRE(r->resize_data(r->capacity()) == Status::ok);
    for (std::byte b : r->data()) REQUIRE(b == std::byte{0});
  }
}

TEST_CASE("without zeroing objects are reused as they are", "[zeroing]") {
  // What zeroing exists for: a dropped object's bytes come straight back.
  // Whether they still hold the old pattern is not promised either way, so
  // only the reuse and the absence of zeroing work are checked.
  auto d = domain(true);
  Pool pool({d}, zeroing_config(false));
  for (std::uint64_t size : {std::uint64_t{100}, 20 * kKiB, 1 * kMiB}) {
    // Reuse is required inside; the old bytes are typically still there.
    auto objs = dirty_then_reallocate(pool, size, 0, Zeroing::pool_default, objects_for(size));
    CHECK(objs.size() == static_cast<std::size_t>(objects_for(size)));
  }
  const PoolStats s = pool.stats();
  CHECK(s.zeroed_allocations == 0);
  CHECK(s.zero_memset_bytes == 0);
  CHECK(s.zero_madvise_bytes == 0);
  CHECK(s.zero_fresh_bytes == 0);
}

TEST_CASE("the per-allocation override beats the pool default both ways", "[zeroing]") {
  auto d = domain(true);
  SECTION("pool zeroes by default, the allocation opts out") {
    Pool pool({d}, zeroing_config(true));
    for (std::uint64_t size : {std::uint64_t{100}, 20 * kKiB, 1 * kMiB}) {
      const std::uint64_t before = pool.stats().zeroed_allocations;
      auto objs = dirty_then_reallocate(pool, size, 0, Zeroing::uninitialized, objects_for(size));
      // The dirtying allocations opted out too: no zeroing at all.
      CHECK(pool.stats().zeroed_allocations == before);
      CHECK(pool.stats().zero_memset_bytes == 0);
    }
  }
  SECTION("pool does not zero, the allocation asks for it") {
    Pool pool({d}, zeroing_config(false));
    for (std::uint64_t size : {std::uint64_t{100}, 20 * kKiB, 1 * kMiB}) {
      auto objs = dirty_then_reallocate(pool, size, 8, Zeroing::zeroed, objects_for(size));
      for (const Ldo& o : objs) CHECK(first_nonzero(o) == kNone);
    }
    CHECK(pool.stats().zeroed_allocations == 3 + 3 + 2);
  }
  SECTION("Pool::allocate(size) follows the pool default") {
    Pool pool({d}, zeroing_config(true));
    { std::memset(pool.allocate(1000)->data().data(), 0x11, 1000); }
    auto r = pool.allocate(1000);
    REQUIRE(r.ok());
    CHECK(first_nonzero(*r) == kNone);
  }
}

TEST_CASE("zeroing on other threads and through their caches", "[zeroing]") {
  auto d = domain(false);
  PoolConfig c = zeroing_config(true);
  c.zero_madvise_min = 64 * kKiB;
  Pool pool({d}, c);
  std::atomic<int> bad{0};
  std::atomic<int> not_reused{0};
  auto work = [&](unsigned char pattern) {
    for (int round = 0; round < 50; ++round) {
      for (std::uint64_t size : {std::uint64_t{64}, std::uint64_t{3000}, 30 * kKiB, 300 * kKiB}) {
        std::byte* base = nullptr;
        {
          auto r = pool.allocate(shape(size, Zeroing::uninitialized));
          if (!r) {
            ++bad;
            return;
          }
          base = r->base();
          std::memset(owned(*r).data(), pattern, owned(*r).size());
        }
        auto r = pool.allocate(size);
        if (!r || first_nonzero(*r) != kNone) ++bad;
        if (r && r->base() != base) ++not_reused;
      }
    }
  };
  std::thread a(work, 0x5A);
  std::thread b(work, 0xC3);
  a.join();
  b.join();
  CHECK(bad.load() == 0);
  // The thread caches hand a thread its own last drop back (LIFO).
  CHECK(not_reused.load() == 0);
  CHECK(pool.stats().zeroed_allocations == 2 * 50 * 4);
}

TEST_CASE("MADV_DONTNEED only where no served domain pins memory", "[zeroing]") {
  constexpr std::uint64_t kSize = 4 * kMiB;
  auto run = [](std::vector<std::shared_ptr<Domain>> domains, PoolConfig c) {
    Pool pool(std::move(domains), c);
    auto objs = dirty_then_reallocate(pool, kSize, 0, Zeroing::zeroed, 1);
    const Ldo& o = objs[0];
    const PoolStats s = pool.stats();
    // Whole pages after the header's page, as mincore sees them before
    // anything reads them: given back, or still there (memset).
    const std::size_t resident = resident_pages(o.base() + kPage, static_cast<std::size_t>(kSize - kPage));
    CHECK(first_nonzero(o) == kNone);
    return std::make_pair(s, resident);
  };
  PoolConfig c = zeroing_config(false);
  c.zero_madvise_min = 64 * kKiB;
  const std::size_t pages = (kSize - kPage) / kPage;

  SECTION("software domains only: whole pages go back to the kernel") {
    auto [s, resident] = run({domain(false), domain(false)}, c);
    CHECK(s.zero_madvise_bytes >= kSize - kPage);
    CHECK(s.zero_memset_bytes < kPage);  // the header's page only
    CHECK(resident == 0);
  }
  SECTION("one pinning domain among them: memset") {
    auto [s, resident] = run({domain(false), domain(true)}, c);
    CHECK(s.zero_madvise_bytes == 0);
    CHECK(s.zero_memset_bytes >= kSize);
    CHECK(resident == pages);
  }
  SECTION("prefault asks for no later faults: memset") {
    c.prefault = true;
    auto [s, resident] = run({domain(false)}, c);
    CHECK(s.zero_madvise_bytes == 0);
    CHECK(resident == pages);
  }
  SECTION("zero_madvise_min = 0: memset") {
    c.zero_madvise_min = 0;
    auto [s, resident] = run({domain(false)}, c);
    CHECK(s.zero_madvise_bytes == 0);
    CHECK(resident == pages);
  }
  SECTION("below zero_madvise_min: memset") {
    c.zero_madvise_min = 8 * kMiB;
    auto [s, resident] = run({domain(false)}, c);
    CHECK(s.zero_madvise_bytes == 0);
    CHECK(resident == pages);
  }
}

TEST_CASE("pages no object has used are not cleared again", "[zeroing]") {
  auto d = domain(true);
  PoolConfig c = zeroing_config(true);
  c.thread_cache = false;  // drops go straight back to the arena
  c.arena_size = 8 * kMiB;
  Pool pool({d}, c);

  // A fresh arena: nothing to do.
  auto big = pool.allocate(1 * kMiB);
  REQUIRE(big.ok());
  PoolStats s = pool.stats();
  CHECK(s.zero_memset_bytes == 0);
  CHECK(s.zero_fresh_bytes == big->capacity());
  CHECK(first_nonzero(*big) == kNone);
  const std::uint64_t dirty_bytes = big->capacity() + kWireHeaderSize;  // the span, header included
  std::memset(owned(*big).data(), 0xEE, owned(*big).size());
  big->reset();

  // A larger object takes the same start (best fit, lowest address): the
  // first span's pages are cleared, the pages after it are known zero.
  auto bigger = pool.allocate(3 * kMiB);
  REQUIRE(bigger.ok());
  s = pool.stats();
  CHECK(s.zero_memset_bytes == dirty_bytes - kWireHeaderSize);
  CHECK(s.zero_fresh_bytes == (kMiB + kPage - kWireHeaderSize) + (bigger->capacity() + kWireHeaderSize - dirty_bytes));
  CHECK(first_nonzero(*bigger) == kNone);

  // Small objects from a slab carved out of untouched pages: no work either,
  // until a slot comes back.
  const std::uint64_t memset_before = s.zero_memset_bytes;
  std::byte* first_base = nullptr;
  {
    auto small = pool.allocate(1000);
    REQUIRE(small.ok());
    CHECK(pool.stats().zero_memset_bytes == memset_before);
    CHECK(first_nonzero(*small) == kNone);
    first_base = small->base();
    std::memset(owned(*small).data(), 0x42, owned(*small).size());
  }
  auto again = pool.allocate(1000);
  REQUIRE(again.ok());
  REQUIRE(again->base() == first_base);
  CHECK(pool.stats().zero_memset_bytes == memset_before + again->capacity());
  CHECK(first_nonzero(*again) == kNone);
}

TEST_CASE("clone into a zeroing pool leaves no old bytes in the slack", "[zeroing]") {
  auto d = domain(true);
  Pool pool({d}, zeroing_config(true));
  auto src = pool.allocate(LdoShape{.data_size = 10, .capacity = 2000});
  REQUIRE(src.ok());
  std::memset(src->data().data(), 0x31, 10);
  {
    auto dirty = pool.allocate(LdoShape{.data_size = 10, .capacity = 2000, .zeroing = Zeroing::uninitialized});
    std::memset(owned(*dirty).data(), 0x99, owned(*dirty).size());
  }
  auto copy = src->clone();
  REQUIRE(copy.ok());
  CHECK(std::memcmp(copy->data().data(), src->data().data(), 10) == 0);
  const auto b = owned(*copy);
  for (std::size_t i = copy->data_offset() - kWireHeaderSize + 10; i < b.size(); ++i) REQUIRE(b[i] == std::byte{0});
}
