// verbs-regcost: what registration costs on a verbs device, against what
// regpool makes it cost. Plain timing (no Google Benchmark) so it runs inside
// the Soft-RoCE guest with nothing but libibverbs:
//
//   test/softroce/guest-run --timeout 900 --file build/bench/verbs-regcost -- verbs-regcost
//
// Part 1: ibv_reg_mr + ibv_dereg_mr of 4 KiB .. 512 MiB (touched, THP-advised
// anonymous memory, as regpool arenas are) against memcpy of the same size.
// Part 2: getting a registered buffer per message, three ways: a regpool LDO
// (allocate + release from a pool whose arena is registered once),
// malloc + register + deregister + free, and memcpy into a pre-registered
// bounce buffer. Medians. On Soft-RoCE under TCG every figure is emulated;
// only the ratios within one run mean anything.
// Exit 77 (SKIP) without a verbs device.

#include <sys/mman.h>

#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "regpool/pool.hpp"
#include "regpool/verbs_domain.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

std::string human(std::size_t n) {
  if (n >= (std::size_t{1} << 20)) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

std::byte* map_touched(std::size_t n) {
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)::madvise(p, n, MADV_HUGEPAGE);
  std::memset(p, 1, n);
  return static_cast<std::byte*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t max_size = std::size_t{512} << 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--max-size") == 0 && i + 1 < argc) max_size = std::strtoull(argv[++i], nullptr, 0);
  }
  std::shared_ptr<regpool::VerbsDomain> dom;
  try {
    dom = regpool::VerbsDomain::open();
  } catch (const regpool::Error& e) {
    std::printf("SKIP: no usable verbs device: %s\n", e.what());
    return 77;
  }
  ibv_pd* pd = dom->native_pd();
  const int flags = regpool::verbs_access_flags(regpool::Access::all, false);
  std::printf("device %s; medians; emulated times (Soft-RoCE under TCG when run in the guest)\n\n",
              dom->name().c_str());

  std::printf("| size | ibv_reg_mr | ibv_dereg_mr | reg+dereg | memcpy | (reg+dereg)/memcpy |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|\n");
  const std::size_t kMiB = std::size_t{1} << 20;
  for (std::size_t size : {std::size_t{4096}, std::size_t{65536}, kMiB, 16 * kMiB, 64 * kMiB, 256 * kMiB, 512 * kMiB}) {
    if (size > max_size) break;
    std::byte* src = map_touched(size);
    std::byte* dst = map_touched(size);
    if (!src || !dst) {
      std::printf("| %s | (mmap failed) | | | | |\n", human(size).c_str());
      if (src) ::munmap(src, size);
      break;
    }
    const int reps = static_cast<int>(std::clamp<std::size_t>((std::size_t{256} << 20) / size, 5, 200));
    std::vector<double> reg, dereg, sum, copy;
    bool failed = false;
    for (int r = 0; r < reps + 1; ++r) {
      auto t0 = Clock::now();
      ibv_mr* mr = ibv_reg_mr(pd, src, size, flags);
      const double a = us_since(t0);
      if (!mr) {
        std::printf("| %s | ibv_reg_mr failed: %s | | | | |\n", human(size).c_str(), std::strerror(errno));
        failed = true;
        break;
      }
      t0 = Clock::now();
      (void)ibv_dereg_mr(mr);
      const double b = us_since(t0);
      t0 = Clock::now();
      std::memcpy(dst, src, size);
      const double c = us_since(t0);
      if (r == 0) continue;  // warm-up
      reg.push_back(a);
      dereg.push_back(b);
      sum.push_back(a + b);
      copy.push_back(c);
    }
    if (!failed) {
      const double s = median(sum), c = median(copy);
      std::printf("| %s | %.1f us | %.1f us | %.1f us | %.1f us | %.3g |\n", human(size).c_str(), median(reg),
                  median(dereg), s, c, c > 0 ? s / c : 0.0);
    }
    std::fflush(stdout);
    ::munmap(src, size);
    ::munmap(dst, size);
  }

  std::printf("\n| size | regpool LDO alloc+release | malloc+reg+dereg+free | bounce memcpy | "
              "register-per-message / LDO |\n");
  std::printf("|---:|---:|---:|---:|---:|\n");
  regpool::PoolConfig pc;
  pc.arena_size = std::size_t{64} << 20;
  regpool::Pool pool({dom}, pc);
  for (std::size_t size : {std::size_t{4096}, std::size_t{65536}, std::size_t{1} << 20}) {
    constexpr int kBatch = 100;
    constexpr int kRounds = 21;
    std::vector<double> ldo, perm, bounce;
    // Pre-registered bounce buffer for the copy variant.
    std::vector<std::byte> payload(size, std::byte{7});
    std::byte* bb = map_touched(size);
    auto bounce_reg = dom->register_memory(bb, size, regpool::Access::all);
    {
      auto warm = pool.allocate(size);  // first arena exists before timing
      if (!warm) return 1;
    }
    for (int round = 0; round < kRounds; ++round) {
      auto t0 = Clock::now();
      for (int i = 0; i < kBatch; ++i) {
        auto l = pool.allocate(size);
        if (!l) return 1;
        l->data()[0] = std::byte{1};
      }
      ldo.push_back(us_since(t0) / kBatch);
      const int n = size >= (std::size_t{1} << 20) ? 10 : kBatch;
      t0 = Clock::now();
      for (int i = 0; i < n; ++i) {
        auto* p = static_cast<std::byte*>(std::malloc(size));
        p[0] = std::byte{1};
        auto r = dom->register_memory(p, size, regpool::Access::all);
        r.reset();
        std::free(p);
      }
      perm.push_back(us_since(t0) / n);
      t0 = Clock::now();
      for (int i = 0; i < kBatch; ++i) std::memcpy(bb, payload.data(), size);
      bounce.push_back(us_since(t0) / kBatch);
    }
    bounce_reg.reset();
    ::munmap(bb, size);
    const double l = median(ldo), p = median(perm), b = median(bounce);
    std::printf("| %s | %.2f us | %.1f us | %.1f us | %.0fx |\n", human(size).c_str(), l, p, b, l > 0 ? p / l : 0.0);
    std::fflush(stdout);
  }
  const auto st = dom->stats();
  std::printf("\ndomain registrations during the run: %llu (pool arenas + the register-per-message loop)\n",
              static_cast<unsigned long long>(st.registrations));
  return 0;
}
