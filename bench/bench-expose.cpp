// bench-expose: what exposing an object costs, per ExposureMode, against a
// plain registration of the same bytes, in one process and one run:
//
//   bench-expose [--provider shm|tcp|verbs[:DEV]] [--sizes LIST] [--rounds N]
//                [--iters N] [--quarantine MS] [--json] [--smoke]
//
// For each size (default 64, 4K, 64K, 1M: a slice of one pool object) three
// methods, in interleaved rounds (each round runs --iters of every method,
// the order rotating from round to round, so drift of a shared machine hits
// all three alike):
//   standard  Endpoint::expose(slice, read_write, standard) + revoke();
//   scoped    Endpoint::expose(slice, read_write, scoped) + revoke();
//   raw       the provider's own registration of the same bytes with the
//             same remote rights: fi_mr_reg + fi_close on the FabricDomain's
//             fid_domain (libfabric), ibv_reg_mr + ibv_dereg_mr on the
//             VerbsDomain's protection domain (verbs).
// Each operation is timed alone (steady_clock); the figures are the median
// and p99 of all of them, and ratio = median / raw median. The domain's
// registration counter is read around each method's operations: standard
// must make none (the exit code says so), scoped one per exposure.
//
// Not a Google Benchmark: it runs inside the Soft-RoCE guest with nothing
// but libibverbs, like verbs-regcost. Revoked standard exposures on shm and
// tcp are quarantined (EndpointConfig::revoke_quarantine, 1 s by default):
// that bookkeeping is part of what standard mode costs and is measured
// (--quarantine MS sets another interval, 0 = none, to see its share).
// Exit codes: 0 ok, 1 failure (or a standard exposure that registered),
// 2 bad arguments, 77 the provider or device is absent.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "platform/mapping.hpp"
#include "regpool/endpoint.hpp"
#include "regpool/pool.hpp"
#include "regpool/slice.hpp"
#include "regpool_config.h"

#if REGPOOL_HAVE_FABRIC
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include "regpool/fabric_domain.hpp"
#include "regpool/fabric_endpoint.hpp"
#endif
#if REGPOOL_HAVE_VERBS && __has_include("regpool/verbs_endpoint.hpp")
#include <infiniband/verbs.h>

#include "regpool/verbs_domain.hpp"
#include "regpool/verbs_endpoint.hpp"
#define BENCH_HAVE_VERBS 1
#else
#define BENCH_HAVE_VERBS 0
#endif

namespace {

using Clock = std::chrono::steady_clock;
using regpool::ExposureMode;
using regpool::Slice;
using regpool::Status;

constexpr int kExitUsage = 2;
constexpr int kExitSkip = 77;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The provider or device is absent on this machine (exit 77 with the reason).
struct Absent : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class Open>
auto open_or_absent(const std::string& provider, Open open) {
  try {
    return open();
  } catch (const regpool::Error& e) {
    throw Absent("cannot open " + provider + ": " + e.what());
  }
}

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: bench-expose [--provider shm|tcp|verbs[:DEV]] [--sizes LIST] [--rounds N] [--iters N]\n"
               "                    [--json] [--smoke]\n"
               "Expose + revoke (standard and scoped) against a plain fi_mr_reg / ibv_reg_mr of\n"
               "the same bytes, interleaved rounds, median and p99 per operation.\n"
               "  --provider P  shm (default), tcp (tcp;ofi_rxm on 127.0.0.1), verbs[:DEV]\n"
               "  --sizes LIST  slice sizes in bytes, suffixes K/M (default 64,4K,64K,1M)\n"
               "  --rounds N    interleaved rounds (default 30)\n"
               "  --iters N     operations per method and round (default 200)\n"
               "  --quarantine MS  EndpointConfig::revoke_quarantine (default: the library's)\n"
               "  --json        one JSON object on stdout\n"
               "  --smoke       2 rounds of 20, sizes 64 and 4K (CI)\n");
}

std::uint64_t parse_count(const std::string& v, const char* what, std::uint64_t max) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n == 0 || n > max) throw UsageError(std::string(what) + ": bad value '" + v + "'");
  return n;
}

std::uint64_t parse_size(std::string v) {
  std::uint64_t mult = 1;
  if (!v.empty() && (v.back() == 'K' || v.back() == 'k')) mult = 1024;
  if (!v.empty() && (v.back() == 'M' || v.back() == 'm')) mult = 1024 * 1024;
  if (mult != 1) v.pop_back();
  return parse_count(v, "--sizes", std::uint64_t{64} << 20) * mult;
}

struct Options {
  std::string provider = "shm";
  std::vector<std::uint64_t> sizes{64, 4096, 65536, std::uint64_t{1} << 20};
  std::uint64_t rounds = 30;
  std::uint64_t iters = 200;
  long long quarantine_ms = -1;  // the library's default
  bool json = false;
};

