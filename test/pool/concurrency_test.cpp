// Where deregistration happens, and closing a pool while other threads drop
// its objects.
//  - An Ldo drop never deregisters: an arena that goes idle is released at
//    the next allocation slow path, by trim() or at close, and never while
//    the class or pool locks that allocation and free need are held.
//  - Pool::close racing with drops on other threads (per-thread caches,
//    the lock-free free path, handed-off copies, exiting threads) loses no
//    object and frees none twice: every registration is undone once the
//    last object has dropped, and not before.
// REGPOOL_STRESS_OPS scales the close stress (default 2,000,000 gives 200
// rounds).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "regpool/pool.hpp"
#include "support/fake_domain.hpp"

using namespace regpool;
using regpool::test::FakeDomain;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Set around each Ldo drop the test makes, on the dropping thread.
thread_local bool tl_in_drop = false;

void drop(Ldo& o) {
  tl_in_drop = true;
  o.reset();
  tl_in_drop = false;
}

// A domain that registers nothing and, on every deregistration, records
// (1) whether it runs inside one of the test's Ldo drops on this thread and
// (2) whether another thread can still use the pool meanwhile: it runs
// `probe` (allocations and stats on the pool) on a helper thread and waits a
// bounded time for it. If the deregistering thread holds a lock that
// allocation, free or stats need, the probe cannot finish until the
// deregistration returns, and the wait times out.
class ProbeDomain final : public Domain {
 public:
  std::string name() const override { return "probe"; }

  // Set while the pool is alive, cleared before it closes.
  void set_probe(std::function<void()> fn) {
    std::lock_guard g(m_);
    probe_ = std::move(fn);
  }
  std::atomic<int> deregistrations{0};
  std::atomic<int> inside_drop{0};
  std::atomic<int> probes_ok{0};
  std::atomic<int> probes_blocked{0};

  // Joins the probe threads (a blocked probe finishes once the locks drop).
  void join_probes() {
    std::lock_guard g(m_);
    for (auto& t : helpers_) t.join();
    helpers_.clear();
  }
  ~ProbeDomain() override { join_probes(); }

 protected:
  Native do_register(void* addr, std::size_t, Access) override {
    const std::uint64_t key = next_key_.fetch_add(1);
    return Native{addr, nullptr, key, static_cast<std::uint32_t>(key), AddressMode::virtual_address};
  }
  void do_deregister(const Native&, void*, std::size_t) noexcept override {
    deregistrations.fetch_add(1);
    if (tl_in_drop) inside_drop.fetch_add(1);
    // One probe at a time, and none from the probe's own allocations; stop
    // after the first blocked one so a failing run does not wait per arena.
    std::function<void()> fn;
    {
      std::lock_guard g(m_);
      fn = probe_;
    }
    if (!fn || probes_blocked.load() > 0 || tl_probing || probing_.exchange(true)) return;
    auto done = std::make_shared<std::promise<void>>();
    auto fut = done->get_future();
    std::thread t([fn, done] {
      tl_probing = true;
      fn();
      done->set_value();
    });
    const bool ok = fut.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    (ok ? probes_ok : probes_blocked).fetch_add(1);
    {
      std::lock_guard g(m_);
      helpers_.push_back(std::move(t));
    }
    probing_.store(false);
  }

 private:
  static thread_local bool tl_probing;
  std::atomic<std::uint64_t> next_key_{1};
  std::atomic<bool> probing_{false};
  std::mutex m_;
  std::function<void()> probe_;
  std::vector<std::thread> helpers_;
};
thread_local bool ProbeDomain::tl_probing = false;

// Allocation and free of the sizes the tests use (their size classes and
// the large-span path) plus stats(): what a deregistration must not block.
std::function<void()> pool_probe(Pool& pool) {
  return [&pool] {
    auto small = pool.allocate(2000);
    auto large = pool.allocate(300 * 1024);
    (void)pool.stats();
    if (small) small->reset();
    if (large) large->reset();
  };
}

// Fills a pool of 2 MiB arenas until it has grown to `arenas` arenas, with
// small objects only or with one large object per 100 small ones.
std::vector<Ldo> fill(Pool& pool, std::uint64_t arenas, bool with_large) {
  std::vector<Ldo> v;
  while (pool.stats().arenas < arenas) {
    for (int i = 0; i < 100; ++i) v.push_back(*pool.allocate(2000));
    if (with_large) v.push_back(*pool.allocate(300 * 1024));
  }
  return v;
}

}  // namespace

