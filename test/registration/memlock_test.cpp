// RLIMIT_MEMLOCK: with the limit lowered and CAP_IPC_LOCK dropped, pinning
// beyond the limit must fail with an error that names the limit, the
// request and the fix. Runs the scenario in a child process so the lowered
// limit and dropped capability do not leak into anything else; exits 77
// (SKIP) only when the scenario cannot be set up.
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "regpool/host_domain.hpp"
#include "regpool/pool.hpp"

using namespace regpool;

namespace {

constexpr int kSkip = 77;

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

bool contains(const std::string& s, const std::string& what) {
  if (s.find(what) != std::string::npos) return true;
  std::fprintf(stderr, "message lacks '%s': %s\n", what.c_str(), s.c_str());
  return false;
}

int scenario() {
  const rlim_t limit = rlim_t{1} << 20;
  rlimit rl{limit, limit};
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
    std::printf("SKIP: cannot lower RLIMIT_MEMLOCK: %s\n", std::strerror(errno));
    return kSkip;
  }
  if (!drop_ipc_lock()) {
    std::printf("SKIP: cannot drop CAP_IPC_LOCK: %s\n", std::strerror(errno));
    return kSkip;
  }
  auto host = HostDomain::open();
  std::vector<std::byte> buf(std::size_t{16} << 20);
  try {
    Registration r = host->register_memory(buf.data(), buf.size(), Access::local);
    // The limit is lowered and the capability dropped (capset succeeded),
    // so the kernel must refuse: success means nothing was pinned.
    std::fprintf(stderr, "FAIL: 16 MiB registered under a 1 MiB memlock limit without CAP_IPC_LOCK\n");
    return 1;
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (e.status() != Status::memlock_limit) {
      std::fprintf(stderr, "wrong status: %s\n", msg.c_str());
      return 1;
    }
    if (e.provider_code() >= 0) return 1;
    if (!contains(msg, "RLIMIT_MEMLOCK") || !contains(msg, std::to_string(buf.size())) ||
        !contains(msg, std::to_string(limit)) || !contains(msg, "ulimit -l") || !contains(msg, "CAP_IPC_LOCK"))
      return 1;
    std::printf("register: %s\n", msg.c_str());
  }
  // A pool whose first arena cannot be pinned fails at construction with
  // the same explanation, and nothing stays registered.
  try {
    PoolConfig cfg;
    cfg.arena_size = std::size_t{4} << 20;
    Pool pool({host}, cfg);
    std::fprintf(stderr, "pool construction should have failed\n");
    return 1;
  } catch (const Error& e) {
    if (e.status() != Status::memlock_limit || !contains(e.what(), "RLIMIT_MEMLOCK")) return 1;
    std::printf("pool: %s\n", e.what());
  }
  const auto s = host->stats();
  if (s.live_registrations != 0 || s.failed_registrations != 2) {
    std::fprintf(stderr, "stats: live %llu failed %llu\n", static_cast<unsigned long long>(s.live_registrations),
                 static_cast<unsigned long long>(s.failed_registrations));
    return 1;
  }
  // Within the limit, pinning still works.
  std::vector<std::byte> small(std::size_t{256} << 10);
  Registration ok = host->register_memory(small.data(), small.size(), Access::local);
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) _exit(scenario());
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) {
    std::fprintf(stderr, "child did not exit normally\n");
    return 1;
  }
  const int code = WEXITSTATUS(status);
  std::printf("%s\n", code == 0 ? "PASS" : code == kSkip ? "SKIPPED" : "FAIL");
  return code;
}
