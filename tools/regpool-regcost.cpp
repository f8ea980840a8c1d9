// regpool-regcost: the copy-versus-register crossover, measured.
//
// For each size and each selected domain it times, per operation:
//   register+deregister   Domain::register_memory + Registration::reset
//   register              the register call alone      } same calls as above,
//   deregister            the deregister call alone    } timed separately
//   memcpy                copying the same number of bytes from a pre-touched
//                         (bounce) buffer into the measured buffer
//   pool                  Pool::allocate + dropping the Ldo: acquiring the
//                         same bytes already registered (pool pre-warmed)
// on pre-touched memory and on fresh memory (a new mapping per operation,
// so registration and copy both pay the first-touch page faults), and
// reports medians with min/max and quartiles over repetitions.
//
// Crossover: the smallest measured size S such that the median of
// register+deregister is below the median of memcpy at S and at every larger
// measured size ("none in range" when even the largest size fails). Asking
// for "every larger size" keeps one noisy point from declaring a crossover.
//
// Domains that only simulate registration (libfabric software providers:
// FabricDomain::pins_memory() == false) are flagged "simulated" in every
// output: their register columns are key-table bookkeeping, not pinning.
//
// Verbs devices are measured through regpool's VerbsDomain when the library
// is built with it, else with libibverbs directly (ibv_reg_mr on a protection
// domain of the named device, wrapped in a regpool::Domain so the pool column
// works too). The tool runs in the Soft-RoCE guest with nothing but libc,
// libstdc++ and the libraries it links (gnuplot only for --plot).

#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "platform/mapping.hpp"
#include "regpool/domain.hpp"
#include "regpool/host_domain.hpp"
#include "regpool/ldo.hpp"
#include "regpool/pool.hpp"
#include "regpool_config.h"
#include "tool_common.hpp"

#if REGPOOL_HAVE_FABRIC
#include "regpool/fabric_domain.hpp"
#endif
#if defined(REGPOOL_TOOLS_HAVE_IBVERBS) && REGPOOL_TOOLS_HAVE_IBVERBS
#include <infiniband/verbs.h>
#endif
// regpool's own verbs backend, when this build has it; otherwise verbs
// devices are timed through the IbvDomain below (plain ibv_reg_mr).
#if REGPOOL_HAVE_VERBS && __has_include("regpool/verbs_domain.hpp")
#include "regpool/verbs_domain.hpp"
#define REGCOST_USE_VERBS_DOMAIN 1
#else
#define REGCOST_USE_VERBS_DOMAIN 0
#endif

