// regpool-info: what this machine offers for registered memory, before
// anyone decides how to manage buffers on it.
//
//   regpool-info [--json]
//   regpool-info --open-time PROVIDER [--emulated-atomics MODE] [--runs N] [--json]
//
// Lists libfabric providers (fi_getinfo without hints, and with the RDM
// hints regpool's FabricDomain uses), verbs devices (libibverbs directly, so
// it works whether or not regpool's verbs backend is built), the memlock
// limit and CAP_IPC_LOCK, transparent-huge-page mode, hugetlbfs pages and
// NUMA nodes. For each RDM provider listed (and each verbs device with an
// active port, when regpool's verbs transport is built) it opens a real
// domain and endpoint and prints Endpoint::enforcement() per exposure mode:
// what the target enforces on its own (keys, bounds, rights, revocation).
// Every section degrades to "none"/"unavailable" instead of failing: the
// tool is run on machines that lack things.
//
// --open-time measures what opening a FabricEndpoint costs on one provider
// (the domain's fi_getinfo apart), per FabricEndpointOptions::emulated_atomics
// mode, runs interleaved across the modes so drifting machine load hits
// them alike; it prints the median, minimum and maximum of the endpoint's
// open time and the process's resident-memory growth while it is open.

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "platform/mapping.hpp"
#include "regpool/endpoint.hpp"
#include "regpool_config.h"
#include "tool_common.hpp"

#if REGPOOL_HAVE_FABRIC
#include <rdma/fabric.h>

#include "regpool/fabric_domain.hpp"
#include "regpool/fabric_endpoint.hpp"
#endif
#if REGPOOL_HAVE_VERBS && __has_include("regpool/verbs_endpoint.hpp")
#include "regpool/verbs_domain.hpp"
#include "regpool/verbs_endpoint.hpp"
#define INFO_HAVE_VERBS_ENDPOINT 1
#else
#define INFO_HAVE_VERBS_ENDPOINT 0
#endif
#if defined(REGPOOL_TOOLS_HAVE_IBVERBS) && REGPOOL_TOOLS_HAVE_IBVERBS
#include <arpa/inet.h>
#include <endian.h>
#include <infiniband/verbs.h>
#endif

namespace {

using regpool_tools::json_escape;
using regpool_tools::UsageError;

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: regpool-info [--json]\n"
               "Lists what this machine offers for registered memory: libfabric providers\n"
               "(endpoint types, FI_MSG/FI_RMA/FI_ATOMIC caps, mr_mode bits, progress), verbs\n"
               "devices (ports, GIDs, max MR size, memory windows), the memlock limit and\n"
               "whether this process may exceed it (CAP_IPC_LOCK), transparent huge pages,\n"
               "hugetlbfs pages and NUMA nodes; and per RDM provider (and verbs device) what\n"
               "the target enforces for exposures in standard and scoped mode (keys, bounds,\n"
               "rights, revocation), from Endpoint::enforcement() of an endpoint it opens.\n"
               "  --json      one JSON object on stdout instead of text\n"
               "  -h, --help  this text\n"
               "usage: regpool-info --open-time PROVIDER [--emulated-atomics MODE] [--runs N] [--json]\n"
               "Times opening a FabricEndpoint on PROVIDER (shm, tcp: node 127.0.0.1),\n"
               "interleaving the modes of FabricEndpointOptions::emulated_atomics\n"
               "  --emulated-atomics MODE  serve, on_demand, off or all (default all)\n"
               "  --runs N                 opens per mode (default 5, 1..1000)\n"
               "Exit codes: 0 ok, 2 bad arguments.\n");
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  return line;
}

// "always [madvise] never" -> "madvise".
std::string bracketed(const std::string& s) {
  const auto a = s.find('[');
  const auto b = s.find(']');
  if (a == std::string::npos || b == std::string::npos || b < a) return s;
  return s.substr(a + 1, b - a - 1);
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') out.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

std::string json_strings(const std::vector<std::string>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += ",";
    out += json_escape(v[i]);
  }
  return out + "]";
}

// ---------------------------------------------------------------- libfabric

struct FabricEntry {
  std::string provider, fabric, domain, ep_type, progress, threading;
  std::vector<std::string> caps, mr_mode;
};

struct FabricReport {
  bool built = false;
  std::string version;
  std::string error_all, error_rdm;
  std::vector<FabricEntry> all, rdm;
};

