// alloc-loop: the single-thread allocate + release loop of bench-alloc's
// regpool/<size> rows, as a plain program for instruction counts.
//
//   alloc-loop SIZE ITERATIONS
//
// Allocates SIZE data bytes, reads base() (as bench-alloc does) and drops
// the LDO, ITERATIONS times, through the installed headers and the shared
// library only (what a user's loop gets). bench/alloc-insns runs it under
// callgrind with two iteration counts and prints the difference per
// iteration: the cost of one allocate + release, loop and checks included,
// without the setup. Exits 1 if an allocation fails.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "regpool/host_domain.hpp"
#include "regpool/pool.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SIZE ITERATIONS\n", argv[0]);
    return 2;
  }
  const std::uint64_t size = std::strtoull(argv[1], nullptr, 0);
  const std::uint64_t iterations = std::strtoull(argv[2], nullptr, 0);
  // Pages are not locked: callgrind runs under the default RLIMIT_MEMLOCK,
  // and locking does not change the hit path.
  regpool::Pool pool({regpool::HostDomain::open({.lock_pages = false})});
  for (std::uint64_t i = 0; i < iterations; ++i) {
    auto r = pool.allocate(size);
    if (!r) [[unlikely]] {
      std::fprintf(stderr, "allocate(%llu): %s\n", static_cast<unsigned long long>(size),
                   regpool::to_string(r.status()));
      return 1;
    }
    std::byte* b = r->base();
    asm volatile("" : : "r"(b) : "memory");  // as benchmark::DoNotOptimize
  }
  return 0;
}