namespace {

using regpool_tools::format_size;
using regpool_tools::json_escape;
using regpool_tools::json_number;
using regpool_tools::Summary;
using regpool_tools::UsageError;

// Two default runs. Quick (no options): 4 KiB..16 MiB, 3 repetitions, about
// 8 MiB timed per repetition: enough to show the crossover on a host domain
// in well under 30 s. --full: 4 KiB..1 GiB, 5 repetitions, 32 MiB per
// repetition (minutes: the fresh-memory state faults in every byte of every
// operation). --max, --sizes and --reps override either.
constexpr std::uint64_t kDefaultMin = std::uint64_t{4} << 10;
constexpr std::uint64_t kQuickMax = std::uint64_t{16} << 20;
constexpr int kQuickReps = 3;
constexpr std::uint64_t kQuickInnerBytes = std::uint64_t{8} << 20;
constexpr std::uint64_t kFullMax = std::uint64_t{1} << 30;
constexpr int kFullReps = 5;
constexpr std::uint64_t kFullInnerBytes = std::uint64_t{32} << 20;
// Each repetition times about inner_bytes (at least one operation, at most
// kMaxInner), so small sizes are averaged over enough operations to rise
// above the clock's resolution while a 1 GiB repetition stays one operation.
constexpr std::uint64_t kMaxInner = 64;

enum Method : int { kRegDereg = 0, kReg, kDereg, kMemcpy, kPool, kMethodCount };
constexpr std::array<const char*, kMethodCount> kMethodKey = {"register_deregister", "register", "deregister",
                                                              "memcpy", "pool"};
constexpr std::array<const char*, kMethodCount> kMethodLabel = {"register+deregister", "register", "deregister",
                                                                "memcpy", "pool"};

enum MemState : int { kTouched = 0, kFresh = 1 };
constexpr std::array<const char*, 2> kStateKey = {"touched", "fresh"};
constexpr std::array<const char*, 2> kStateLabel = {"pre-touched", "fresh"};

void usage(std::FILE* to) {
  std::fprintf(
      to,
      "usage: regpool-regcost [options]\n"
      "Measures registration cost against memcpy and against acquiring the same bytes\n"
      "from a pre-registered regpool pool, per size and domain, and reports the\n"
      "copy-versus-register crossover.\n"
      "  --domain LIST   comma-separated domains (default: host,shm,tcp, plus verbs\n"
      "                  when a verbs device exists):\n"
      "                    host          mlock(2) pinning (HostDomain)\n"
      "                    shm, tcp      libfabric providers (tcp runs libfabric's net on\n"
      "                                  127.0.0.1); these SIMULATE registration\n"
      "                    fabric:NAME   any libfabric provider by name\n"
      "                    verbs[:DEV]   ibv_reg_mr on a verbs device (default: first)\n"
      "  --full          the long sweep: --max 1G, --reps 5, 32 MiB timed per\n"
      "                  repetition (minutes); default: a quick run, --max 16M,\n"
      "                  --reps 3, 8 MiB per repetition (seconds)\n"
      "  --min SIZE      smallest size (default 4K); sizes double up to --max\n"
      "  --max SIZE      largest size (default 16M; 1G with --full)\n"
      "  --sizes LIST    explicit comma-separated sizes instead of --min/--max\n"
      "                  (suffixes K, M, G; binary)\n"
      "  --reps N        repetitions per size and method; medians are over these\n"
      "                  (default 3; 5 with --full; 1..1000)\n"
      "  --memory LIST   touched, fresh or touched,fresh (default both)\n"
      "  --thp           advise transparent huge pages on the measured buffers\n"
      "                  (default: plain pages, like malloc'd memory)\n"
      "  --csv[=FILE]    CSV instead of the table (to FILE: in addition to it)\n"
      "  --json[=FILE]   JSON instead of the table (to FILE: in addition to it)\n"
      "  --plot FILE     log-log chart (cost against size, one line per method,\n"
      "                  one panel per domain) to FILE ending in .svg or .png; needs\n"
      "                  gnuplot; repeat for several files from one run\n"
      "  --from-csv FILE measure nothing: read a run saved with --csv=FILE (e.g. one\n"
      "                  made inside the Soft-RoCE guest, which has no gnuplot) and\n"
      "                  print, convert or --plot it; sizes, reps and memory states\n"
      "                  come from the file\n"
      "  --progress      progress on stderr even when it is not a terminal (there:\n"
      "                  one line per domain, memory state and size)\n"
      "  --no-progress   no progress line, even on a terminal (e.g. in the qemu guest,\n"
      "                  whose console merges stderr into the output)\n"
      "  -h, --help      this text\n"
      "Times are microseconds per operation. Crossover: the smallest measured size S\n"
      "with median(register+deregister) < median(memcpy) at S and at every larger\n"
      "size; \"none in range\" when there is none.\n"
      "Exit codes: 0 ok (per-domain failures such as the memlock limit are reported\n"
      "in the output), 1 runtime failure (e.g. gnuplot missing), 2 bad arguments.\n");
}

double now_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

// Keeps the compiler from proving a copy dead.
inline void clobber(void* p) { asm volatile("" : : "g"(p) : "memory"); }

#if defined(REGPOOL_TOOLS_HAVE_IBVERBS) && REGPOOL_TOOLS_HAVE_IBVERBS && !REGCOST_USE_VERBS_DOMAIN
// ibv_reg_mr on one protection domain of one device, as a regpool Domain so
// the pool column can use it like any other backend.
class IbvDomain final : public regpool::Domain {
 public:
  explicit IbvDomain(const std::string& device) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list || n == 0) {
      if (list) ibv_free_device_list(list);
      throw regpool::Error(regpool::Status::unsupported, -ENODEV, "verbs: no RDMA devices on this machine");
    }
    ibv_device* dev = nullptr;
    for (int i = 0; i < n && !dev; ++i) {
      if (device.empty() || device == ibv_get_device_name(list[i])) dev = list[i];
    }
    if (!dev) {
      ibv_free_device_list(list);
      throw regpool::Error(regpool::Status::invalid_argument, -ENODEV, "verbs: no device named '" + device + "'");
    }
    device_ = ibv_get_device_name(dev);
    ctx_ = ibv_open_device(dev);
    ibv_free_device_list(list);
    if (!ctx_) throw regpool::Error(regpool::Status::registration_failed, -errno, "verbs: ibv_open_device failed");
    pd_ = ibv_alloc_pd(ctx_);
    if (!pd_) {
      ibv_close_device(ctx_);
      throw regpool::Error(regpool::Status::registration_failed, -errno, "verbs: ibv_alloc_pd failed");
    }
  }
  ~IbvDomain() override {
    ibv_dealloc_pd(pd_);
    ibv_close_device(ctx_);
  }
  std::string name() const override { return "verbs:" + device_; }

 protected:
  Native do_register(void* addr, std::size_t length, regpool::Access access) override {
    int flags = IBV_ACCESS_LOCAL_WRITE;
    if (regpool::grants(access, regpool::Access::remote_read)) flags |= IBV_ACCESS_REMOTE_READ;
    if (regpool::grants(access, regpool::Access::remote_write)) flags |= IBV_ACCESS_REMOTE_WRITE;
    if (regpool::grants(access, regpool::Access::remote_atomic)) flags |= IBV_ACCESS_REMOTE_ATOMIC;
    ibv_mr* mr = ibv_reg_mr(pd_, addr, length, flags);
    if (!mr) {
      const int err = errno;
      if (err == ENOMEM || err == EPERM || err == EAGAIN) {
        throw regpool::Error(regpool::Status::memlock_limit, -err, regpool::platform::memlock_advice(length, err));
      }
      throw regpool::Error(regpool::Status::registration_failed, -err,
                           std::string("verbs: ibv_reg_mr failed: ") + std::strerror(err));
    }
    return Native{mr, nullptr, mr->rkey, mr->lkey, regpool::AddressMode::virtual_address};
  }
  void do_deregister(const Native& native, void*, std::size_t) noexcept override {
    ibv_dereg_mr(static_cast<ibv_mr*>(native.handle));
  }

 private:
  std::string device_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
};

#endif
#if defined(REGPOOL_TOOLS_HAVE_IBVERBS) && REGPOOL_TOOLS_HAVE_IBVERBS
bool verbs_device_present() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list) ibv_free_device_list(list);
  return list && n > 0;
}
#else
bool verbs_device_present() { return false; }
#endif

struct DomainSpec {
  std::string text;   // as given
  std::string kind;   // host, fabric, verbs
  std::string param;  // provider or device
};

struct Options {
  std::vector<std::uint64_t> sizes;
  int reps = kQuickReps;
  bool full = false;
  std::uint64_t inner_bytes = kQuickInnerBytes;
  std::vector<DomainSpec> domains;
  std::vector<MemState> states{kTouched, kFresh};
  bool thp = false;
  bool csv = false, json = false;
  std::string csv_file, json_file;
  std::vector<std::string> plot_files;
  bool progress = false;
  bool no_progress = false;
  // Re-render a saved --csv run (e.g. one measured inside the qemu guest,
  // which has no gnuplot) instead of measuring.
  std::string from_csv;
};

// One cell: a summary over repetitions, or why there is none.
struct Cell {
  bool ok = false;
  Summary s;
  std::string error;
};

struct SizeRow {
  std::uint64_t size = 0;
  std::array<Cell, kMethodCount> cells;
};

struct StateResult {
  MemState state = kTouched;
  std::vector<SizeRow> rows;
  std::optional<std::uint64_t> crossover, crossover_register_only;
};

struct DomainResult {
  std::string spec, name, kind;
  bool opened = false;
  bool pins = false;
  bool simulated = false;
  std::string note, error;
  std::string pool_error;
  std::uint64_t pool_registrations_during = 0;
  std::vector<StateResult> states;
};