#if REGPOOL_HAVE_FABRIC
FabricEntry describe(const fi_info* fi) {
  FabricEntry e;
  e.provider = fi->fabric_attr && fi->fabric_attr->prov_name ? fi->fabric_attr->prov_name : "?";
  e.fabric = fi->fabric_attr && fi->fabric_attr->name ? fi->fabric_attr->name : "";
  e.domain = fi->domain_attr && fi->domain_attr->name ? fi->domain_attr->name : "";
  switch (fi->ep_attr ? fi->ep_attr->type : FI_EP_UNSPEC) {
    case FI_EP_MSG: e.ep_type = "MSG"; break;
    case FI_EP_DGRAM: e.ep_type = "DGRAM"; break;
    case FI_EP_RDM: e.ep_type = "RDM"; break;
    default: e.ep_type = "other"; break;
  }
  const struct {
    std::uint64_t bit;
    const char* name;
  } kCaps[] = {{FI_MSG, "MSG"},       {FI_RMA, "RMA"},           {FI_ATOMIC, "ATOMIC"},
               {FI_TAGGED, "TAGGED"}, {FI_RMA_EVENT, "RMA_EVENT"}, {FI_MULTI_RECV, "MULTI_RECV"},
               {FI_HMEM, "HMEM"}};
  for (const auto& c : kCaps) {
    if (fi->caps & c.bit) e.caps.emplace_back(c.name);
  }
  const int mr = fi->domain_attr ? fi->domain_attr->mr_mode : 0;
  const struct {
    int bit;
    const char* name;
  } kMr[] = {{FI_MR_LOCAL, "LOCAL"},         {FI_MR_RAW, "RAW"},           {FI_MR_VIRT_ADDR, "VIRT_ADDR"},
             {FI_MR_ALLOCATED, "ALLOCATED"}, {FI_MR_PROV_KEY, "PROV_KEY"}, {FI_MR_MMU_NOTIFY, "MMU_NOTIFY"},
             {FI_MR_RMA_EVENT, "RMA_EVENT"}, {FI_MR_ENDPOINT, "ENDPOINT"}, {FI_MR_HMEM, "HMEM"},
             {FI_MR_COLLECTIVE, "COLLECTIVE"}};
  // The pre-1.5 enum values (FI_MR_BASIC = 1, FI_MR_SCALABLE = 2) still
  // appear in old providers' answers; name them rather than drop them.
  if (mr & 1) e.mr_mode.emplace_back("BASIC");
  if (mr & 2) e.mr_mode.emplace_back("SCALABLE");
  for (const auto& m : kMr) {
    if (mr & m.bit) e.mr_mode.emplace_back(m.name);
  }
  switch (fi->domain_attr ? fi->domain_attr->data_progress : FI_PROGRESS_UNSPEC) {
    case FI_PROGRESS_AUTO: e.progress = "auto"; break;
    case FI_PROGRESS_MANUAL: e.progress = "manual"; break;
    default: e.progress = "unspec"; break;
  }
  switch (fi->domain_attr ? fi->domain_attr->threading : FI_THREAD_UNSPEC) {
    case FI_THREAD_SAFE: e.threading = "safe"; break;
    case FI_THREAD_DOMAIN: e.threading = "domain"; break;
    case FI_THREAD_COMPLETION: e.threading = "completion"; break;
    case FI_THREAD_ENDPOINT: e.threading = "endpoint"; break;
    default: e.threading = "other"; break;
  }
  return e;
}

std::vector<FabricEntry> getinfo(fi_info* hints, std::string& error) {
  std::vector<FabricEntry> out;
  fi_info* list = nullptr;
  const int rc = fi_getinfo(FI_VERSION(1, 14), nullptr, nullptr, 0, hints, &list);
  if (rc == -FI_ENODATA) return out;  // nothing matches: an empty list, not an error
  if (rc != 0) {
    error = std::string("fi_getinfo: ") + fi_strerror(-rc);
    return out;
  }
  for (const fi_info* fi = list; fi; fi = fi->next) out.push_back(describe(fi));
  fi_freeinfo(list);
  return out;
}
#endif

FabricReport fabric_report() {
  FabricReport r;
#if REGPOOL_HAVE_FABRIC
  r.built = true;
  const std::uint32_t v = fi_version();
  r.version = std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
  r.all = getinfo(nullptr, r.error_all);
  // The hints FabricDomain opens with: an RDM endpoint with MSG and RMA,
  // realistic mode bits (FI_CONTEXT|FI_CONTEXT2; docs/provider-facts.md: mode ~0 changes
  // rxm's answer) and the mr_mode bits regpool honours.
  if (fi_info* hints = fi_allocinfo()) {
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_RMA;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    r.rdm = getinfo(hints, r.error_rdm);
    // Asking for FI_MSG|FI_RMA narrows the returned caps to those, hiding
    // FI_ATOMIC; ask again with it and mark the providers that answer.
    hints->caps |= FI_ATOMIC;
    std::string ignored;
    std::vector<std::string> atomic_providers;
    for (const auto& e : getinfo(hints, ignored)) atomic_providers.push_back(e.provider);
    for (auto& e : r.rdm) {
      if (std::find(atomic_providers.begin(), atomic_providers.end(), e.provider) != atomic_providers.end()) {
        e.caps.insert(e.caps.begin() + 2, "ATOMIC");
      }
    }
    fi_freeinfo(hints);
  } else {
    r.error_rdm = "fi_allocinfo failed";
  }
#endif
  return r;
}

// -------------------------------------------------------------------- verbs

struct GidEntry {
  int index = 0;
  std::string gid, type;
};
struct PortEntry {
  int port = 0;
  std::string state, link_layer;
  int active_mtu = 0;
  std::vector<GidEntry> gids;
};
struct VerbsDevice {
  std::string name, node_guid;
  std::uint64_t max_mr_size = 0;
  int max_mr = 0, max_mw = 0;
  bool mw_type1 = false, mw_type2a = false, mw_type2b = false;
  std::string error;
  std::vector<PortEntry> ports;
};
struct VerbsReport {
  bool built = false;
  std::string error;
  std::vector<VerbsDevice> devices;
};