bool is_verbs(const std::string& p) { return p == "verbs" || p.rfind("verbs:", 0) == 0; }

// The provider's own registration of a byte range, undone at once: what an
// application without regpool pays to hand a peer a key for those bytes.
class RawRegistration {
 public:
  virtual ~RawRegistration() = default;
  // Registers and deregisters once; false (with `error` set) on failure.
  virtual bool once(void* addr, std::size_t len, std::string& error) noexcept = 0;
  virtual const char* name() const noexcept = 0;
};

#if REGPOOL_HAVE_FABRIC
class FabricRaw final : public RawRegistration {
 public:
  explicit FabricRaw(const regpool::FabricDomain& d) : domain_(d.native_domain()) {
    const fi_info* info = d.native_info();
    prov_key_ = (d.mr_mode() & FI_MR_PROV_KEY) != 0;
    const std::size_t key_size = info && info->domain_attr ? info->domain_attr->mr_key_size : 8;
    key_mask_ = key_size >= 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * key_size)) - 1;
    // Far from the domain's random keys with overwhelming likelihood; a
    // taken key answers -FI_ENOKEY and the next one is tried.
    next_key_ = static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()) & key_mask_;
  }
  bool once(void* addr, std::size_t len, std::string& error) noexcept override {
    // The rights FabricDomain gives a read-write registration.
    constexpr std::uint64_t kAccess = FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    for (int tries = 0; tries < 16; ++tries) {
      fid_mr* mr = nullptr;
      const std::uint64_t key = prov_key_ ? 0 : (next_key_++ & key_mask_);
      const int rc = fi_mr_reg(domain_, addr, len, kAccess, 0, key, 0, &mr, nullptr);
      if (rc == -FI_ENOKEY && !prov_key_) continue;
      if (rc != 0) {
        error = std::string("fi_mr_reg: ") + fi_strerror(-rc);
        return false;
      }
      const int cr = fi_close(&mr->fid);
      if (cr != 0) {
        error = std::string("fi_close(mr): ") + fi_strerror(-cr);
        return false;
      }
      return true;
    }
    error = "fi_mr_reg: no free key";
    return false;
  }
  const char* name() const noexcept override { return "fi_mr_reg+fi_close"; }

 private:
  fid_domain* domain_;
  bool prov_key_ = false;
  std::uint64_t key_mask_ = ~std::uint64_t{0};
  std::uint64_t next_key_ = 1;
};
#endif

#if BENCH_HAVE_VERBS
class VerbsRaw final : public RawRegistration {
 public:
  explicit VerbsRaw(const regpool::VerbsDomain& d) : pd_(d.native_pd()) {}
  bool once(void* addr, std::size_t len, std::string& error) noexcept override {
    ibv_mr* mr = ibv_reg_mr(pd_, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
    if (!mr) {
      error = std::string("ibv_reg_mr: ") + std::strerror(errno);
      return false;
    }
    if (const int rc = ibv_dereg_mr(mr); rc != 0) {
      error = std::string("ibv_dereg_mr: ") + std::strerror(rc);
      return false;
    }
    return true;
  }
  const char* name() const noexcept override { return "ibv_reg_mr+ibv_dereg_mr"; }

 private:
  ibv_pd* pd_;
};
#endif

// A domain, a pool serving it and an endpoint on it, plus the raw path.
struct Stack {
  std::shared_ptr<regpool::Domain> domain;
  std::unique_ptr<regpool::Pool> pool;
  std::unique_ptr<regpool::Endpoint> ep;
  std::unique_ptr<RawRegistration> raw;