std::vector<DomainSpec> parse_domains(const std::string& text) {
  std::vector<DomainSpec> out;
  for (const auto& item : regpool_tools::split(text, ',')) {
    DomainSpec d;
    d.text = item;
    if (item == "host") {
      d.kind = "host";
    } else if (item == "shm" || item == "tcp") {
      d.kind = "fabric";
      d.param = item;
    } else if (item.rfind("fabric:", 0) == 0 && item.size() > 7) {
      d.kind = "fabric";
      d.param = item.substr(7);
    } else if (item == "verbs" || (item.rfind("verbs:", 0) == 0 && item.size() > 6)) {
      d.kind = "verbs";
      d.param = item == "verbs" ? "" : item.substr(6);
    } else {
      throw UsageError("--domain: unknown domain '" + item + "' (host, shm, tcp, fabric:NAME, verbs[:DEV])");
    }
    out.push_back(d);
  }
  return out;
}

std::vector<MemState> parse_states(const std::string& text) {
  std::vector<MemState> out;
  for (const auto& item : regpool_tools::split(text, ',')) {
    MemState s;
    if (item == "touched") {
      s = kTouched;
    } else if (item == "fresh") {
      s = kFresh;
    } else {
      throw UsageError("--memory: expected touched and/or fresh, got '" + item + "'");
    }
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

Options parse_args(int argc, char** argv, bool& help) {
  Options o;
  std::uint64_t min = kDefaultMin, max = 0;
  bool max_given = false;  // else the quick or the --full default
  bool range_given = false;
  bool reps_given = false;
  std::string sizes_text, domains_text;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    using regpool_tools::is_option;
    using regpool_tools::option_value;
    if (a == "--help" || a == "-h") {
      help = true;
      return o;
    } else if (is_option(a, "--domain")) {
      domains_text = option_value(argc, argv, i, "--domain");
    } else if (is_option(a, "--min")) {
      min = regpool_tools::parse_size(option_value(argc, argv, i, "--min"), "--min");
      range_given = true;
    } else if (is_option(a, "--max")) {
      max = regpool_tools::parse_size(option_value(argc, argv, i, "--max"), "--max");
      max_given = true;
      range_given = true;
    } else if (is_option(a, "--sizes")) {
      sizes_text = option_value(argc, argv, i, "--sizes");
    } else if (is_option(a, "--reps")) {
      o.reps = static_cast<int>(regpool_tools::parse_uint(option_value(argc, argv, i, "--reps"), "--reps", 1, 1000));
      reps_given = true;
    } else if (a == "--full") {
      o.full = true;
    } else if (is_option(a, "--memory")) {
      o.states = parse_states(option_value(argc, argv, i, "--memory"));
    } else if (a == "--thp") {
      o.thp = true;
    } else if (a == "--csv") {
      o.csv = true;
    } else if (a.rfind("--csv=", 0) == 0 && a.size() > 6) {
      o.csv_file = a.substr(6);
    } else if (a == "--json") {
      o.json = true;
    } else if (a.rfind("--json=", 0) == 0 && a.size() > 7) {
      o.json_file = a.substr(7);
    } else if (is_option(a, "--plot")) {
      const std::string f = option_value(argc, argv, i, "--plot");
      const auto dot = f.rfind('.');
      const std::string ext = dot == std::string::npos ? "" : f.substr(dot);
      if (ext != ".svg" && ext != ".png") throw UsageError("--plot: FILE must end in .svg or .png, got '" + f + "'");
      o.plot_files.push_back(f);
    } else if (is_option(a, "--from-csv")) {
      o.from_csv = option_value(argc, argv, i, "--from-csv");
    } else if (a == "--progress") {
      o.progress = true;
    } else if (a == "--no-progress") {
      o.no_progress = true;
    } else {
      throw UsageError("unknown argument '" + a + "'");
    }
  }
  if (!max_given) max = std::max(min, o.full ? kFullMax : kQuickMax);
  if (!reps_given) o.reps = o.full ? kFullReps : kQuickReps;
  o.inner_bytes = o.full ? kFullInnerBytes : kQuickInnerBytes;
  if (o.csv && o.json) throw UsageError("--csv and --json both want stdout; give one of them a file (--json=FILE)");
  if (!sizes_text.empty()) {
    if (range_given) throw UsageError("--sizes and --min/--max are exclusive");
    o.sizes = regpool_tools::parse_size_list(sizes_text, "--sizes");
  } else {
    if (min == 0) throw UsageError("--min must be at least 1 byte");
    if (min > max) throw UsageError("--min (" + format_size(min) + ") is larger than --max (" + format_size(max) + ")");
    for (std::uint64_t s = min; s <= max; s *= 2) {
      o.sizes.push_back(s);
      if (s > max / 2) break;
    }
  }
  if (o.sizes.empty() || o.sizes.front() == 0) throw UsageError("sizes must be at least 1 byte");
  if (o.sizes.back() > (std::uint64_t{1} << 40)) throw UsageError("sizes above 1 TiB are not measured");
  if (domains_text.empty()) {
    domains_text = "host";
#if REGPOOL_HAVE_FABRIC
    domains_text += ",shm,tcp";
#endif
    if (verbs_device_present()) domains_text += ",verbs";
  }
  o.domains = parse_domains(domains_text);
  return o;
}

std::uint64_t mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t v = 0;
  std::string unit;
  while (in >> key >> v) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return v * 1024;
  }
  return 0;
}

// Memory: the measured buffer, the bounce buffer, one pool arena and one
// fresh buffer at a time, each as large as the largest size.
std::uint64_t memory_needed(const Options& o) { return 4 * (o.sizes.back() + (std::uint64_t{4} << 20)); }

std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  for (const auto& dir : regpool_tools::split(path ? path : "/usr/bin:/bin", ':')) {
    const std::string p = (dir.empty() ? std::string(".") : dir) + "/gnuplot";
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return {};
}

regpool::platform::Mapping map_or_throw(std::size_t size, bool thp, bool prefault) {
  regpool::platform::MapOptions mo;
  mo.transparent_huge_pages = thp;
  mo.prefault = prefault;
  auto m = regpool::platform::Mapping::create(size, mo);
  if (!m) throw regpool::Error(m.status(), -ENOMEM, "cannot map " + format_size(size));
  return std::move(*m);
}