#if defined(REGPOOL_TOOLS_HAVE_IBVERBS) && REGPOOL_TOOLS_HAVE_IBVERBS
std::string gid_text(const ibv_gid& g) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (!::inet_ntop(AF_INET6, g.raw, buf, sizeof buf)) return "?";
  return buf;
}

VerbsDevice describe(ibv_device* dev) {
  VerbsDevice d;
  d.name = ibv_get_device_name(dev);
  char guid[32];
  std::snprintf(guid, sizeof guid, "%016llx",
                static_cast<unsigned long long>(be64toh(ibv_get_device_guid(dev))));
  d.node_guid = guid;
  ibv_context* ctx = ibv_open_device(dev);
  if (!ctx) {
    d.error = std::string("ibv_open_device: ") + std::strerror(errno);
    return d;
  }
  ibv_device_attr attr{};
  if (int rc = ibv_query_device(ctx, &attr); rc != 0) {
    d.error = std::string("ibv_query_device: ") + std::strerror(rc);
    ibv_close_device(ctx);
    return d;
  }
  d.max_mr_size = attr.max_mr_size;
  d.max_mr = attr.max_mr;
  d.max_mw = attr.max_mw;
  d.mw_type1 = (attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW) != 0 || attr.max_mw > 0;
  d.mw_type2a = (attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2A) != 0;
  d.mw_type2b = (attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0;
  for (int p = 1; p <= attr.phys_port_cnt; ++p) {
    PortEntry pe;
    pe.port = p;
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, static_cast<std::uint8_t>(p), &pa) != 0) {
      pe.state = "query failed";
      d.ports.push_back(pe);
      continue;
    }
    pe.state = ibv_port_state_str(pa.state);
    pe.link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET     ? "Ethernet"
                    : pa.link_layer == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand"
                                                                 : "unspecified";
    pe.active_mtu = pa.active_mtu == IBV_MTU_256    ? 256
                    : pa.active_mtu == IBV_MTU_512  ? 512
                    : pa.active_mtu == IBV_MTU_1024 ? 1024
                    : pa.active_mtu == IBV_MTU_2048 ? 2048
                    : pa.active_mtu == IBV_MTU_4096 ? 4096
                                                    : 0;
    for (int gi = 0; gi < pa.gid_tbl_len; ++gi) {
      ibv_gid gid{};
      if (ibv_query_gid(ctx, static_cast<std::uint8_t>(p), gi, &gid) != 0) continue;
      bool zero = true;
      for (auto b : gid.raw) zero = zero && b == 0;
      if (zero) continue;  // unused table slot
      GidEntry ge;
      ge.index = gi;
      ge.gid = gid_text(gid);
      // RoCE v1 vs v2 decides which GID index a peer must use (docs/provider-facts.md:
      // index 1 is RoCEv2 on rxe).
      ibv_gid_entry ent{};
      if (ibv_query_gid_ex(ctx, static_cast<std::uint32_t>(p), static_cast<std::uint32_t>(gi), &ent, 0) == 0) {
        ge.type = ent.gid_type == IBV_GID_TYPE_IB         ? "IB"
                  : ent.gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCEv1"
                  : ent.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCEv2"
                                                          : "?";
      }
      pe.gids.push_back(ge);
    }
    d.ports.push_back(pe);
  }
  ibv_close_device(ctx);
  return d;
}
#endif

VerbsReport verbs_report() {
  VerbsReport r;
#if defined(REGPOOL_TOOLS_HAVE_IBVERBS) && REGPOOL_TOOLS_HAVE_IBVERBS
  r.built = true;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    // ENOSYS: no kernel support (no ib_uverbs); other errors are reported.
    if (errno != ENOSYS && errno != 0) r.error = std::string("ibv_get_device_list: ") + std::strerror(errno);
    return r;
  }
  for (int i = 0; i < n; ++i) r.devices.push_back(describe(list[i]));
  ibv_free_device_list(list);
#endif
  return r;
}

// ---------------------------------------------------------------- exposures

// One opened backend's Endpoint::enforcement() answers.
struct EnforcementRow {
  regpool::ExposureMode mode = regpool::ExposureMode::standard;
  bool per_peer = false;
  regpool::Enforcement e;
};
struct ExposureEntry {
  std::string backend;   // "fabric" or "verbs"
  std::string provider;  // as listed (fabric) or the device name (verbs)
  std::string domain;    // Domain::name() of what was opened
  std::string error;     // the domain or endpoint could not be opened
  std::vector<EnforcementRow> rows;
};
struct ExposureReport {
  std::chrono::milliseconds quarantine{0};  // EndpointConfig's default
  std::vector<ExposureEntry> entries;
};

void add_rows(ExposureEntry& x, const regpool::Endpoint& ep, bool per_peer_keys) {
  for (bool per_peer : {false, true}) {
    if (per_peer && !per_peer_keys) continue;
    for (auto mode : {regpool::ExposureMode::standard, regpool::ExposureMode::scoped}) {
      x.rows.push_back(EnforcementRow{mode, per_peer, ep.enforcement(mode, per_peer)});
    }
  }
}

