// bench-zeroing: what zero on allocate costs (PoolConfig::zero_on_allocate),
// per object size, and where madvise(MADV_DONTNEED) beats memset.
//
// Every figure is one allocate + drop through Pool::allocate, in ns, as the
// median over interleaved rounds (each round runs every method once, in an
// order that rotates per round, for a fixed number of iterations; the round's
// figure is the mean of those). Methods:
//   plain          Zeroing::uninitialized: the baseline, no zeroing
//   memset         Zeroing::zeroed in a pool with zero_madvise_min = 0
//   madvise        Zeroing::zeroed in a pool with zero_madvise_min = 1, so
//                  every span (> 32 KiB objects) takes MADV_DONTNEED for its
//                  whole pages (small objects are always memset)
//   fresh          Zeroing::zeroed, from arena pages no object has used yet
//                  (a new pool per run, set up untimed; the objects are kept
//                  until the clock stops): no zeroing work at all
// and the same four with "+write": the caller then writes every data byte
// (a put target filled by the peer, a message being built), which is where
// MADV_DONTNEED's deferred cost shows: each page faults in again (a fresh
// 4 KiB page, or a 2 MiB transparent huge page where a whole aligned one
// was dropped), and fresh pages fault the first time too.
//
// The pools serve a HostDomain with lock_pages = false (pins nothing, so the
// pool may use madvise), arenas of 256 MiB with THP advice as by default.
//
// Usage: bench-zeroing [--rounds N] [--budget-ms M] [--no-thp] [--smoke] [--json]
//   --no-thp: arenas without MADV_HUGEPAGE (PoolConfig::transparent_huge_pages).
//   --smoke: 2 rounds, tiny budget, three sizes (the bench-smoke test).
// Exits non-zero when an allocation fails or a zeroed object is not zero.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "regpool/host_domain.hpp"
#include "regpool/pool.hpp"

namespace {

using regpool::Ldo;
using regpool::LdoShape;
using regpool::Pool;
using regpool::PoolConfig;
using regpool::Zeroing;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kMethods = 8;
constexpr std::array<const char*, kMethods> kNames = {"plain",       "memset",       "madvise",       "fresh",
                                                      "plain+write", "memset+write", "madvise+write", "fresh+write"};

int g_failures = 0;
bool g_thp = true;

PoolConfig config(const char* name, std::size_t madvise_min) {
  PoolConfig c;
  c.name = name;
  c.arena_size = std::size_t{256} << 20;
  c.zero_madvise_min = madvise_min;
  c.transparent_huge_pages = g_thp;
  return c;
}

std::vector<std::shared_ptr<regpool::Domain>> domains() {
  return {regpool::HostDomain::open({.lock_pages = false})};
}

// Reads one byte per 512 so the check cannot be optimised away and costs
// little next to the allocation (run once per size, outside the timing).
bool looks_zero(const Ldo& o) {
  const auto d = o.data();
  for (std::size_t i = 0; i < d.size(); i += 512)
    if (d[i] != std::byte{0}) return false;
  return d.empty() || d[d.size() - 1] == std::byte{0};
}

struct Bench {
  std::uint64_t size;
  Pool& memset_pool;
  Pool& madvise_pool;