// On a terminal: one line rewritten in place. Elsewhere (a log, a pipe,
// CI): one plain line per step, so the log shows how far a run got.
class Progress {
 public:
  Progress(bool on, bool tty) : on_(on), tty_(tty) {}
  void show(const std::string& what) {
    if (!on_) return;
    if (tty_) {
      std::fprintf(stderr, "\r\033[Kregpool-regcost: %s", what.c_str());
    } else {
      std::fprintf(stderr, "regpool-regcost: %s\n", what.c_str());
    }
    std::fflush(stderr);
  }
  void done() {
    if (!on_ || !tty_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }

 private:
  bool on_;
  bool tty_;
};

// Per-operation means of one repetition for the three registration methods.
struct RegSample {
  double reg = 0, dereg = 0, both = 0;
};

RegSample time_registration(regpool::Domain& d, std::byte* touched, std::uint64_t size, MemState state, bool thp,
                            std::uint64_t inner) {
  RegSample s;
  // One untimed registration of a single page first: the batch before ran a
  // large memcpy that evicted the domain's code and data from the caches,
  // and with one operation per batch (large sizes) that cold start would be
  // most of what a simulated domain's number shows.
  d.register_memory(touched, regpool::platform::kPageSize, regpool::Access::all).reset();
  for (std::uint64_t k = 0; k < inner; ++k) {
    regpool::platform::Mapping fresh;
    std::byte* p = touched;
    if (state == kFresh) {
      fresh = map_or_throw(size, thp, false);
      p = fresh.data();
    }
    const double t0 = now_us();
    auto r = d.register_memory(p, size, regpool::Access::all);
    const double t1 = now_us();
    r.reset();
    const double t2 = now_us();
    s.reg += t1 - t0;
    s.dereg += t2 - t1;
    s.both += t2 - t0;
  }
  const auto n = static_cast<double>(inner);
  s.reg /= n;
  s.dereg /= n;
  s.both /= n;
  return s;
}

double time_memcpy(std::byte* touched, const std::byte* bounce, std::uint64_t size, MemState state, bool thp,
                   std::uint64_t inner) {
  double total = 0;
  for (std::uint64_t k = 0; k < inner; ++k) {
    regpool::platform::Mapping fresh;
    std::byte* p = touched;
    if (state == kFresh) {
      fresh = map_or_throw(size, thp, false);
      p = fresh.data();
    }
    const double t0 = now_us();
    std::memcpy(p, bounce, size);
    clobber(p);
    total += now_us() - t0;
  }
  return total / static_cast<double>(inner);
}

// Acquire + release through the pool; nullopt with `error` set on failure.
std::optional<double> time_pool(regpool::Pool& pool, std::uint64_t size, std::uint64_t inner, std::string& error) {
  double total = 0;
  // Untimed warm-up, for the same reason as in time_registration.
  if (auto w = pool.allocate(size); !w) {
    error = std::string("pool allocate: ") + regpool::to_string(w.status());
    return std::nullopt;
  }
  for (std::uint64_t k = 0; k < inner; ++k) {
    const double t0 = now_us();
    auto r = pool.allocate(size);
    if (!r) {
      error = std::string("pool allocate: ") + regpool::to_string(r.status());
      return std::nullopt;
    }
    r->reset();
    total += now_us() - t0;
  }
  return total / static_cast<double>(inner);
}

std::shared_ptr<regpool::Domain> open_domain(const DomainSpec& spec, DomainResult& out) {
  if (spec.kind == "host") {
    auto d = regpool::HostDomain::open();
    out.name = d->name();
    out.pins = true;
    out.note = "mlock(2) pins the pages; no NIC involved";
    return d;
  }
#if REGPOOL_HAVE_FABRIC
  if (spec.kind == "fabric") {
    regpool::FabricConfig fc;
    fc.provider = spec.param;
    if (spec.param == "tcp") fc.node = "127.0.0.1";
    auto d = regpool::FabricDomain::open(fc);
    out.name = d->name();
    out.pins = d->pins_memory();
    out.note = out.pins ? "fi_mr_reg on provider " + d->provider_name()
                        : "SIMULATED: provider " + d->provider_name() +
                              " registers nothing (fi_mr_reg pins no pages); the register columns are "
                              "key-table bookkeeping, not pinning";
    return d;
  }
#endif
#if REGCOST_USE_VERBS_DOMAIN
  if (spec.kind == "verbs") {
    regpool::VerbsConfig vc;
    vc.device = spec.param;
    auto d = regpool::VerbsDomain::open(vc);
    out.name = d->name();
    out.pins = d->pins_memory();
    out.note = "ibv_reg_mr / ibv_dereg_mr through regpool's VerbsDomain on " + d->device_name() +
               (d->memory_windows() ? " (with IBV_ACCESS_MW_BIND)" : "");
    return d;
  }
#elif defined(REGPOOL_TOOLS_HAVE_IBVERBS) && REGPOOL_TOOLS_HAVE_IBVERBS
  if (spec.kind == "verbs") {
    auto d = std::make_shared<IbvDomain>(spec.param);
    out.name = d->name();
    out.pins = true;
    out.note = "ibv_reg_mr / ibv_dereg_mr on a protection domain of " + d->name().substr(6);
    return d;
  }
#endif
  throw regpool::Error(regpool::Status::unsupported, 0,
                       spec.kind + ": this build of regpool-regcost has no " + spec.kind + " support");
}

std::optional<std::uint64_t> crossover(const std::vector<SizeRow>& rows, Method reg) {
  std::optional<std::uint64_t> found;
  // Walk down from the largest size; the crossover is where the run of
  // "register wins" that reaches the top of the range begins.
  for (auto it = rows.rbegin(); it != rows.rend(); ++it) {
    const Cell& r = it->cells[reg];
    const Cell& c = it->cells[kMemcpy];
    if (!r.ok || !c.ok) {
      if (found) break;  // a gap ends the run
      return std::nullopt;
    }
    if (r.s.median < c.s.median) {
      found = it->size;
    } else {
      break;
    }
  }
  return found;
}

std::string crossover_text(const std::optional<std::uint64_t>& x, const std::vector<SizeRow>& rows) {
  if (!x) return "none in range";
  if (!rows.empty() && *x == rows.front().size) {
    return "<= " + format_size(*x) + " (registering wins at every size measured)";
  }
  return format_size(*x);
}

DomainResult measure_domain(const DomainSpec& spec, const Options& o, std::byte* touched, const std::byte* bounce,
                            Progress& progress) {
  DomainResult res;
  res.spec = spec.text;
  res.kind = spec.kind;
  std::shared_ptr<regpool::Domain> domain;
  try {
    domain = open_domain(spec, res);
    res.opened = true;
    res.simulated = !res.pins;
  } catch (const std::exception& e) {
    res.error = e.what();
    if (res.name.empty()) res.name = spec.text;
    return res;
  }

  // The pool: one arena large enough for the largest object, registered
  // once here (the warm-up), then pre-warmed with one object of every size
  // so the measured loop only carves and returns.
  std::unique_ptr<regpool::Pool> pool;
  try {
    regpool::PoolConfig pc;
    pc.name = "regcost-" + spec.text;
    pc.arena_size = regpool::platform::round_up(o.sizes.back() + regpool::kWireHeaderSize + 4096,
                                                regpool::platform::kHugePageSize);
    pc.initial_arenas = 1;
    pc.growth_arenas = 1;
    pc.auto_trim = false;
    pc.prefault = true;
    pool = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain}, pc);
    for (const auto size : o.sizes) {
      auto r = pool->allocate(size);
      if (!r) throw regpool::Error(r.status(), 0, std::string("pool pre-warm: ") + regpool::to_string(r.status()));
    }
  } catch (const std::exception& e) {
    res.pool_error = e.what();
    pool.reset();
  }
  const std::uint64_t pool_regs_before = pool ? pool->stats().registrations : 0;

  for (const MemState state : o.states) {
    StateResult sr;
    sr.state = state;
    std::string reg_error;  // once registration fails, larger sizes fail too
    for (const auto size : o.sizes) {
      progress.show(res.name + " " + kStateLabel[state] + " " + format_size(size));
      SizeRow row;
      row.size = size;
      const std::uint64_t inner = std::clamp<std::uint64_t>(o.inner_bytes / size, 1, kMaxInner);
      std::array<std::vector<double>, kMethodCount> samples;
      std::string pool_err = res.pool_error.empty() ? "" : "pool unavailable: " + res.pool_error;
      for (int rep = 0; rep < o.reps; ++rep) {
        // Methods alternate within each repetition, so a load change on the
        // (shared, busy) machine hits all of them rather than one.
        if (reg_error.empty()) {
          try {
            const RegSample s = time_registration(*domain, touched, size, state, o.thp, inner);
            samples[kReg].push_back(s.reg);
            samples[kDereg].push_back(s.dereg);
            samples[kRegDereg].push_back(s.both);
          } catch (const regpool::Error& e) {
            reg_error = std::string(regpool::to_string(e.status())) + " at " + format_size(size) + ": " + e.what();
          }
        }
        samples[kMemcpy].push_back(time_memcpy(touched, bounce, size, state, o.thp, inner));
        if (pool && pool_err.empty()) {
          if (auto t = time_pool(*pool, size, inner, pool_err)) samples[kPool].push_back(*t);
        }
      }
      for (int m = 0; m < kMethodCount; ++m) {
        Cell& c = row.cells[m];
        if (!samples[m].empty() && (m == kMemcpy || m == kPool || reg_error.empty())) {
          c.ok = true;
          c.s = regpool_tools::summarize(samples[m]);
        } else if (m == kPool) {
          c.error = pool_err.empty() ? "not measured" : pool_err;
        } else if (m != kMemcpy) {
          c.error = reg_error;
        }
      }
      sr.rows.push_back(row);
    }
    sr.crossover = crossover(sr.rows, kRegDereg);
    sr.crossover_register_only = crossover(sr.rows, kReg);
    res.states.push_back(std::move(sr));
  }
  if (pool) res.pool_registrations_during = pool->stats().registrations - pool_regs_before;
  return res;
}

