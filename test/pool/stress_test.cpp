// Multi-threaded stress: objects allocated on one thread, copied, handed to
// another and dropped there; millions of operations; counters must balance
// (no leak, no double free) and no object may ever be handed out twice.
// REGPOOL_STRESS_OPS scales the run (default 2,000,000 allocations).
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "regpool/pool.hpp"
#include "support/fake_domain.hpp"

using namespace regpool;
using regpool::test::FakeDomain;

namespace {

std::uint64_t ops_from_env() {
  const char* e = std::getenv("REGPOOL_STRESS_OPS");
  return e ? std::strtoull(e, nullptr, 10) : 2000000;
}

struct Item {
  Ldo ldo;
  std::uint64_t stamp;
};

// A bounded hand-off queue between threads.
class Mailbox {
 public:
  void push(Item it) {
    std::lock_guard g(m_);
    q_.push_back(std::move(it));
  }
  bool pop(Item& out) {
    std::lock_guard g(m_);
    if (q_.empty()) return false;
    out = std::move(q_.front());
    q_.pop_front();
    return true;
  }
  std::size_t size() {
    std::lock_guard g(m_);
    return q_.size();
  }

 private:
  std::mutex m_;
  std::deque<Item> q_;
};

void stamp(const Ldo& o, std::uint64_t s) {
  auto d = o.data();
  if (d.size() >= sizeof s) std::memcpy(d.data(), &s, sizeof s);
  if (d.size() >= 2 * sizeof s) std::memcpy(d.data() + d.size() - sizeof s, &s, sizeof s);
}

bool stamped(const Ldo& o, std::uint64_t s) {
  auto d = o.data();
  std::uint64_t a = s, b = s;
  if (d.size() >= sizeof s) std::memcpy(&a, d.data(), sizeof s);
  if (d.size() >= 2 * sizeof s) std::memcpy(&b, d.data() + d.size() - sizeof s, sizeof s);
  return a == s && b == s;
}

void run(Pool& pool, unsigned threads, std::uint64_t total) {
  std::vector<Mailbox> boxes(threads);
  std::atomic<std::uint64_t> next_stamp{1};
  std::atomic<std::uint64_t> failures{0};
  std::atomic<std::uint64_t> alloc_failures{0};
  const std::uint64_t per_thread = total / threads;
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(t * 7919 + 1);
      std::vector<Item> held;  // copies kept for a while on this thread
      for (std::uint64_t i = 0; i < per_thread; ++i) {
        const auto pick = rng() % 1000;
        const std::uint64_t size = pick < 900 ? rng() % 2048 : pick < 995 ? rng() % 40000 : 100000 + rng() % 300000;
        auto r = pool.allocate(size);
        if (!r) {
          alloc_failures.fetch_add(1);
          continue;
        }
        const std::uint64_t s = next_stamp.fetch_add(1);
        stamp(*r, s);
        Item it{std::move(*r), s};
        if (rng() % 4 == 0) held.push_back(Item{it.ldo, s});  // a second owner on this thread
        boxes[(t + 1) % threads].push(std::move(it));          // dropped by the next thread
        Item in;
        while (boxes[t].pop(in)) {
          if (!stamped(in.ldo, in.stamp)) failures.fetch_add(1);
          in.ldo.reset();
        }
        if (held.size() > 64) {
          for (auto& h : held)
            if (!stamped(h.ldo, h.stamp)) failures.fetch_add(1);
          held.clear();
        }
      }
      for (auto& h : held)
        if (!stamped(h.ldo, h.stamp)) failures.fetch_add(1);
    });
  }
  for (auto& t : ts) t.join();
  // Drain what the last thread to finish left behind.
  for (auto& b : boxes) {
    Item in;
    while (b.pop(in))
      if (!stamped(in.ldo, in.stamp)) failures.fetch_add(1);
  }
  CHECK(failures.load() == 0);
  CHECK(alloc_failures.load() == 0);
}

}  // namespace

