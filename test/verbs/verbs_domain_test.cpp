// VerbsDomain on a real device (rxe0 inside the Soft-RoCE guest): device
// selection, registration with the asked rights, keys, errors, and the
// memlock error (RLIMIT_MEMLOCK lowered and CAP_IPC_LOCK dropped in a child).
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "regpool/pool.hpp"
#include "regpool/verbs_domain.hpp"

using regpool::Access;
using regpool::Status;

TEST_CASE("verbs domain opens the first active device and registers with the asked rights", "[verbs]") {
  auto d = regpool::VerbsDomain::open();
  CHECK(d->name().rfind("verbs:", 0) == 0);
  CHECK(d->address_mode() == regpool::AddressMode::virtual_address);
  CHECK(d->pins_memory());
  CHECK(d->port_info().port >= 1);
  std::vector<std::byte> buf(1 << 16);
  {
    auto r = d->register_memory(buf.data(), buf.size(), Access::all);
    CHECK(r.local_key() != 0);
    CHECK(r.remote_key() != 0);
    CHECK(r.remote_address(buf.data() + 5) == reinterpret_cast<std::uintptr_t>(buf.data() + 5));
    auto* mr = static_cast<ibv_mr*>(r.native());
    REQUIRE(mr != nullptr);
    CHECK(mr->lkey == r.local_key());
    CHECK(mr->length == buf.size());
    CHECK(d->stats().live_registrations == 1);
  }
  CHECK(d->stats().live_registrations == 0);
  CHECK(d->stats().deregistrations == 1);
  // Access mapping: local write always, remote rights as asked, MW_BIND with windows.
  CHECK(regpool::verbs_access_flags(Access::local, false) == IBV_ACCESS_LOCAL_WRITE);
  CHECK(regpool::verbs_access_flags(Access::remote_read, true) ==
        (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND));
  CHECK(regpool::verbs_access_flags(Access::all, false) ==
        (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC));
}

TEST_CASE("verbs domain selects by name and rejects unknown devices and bad input", "[verbs]") {
  auto first = regpool::VerbsDomain::open();
  regpool::VerbsConfig c;
  c.device = first->device_name();
  auto again = regpool::VerbsDomain::open(c);
  CHECK(again->device_name() == first->device_name());
  c.device = "no_such_device0";
  try {
    (void)regpool::VerbsDomain::open(c);
    FAIL("opened a device that does not exist");
  } catch (const regpool::Error& e) {
    CHECK(e.status() == Status::unsupported);
    CHECK(std::string(e.what()).find("no_such_device0") != std::string::npos);
  }
  std::vector<std::byte> buf(4096);
  CHECK(first->try_register(buf.data(), 0, Access::all).status() == Status::invalid_argument);
  CHECK(first->try_register(nullptr, 4096, Access::all).status() == Status::invalid_argument);
  CHECK(first->stats().failed_registrations == 2);
}

TEST_CASE("a pool serves a verbs domain: arenas registered once, objects carry lkey/rkey", "[verbs]") {
  auto d = regpool::VerbsDomain::open();
  regpool::PoolConfig pc;
  pc.arena_size = std::size_t{4} << 20;
  regpool::Pool pool({d}, pc);
  const auto before = d->stats().registrations;
  std::vector<regpool::Ldo> objs;
  for (int i = 0; i < 100; ++i) {
    auto r = pool.allocate(4096);
    REQUIRE(r.ok());
    objs.push_back(std::move(*r));
  }
  auto region = objs[7].region(*d);
  REQUIRE(region.ok());
  CHECK(region->local_key != 0);
  CHECK(region->remote_key != 0);
  CHECK(d->stats().registrations - before <= 1);  // at most the first arena
}

namespace {
bool drop_ipc_lock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  const unsigned bit = 1U << CAP_IPC_LOCK;
  data[0].effective &= ~bit;
  data[0].permitted &= ~bit;
  data[0].inheritable &= ~bit;
  return syscall(SYS_capset, &header, data) == 0;
}
}  // namespace

TEST_CASE("ibv_reg_mr beyond RLIMIT_MEMLOCK names the limit and the fix", "[verbs]") {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // 0 ok; anything else a failure, explained on stderr.
    int rc = 1;
    try {
      rlimit rl{rlim_t{1} << 20, rlim_t{1} << 20};
      if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
        std::fprintf(stderr, "cannot lower RLIMIT_MEMLOCK: %s\n", std::strerror(errno));
        ::_exit(5);
      }
      if (!drop_ipc_lock()) {
        std::fprintf(stderr, "cannot drop CAP_IPC_LOCK: %s\n", std::strerror(errno));
        ::_exit(6);
      }
      auto d = regpool::VerbsDomain::open();
      std::vector<std::byte> buf(std::size_t{16} << 20, std::byte{1});
      try {
        auto r = d->register_memory(buf.data(), buf.size(), Access::all);
        std::fprintf(stderr, "16 MiB registered under a 1 MiB memlock limit\n");
        rc = 2;
      } catch (const regpool::Error& e) {
        const std::string m = e.what();
        std::fprintf(stderr, "memlock error: %s\n", m.c_str());
        const bool ok = e.status() == Status::memlock_limit && m.find("RLIMIT_MEMLOCK") != std::string::npos &&
                        m.find("1048576") != std::string::npos && m.find("ulimit -l") != std::string::npos;
        rc = ok ? 0 : 3;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      rc = 4;
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  REQUIRE(WIFEXITED(st));
  // Lowering one's own limit and dropping one's own capability are always
  // permitted (the guest runs as root, which has the capability to drop),
  // so the scenario can always be set up: a child that could not set it up
  // fails the case rather than skipping it.
  INFO("child exit code " << WEXITSTATUS(st)
                          << ": 2 registered past the limit, 3 wrong error, 4 exception, 5/6 setup (stderr)");
  CHECK(WEXITSTATUS(st) == 0);
}