// Reads what write_csv wrote. Throws std::runtime_error naming the line on
// anything it does not understand: the file may come from another machine.
std::vector<DomainResult> read_csv(const std::string& file, Options& o) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error("cannot read " + file);
  auto fields_of = [](const std::string& line) {
    std::vector<std::string> f(1);
    bool quoted = false;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        f.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = !quoted;
      } else if (c == ',' && !quoted) {
        f.emplace_back();
      } else {
        f.back() += c;
      }
    }
    return f;
  };
  std::vector<DomainResult> results;
  std::vector<std::uint64_t> sizes;
  std::vector<MemState> states;
  std::string line;
  std::size_t lineno = 0;
  std::getline(in, line);
  ++lineno;
  if (line.rfind("domain,simulated,memory,size_bytes,method", 0) != 0)
    throw std::runtime_error(file + ": not a regpool-regcost --csv file (header)");
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    const auto f = fields_of(line);
    const std::string where = file + ":" + std::to_string(lineno);
    if (f.size() != 13) throw std::runtime_error(where + ": expected 13 fields");
    if (results.empty() || results.back().name != f[0]) {
      DomainResult d;
      d.name = d.spec = f[0];
      d.kind = f[0].rfind("fabric:", 0) == 0 ? "fabric" : f[0].rfind("verbs:", 0) == 0 ? "verbs" : f[0];
      d.simulated = f[1] == "1";
      d.pins = !d.simulated;
      d.opened = !f[2].empty();
      d.error = d.opened ? "" : f[12];
      d.note = d.simulated ? "registration is simulated (registers nothing)" : "read from " + file;
      results.push_back(std::move(d));
    }
    DomainResult& d = results.back();
    if (!d.opened) continue;
    MemState st;
    if (f[2] == kStateKey[kTouched]) st = kTouched;
    else if (f[2] == kStateKey[kFresh]) st = kFresh;
    else throw std::runtime_error(where + ": unknown memory state '" + f[2] + "'");
    if (d.states.empty() || d.states.back().state != st) {
      d.states.emplace_back();
      d.states.back().state = st;
      if (std::find(states.begin(), states.end(), st) == states.end()) states.push_back(st);
    }
    StateResult& sr = d.states.back();
    const std::uint64_t size = std::stoull(f[3]);
    if (sr.rows.empty() || sr.rows.back().size != size) {
      sr.rows.emplace_back();
      sr.rows.back().size = size;
      if (std::find(sizes.begin(), sizes.end(), size) == sizes.end()) sizes.push_back(size);
    }
    int m = 0;
    while (m < kMethodCount && f[4] != kMethodKey[static_cast<std::size_t>(m)]) ++m;
    if (m == kMethodCount) throw std::runtime_error(where + ": unknown method '" + f[4] + "'");
    Cell& c = sr.rows.back().cells[static_cast<std::size_t>(m)];
    if (f[5].empty()) {
      c.error = f[12];
    } else {
      c.ok = true;
      c.s.median = std::stod(f[5]);
      c.s.q1 = std::stod(f[6]);
      c.s.q3 = std::stod(f[7]);
      c.s.min = std::stod(f[8]);
      c.s.max = std::stod(f[9]);
      c.s.n = std::stoull(f[10]);
      o.reps = static_cast<int>(c.s.n);
    }
  }
  if (sizes.empty()) throw std::runtime_error(file + ": no measurements");
  for (auto& d : results)
    for (auto& sr : d.states) {
      sr.crossover = crossover(sr.rows, kRegDereg);
      sr.crossover_register_only = crossover(sr.rows, kReg);
    }
  std::sort(sizes.begin(), sizes.end());
  o.sizes = sizes;
  o.states = states;
  return results;
}