  // One timed run of `method`, `iters` times; returns ns per iteration.
  double run(std::size_t method, int iters) {
    const bool write = method >= 4;
    const std::size_t kind = method % 4;
    double ns = 0;
    if (kind == 3) {
      // Fresh pages: a new pool (set up untimed) whose arena holds all the
      // iterations' objects, none dropped until the clock stops, so each
      // comes from pages no object has used. At most 256 MiB per run.
      iters = static_cast<int>(std::min<std::uint64_t>(iters, std::max<std::uint64_t>(1, (256u << 20) / size)));
      PoolConfig c = config("fresh", 1);
      c.arena_size = static_cast<std::size_t>(iters) * (static_cast<std::size_t>(size) + 8192) + (2u << 20);
      Pool p(domains(), c);
      std::vector<Ldo> keep;
      keep.reserve(static_cast<std::size_t>(iters));
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        auto r = p.allocate(LdoShape{.data_size = size, .zeroing = Zeroing::zeroed});
        if (!r) {
          ++g_failures;
          return 0;
        }
        if (write) std::memset(r->data().data(), 0x5a, r->data().size());
        keep.push_back(std::move(*r));
      }
      ns = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
      // Fresh pages need no work: any memset here means the pool lost track.
      if (p.stats().zero_memset_bytes != 0) {
        std::fprintf(stderr, "fresh pool zeroed %llu bytes by memset\n",
                     static_cast<unsigned long long>(p.stats().zero_memset_bytes));
        ++g_failures;
      }
      return ns / iters;
    }
    Pool& pool = kind == 2 ? madvise_pool : memset_pool;
    const Zeroing z = kind == 0 ? Zeroing::uninitialized : Zeroing::zeroed;
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      auto r = pool.allocate(LdoShape{.data_size = size, .zeroing = z});
      if (!r) {
        ++g_failures;
        return 0;
      }
      if (write) std::memset(r->data().data(), 0x5a, r->data().size());
    }
    ns = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    return ns / iters;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string human(std::uint64_t b) {
  if (b >= (1u << 20)) return std::to_string(b >> 20) + " MiB";
  return std::to_string(b >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 9;
  double budget_ms = 20;  // per method per round
  bool smoke = false;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--budget-ms" && i + 1 < argc) {
      budget_ms = std::atof(argv[++i]);
    } else if (a == "--smoke") {
      smoke = true;
    } else if (a == "--no-thp") {
      g_thp = false;
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "usage: %s [--rounds N] [--budget-ms M] [--no-thp] [--smoke] [--json]\n", argv[0]);
      return 2;
    }
  }
  std::vector<std::uint64_t> sizes;
  if (smoke) {
    rounds = 2;
    budget_ms = 0.5;
    sizes = {4 << 10, 256 << 10, 4 << 20};
  } else {
    for (std::uint64_t s = 4 << 10; s <= (std::uint64_t{64} << 20); s *= 4) sizes.push_back(s);
  }
  try {
    Pool memset_pool(domains(), config("memset", 0));
    Pool madvise_pool(domains(), config("madvise", 1));
    if (json) std::printf("[\n");
    else {
      std::printf("| size |");
      for (const char* n : kNames) std::printf(" %s |", n);
      std::printf("\n|---|");
      for (std::size_t m = 0; m < kMethods; ++m) std::printf("---:|");
      std::printf("\n");
    }
    bool first_row = true;
    for (const std::uint64_t size : sizes) {
      Bench b{size, memset_pool, madvise_pool};
      // Dirty the objects the pools will hand back, then check that zeroing
      // works at this size before timing it.
      for (Pool* p : {&memset_pool, &madvise_pool}) {
        {
          auto r = p->allocate(LdoShape{.data_size = size, .zeroing = Zeroing::uninitialized});
          if (!r) {
            std::fprintf(stderr, "allocate %llu failed\n", static_cast<unsigned long long>(size));
            return 1;
          }
          std::memset(r->data().data(), 0xa5, r->data().size());
        }
        auto z = p->allocate(LdoShape{.data_size = size, .zeroing = Zeroing::zeroed});
        if (!z || !looks_zero(*z)) {
          std::fprintf(stderr, "%s: a zeroed object of %llu bytes is not zero\n", p->config().name.c_str(),
                       static_cast<unsigned long long>(size));
          return 1;
        }
      }
      // Iterations per method per round from one calibration run each.
      std::array<int, kMethods> iters{};
      for (std::size_t m = 0; m < kMethods; ++m) {
        const double one = std::max(1.0, b.run(m, 1));
        const double want = budget_ms * 1e6 / one;
        iters[m] = static_cast<int>(std::clamp(want, 1.0, 100000.0));
      }
      // A fresh pool's first allocation also creates its thread cache and
      // faults in side tables: spread that over as many objects as fit.
      for (std::size_t m : {std::size_t{3}, std::size_t{7}})
        iters[m] = std::max(iters[m], static_cast<int>(std::min<std::uint64_t>(1000, (256u << 20) / size)));
      std::array<std::vector<double>, kMethods> samples;
      for (int r = 0; r < rounds; ++r) {
        for (std::size_t k = 0; k < kMethods; ++k) {
          const std::size_t m = (k + static_cast<std::size_t>(r)) % kMethods;
          samples[m].push_back(b.run(m, iters[m]));
        }
      }
      if (json) {
        std::printf("%s  {\"size\":%llu", first_row ? "" : ",\n", static_cast<unsigned long long>(size));
        for (std::size_t m = 0; m < kMethods; ++m) std::printf(",\"%s_ns\":%.0f", kNames[m], median(samples[m]));
        std::printf("}");
      } else {
        std::printf("| %s |", human(size).c_str());
        for (std::size_t m = 0; m < kMethods; ++m) std::printf(" %.0f |", median(samples[m]));
        std::printf("\n");
      }
      std::fflush(stdout);
      first_row = false;
    }
    if (json) std::printf("\n]\n");
    const auto s = madvise_pool.stats();
    std::fprintf(stderr, "madvise pool: %llu zeroed, %llu B memset, %llu B madvise, %llu B fresh\n",
                 static_cast<unsigned long long>(s.zeroed_allocations),
                 static_cast<unsigned long long>(s.zero_memset_bytes),
                 static_cast<unsigned long long>(s.zero_madvise_bytes),
                 static_cast<unsigned long long>(s.zero_fresh_bytes));
    if (s.zero_madvise_bytes == 0 && sizes.back() > regpool::kMaxSmallObject) {
      std::fprintf(stderr, "the madvise pool never used madvise\n");
      ++g_failures;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench-zeroing: %s\n", e.what());
    return 1;
  }
  return g_failures ? 1 : 0;
}