TEST_CASE("cross-thread allocate/copy/drop balances", "[stress]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg;
  cfg.arena_size = std::size_t{16} << 20;
  Pool pool({d}, cfg);
  const std::uint64_t total = ops_from_env();
  run(pool, 4, total);
  const auto s = pool.stats();
  CHECK(s.live_objects == 0);
  CHECK(s.allocations == s.releases);
  CHECK(s.allocations == total / 4 * 4);
  CHECK(s.bytes_in_use == 0);
  // Registrations happened only when arenas were created.
  CHECK(d->calls() == s.arenas_created);
  CHECK(s.registrations == s.arenas_created);
  pool.trim();
  CHECK(pool.stats().arenas == 1);
}

TEST_CASE("stress without thread caches", "[stress]") {
  auto d = std::make_shared<FakeDomain>();
  PoolConfig cfg;
  cfg.arena_size = std::size_t{16} << 20;
  cfg.thread_cache = false;
  Pool pool({d}, cfg);
  const std::uint64_t total = ops_from_env() / 8;
  run(pool, 3, total);
  const auto s = pool.stats();
  CHECK(s.live_objects == 0);
  CHECK(s.allocations == s.releases);
}

TEST_CASE("threads exit while a pool lives, and objects outlive their pool", "[stress]") {
  auto d = std::make_shared<FakeDomain>();
  for (int round = 0; round < 20; ++round) {
    auto pool = std::make_unique<Pool>(std::vector<std::shared_ptr<Domain>>{d}, PoolConfig{});
    std::vector<std::thread> ts;
    std::vector<Ldo> survivors(4);
    for (int t = 0; t < 4; ++t) {
      ts.emplace_back([&, t] {
        std::vector<Ldo> v;
        for (int i = 0; i < 2000; ++i) v.push_back(*pool->allocate(static_cast<std::uint64_t>(i % 3000)));
        survivors[static_cast<std::size_t>(t)] = v.back();
      });
    }
    for (auto& t : ts) t.join();
    CHECK(pool->stats().live_objects == 4);
    pool.reset();  // objects outlive the pool; their drop finishes the teardown
    survivors.clear();
    CHECK(d->stats().live_registrations == 0);
  }
}

TEST_CASE("a pool dies while its threads live, holding objects and cached free slots", "[stress]") {
  auto d = std::make_shared<FakeDomain>();
  for (int round = 0; round < 20; ++round) {
    auto pool = std::make_unique<Pool>(std::vector<std::shared_ptr<Domain>>{d}, PoolConfig{});
    std::mutex m;
    std::condition_variable cv;
    int ready = 0;
    bool gone = false;
    std::atomic<int> failures{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) {
      ts.emplace_back([&, t] {
        Ldo kept;
        {
          std::vector<Ldo> v;
          for (int i = 0; i < 2000; ++i) {
            auto r = pool->allocate(static_cast<std::uint64_t>(i % 3000));
            if (!r) {
              failures.fetch_add(1);
              break;
            }
            v.push_back(std::move(*r));
          }
          if (!v.empty()) kept = v.back();
        }  // the other objects go back into this thread's cache
        if (kept) std::memset(kept.data().data(), 0x40 + t, kept.data().size());
        std::unique_lock lk(m);
        ++ready;
        cv.notify_all();
        cv.wait(lk, [&] { return gone; });
        lk.unlock();
        // The pool is gone, this thread and its cache are not: the object
        // still holds its bytes, and dropping it finishes the teardown.
        for (std::byte b : kept.data())
          if (b != static_cast<std::byte>(0x40 + t)) {
            failures.fetch_add(1);
            break;
          }
        kept.reset();
      });
    }
    {
      std::unique_lock lk(m);
      cv.wait(lk, [&] { return ready == 4; });
    }
    CHECK(failures.load() == 0);
    CHECK(pool->stats().live_objects == 4);
    const auto registered = d->stats().live_registrations;
    CHECK(registered >= 1);
    pool.reset();  // while all four threads (and their caches) live
    CHECK(d->stats().live_registrations == registered);  // four objects still use the arenas
    {
      std::lock_guard lk(m);
      gone = true;
    }
    cv.notify_all();
    for (auto& th : ts) th.join();
    CHECK(failures.load() == 0);
    CHECK(d->stats().live_registrations == 0);
  }
}