// ------------------------------------------------------------------ output

// Fixed-point with precision by magnitude: microseconds from 0.06 to 10^6
// stay readable and aligned (no exponents) in a 26-column cell.
std::string us_text(double v) {
  char buf[32];
  const double a = std::fabs(v);
  std::snprintf(buf, sizeof buf, a >= 1000 ? "%.0f" : a >= 10 ? "%.1f" : a >= 1 ? "%.2f" : "%.3f", v);
  return buf;
}

std::string cell_text(const Cell& c) {
  if (!c.ok) return "error";
  return us_text(c.s.median) + " [" + us_text(c.s.min) + "," + us_text(c.s.max) + "]";
}

void print_table(std::ostream& out, const Options& o, const std::vector<DomainResult>& results) {
  out << "regpool-regcost: " << o.sizes.size() << " sizes " << format_size(o.sizes.front()) << ".."
      << format_size(o.sizes.back()) << ", " << o.reps
      << " repetitions; microseconds per operation, median [min,max]\n"
      << "memcpy copies from a pre-touched buffer into the measured one; pool = Pool::allocate + release "
         "(pre-registered)\n";
  for (const auto& d : results) {
    out << "\ndomain " << d.name << (d.simulated ? "  [SIMULATED]" : "") << "\n";
    if (!d.opened) {
      out << "  not measured: " << d.error << "\n";
      continue;
    }
    out << "  " << d.note << "\n";
    if (!d.pool_error.empty()) out << "  pool: " << d.pool_error << "\n";
    for (const auto& sr : d.states) {
      out << "  memory: " << kStateLabel[sr.state] << "\n";
      char line[512];
      std::snprintf(line, sizeof line, "  %10s %26s %26s %26s %26s %26s %9s\n", "size", kMethodLabel[0],
                    kMethodLabel[1], kMethodLabel[2], kMethodLabel[3], kMethodLabel[4], "reg/copy");
      out << line;
      std::vector<std::string> errors;  // distinct, in order of appearance
      for (const auto& row : sr.rows) {
        const Cell& rd = row.cells[kRegDereg];
        const Cell& mc = row.cells[kMemcpy];
        char ratio[32] = "-";
        if (rd.ok && mc.ok && mc.s.median > 0) std::snprintf(ratio, sizeof ratio, "%.3g", rd.s.median / mc.s.median);
        std::snprintf(line, sizeof line, "  %10s %26s %26s %26s %26s %26s %9s\n", format_size(row.size).c_str(),
                      cell_text(row.cells[0]).c_str(), cell_text(row.cells[1]).c_str(),
                      cell_text(row.cells[2]).c_str(), cell_text(row.cells[3]).c_str(),
                      cell_text(row.cells[4]).c_str(), ratio);
        out << line;
        for (const auto& c : row.cells) {
          if (!c.ok && !c.error.empty() && std::find(errors.begin(), errors.end(), c.error) == errors.end()) {
            errors.push_back(c.error);
          }
        }
      }
      for (const auto& e : errors) out << "  error: " << e << "\n";
      out << "  crossover (register+deregister beats memcpy from here up): " << crossover_text(sr.crossover, sr.rows)
          << "; register alone: " << crossover_text(sr.crossover_register_only, sr.rows) << "\n";
    }
    if (d.simulated) {
      out << "  note: registration on " << d.name
          << " is simulated; a crossover here says nothing about pinning cost.\n";
    }
    out << "  pool registrations during measurement: " << d.pool_registrations_during << "\n";
  }
}

void write_csv(std::ostream& out, const std::vector<DomainResult>& results) {
  out << "domain,simulated,memory,size_bytes,method,median_us,q1_us,q3_us,min_us,max_us,reps,crossover_bytes,error\n";
  auto quote = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  for (const auto& d : results) {
    if (!d.opened) {
      out << quote(d.name) << "," << (d.simulated ? 1 : 0) << ",,,,,,,,,,," << quote(d.error) << "\n";
      continue;
    }
    for (const auto& sr : d.states) {
      const std::string x = sr.crossover ? std::to_string(*sr.crossover) : "";
      for (const auto& row : sr.rows) {
        for (int m = 0; m < kMethodCount; ++m) {
          const Cell& c = row.cells[m];
          out << quote(d.name) << "," << (d.simulated ? 1 : 0) << "," << kStateKey[sr.state] << "," << row.size
              << "," << kMethodKey[m] << ",";
          if (c.ok) {
            char buf[160];
            std::snprintf(buf, sizeof buf, "%.6g,%.6g,%.6g,%.6g,%.6g,%zu", c.s.median, c.s.q1, c.s.q3, c.s.min,
                          c.s.max, c.s.n);
            out << buf << "," << x << ",\n";
          } else {
            out << ",,,,,0," << x << "," << quote(c.error) << "\n";
          }
        }
      }
    }
  }
}