ExposureReport exposure_report(const FabricReport& f, const VerbsReport& vr) {
  ExposureReport r;
  r.quarantine = regpool::EndpointConfig{}.revoke_quarantine;
  regpool::EndpointConfig ec;
  ec.max_in_flight = 16;
#if REGPOOL_HAVE_FABRIC
  std::vector<std::string> seen;
  for (const auto& e : f.rdm) {
    if (std::find(seen.begin(), seen.end(), e.provider) != seen.end()) continue;
    seen.push_back(e.provider);
    ExposureEntry x;
    x.backend = "fabric";
    x.provider = e.provider;
    // Only providers whose enforcement regpool has measured get an endpoint
    // opened (FabricEndpoint claims nothing for the others). Opening one of
    // the others is also not free of side effects: libfabric 1.17's net
    // leaks an fi_info per endpoint (docs/provider-facts.md), and others
    // may do worse.
    if (e.provider != "shm" && e.provider != "tcp;ofi_rxm" && e.provider != "net") {
      x.error = "not measured by regpool: nothing claimed, no endpoint opened";
      r.entries.push_back(std::move(x));
      continue;
    }
    try {
      regpool::FabricConfig fc;
      fc.provider = e.provider;
      auto d = regpool::FabricDomain::open(fc);
      x.domain = d->name();
      auto ep = regpool::FabricEndpoint::open(d, ec);
      // libfabric keys are not scoped to a connection (no per-peer rows).
      add_rows(x, *ep, false);
    } catch (const std::exception& ex) {
      x.error = std::string("could not open: ") + ex.what();
    }
    r.entries.push_back(std::move(x));
  }
#else
  (void)f;
#endif
#if INFO_HAVE_VERBS_ENDPOINT
  for (const auto& d : vr.devices) {
    // ibv_port_state_str() says "PORT_ACTIVE" or "active" depending on the
    // rdma-core version (rxe in the Soft-RoCE guest: "active").
    const bool active = std::any_of(d.ports.begin(), d.ports.end(), [](const PortEntry& p) {
      std::string st = p.state;
      for (char& ch : st) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      return st == "port_active" || st == "active";
    });
    if (!d.error.empty() || !active) continue;
    ExposureEntry x;
    x.backend = "verbs";
    x.provider = d.name;
    try {
      regpool::VerbsConfig vc;
      vc.device = d.name;
      auto vd = regpool::VerbsDomain::open(vc);
      x.domain = vd->name();
      auto ep = regpool::VerbsEndpoint::open(vd, ec);
      // Verbs can scope a key to one peer's queue pair (a memory window).
      add_rows(x, *ep, true);
    } catch (const std::exception& ex) {
      x.error = std::string("could not open: ") + ex.what();
    }
    r.entries.push_back(std::move(x));
  }
#else
  (void)vr;
#endif
  return r;
}

const char* yes_no(bool b) { return b ? "yes" : "no"; }

std::string mode_label(const EnforcementRow& row) {
  return std::string(regpool::to_string(row.mode)) + (row.per_peer ? ", per peer" : "");
}

void print_exposures_text(const ExposureReport& r) {
  std::printf("\nexposures (Endpoint::enforcement() of an endpoint opened here: what the target\n"
              "enforces on its own, whatever an initiator does):\n");
  if (r.entries.empty()) {
    std::printf("  none (no RDM provider or verbs device to open)\n");
    return;
  }
  std::printf("    %-13s %-20s %-19s %-5s %-6s %-6s %s\n", "provider", "domain", "mode", "keys", "bounds", "rights",
              "revocation");
  for (const auto& x : r.entries) {
    if (!x.error.empty()) {
      std::printf("    %-13s %s\n", x.provider.c_str(), x.error.c_str());
      continue;
    }
    for (const auto& row : x.rows) {
      std::printf("    %-13s %-20s %-19s %-5s %-6s %-6s %s\n", x.provider.c_str(), x.domain.c_str(),
                  mode_label(row).c_str(), yes_no(row.e.keys), yes_no(row.e.bounds), yes_no(row.e.rights),
                  yes_no(row.e.revocation));
    }
  }
  std::printf("  (\"no\" is guarded only by honest initiators' checks; where revocation is \"no\",\n"
              "   revoked bytes are quarantined for EndpointConfig::revoke_quarantine, default %lld ms;\n"
              "   see docs/exposures.md)\n",
              static_cast<long long>(r.quarantine.count()));
}

