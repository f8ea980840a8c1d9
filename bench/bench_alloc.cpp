// bench-alloc: acquiring a registered buffer, several ways, same sizes,
// same run (docs/architecture.md).
//
// Names begin with the method and end with the size in bytes:
//   regpool/<size>                 Pool::allocate(data_size = size) + drop of
//                                  the LDO (the pool writes the 24-byte wire
//                                  header), one thread.
//   malloc/<size>                  malloc + touch the first byte + free.
//   malloc_register/<domain>/<size>
//                                  malloc + touch + Domain::register_memory +
//                                  deregister + free every iteration;
//                                  domains: host (HostDomain, mlock), shm,
//                                  tcp (FabricDomain; skipped, not failed,
//                                  when the provider cannot be opened).
//   bounce_copy/<size>             memcpy from an unregistered buffer into a
//                                  pre-allocated (so pre-registered) pool LDO.
// The scaling families run the regpool/malloc bodies with one and with two
// threads; Google Benchmark appends its own suffixes there:
//   regpool_mt/<size>/real_time/threads:{1,2}
//   malloc_mt/<size>/real_time/threads:{1,2}
// They use real (wall-clock) time so that items_per_second is the
// throughput of all threads together (with cpu time the rate would be
// divided by the cpu time summed over the threads). One item = one
// allocate + release. The single-thread rows keep the default (cpu time
// decides the iteration count); their JSON has both real_time and cpu_time.
// Closer to a network code than "free what you just allocated":
//   mixed_regpool, mixed_malloc    a fixed pseudo-random sequence of sizes
//                                  (60% 64-256 B, 25% 1-4 KiB, 12% 16-64 KiB,
//                                  3% 256 KiB-1 MiB), 64 objects live: each
//                                  iteration releases the oldest and
//                                  allocates the next.
//   handoff_regpool/<size>, handoff_malloc/<size>
//                                  the completion pattern: the benchmark
//                                  thread allocates, a second thread releases
//                                  (through a 16-entry single-producer ring:
//                                  a window of 16 operations in flight),
//                                  so frees land in another thread's cache
//                                  and objects must travel back through the
//                                  pool's central lists (or malloc's).
//   pmr_mt/<size>/real_time/threads:{1,2}
//                                  PoolResource allocate + deallocate (the
//                                  std::pmr adapter, whose deallocation finds
//                                  the object from its address).
// Every process reports which library its malloc came from in the JSON
// context ("malloc_library"), so a run under LD_PRELOAD can be checked
// (bench/malloc-compare.py does).
//
// What malloc_register measures: glibc hands back the same, already
// resident, memory every iteration after the first (small sizes from the
// tcache/bins; 1 MiB is mmap'd once, then the dynamic mmap threshold rises
// and it comes from the heap). So the steady state is mlock of resident
// pages (page-table walk, VMA split and merge, plus munlock), not page
// faults; the "minflt" counter (minor faults per iteration, from getrusage)
// shows it. Faulting never-touched pages would cost more (docs/provider-facts.md: 370-530
// us/MiB untouched against ~135 us/MiB touched). libfabric tcp and shm pin
// nothing: their figure is the cost of fi_mr_reg/fi_close bookkeeping.
//
// One Pool (HostDomain with lock_pages = true, one 64 MiB arena, mlocked
// once at first use) is shared by every regpool and bounce_copy benchmark
// and by both threads of the two-thread runs.

#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <sys/resource.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "regpool/error.hpp"
#include "regpool/host_domain.hpp"
#include "regpool/memory_resource.hpp"
#include "regpool/pool.hpp"
#if REGPOOL_BENCH_HAVE_FABRIC
#include "regpool/fabric_domain.hpp"
#endif