void write_json(std::ostream& out, const Options& o, const std::vector<DomainResult>& results) {
  std::string s = "{\"tool\":\"regpool-regcost\",\"version\":" + json_escape(REGPOOL_VERSION);
  s += ",\"units\":\"microseconds per operation\",\"reps\":" + std::to_string(o.reps);
  s += ",\"thp\":" + std::string(o.thp ? "true" : "false");
  s += ",\"sizes\":[";
  for (std::size_t i = 0; i < o.sizes.size(); ++i) s += (i ? "," : "") + std::to_string(o.sizes[i]);
  s += "],\"methods\":[";
  for (int m = 0; m < kMethodCount; ++m) s += (m ? "," : "") + json_escape(kMethodKey[m]);
  s += "],\"crossover_definition\":" +
       json_escape("smallest measured size S with median(register_deregister) < median(memcpy) at S and at every "
                   "larger measured size; null when there is none (\"none in range\")");
  s += ",\"domains\":[";
  for (std::size_t di = 0; di < results.size(); ++di) {
    const auto& d = results[di];
    if (di) s += ",";
    s += "{\"spec\":" + json_escape(d.spec) + ",\"name\":" + json_escape(d.name) + ",\"kind\":" + json_escape(d.kind);
    s += ",\"opened\":" + std::string(d.opened ? "true" : "false");
    s += ",\"pins_memory\":" + std::string(d.pins ? "true" : "false");
    s += ",\"simulated\":" + std::string(d.simulated ? "true" : "false");
    s += ",\"note\":" + json_escape(d.note);
    s += ",\"error\":" + (d.error.empty() ? std::string("null") : json_escape(d.error));
    s += ",\"pool_error\":" + (d.pool_error.empty() ? std::string("null") : json_escape(d.pool_error));
    s += ",\"pool_registrations_during_measurement\":" + std::to_string(d.pool_registrations_during);
    s += ",\"memory\":[";
    for (std::size_t si = 0; si < d.states.size(); ++si) {
      const auto& sr = d.states[si];
      if (si) s += ",";
      s += "{\"state\":" + json_escape(kStateKey[sr.state]);
      s += ",\"crossover_bytes\":" + (sr.crossover ? std::to_string(*sr.crossover) : std::string("null"));
      s += ",\"crossover\":" + json_escape(crossover_text(sr.crossover, sr.rows));
      s += ",\"crossover_register_only_bytes\":" +
           (sr.crossover_register_only ? std::to_string(*sr.crossover_register_only) : std::string("null"));
      s += ",\"results\":[";
      for (std::size_t ri = 0; ri < sr.rows.size(); ++ri) {
        const auto& row = sr.rows[ri];
        if (ri) s += ",";
        s += "{\"size\":" + std::to_string(row.size) + ",\"methods\":{";
        for (int m = 0; m < kMethodCount; ++m) {
          const Cell& c = row.cells[m];
          if (m) s += ",";
          s += json_escape(kMethodKey[m]) + ":";
          if (c.ok) {
            s += "{\"median_us\":" + json_number(c.s.median) + ",\"q1_us\":" + json_number(c.s.q1) +
                 ",\"q3_us\":" + json_number(c.s.q3) + ",\"min_us\":" + json_number(c.s.min) +
                 ",\"max_us\":" + json_number(c.s.max) + ",\"n\":" + std::to_string(c.s.n) + "}";
          } else {
            s += "{\"error\":" + json_escape(c.error) + "}";
          }
        }
        s += "}}";
      }
      s += "]}";
    }
    s += "]}";
  }
  s += "]}\n";
  out << s;
}

// gnuplot script with inline data blocks: one panel per measured domain,
// one line per method; solid = pre-touched, dashed = fresh.
std::string plot_script(const Options& o, const std::vector<DomainResult>& results, const std::string& file) {
  std::vector<const DomainResult*> ds;
  for (const auto& d : results) {
    if (d.opened) ds.push_back(&d);
  }
  const bool svg = file.size() >= 4 && file.substr(file.size() - 4) == ".svg";
  const int panels = static_cast<int>(ds.size());
  const int cols = panels > 1 ? 2 : 1;
  const int rows = (panels + cols - 1) / cols;
  const int w = 640 * cols, h = 560 * rows;
  std::ostringstream g;
  if (svg) {
    g << "set terminal svg size " << w << "," << h << " dynamic enhanced font 'Helvetica,11' background '#ffffff'\n";
  } else {
    g << "set terminal pngcairo size " << w << "," << h << " enhanced font 'Helvetica,10'\n";
  }
  g << "set output " << json_escape(file) << "\n";
  // Data blocks: $d<domain>_<state>, columns: size, then the median of each
  // method in microseconds ("NaN" for missing cells: gnuplot skips them).
  for (int i = 0; i < panels; ++i) {
    for (const auto& sr : ds[i]->states) {
      g << "$d" << i << "_" << kStateKey[sr.state] << " << EOD\n";
      for (const auto& row : sr.rows) {
        g << row.size;
        for (const auto& c : row.cells) {
          if (c.ok && c.s.median > 0) {
            g << " " << json_number(c.s.median);
          } else {
            g << " NaN";
          }
        }
        g << "\n";
      }
      g << "EOD\n";
    }
  }
  g << "set logscale xy\nset grid xtics ytics lc rgb '#dddddd'\n"
    << "set xlabel 'size'\nset ylabel 'microseconds per operation'\n"
    << "set format y '10^{%T}'\n"
    << "set key outside bottom center horizontal maxcols " << kMethodCount << " font ',9' spacing 1.1\n";
  // Size ticks in binary units, at most about ten of them.
  const std::size_t step = std::max<std::size_t>(1, (o.sizes.size() + 9) / 10);
  g << "set xtics (";
  for (std::size_t i = 0; i < o.sizes.size(); i += step) {
    if (i) g << ", ";
    std::string label = format_size(o.sizes[i]);
    label.erase(std::remove(label.begin(), label.end(), ' '), label.end());
    g << json_escape(label) << " " << o.sizes[i];
  }
  g << ") rotate by -30 font ',9'\n";
  g << "set xrange [" << static_cast<double>(o.sizes.front()) / 1.5 << ":" << static_cast<double>(o.sizes.back()) * 1.5
    << "]\n";
  if (panels > 1) {
    g << "set multiplot layout " << rows << "," << cols << " title 'regpool-regcost: registration vs copy ("
      << o.reps << " reps, medians)'\n";
  }
  const char* colors[kMethodCount] = {"#d62728", "#ff7f0e", "#9467bd", "#1f77b4", "#2ca02c"};
  for (int i = 0; i < panels; ++i) {
    const DomainResult& d = *ds[i];
    std::string title = d.name;
    if (d.simulated) title += " (SIMULATED: registers nothing)";
    for (const auto& sr : d.states) {
      std::string x = "none in range";
      if (sr.crossover) x = (*sr.crossover == o.sizes.front() ? "<= " : "") + format_size(*sr.crossover);
      title += std::string(", ") + kStateKey[sr.state] + " crossover " + x;
    }
    // gnuplot's enhanced text treats _ ^ @ & as markup.
    std::string safe;
    for (char c : title) {
      if (c == '_' || c == '^' || c == '@' || c == '&' || c == '{' || c == '}') safe += '\\';
      safe += c;
    }
    g << "set title " << json_escape(safe) << " font ',10'\n";
    // A vertical line at each crossover.
    g << "unset arrow\nunset label\n";
    int tag = 1;
    for (const auto& sr : d.states) {
      if (!sr.crossover) continue;
      g << "set arrow " << tag << " from " << *sr.crossover << ", graph 0 to " << *sr.crossover
        << ", graph 1 nohead dt " << (sr.state == kTouched ? 1 : 2) << " lw 1 lc rgb '#555555'\n";
      g << "set label " << tag << " " << json_escape(std::string("crossover (") + kStateKey[sr.state] + ")") << " at "
        << *sr.crossover << ", graph " << (sr.state == kTouched ? 0.95 : 0.88) << " offset 0.5,0 font ',8'\n";
      ++tag;
    }
    g << "plot ";
    bool first = true;
    for (const auto& sr : d.states) {
      for (int m = 0; m < kMethodCount; ++m) {
        if (!first) g << ", \\\n     ";
        first = false;
        g << "$d" << i << "_" << kStateKey[sr.state] << " using 1:" << (m + 2) << " with linespoints lw 2 pt 7 ps 0.5"
          << " dt " << (sr.state == kTouched ? 1 : 2) << " lc rgb '" << colors[m] << "' title '" << kMethodLabel[m]
          << (o.states.size() > 1 ? std::string(" (") + kStateKey[sr.state] + ")" : std::string()) << "'";
      }
    }
    g << "\n";
  }
  if (panels > 1) g << "unset multiplot\n";
  return g.str();
}