std::string exposures_json(const ExposureReport& r) {
  std::string o = "{\"revoke_quarantine_ms\":" + std::to_string(r.quarantine.count()) + ",\"backends\":[";
  for (std::size_t i = 0; i < r.entries.size(); ++i) {
    const auto& x = r.entries[i];
    if (i) o += ",";
    o += "{\"backend\":" + json_escape(x.backend) + ",\"provider\":" + json_escape(x.provider) +
         ",\"domain\":" + (x.domain.empty() ? std::string("null") : json_escape(x.domain)) +
         ",\"error\":" + (x.error.empty() ? std::string("null") : json_escape(x.error)) + ",\"enforcement\":[";
    for (std::size_t j = 0; j < x.rows.size(); ++j) {
      const auto& row = x.rows[j];
      if (j) o += ",";
      o += "{\"mode\":" + json_escape(regpool::to_string(row.mode)) +
           ",\"per_peer\":" + (row.per_peer ? "true" : "false") + ",\"keys\":" + (row.e.keys ? "true" : "false") +
           ",\"bounds\":" + (row.e.bounds ? "true" : "false") + ",\"rights\":" + (row.e.rights ? "true" : "false") +
           ",\"revocation\":" + (row.e.revocation ? "true" : "false") + "}";
    }
    o += "]}";
  }
  return o + "]}";
}

// ------------------------------------------------------------------- memory

struct MemoryReport {
  std::uint64_t soft = 0, hard = 0;  // UINT64_MAX = unlimited
  bool can_exceed = false;
  std::string locked_now;  // VmLck of this process
  std::string thp_enabled, thp_defrag;
  struct HugePool {
    std::uint64_t page_kib = 0, total = 0, free = 0;
  };
  std::vector<HugePool> huge;
  std::vector<std::string> hugetlbfs_mounts;
  struct Node {
    int id = 0;
    std::string cpus;
    std::uint64_t mem_total_kib = 0;
  };
  std::string numa_online;
  std::vector<Node> nodes;
};

MemoryReport memory_report() {
  MemoryReport m;
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    m.soft = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
    m.hard = rl.rlim_max == RLIM_INFINITY ? UINT64_MAX : rl.rlim_max;
  }
  m.can_exceed = regpool::platform::can_exceed_memlock();
  {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmLck:", 0) == 0) {
        std::istringstream ss(line.substr(6));
        std::string v, unit;
        ss >> v >> unit;
        m.locked_now = v + " " + unit;
      }
    }
  }
  m.thp_enabled = bracketed(read_first_line("/sys/kernel/mm/transparent_hugepage/enabled"));
  m.thp_defrag = bracketed(read_first_line("/sys/kernel/mm/transparent_hugepage/defrag"));
  for (const auto& dir : list_dir("/sys/kernel/mm/hugepages")) {
    // "hugepages-2048kB"
    MemoryReport::HugePool hp;
    hp.page_kib = std::strtoull(dir.c_str() + std::strlen("hugepages-"), nullptr, 10);
    const std::string base = "/sys/kernel/mm/hugepages/" + dir + "/";
    hp.total = std::strtoull(read_first_line(base + "nr_hugepages").c_str(), nullptr, 10);
    hp.free = std::strtoull(read_first_line(base + "free_hugepages").c_str(), nullptr, 10);
    m.huge.push_back(hp);
  }
  std::sort(m.huge.begin(), m.huge.end(), [](const auto& a, const auto& b) { return a.page_kib < b.page_kib; });
  {
    std::ifstream in("/proc/mounts");
    std::string dev, mnt, type, rest;
    while (in >> dev >> mnt >> type && std::getline(in, rest)) {
      if (type == "hugetlbfs") m.hugetlbfs_mounts.push_back(mnt);
    }
  }
  m.numa_online = read_first_line("/sys/devices/system/node/online");
  for (const auto& dir : list_dir("/sys/devices/system/node")) {
    if (dir.rfind("node", 0) != 0 || dir.size() < 5 || !std::isdigit(static_cast<unsigned char>(dir[4]))) continue;
    MemoryReport::Node n;
    n.id = std::atoi(dir.c_str() + 4);
    const std::string base = "/sys/devices/system/node/" + dir + "/";
    n.cpus = read_first_line(base + "cpulist");
    std::ifstream in(base + "meminfo");
    std::string line;
    while (std::getline(in, line)) {
      const auto pos = line.find("MemTotal:");
      if (pos != std::string::npos) n.mem_total_kib = std::strtoull(line.c_str() + pos + 9, nullptr, 10);
    }
    m.nodes.push_back(n);
  }
  std::sort(m.nodes.begin(), m.nodes.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return m;
}

std::string limit_text(std::uint64_t v) {
  return v == UINT64_MAX ? std::string("unlimited") : regpool_tools::format_size(v);
}
std::string limit_json(std::uint64_t v) { return v == UINT64_MAX ? std::string("null") : std::to_string(v); }

// ------------------------------------------------------------------- output

