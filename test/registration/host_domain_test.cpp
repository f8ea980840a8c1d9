// The host domain pins with mlock and gives no remote key.
#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <fstream>
#include <string>

#include "regpool/host_domain.hpp"
#include "regpool/pool.hpp"

using namespace regpool;

namespace {

std::uint64_t locked_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6));
  return 0;
}

struct Buffer {
  explicit Buffer(std::size_t n) : size(n) {
    p = static_cast<std::byte*>(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  ~Buffer() { ::munmap(p, size); }
  std::byte* p;
  std::size_t size;
};

}  // namespace

TEST_CASE("host registration pins pages and unpins on release", "[host]") {
  auto host = HostDomain::open();
  CHECK(host->name() == "host");
  CHECK_FALSE(host->remote_capable());
  CHECK(host->pins_memory());
  Buffer buf(std::size_t{1} << 20);  // under the default 8 MiB memlock limit
  const auto before = locked_kib();
  {
    Registration r = host->register_memory(buf.p, buf.size, Access::local);
    CHECK(locked_kib() >= before + 1024);
    CHECK(r.remote_key() == 0);
    CHECK(r.address_mode() == AddressMode::virtual_address);
  }
  CHECK(locked_kib() == before);
  CHECK(host->stats().registrations == 1);
  CHECK(host->stats().deregistrations == 1);
  CHECK(host->stats().register_ns > 0);
}

TEST_CASE("host domain without locking counts but pins nothing", "[host]") {
  auto host = HostDomain::open(HostDomainConfig{false});
  CHECK_FALSE(host->pins_memory());
  Buffer buf(std::size_t{4} << 20);
  const auto before = locked_kib();
  Registration r = host->register_memory(buf.p, buf.size, Access::local);
  CHECK(locked_kib() == before);
  CHECK(host->stats().bytes_registered_live == buf.size);
}

TEST_CASE("host registration of zero bytes is refused", "[host]") {
  auto host = HostDomain::open();
  Buffer buf(4096);
  try {
    (void)host->register_memory(buf.p, 0, Access::local);
    FAIL("expected an Error");
  } catch (const Error& e) {
    CHECK(e.status() == Status::invalid_argument);
  }
  CHECK(host->stats().failed_registrations == 1);
}

TEST_CASE("a pool on the host domain pins its arena once", "[host]") {
  auto host = HostDomain::open();
  PoolConfig cfg;
  cfg.arena_size = std::size_t{2} << 20;
  const auto before = locked_kib();
  Pool pool({host}, cfg);
  CHECK(locked_kib() >= before + 2048);
  for (int i = 0; i < 1000; ++i) {
    auto r = pool.allocate(1000);
    REQUIRE(r.ok());
  }
  CHECK(host->stats().registrations == 1);
}