  Stack(const std::string& provider, std::uint64_t max_size, long long quarantine_ms) {
    regpool::EndpointConfig ec;
    ec.max_in_flight = 16;
    if (quarantine_ms >= 0) ec.revoke_quarantine = std::chrono::milliseconds(quarantine_ms);
    if (is_verbs(provider)) {
#if BENCH_HAVE_VERBS
      regpool::VerbsConfig vc;
      if (provider.size() > 6) vc.device = provider.substr(6);
      auto vd = open_or_absent(provider, [&] { return regpool::VerbsDomain::open(vc); });
      domain = vd;
      raw = std::make_unique<VerbsRaw>(*vd);
      make_pool(max_size);
      ep = regpool::VerbsEndpoint::open(vd, ec);
      return;
#else
      throw Absent("built without regpool's verbs transport");
#endif
    }
#if REGPOOL_HAVE_FABRIC
    regpool::FabricConfig fc;
    fc.provider = provider;
    if (provider == "tcp") fc.node = "127.0.0.1";
    auto fd = open_or_absent(provider, [&] { return regpool::FabricDomain::open(fc); });
    domain = fd;
    // Under FI_MR_ENDPOINT a raw registration would also need binding to an
    // endpoint and enabling; no provider measured here has it.
    if (fd->needs_endpoint_binding()) {
      throw regpool::Error(Status::unsupported, 0, "provider needs FI_MR_ENDPOINT: raw fi_mr_reg not comparable");
    }
    raw = std::make_unique<FabricRaw>(*fd);
    make_pool(max_size);
    ep = regpool::FabricEndpoint::open(fd, ec);
#else
    throw Absent("built without libfabric");
#endif
  }
  void make_pool(std::uint64_t max_size) {
    regpool::PoolConfig pc;
    pc.name = "bench-expose";
    pc.arena_size = regpool::platform::round_up(max_size + (std::uint64_t{4} << 20), regpool::platform::kHugePageSize);
    pc.prefault = true;
    pool = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain}, pc);
  }
  ~Stack() {
    ep.reset();
    pool.reset();
  }
};

enum Method : int { kStandard = 0, kScoped = 1, kRaw = 2, kMethods = 3 };
const char* method_name(int m) { return m == kStandard ? "standard" : m == kScoped ? "scoped" : "raw"; }

struct Cell {
  std::vector<double> ns;
  std::uint64_t registrations = 0;
  std::string error;
};

double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const auto i = static_cast<std::size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

// Runs `iters` of method `m` on `slice`, appending one time per operation.
void run_method(Stack& s, int m, const Slice& slice, std::uint64_t iters, Cell& cell) {
  if (!cell.error.empty()) return;
  const std::uint64_t regs = s.domain->stats().registrations;
  for (std::uint64_t i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    if (m == kRaw) {
      if (!s.raw->once(slice.address(), static_cast<std::size_t>(slice.length()), cell.error)) return;
    } else {
      auto e = s.ep->expose(slice, regpool::RemoteAccess::read_write,
                            m == kStandard ? ExposureMode::standard : ExposureMode::scoped);
      if (!e) {
        cell.error = std::string("expose: ") + regpool::to_string(e.status());
        return;
      }
      e->revoke();
    }
    cell.ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
  }
  cell.registrations += s.domain->stats().registrations - regs;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      o += ' ';
      continue;
    }
    o += c;
  }
  return o + "\"";
}