// Text output folds entries that differ only in address (fi_getinfo
// returns one per interface address family and subnet), listing their
// domains, so the table shows providers rather than addresses.
void print_fabric_text(const std::vector<FabricEntry>& v) {
  if (v.empty()) {
    std::printf("    none\n");
    return;
  }
  struct Row {
    std::string key;
    const FabricEntry* e;
    std::vector<std::string> domains;
    int count;
  };
  std::vector<Row> rows;
  for (const auto& e : v) {
    const std::string key = e.provider + "|" + e.ep_type + "|" + join(e.caps, ",") + "|" + join(e.mr_mode, ",") +
                            "|" + e.progress;
    auto it = std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.key == key; });
    if (it == rows.end()) {
      rows.push_back(Row{key, &e, {}, 0});
      it = rows.end() - 1;
    }
    ++it->count;
    if (std::find(it->domains.begin(), it->domains.end(), e.domain) == it->domains.end()) {
      it->domains.push_back(e.domain);
    }
  }
  std::printf("    %-13s %-5s %-44s %-16s %-8s %s\n", "provider", "ep", "caps", "mr_mode", "progress", "domains");
  for (const auto& r : rows) {
    const FabricEntry& e = *r.e;
    std::printf("    %-13s %-5s %-44s %-16s %-8s %s\n", e.provider.c_str(), e.ep_type.c_str(),
                join(e.caps, ",").c_str(),
                e.mr_mode.empty() ? "0" : join(e.mr_mode, ",").c_str(), e.progress.c_str(),
                join(r.domains, ",").c_str());
  }
}

void print_text(const FabricReport& f, const VerbsReport& vr, const ExposureReport& x, const MemoryReport& m) {
  std::printf("regpool %s\n\n", REGPOOL_VERSION);
  std::printf("libfabric:\n");
  if (!f.built) {
    std::printf("  unavailable (regpool built without libfabric)\n");
  } else {
    std::printf("  library API %s\n", f.version.c_str());
    std::printf("  all providers (fi_getinfo, no hints):\n");
    if (!f.error_all.empty()) std::printf("    error: %s\n", f.error_all.c_str());
    print_fabric_text(f.all);
    std::printf("  RDM with MSG+RMA (the hints regpool's FabricDomain uses):\n");
    if (!f.error_rdm.empty()) std::printf("    error: %s\n", f.error_rdm.c_str());
    print_fabric_text(f.rdm);
  }
  std::printf("\nverbs devices:\n");
  if (!vr.built) {
    std::printf("  unavailable (built without libibverbs)\n");
  } else if (!vr.error.empty()) {
    std::printf("  none (%s)\n", vr.error.c_str());
  } else if (vr.devices.empty()) {
    std::printf("  none\n");
  }
  for (const auto& d : vr.devices) {
    std::printf("  %s  node GUID %s\n", d.name.c_str(), d.node_guid.c_str());
    if (!d.error.empty()) {
      std::printf("    error: %s\n", d.error.c_str());
      continue;
    }
    std::printf("    max MR size %s, max MRs %d, max MWs %d, memory windows: type 1 %s, type 2A %s, type 2B %s\n",
                limit_text(d.max_mr_size).c_str(), d.max_mr, d.max_mw, d.mw_type1 ? "yes" : "no",
                d.mw_type2a ? "yes" : "no", d.mw_type2b ? "yes" : "no");
    for (const auto& p : d.ports) {
      std::printf("    port %d: %s, %s, active MTU %d\n", p.port, p.state.c_str(), p.link_layer.c_str(), p.active_mtu);
      for (const auto& g : p.gids) {
        std::printf("      GID[%d] %s %s\n", g.index, g.gid.c_str(), g.type.c_str());
      }
    }
  }
  print_exposures_text(x);
  std::printf("\nmemory:\n");
  std::printf("  memlock limit: soft %s, hard %s; may exceed it (CAP_IPC_LOCK): %s; locked now: %s\n",
              limit_text(m.soft).c_str(), limit_text(m.hard).c_str(), m.can_exceed ? "yes" : "no",
              m.locked_now.empty() ? "?" : m.locked_now.c_str());
  std::printf("  transparent huge pages: enabled [%s], defrag [%s]\n",
              m.thp_enabled.empty() ? "unavailable" : m.thp_enabled.c_str(),
              m.thp_defrag.empty() ? "unavailable" : m.thp_defrag.c_str());
  std::printf("  hugetlbfs pages:");
  if (m.huge.empty()) std::printf(" none");
  for (const auto& h : m.huge) {
    std::printf(" %s: %llu total, %llu free;", regpool_tools::format_size(h.page_kib * 1024).c_str(),
                static_cast<unsigned long long>(h.total), static_cast<unsigned long long>(h.free));
  }
  // PoolConfig::huge_page_size maps these with MAP_HUGETLB: the free count
  // is what a pool can use, and no hugetlbfs mount is needed for that.
  std::printf("\n  (PoolConfig::huge_page_size draws on the free pages above; no mount needed)");
  std::printf("\n  hugetlbfs mounts: %s\n",
              m.hugetlbfs_mounts.empty() ? "none" : join(m.hugetlbfs_mounts, ", ").c_str());
  std::printf("  NUMA nodes online: %s\n", m.numa_online.empty() ? "unknown" : m.numa_online.c_str());
  for (const auto& n : m.nodes) {
    std::printf("    node %d: cpus %s, memory %s\n", n.id, n.cpus.c_str(),
                regpool_tools::format_size(n.mem_total_kib * 1024).c_str());
  }
}

