// The smallest regpool user: a pool over a host domain, one LDO, its bytes
// written, the pool's counters printed. test/install/check-install builds
// it against an installed regpool three ways (pkg-config, CMake, Meson
// subproject); docs/install.md shows the same snippets.
#include <regpool/regpool.hpp>

#include <cstring>
#include <iostream>

int main() {
  // lock_pages = false: the pool registers (counts) its arena without
  // mlock, so this runs under any RLIMIT_MEMLOCK.
  auto host = regpool::HostDomain::open({.lock_pages = false});
  regpool::PoolConfig config;
  config.name = "consumer";
  config.arena_size = 4 << 20;
  regpool::Pool pool({host}, config);

  auto ldo = pool.allocate(4096);
  if (!ldo) {
    std::cerr << "consumer: allocate failed: " << regpool::to_string(ldo.status()) << "\n";
    return 1;
  }
  std::memset(ldo->data().data(), 0x5a, ldo->data().size());
  const auto stats = pool.stats();
  regpool::print(std::cout, stats);
  std::cout << "consumer OK: " << ldo->data().size() << " data bytes in an LDO, " << stats.registrations
            << " registration(s)\n";
  return stats.registrations >= 1 ? 0 : 1;
}