namespace {

constexpr std::int64_t kSizes[] = {64, 4 << 10, 64 << 10, 1 << 20};

// Failures other than "this domain cannot be opened here" (which is a skip)
// make the process exit non-zero, so the smoke test catches them.
std::atomic<int> g_failures{0};

void fail(benchmark::State& state, const char* what) {
  g_failures.fetch_add(1, std::memory_order_relaxed);
  state.SkipWithError(what);
}

// ---------------------------------------------------------------- shared setup

struct SharedPool {
  std::unique_ptr<regpool::Pool> pool;
  std::string error;
};

// Created once, on first use, and shared by all threads (a function-local
// static is initialised exactly once even when two benchmark threads race).
SharedPool& shared_pool() {
  static SharedPool sp = [] {
    SharedPool s;
    try {
      regpool::PoolConfig cfg;
      cfg.name = "bench-alloc";
      s.pool = std::make_unique<regpool::Pool>(
          std::vector<std::shared_ptr<regpool::Domain>>{regpool::HostDomain::open({.lock_pages = true})}, cfg);
    } catch (const std::exception& e) {
      s.error = std::string("cannot create the pool: ") + e.what();
    }
    return s;
  }();
  return sp;
}

struct SharedDomain {
  std::shared_ptr<regpool::Domain> domain;
  std::string error;
};

SharedDomain open_domain(const std::string& which) {
  SharedDomain d;
  try {
    if (which == "host") {
      d.domain = regpool::HostDomain::open({.lock_pages = true});
    } else {
#if REGPOOL_BENCH_HAVE_FABRIC
      regpool::FabricConfig cfg;
      cfg.provider = which;
      if (which == "tcp") cfg.node = "127.0.0.1";  // stay on loopback
      d.domain = regpool::FabricDomain::open(cfg);
#else
      d.error = "built without libfabric";
#endif
    }
  } catch (const std::exception& e) {
    d.error = "domain '" + which + "' unavailable: " + e.what();
  }
  return d;
}

// Opened once per name, on first use (so a filtered run opens only what it
// measures).
SharedDomain& shared_domain(const std::string& which) {
  static std::mutex m;
  static std::vector<std::pair<std::string, std::unique_ptr<SharedDomain>>> cache;
  std::lock_guard g(m);
  for (auto& [name, d] : cache)
    if (name == which) return *d;
  cache.emplace_back(which, std::make_unique<SharedDomain>(open_domain(which)));
  return *cache.back().second;
}

long minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

void finish(benchmark::State& state, std::int64_t size) {
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * size);
}

// ---------------------------------------------------------------- benchmarks

void BM_regpool(benchmark::State& state, std::int64_t sz) {
  const auto size = static_cast<std::uint64_t>(sz);
  SharedPool& sp = shared_pool();
  if (!sp.pool) {
    fail(state, sp.error.c_str());
    return;
  }
  regpool::Pool& pool = *sp.pool;
  for (auto _ : state) {
    auto r = pool.allocate(size);
    if (!r) [[unlikely]] {
      fail(state, regpool::to_string(r.status()));
      break;
    }
    benchmark::DoNotOptimize(r->base());
    // r (and the Ldo in it) drops here: the bytes go back to the pool.
  }
  finish(state, sz);
}