std::string fabric_json(const std::vector<FabricEntry>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto& e = v[i];
    if (i) out += ",";
    out += "{\"provider\":" + json_escape(e.provider) + ",\"fabric\":" + json_escape(e.fabric) +
           ",\"domain\":" + json_escape(e.domain) + ",\"ep_type\":" + json_escape(e.ep_type) +
           ",\"caps\":" + json_strings(e.caps) + ",\"mr_mode\":" + json_strings(e.mr_mode) +
           ",\"progress\":" + json_escape(e.progress) + ",\"threading\":" + json_escape(e.threading) + "}";
  }
  return out + "]";
}

void print_json(const FabricReport& f, const VerbsReport& vr, const ExposureReport& x, const MemoryReport& m) {
  std::string o = "{";
  o += "\"regpool_version\":" + json_escape(REGPOOL_VERSION);
  o += ",\"libfabric\":{\"available\":" + std::string(f.built ? "true" : "false");
  o += ",\"api_version\":" + json_escape(f.version);
  o += ",\"error\":" + (f.error_all.empty() ? std::string("null") : json_escape(f.error_all));
  o += ",\"providers\":" + fabric_json(f.all);
  o += ",\"rdm_error\":" + (f.error_rdm.empty() ? std::string("null") : json_escape(f.error_rdm));
  o += ",\"rdm_providers\":" + fabric_json(f.rdm) + "}";
  o += ",\"verbs\":{\"available\":" + std::string(vr.built ? "true" : "false");
  o += ",\"error\":" + (vr.error.empty() ? std::string("null") : json_escape(vr.error));
  o += ",\"devices\":[";
  for (std::size_t i = 0; i < vr.devices.size(); ++i) {
    const auto& d = vr.devices[i];
    if (i) o += ",";
    o += "{\"name\":" + json_escape(d.name) + ",\"node_guid\":" + json_escape(d.node_guid);
    o += ",\"error\":" + (d.error.empty() ? std::string("null") : json_escape(d.error));
    o += ",\"max_mr_size\":" + std::to_string(d.max_mr_size) + ",\"max_mr\":" + std::to_string(d.max_mr) +
         ",\"max_mw\":" + std::to_string(d.max_mw);
    o += ",\"memory_windows\":{\"type1\":" + std::string(d.mw_type1 ? "true" : "false") +
         ",\"type2a\":" + (d.mw_type2a ? "true" : "false") + ",\"type2b\":" + (d.mw_type2b ? "true" : "false") + "}";
    o += ",\"ports\":[";
    for (std::size_t j = 0; j < d.ports.size(); ++j) {
      const auto& p = d.ports[j];
      if (j) o += ",";
      o += "{\"port\":" + std::to_string(p.port) + ",\"state\":" + json_escape(p.state) +
           ",\"link_layer\":" + json_escape(p.link_layer) + ",\"active_mtu\":" + std::to_string(p.active_mtu) +
           ",\"gids\":[";
      for (std::size_t k = 0; k < p.gids.size(); ++k) {
        if (k) o += ",";
        o += "{\"index\":" + std::to_string(p.gids[k].index) + ",\"gid\":" + json_escape(p.gids[k].gid) +
             ",\"type\":" + json_escape(p.gids[k].type) + "}";
      }
      o += "]}";
    }
    o += "]}";
  }
  o += "]}";
  o += ",\"exposures\":" + exposures_json(x);
  o += ",\"memlock\":{\"soft_limit_bytes\":" + limit_json(m.soft) + ",\"hard_limit_bytes\":" + limit_json(m.hard) +
       ",\"can_exceed\":" + (m.can_exceed ? "true" : "false") + ",\"locked_now\":" + json_escape(m.locked_now) + "}";
  o += ",\"transparent_hugepages\":{\"enabled\":" + json_escape(m.thp_enabled) +
       ",\"defrag\":" + json_escape(m.thp_defrag) + "}";
  o += ",\"hugetlbfs\":{\"pools\":[";
  for (std::size_t i = 0; i < m.huge.size(); ++i) {
    if (i) o += ",";
    o += "{\"page_size_bytes\":" + std::to_string(m.huge[i].page_kib * 1024) +
         ",\"total\":" + std::to_string(m.huge[i].total) + ",\"free\":" + std::to_string(m.huge[i].free) + "}";
  }
  o += "],\"mounts\":" + json_strings(m.hugetlbfs_mounts) + "}";
  o += ",\"numa\":{\"online\":" + json_escape(m.numa_online) + ",\"nodes\":[";
  for (std::size_t i = 0; i < m.nodes.size(); ++i) {
    if (i) o += ",";
    o += "{\"node\":" + std::to_string(m.nodes[i].id) + ",\"cpus\":" + json_escape(m.nodes[i].cpus) +
         ",\"mem_total_bytes\":" + std::to_string(m.nodes[i].mem_total_kib * 1024) + "}";
  }
  o += "]}}";
  std::printf("%s\n", o.c_str());
}

// ---------------------------------------------------------------- open time

struct OpenTimeArgs {
  std::string provider;
  std::vector<std::string> modes;
  int runs = 5;
};

