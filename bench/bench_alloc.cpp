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
#include <sys/resource.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "regpool/error.hpp"
#include "regpool/host_domain.hpp"
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
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return g_failures.load() == 0 ? 0 : 1;
}