void BM_malloc(benchmark::State& state, std::int64_t sz) {
  const auto size = static_cast<std::size_t>(sz);
  const long f0 = minor_faults();
  for (auto _ : state) {
    void* p = std::malloc(size);
    if (!p) [[unlikely]] {
      fail(state, "malloc failed");
      break;
    }
    *static_cast<volatile char*>(p) = 1;  // the pool writes its header; touch ours
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
  finish(state, sz);
  state.counters["minflt"] = benchmark::Counter(static_cast<double>(minor_faults() - f0),
                                                benchmark::Counter::kAvgIterations);
}

void BM_malloc_register(benchmark::State& state, const std::string& which, std::int64_t sz) {
  const auto size = static_cast<std::size_t>(sz);
  SharedDomain& d = shared_domain(which);
  if (!d.domain) {
    state.SkipWithError(d.error.c_str());
    return;
  }
  regpool::Domain& domain = *d.domain;
  const long f0 = minor_faults();
  for (auto _ : state) {
    void* p = std::malloc(size);
    if (!p) [[unlikely]] {
      fail(state, "malloc failed");
      break;
    }
    *static_cast<volatile char*>(p) = 1;
    try {
      regpool::Registration reg = domain.register_memory(p, size, regpool::Access::all);
      benchmark::DoNotOptimize(reg.remote_key());
      // reg deregisters here
    } catch (const std::exception& e) {
      std::free(p);
      fail(state, e.what());
      break;
    }
    std::free(p);
  }
  finish(state, sz);
  state.counters["minflt"] = benchmark::Counter(static_cast<double>(minor_faults() - f0),
                                                benchmark::Counter::kAvgIterations);
}

void BM_bounce_copy(benchmark::State& state, std::int64_t sz) {
  const auto size = static_cast<std::size_t>(sz);
  SharedPool& sp = shared_pool();
  if (!sp.pool) {
    fail(state, sp.error.c_str());
    return;
  }
  auto dst = sp.pool->allocate(size);  // the pre-registered bounce buffer
  if (!dst) {
    fail(state, regpool::to_string(dst.status()));
    return;
  }
  std::vector<std::byte> src(size, std::byte{0x5a});  // unregistered, resident
  std::byte* out = dst->data().data();
  for (auto _ : state) {
    std::memcpy(out, src.data(), size);
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
  finish(state, sz);
}

// ------------------------------------------------ closer to a network code

// The mixed-size sequence: fixed seed, so every allocator sees the same sizes.
const std::vector<std::uint32_t>& mixed_sizes() {
  static const std::vector<std::uint32_t> sizes = [] {
    std::vector<std::uint32_t> v;
    std::uint64_t x = 0x9e3779b97f4a7c15ULL;
    auto next = [&x] {  // xorshift64*
      x ^= x >> 12;
      x ^= x << 25;
      x ^= x >> 27;
      return x * 0x2545f4914f6cdd1dULL;
    };
    auto in = [&](std::uint64_t lo, std::uint64_t hi) { return static_cast<std::uint32_t>(lo + next() % (hi - lo + 1)); };
    for (int i = 0; i < 4096; ++i) {
      const std::uint64_t p = next() % 100;
      v.push_back(p < 60 ? in(64, 256) : p < 85 ? in(1 << 10, 4 << 10) : p < 97 ? in(16 << 10, 64 << 10)
                                                                                : in(256 << 10, 1 << 20));
    }
    return v;
  }();
  return sizes;
}
constexpr std::size_t kMixedLive = 64;

void BM_mixed_regpool(benchmark::State& state) {
  SharedPool& sp = shared_pool();
  if (!sp.pool) {
    fail(state, sp.error.c_str());
    return;
  }
  const auto& sizes = mixed_sizes();
  std::vector<regpool::Ldo> live(kMixedLive);
  std::size_t i = 0;
  std::uint64_t bytes = 0;
  for (auto _ : state) {
    const std::uint32_t size = sizes[i % sizes.size()];
    regpool::Ldo& slot = live[i % kMixedLive];
    slot.reset();
    auto r = sp.pool->allocate(size);
    if (!r) [[unlikely]] {
      fail(state, regpool::to_string(r.status()));
      break;
    }
    slot = std::move(*r);
    benchmark::DoNotOptimize(slot.base());
    bytes += size;
    ++i;
  }
  live.clear();
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
}

void BM_mixed_malloc(benchmark::State& state) {
  const auto& sizes = mixed_sizes();
  std::vector<void*> live(kMixedLive, nullptr);
  std::size_t i = 0;
  std::uint64_t bytes = 0;
  for (auto _ : state) {
    const std::uint32_t size = sizes[i % sizes.size()];
    void*& slot = live[i % kMixedLive];
    std::free(slot);
    slot = std::malloc(size);
    if (!slot) [[unlikely]] {
      fail(state, "malloc failed");
      break;
    }
    *static_cast<volatile char*>(slot) = 1;
    benchmark::DoNotOptimize(slot);
    bytes += size;
    ++i;
  }
  for (void* p : live) std::free(p);
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
}

// Single-producer single-consumer ring of T (a moved-in Ldo or a pointer):
// the benchmark thread allocates and pushes, a second thread pops and
// releases. Slots are written by one side and read by the other only after
// the index that publishes them (release/acquire).
template <class T>
class HandoffRing {
 public:
  static constexpr std::size_t kSize = 16;
  bool push(T&& v) noexcept {
    const std::size_t t = tail_.load(std::memory_order_relaxed);
    if (t - head_.load(std::memory_order_acquire) == kSize) return false;
    slots_[t % kSize] = std::move(v);
    tail_.store(t + 1, std::memory_order_release);
    return true;
  }
  template <class Drop>
  std::size_t pop_all(Drop&& drop) noexcept {
    const std::size_t h = head_.load(std::memory_order_relaxed);
    const std::size_t t = tail_.load(std::memory_order_acquire);
    for (std::size_t i = h; i != t; ++i) drop(slots_[i % kSize]);
    head_.store(t, std::memory_order_release);
    return t - h;
  }
  bool empty() const noexcept {
    return head_.load(std::memory_order_acquire) == tail_.load(std::memory_order_acquire);
  }

 private:
  std::array<T, kSize> slots_{};
  alignas(64) std::atomic<std::size_t> head_{0};
  alignas(64) std::atomic<std::size_t> tail_{0};
};

// Runs `produce` (returns false on failure) in the timed loop and releases
// on a second thread with `drop`.
template <class T, class Produce, class Drop>
void run_handoff(benchmark::State& state, Produce&& produce, Drop&& drop) {
  auto ring = std::make_unique<HandoffRing<T>>();
  std::atomic<bool> done{false};
  std::thread consumer([&] {
    while (!done.load(std::memory_order_acquire) || !ring->empty())
      if (ring->pop_all(drop) == 0) std::this_thread::yield();
  });
  for (auto _ : state) {
    T v{};
    if (!produce(v)) [[unlikely]]
      break;
    while (!ring->push(std::move(v))) std::this_thread::yield();
  }
  done.store(true, std::memory_order_release);
  consumer.join();
  state.SetItemsProcessed(state.iterations());
}

void BM_handoff_regpool(benchmark::State& state, std::int64_t size) {
  SharedPool& sp = shared_pool();
  if (!sp.pool) {
    fail(state, sp.error.c_str());
    return;
  }
  regpool::Pool& pool = *sp.pool;
  run_handoff<regpool::Ldo>(
      state,
      [&](regpool::Ldo& out) {
        auto r = pool.allocate(static_cast<std::uint64_t>(size));
        if (!r) {
          fail(state, regpool::to_string(r.status()));
          return false;
        }
        out = std::move(*r);
        benchmark::DoNotOptimize(out.base());
        return true;
      },
      [](regpool::Ldo& l) { l.reset(); });
  state.SetBytesProcessed(state.iterations() * size);
}

void BM_handoff_malloc(benchmark::State& state, std::int64_t size) {
  run_handoff<void*>(
      state,
      [&](void*& out) {
        out = std::malloc(static_cast<std::size_t>(size));
        if (!out) {
          fail(state, "malloc failed");
          return false;
        }
        *static_cast<volatile char*>(out) = 1;
        return true;
      },
      [](void*& p) {
        std::free(p);
        p = nullptr;
      });
  state.SetBytesProcessed(state.iterations() * size);
}

void BM_pmr(benchmark::State& state, std::int64_t sz) {
  const auto size = static_cast<std::size_t>(sz);
  SharedPool& sp = shared_pool();
  if (!sp.pool) {
    fail(state, sp.error.c_str());
    return;
  }
  regpool::PoolResource resource(*sp.pool);
  std::pmr::memory_resource& res = resource;
  for (auto _ : state) {
    void* p = nullptr;
    try {
      p = res.allocate(size, alignof(std::max_align_t));
    } catch (const std::bad_alloc&) {
      fail(state, "PoolResource: bad_alloc");
      break;
    }
    *static_cast<volatile char*>(p) = 1;
    benchmark::DoNotOptimize(p);
    res.deallocate(p, size, alignof(std::max_align_t));
  }
  finish(state, sz);
}

// Which shared object this process's malloc comes from (LD_PRELOAD check).
std::string malloc_library() {
  Dl_info info{};
  void* (*fn)(std::size_t) = &std::malloc;
  if (dladdr(reinterpret_cast<void*>(fn), &info) == 0 || !info.dli_fname) return "unknown";
  return info.dli_fname;
}

void register_all() {
  // One size at a time, so the figures a ratio compares are measured close
  // together (add --benchmark_enable_random_interleaving=true for more).
  for (const std::int64_t size : kSizes) {
    const std::string sz = std::to_string(size);
    auto reg = [](const std::string& name, auto fn) { return benchmark::RegisterBenchmark(name.c_str(), fn); };
    reg("regpool/" + sz, [size](benchmark::State& s) { BM_regpool(s, size); });
    // Scaling: real time, so items_per_second is the throughput of all
    // threads together (cpu time would be summed over the threads).
    reg("regpool_mt/" + sz, [size](benchmark::State& s) { BM_regpool(s, size); })
        ->UseRealTime()
        ->Threads(1)
        ->Threads(2);
    reg("malloc/" + sz, [size](benchmark::State& s) { BM_malloc(s, size); });
    reg("malloc_mt/" + sz, [size](benchmark::State& s) { BM_malloc(s, size); })
        ->UseRealTime()
        ->Threads(1)
        ->Threads(2);
    for (const std::string which : {"host", "shm", "tcp"}) {
      reg("malloc_register/" + which + "/" + sz,
          [which, size](benchmark::State& s) { BM_malloc_register(s, which, size); });
    }
    reg("bounce_copy/" + sz, [size](benchmark::State& s) { BM_bounce_copy(s, size); });
    reg("handoff_regpool/" + sz, [size](benchmark::State& s) { BM_handoff_regpool(s, size); })->UseRealTime();
    reg("handoff_malloc/" + sz, [size](benchmark::State& s) { BM_handoff_malloc(s, size); })->UseRealTime();
    reg("pmr_mt/" + sz, [size](benchmark::State& s) { BM_pmr(s, size); })->UseRealTime()->Threads(1)->Threads(2);
  }
  benchmark::RegisterBenchmark("mixed_regpool", BM_mixed_regpool);
  benchmark::RegisterBenchmark("mixed_malloc", BM_mixed_malloc);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::AddCustomContext("malloc_library", malloc_library());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return g_failures.load() == 0 ? 0 : 1;
}