int render_plot(const Options& o, const std::vector<DomainResult>& results, const std::string& gnuplot,
                const std::string& file) {
  char path[] = "/tmp/regpool-regcost-XXXXXX.gp";
  const int fd = ::mkstemps(path, 3);
  if (fd < 0) {
    std::fprintf(stderr, "regpool-regcost: cannot create a temporary file: %s\n", std::strerror(errno));
    return 1;
  }
  const std::string script = plot_script(o, results, file);
  const bool wrote = ::write(fd, script.data(), script.size()) == static_cast<ssize_t>(script.size());
  ::close(fd);
  if (!wrote) {
    ::unlink(path);
    std::fprintf(stderr, "regpool-regcost: cannot write the gnuplot script\n");
    return 1;
  }
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(gnuplot.c_str(), "gnuplot", path, static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int st = 0;
  if (pid > 0) ::waitpid(pid, &st, 0);
  ::unlink(path);
  if (pid < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::fprintf(stderr, "regpool-regcost: gnuplot failed to render %s\n", file.c_str());
    return 1;
  }
  return 0;
}

bool write_to_file(const std::string& file, const std::function<void(std::ostream&)>& fn) {
  std::ofstream f(file);
  if (!f) return false;
  fn(f);
  return static_cast<bool>(f);
}

// Prints (table, --csv or --json), writes the requested files and plots.
int emit(const Options& o, const std::vector<DomainResult>& results) {
  std::string gnuplot;
  if (!o.plot_files.empty()) {
    gnuplot = find_gnuplot();
    if (gnuplot.empty()) {
      std::fprintf(stderr, "regpool-regcost: --plot needs gnuplot, which is not in PATH (Debian: apt-get install "
                           "gnuplot-nox)\n");
      return 1;
    }
  }
  int rc = 0;
  if (o.json) {
    write_json(std::cout, o, results);
  } else if (o.csv) {
    write_csv(std::cout, results);
  } else {
    print_table(std::cout, o, results);
  }
  std::cout.flush();
  if (!o.json_file.empty() && !write_to_file(o.json_file, [&](std::ostream& f) { write_json(f, o, results); })) {
    std::fprintf(stderr, "regpool-regcost: cannot write %s\n", o.json_file.c_str());
    rc = 1;
  }
  if (!o.csv_file.empty() && !write_to_file(o.csv_file, [&](std::ostream& f) { write_csv(f, results); })) {
    std::fprintf(stderr, "regpool-regcost: cannot write %s\n", o.csv_file.c_str());
    rc = 1;
  }
  for (const auto& file : o.plot_files) {
    if (render_plot(o, results, gnuplot, file) != 0) rc = 1;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    bool help = false;
    o = parse_args(argc, argv, help);
    if (help) {
      usage(stdout);
      return 0;
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "regpool-regcost: %s\n", e.what());
    std::fprintf(stderr, "Try 'regpool-regcost --help'.\n");
    return regpool_tools::kExitUsage;
  }
  if (!o.from_csv.empty()) {
    std::vector<DomainResult> results;
    try {
      results = read_csv(o.from_csv, o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "regpool-regcost: --from-csv: %s\n", e.what());
      return 1;
    }
    return emit(o, results);
  }
  const std::uint64_t need = memory_needed(o);
  const std::uint64_t avail = mem_available();
  if (avail != 0 && need > avail) {
    std::fprintf(stderr,
                 "regpool-regcost: sizes up to %s need about %s of memory (buffers, bounce buffer, pool arena, fresh "
                 "mapping) but only %s is available; lower --max\n",
                 format_size(o.sizes.back()).c_str(), format_size(need >> 20 << 20).c_str(),
                 format_size(avail >> 20 << 20).c_str());
    return regpool_tools::kExitUsage;
  }
  if (!o.plot_files.empty()) {
    // Fail before measuring, not after minutes of it.
    if (find_gnuplot().empty()) {
      std::fprintf(stderr,
                   "regpool-regcost: --plot needs gnuplot, which is not in PATH (Debian: apt-get install "
                   "gnuplot-nox); rerun without --plot for the table, --csv or --json\n");
      return 1;
    }
  }
  ::setenv("FI_TCP_IFACE", "lo", 0);

  std::vector<DomainResult> results;
  try {
    const std::uint64_t max = o.sizes.back();
    auto touched = map_or_throw(max, o.thp, true);
    auto bounce = map_or_throw(max, true, true);
    std::memset(bounce.data(), 0x5a, max);
    const bool tty = ::isatty(2) != 0;
    Progress progress(!o.no_progress && (o.progress || tty), tty);
    for (const auto& spec : o.domains) {
      results.push_back(measure_domain(spec, o, touched.data(), bounce.data(), progress));
    }
    progress.done();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "regpool-regcost: %s\n", e.what());
    return 1;
  }

  return emit(o, results);
}
