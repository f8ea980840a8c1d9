// Catch2 main for the verbs suite: without a usable RDMA device (the host,
// which has no RDMA) the binary exits 77 (SKIP) with the reason instead of
// failing; inside the Soft-RoCE guest (test/softroce/guest-run) rxe0 exists
// and the tests run.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "regpool/verbs_domain.hpp"

int main(int argc, char** argv) {
  try {
    auto d = regpool::VerbsDomain::open();
    std::printf("verbs device: %s (port %u, %s, GID index %d, memory windows %s)\n", d->name().c_str(),
                static_cast<unsigned>(d->port_info().port), d->port_info().ethernet ? "RoCE" : "IB",
                d->port_info().gid_index, d->memory_windows() ? "yes" : "no");
  } catch (const regpool::Error& e) {
    if (e.status() == regpool::Status::unsupported) {
      std::printf("SKIP: no usable verbs device: %s\n", e.what());
      return 77;
    }
    std::fprintf(stderr, "verbs domain failed to open: %s\n", e.what());
    return 1;
  }
  std::fflush(stdout);
  return Catch::Session().run(argc, argv);
}