int run(const Options& o) {
  const std::uint64_t max_size = *std::max_element(o.sizes.begin(), o.sizes.end());
  std::unique_ptr<Stack> s;
  try {
    s = std::make_unique<Stack>(o.provider, max_size, o.quarantine_ms);
  } catch (const Absent& e) {
    std::fprintf(stderr, "bench-expose: SKIP: %s\n", e.what());
    return kExitSkip;
  }
  auto obj = s->pool->allocate(max_size);
  if (!obj) {
    std::fprintf(stderr, "bench-expose: pool allocate: %s\n", regpool::to_string(obj.status()));
    return 1;
  }
  std::vector<std::vector<Cell>> cells(o.sizes.size(), std::vector<Cell>(kMethods));
  for (auto& row : cells) {
    for (auto& c : row) c.ns.reserve(o.rounds * o.iters);
  }
  // Warm-up: the exposure table, the scoped slot list, the provider's
  // key table and the caches, for every size and method.
  for (std::size_t si = 0; si < o.sizes.size(); ++si) {
    auto slice = Slice::data(*obj, 0, o.sizes[si]);
    if (!slice) {
      std::fprintf(stderr, "bench-expose: slice of %llu bytes: %s\n", static_cast<unsigned long long>(o.sizes[si]),
                   regpool::to_string(slice.status()));
      return 1;
    }
    for (int m = 0; m < kMethods; ++m) {
      Cell warm;
      run_method(*s, m, *slice, std::min<std::uint64_t>(o.iters, 32), warm);
      if (!warm.error.empty()) cells[si][m].error = warm.error;
    }
  }
  for (std::uint64_t r = 0; r < o.rounds; ++r) {
    for (std::size_t si = 0; si < o.sizes.size(); ++si) {
      auto slice = Slice::data(*obj, 0, o.sizes[si]);
      for (int k = 0; k < kMethods; ++k) {
        const int m = static_cast<int>((r + static_cast<std::uint64_t>(k)) % kMethods);
        run_method(*s, m, *slice, o.iters, cells[si][m]);
      }
    }
  }

  bool failed = false;
  std::string out;
  const std::string domain = s->domain->name();
  if (o.json) {
    out = "{\"tool\":\"bench-expose\",\"provider\":" + json_str(o.provider) + ",\"domain\":" + json_str(domain) +
          ",\"raw\":" + json_str(s->raw->name()) + ",\"rounds\":" + std::to_string(o.rounds) +
          ",\"iters\":" + std::to_string(o.iters) +
          ",\"revoke_quarantine_ms\":" + std::to_string(s->ep->config().revoke_quarantine.count()) + ",\"units\":\"nanoseconds per expose+revoke\",\"results\":[";
  } else {
    out = "bench-expose: " + domain + ", raw = " + s->raw->name() + ", " + std::to_string(o.rounds) +
          " interleaved rounds of " + std::to_string(o.iters) + " per method, revoke_quarantine " +
          std::to_string(s->ep->config().revoke_quarantine.count()) + " ms\n";
    char line[200];
    std::snprintf(line, sizeof line, "%10s %-9s %12s %12s %10s %14s\n", "size", "method", "median ns", "p99 ns",
                  "vs raw", "registrations");
    out += line;
  }
  bool first = true;
  for (std::size_t si = 0; si < o.sizes.size(); ++si) {
    for (auto& c : cells[si]) std::sort(c.ns.begin(), c.ns.end());
    const double raw_median = quantile(cells[si][kRaw].ns, 0.5);
    for (int m = 0; m < kMethods; ++m) {
      const Cell& c = cells[si][m];
      const double med = quantile(c.ns, 0.5), p99 = quantile(c.ns, 0.99);
      const double ratio = raw_median > 0 ? med / raw_median : 0;
      if (!c.error.empty()) failed = true;
      // Standard mode registers nothing: anything else is a regression.
      if (m == kStandard && c.registrations != 0) {
        failed = true;
        std::fprintf(stderr, "bench-expose: standard exposures of %llu bytes made %llu domain registrations\n",
                     static_cast<unsigned long long>(o.sizes[si]), static_cast<unsigned long long>(c.registrations));
      }
      if (o.json) {
        char buf[400];
        std::snprintf(buf, sizeof buf,
                      "%s{\"size\":%llu,\"method\":\"%s\",\"median_ns\":%.1f,\"p99_ns\":%.1f,\"ops\":%zu,"
                      "\"ratio_vs_raw\":%.4f,\"domain_registrations\":%llu,\"error\":",
                      first ? "" : ",", static_cast<unsigned long long>(o.sizes[si]), method_name(m), med, p99,
                      c.ns.size(), ratio, static_cast<unsigned long long>(c.registrations));
        out += buf;
        out += c.error.empty() ? std::string("null") : json_str(c.error);
        out += "}";
        first = false;
      } else {
        char buf[300];
        std::snprintf(buf, sizeof buf, "%10llu %-9s %12.0f %12.0f %10.3f %14llu%s%s\n",
                      static_cast<unsigned long long>(o.sizes[si]), method_name(m), med, p99, ratio,
                      static_cast<unsigned long long>(c.registrations), c.error.empty() ? "" : "  error: ",
                      c.error.c_str());
        out += buf;
      }
    }
  }
  if (o.json) {
    const auto st = s->ep->exposure_stats();
    out += "],\"exposure_stats\":{\"created\":" + std::to_string(st.created) +
           ",\"scoped\":" + std::to_string(st.scoped) + ",\"registrations\":" + std::to_string(st.registrations) +
           ",\"quarantine_total\":" + std::to_string(st.quarantine_total) + "}}\n";
  }
  std::fputs(out.c_str(), stdout);
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw UsageError(a + " needs a value");
        return argv[++i];
      };
      if (a == "-h" || a == "--help") {
        usage(stdout);
        return 0;
      } else if (a == "--provider") {
        o.provider = value();
      } else if (a == "--sizes") {
        o.sizes.clear();
        std::string v = value();
        std::size_t pos = 0;
        while (pos <= v.size()) {
          const auto comma = v.find(',', pos);
          o.sizes.push_back(parse_size(v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos)));
          if (comma == std::string::npos) break;
          pos = comma + 1;
        }
      } else if (a == "--rounds") {
        o.rounds = parse_count(value(), "--rounds", 100000);
      } else if (a == "--iters") {
        o.iters = parse_count(value(), "--iters", 1000000);
      } else if (a == "--quarantine") {
        const std::string v = value();
        o.quarantine_ms = v == "0" ? 0 : static_cast<long long>(parse_count(v, "--quarantine", 3600000));
      } else if (a == "--json") {
        o.json = true;
      } else if (a == "--smoke") {
        o.sizes = {64, 4096};
        o.rounds = 2;
        o.iters = 20;
      } else {
        throw UsageError("unknown argument '" + a + "'");
      }
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "bench-expose: %s\n", e.what());
    usage(stderr);
    return kExitUsage;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench-expose: %s\n", e.what());
    return 1;
  }
}