TEST_CASE("auto_trim: dropping the last object of an arena does not deregister it; the next slow path does",
          "[pool][trim][concurrency]") {
  auto d = std::make_shared<ProbeDomain>();
  {
    PoolConfig cfg;
    cfg.arena_size = 2 * kMiB;
    cfg.auto_trim = true;
    cfg.retain_idle_arenas = 1;
    Pool pool({d}, cfg);
    d->set_probe(pool_probe(pool));
    // Small objects only: dropped in allocation order, they empty whole
    // slabs and so whole arenas (a large span would sit in the thread's
    // span cache and keep its arena busy).
    // The first slabs to empty stay with their class (it keeps some free
    // room), so of six arenas about four go idle.
    std::vector<Ldo> v = fill(pool, 6, false);
    const auto full = pool.stats();
    REQUIRE(full.arenas >= 6);
    for (auto& o : v) drop(o);
    // Nothing was deregistered inside a drop: the idle arenas are still
    // mapped and registered, waiting for the next release point.
    CHECK(d->inside_drop.load() == 0);
    CHECK(d->deregistrations.load() == 0);
    const auto idle = pool.stats();
    CHECK(idle.live_objects == 0);
    CHECK(idle.deregistrations == 0);
    CHECK(idle.arenas_released == 0);
    CHECK(idle.idle_arenas > cfg.retain_idle_arenas);
    CHECK(d->stats().live_registrations == idle.arenas);

    // A large allocation takes the slow path: it releases the idle arenas
    // beyond the retention, after dropping its locks.
    auto big = pool.allocate(300 * 1024);
    REQUIRE(big.ok());
    const auto after = pool.stats();
    CHECK(after.arenas_released > 0);
    CHECK(after.deregistrations == after.arenas_released);
    CHECK(after.arenas == full.arenas - after.arenas_released);
    CHECK(after.idle_arenas <= cfg.retain_idle_arenas);
    CHECK(d->stats().live_registrations == after.arenas);
    CHECK(static_cast<std::uint64_t>(d->deregistrations.load()) == after.deregistrations);
    CHECK(d->inside_drop.load() == 0);
    CHECK(d->probes_ok.load() > 0);
    CHECK(d->probes_blocked.load() == 0);
    big->reset();
    d->set_probe(nullptr);
  }
  d->join_probes();
  CHECK(d->stats().live_registrations == 0);
  CHECK(d->inside_drop.load() == 0);
}

TEST_CASE("auto_trim: a dedicated arena stays registered after its drop until the next slow path",
          "[pool][trim][concurrency]") {
  auto d = std::make_shared<ProbeDomain>();
  PoolConfig cfg;
  cfg.arena_size = 2 * kMiB;
  Pool pool({d}, cfg);
  d->set_probe(pool_probe(pool));
  Ldo big = *pool.allocate(5 * kMiB);
  CHECK(pool.stats().dedicated_arenas == 1);
  drop(big);
  CHECK(d->deregistrations.load() == 0);
  CHECK(pool.stats().dedicated_arenas == 1);
  CHECK(pool.stats().idle_arenas == 2);  // the regular one (retained) and the dedicated one
  // A small allocation from a thread with an empty cache is a slow path too.
  std::thread([&] { CHECK(pool.allocate(100).ok()); }).join();
  const auto s = pool.stats();
  CHECK(s.dedicated_arenas == 0);
  CHECK(s.arenas_released == 1);
  CHECK(s.deregistrations == 1);
  CHECK(d->inside_drop.load() == 0);
  CHECK(d->probes_blocked.load() == 0);
  d->set_probe(nullptr);
}

TEST_CASE("trim deregisters after dropping the pool's locks", "[pool][trim][concurrency]") {
  auto d = std::make_shared<ProbeDomain>();
  PoolConfig cfg;
  cfg.arena_size = 2 * kMiB;
  cfg.auto_trim = false;
  Pool pool({d}, cfg);
  d->set_probe(pool_probe(pool));
  std::vector<Ldo> v = fill(pool, 4, true);
  const auto full = pool.stats();
  for (auto& o : v) drop(o);
  CHECK(d->deregistrations.load() == 0);
  const std::size_t released = pool.trim();
  const auto s = pool.stats();
  CHECK(released == full.bytes_mapped - s.bytes_mapped);
  CHECK(s.arenas == 1);
  CHECK(s.deregistrations == full.arenas - 1);
  CHECK(d->probes_ok.load() > 0);
  CHECK(d->probes_blocked.load() == 0);
  d->set_probe(nullptr);
}

namespace {

std::uint64_t rounds_from_env() {
  const char* e = std::getenv("REGPOOL_STRESS_OPS");
  const std::uint64_t ops = e ? std::strtoull(e, nullptr, 10) : 2000000;
  return ops / 10000 > 4 ? ops / 10000 : 4;
}

class Mailbox {
 public:
  void push(Ldo o) {
    std::lock_guard g(m_);
    q_.push_back(std::move(o));
  }
  bool pop(Ldo& out) {
    std::lock_guard g(m_);
    if (q_.empty()) return false;
    out = std::move(q_.front());
    q_.pop_front();
    return true;
  }