#if REGPOOL_HAVE_FABRIC
double rss_mib() {
  std::ifstream in("/proc/self/statm");
  long pages = 0;
  long resident = 0;
  if (!(in >> pages >> resident)) return 0;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

regpool::FabricEndpointOptions::EmulatedAtomics mode_of(const std::string& m) {
  using E = regpool::FabricEndpointOptions::EmulatedAtomics;
  return m == "serve" ? E::serve : m == "off" ? E::off : E::on_demand;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
#endif

int open_time(const OpenTimeArgs& a, bool json) {
#if REGPOOL_HAVE_FABRIC
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  regpool::FabricConfig fc;
  fc.provider = a.provider;
  if (a.provider == "tcp") fc.node = "127.0.0.1";
  struct Series {
    std::vector<double> domain_ms, endpoint_ms, rss_mib;
    bool control = false;
    std::string provider;
  };
  std::vector<Series> s(a.modes.size());
  try {
    for (int r = 0; r < a.runs; ++r) {
      for (std::size_t m = 0; m < a.modes.size(); ++m) {
        const auto t0 = Clock::now();
        auto d = regpool::FabricDomain::open(fc);
        const auto t1 = Clock::now();
        const double rss0 = rss_mib();
        regpool::FabricEndpointOptions fo;
        fo.emulated_atomics = mode_of(a.modes[m]);
        const auto t2 = Clock::now();
        auto ep = regpool::FabricEndpoint::open(d, {}, fo);
        const auto t3 = Clock::now();
        s[m].rss_mib.push_back(rss_mib() - rss0);
        s[m].domain_ms.push_back(ms(t1 - t0));
        s[m].endpoint_ms.push_back(ms(t3 - t2));
        s[m].control = ep->control_open();
        s[m].provider = d->provider_name();
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "regpool-info: --open-time %s: %s\n", a.provider.c_str(), e.what());
    return 1;
  }
  auto lo = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  auto hi = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  if (json) {
    std::string o = "{\"open_time\":[";
    for (std::size_t m = 0; m < s.size(); ++m) {
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "%s{\"provider\":%s,\"emulated_atomics\":\"%s\",\"control_endpoint\":%s,\"runs\":%d,"
                    "\"endpoint_ms\":{\"median\":%.1f,\"min\":%.1f,\"max\":%.1f},\"domain_ms_median\":%.1f,"
                    "\"rss_growth_mib_median\":%.1f}",
                    m ? "," : "", json_escape(s[m].provider).c_str(), a.modes[m].c_str(),
                    s[m].control ? "true" : "false", a.runs, median(s[m].endpoint_ms), lo(s[m].endpoint_ms),
                    hi(s[m].endpoint_ms), median(s[m].domain_ms), median(s[m].rss_mib));
      o += buf;
    }
    std::printf("%s]}\n", o.c_str());
    return 0;
  }
  std::printf("FabricEndpoint open time, %d runs per mode, interleaved (domain open not included)\n", a.runs);
  std::printf("%-12s %-10s %-8s %10s %10s %10s %12s %10s\n", "provider", "atomics", "control", "median ms",
              "min ms", "max ms", "domain ms", "RSS MiB");
  for (std::size_t m = 0; m < s.size(); ++m) {
    std::printf("%-12s %-10s %-8s %10.1f %10.1f %10.1f %12.1f %10.1f\n", s[m].provider.c_str(), a.modes[m].c_str(),
                s[m].control ? "open" : "none", median(s[m].endpoint_ms), lo(s[m].endpoint_ms), hi(s[m].endpoint_ms),
                median(s[m].domain_ms), median(s[m].rss_mib));
  }
  return 0;
#else
  (void)a;
  (void)json;
  std::fprintf(stderr, "regpool-info: --open-time needs regpool built with libfabric\n");
  return 1;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  bool timing = false;
  OpenTimeArgs ot;
  std::string mode = "all";
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw UsageError("'" + a + "' needs a value");
        return argv[++i];
      };
      if (a == "--help" || a == "-h") {
        usage(stdout);
        return 0;
      }
      if (a == "--json") {
        json = true;
      } else if (a == "--open-time") {
        timing = true;
        ot.provider = value();
      } else if (a == "--emulated-atomics") {
        mode = value();
        if (mode != "serve" && mode != "on_demand" && mode != "off" && mode != "all") {
          throw UsageError("--emulated-atomics: '" + mode + "' is not serve, on_demand, off or all");
        }
      } else if (a == "--runs") {
        const std::string v = value();
        char* end = nullptr;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || n < 1 || n > 1000) throw UsageError("--runs: '" + v + "' is not 1..1000");
        ot.runs = static_cast<int>(n);
      } else {
        throw UsageError("unknown argument '" + a + "'");
      }
    }
    if (!timing && (mode != "all" || ot.runs != 5)) throw UsageError("--emulated-atomics and --runs need --open-time");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "regpool-info: %s\n", e.what());
    usage(stderr);
    return regpool_tools::kExitUsage;
  }
  if (timing) {
    ot.modes = mode == "all" ? std::vector<std::string>{"serve", "on_demand", "off"} : std::vector<std::string>{mode};
    return open_time(ot, json);
  }
  const FabricReport f = fabric_report();
  const VerbsReport v = verbs_report();
  const ExposureReport x = exposure_report(f, v);
  const MemoryReport m = memory_report();
  if (json) {
    print_json(f, v, x, m);
  } else {
    print_text(f, v, x, m);
  }
  return 0;
}