 private:
  std::mutex m_;
  std::deque<Ldo> q_;
};

// One round: workers allocate their objects, then drop them (some after
// handing a copy to the next worker, which drops that too) and exit, while
// the main thread destroys the pool part-way through, keeping a few objects
// past the close. Checks that nothing was corrupted and that every
// registration is undone once the last survivor drops (not before).
void close_round(PoolConfig cfg, unsigned workers, std::uint64_t seed) {
  auto d = std::make_shared<FakeDomain>();
  auto pool = std::make_unique<Pool>(std::vector<std::shared_ptr<Domain>>{d}, cfg);
  std::mt19937_64 rng(seed);
  constexpr int kPerWorker = 600;
  std::vector<Mailbox> boxes(workers);
  std::vector<Ldo> survivors(workers);
  std::atomic<unsigned> ready{0};
  std::atomic<bool> go{false};
  std::atomic<std::uint64_t> drops{0};
  std::atomic<std::uint64_t> corrupt{0};
  std::atomic<std::uint64_t> alloc_failures{0};
  std::vector<std::thread> ts;
  for (unsigned w = 0; w < workers; ++w) {
    ts.emplace_back([&, w, s = rng()] {
      std::mt19937_64 r(s);
      std::vector<Ldo> mine;
      std::vector<int> stamps;
      for (int i = 0; i < kPerWorker; ++i) {
        const auto pick = r() % 100;
        const std::uint64_t size = pick < 85 ? r() % 3000 : pick < 99 ? 40000 + r() % 100000 : 5 * kMiB;
        auto o = pool->allocate(size);
        if (!o) {
          alloc_failures.fetch_add(1);
          continue;
        }
        if (o->data_size() >= sizeof i) std::memcpy(o->data().data(), &i, sizeof i);
        mine.push_back(std::move(*o));
        stamps.push_back(i);
      }
      if (!mine.empty()) survivors[w] = mine.front();
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      for (std::size_t i = 0; i < mine.size(); ++i) {
        if (i % 3 == 0) boxes[(w + 1) % workers].push(mine[i]);  // a second owner elsewhere
        const int want = stamps[i];
        if (mine[i].data_size() >= sizeof want && std::memcmp(mine[i].data().data(), &want, sizeof want) != 0)
          corrupt.fetch_add(1);
        mine[i].reset();
        drops.fetch_add(1);
        Ldo in;
        while (boxes[w].pop(in)) in.reset();
      }
    });
  }
  while (ready.load() < workers) std::this_thread::yield();
  const std::uint64_t close_at = rng() % (std::uint64_t{workers} * kPerWorker);
  go.store(true);
  while (drops.load() < close_at) std::this_thread::yield();
  pool.reset();  // races with the workers' drops and exits
  for (auto& t : ts) t.join();
  for (auto& b : boxes) {
    Ldo in;
    while (b.pop(in)) in.reset();
  }
  REQUIRE(alloc_failures.load() == 0);
  REQUIRE(corrupt.load() == 0);
  // The survivors still hold the arenas registered.
  REQUIRE(d->stats().live_registrations > 0);
  survivors.clear();
  const auto ds = d->stats();
  REQUIRE(ds.live_registrations == 0);
  REQUIRE(ds.registrations == ds.deregistrations);
}

}  // namespace

TEST_CASE("closing a pool while other threads drop, hand off and exit loses nothing", "[pool][close][concurrency]") {
  const std::uint64_t rounds = rounds_from_env();
  PoolConfig cfg;
  cfg.arena_size = 2 * kMiB;
  for (std::uint64_t round = 0; round < rounds; ++round) {
    INFO("round " << round);
    close_round(cfg, 3, round * 7919 + 11);
  }
}

TEST_CASE("closing a pool without thread caches while other threads drop", "[pool][close][concurrency]") {
  const std::uint64_t rounds = rounds_from_env() / 4;
  PoolConfig cfg;
  cfg.arena_size = 2 * kMiB;
  cfg.thread_cache = false;
  for (std::uint64_t round = 0; round < rounds + 1; ++round) {
    INFO("round " << round);
    close_round(cfg, 3, round * 104729 + 5);
  }
}

TEST_CASE("clone() of an object whose pool has closed is refused; the object stays usable", "[pool][close]") {
  auto d = std::make_shared<FakeDomain>();
  Ldo small;
  Ldo large;
  {
    PoolConfig cfg;
    cfg.arena_size = 2 * kMiB;
    Pool pool({d}, cfg);
    small = *pool.allocate(100);
    large = *pool.allocate(100000);
    // Warm this thread's caches so a clone could come from them.
    for (int i = 0; i < 10; ++i) {
      (void)pool.allocate(100);
      (void)pool.allocate(100000);
    }
    // And park spans of large's size on the central span lists: dropped on
    // another thread, they overflow that thread's span cache.
    {
      std::vector<Ldo> v;
      for (int i = 0; i < 12; ++i) v.push_back(*pool.allocate(100000));
      std::thread([&] { v.clear(); }).join();
    }
    std::memset(small.data().data(), 5, 100);
  }
  CHECK(small.clone().status() == Status::closed);
  CHECK(large.clone().status() == Status::closed);
  CHECK(small.data()[99] == std::byte{5});
  CHECK(small.region(*d).ok());
  CHECK(d->stats().live_registrations == 1);
  small.reset();
  CHECK(d->stats().live_registrations == 1);
  large.reset();
  CHECK(d->stats().live_registrations == 0);
}
