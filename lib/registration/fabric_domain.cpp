#include "regpool/fabric_domain.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <sys/random.h>
#include <sys/types.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace regpool {
namespace {

// The oldest API the build accepts (meson: libfabric >= 1.14). Nothing here
// needs a newer one, and asking for an old version keeps the semantics stable
// when the library is built against a newer header.
constexpr std::uint32_t kApiVersion = FI_VERSION(1, 14);

constexpr std::uint64_t kBaseCaps =
    FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;

// What this library can cope with. FI_MR_RAW and FI_MR_HMEM are not declared:
// keys are exchanged as 64-bit integers and only host memory is registered.
constexpr int kBaseMrMode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

std::string fi_message(int rc) {
  return std::string(fi_strerror(rc < 0 ? -rc : rc)) + " (" + std::to_string(rc) + ")";
}

struct InfoDeleter {
  void operator()(fi_info* p) const noexcept {
    if (p) fi_freeinfo(p);
  }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// One fi_getinfo attempt.
struct Attempt {
  bool virt_addr;
  bool atomics;
  bool thread_safe;
  bool order_sas;
  bool source;  // FI_SOURCE: receive completions name the sender (fi_cq_readfrom)
};

InfoPtr make_hints(const FabricConfig& config, const Attempt& a) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) throw Error(Status::out_of_memory, -FI_ENOMEM, "fabric domain: fi_allocinfo failed");
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = kBaseCaps | (a.atomics ? FI_ATOMIC : 0) | (a.source ? FI_SOURCE : 0);
  // Realistic mode bits: the transport can supply contexts. mode = ~0 would
  // make rxm pick FI_BUFFERED_RECV (docs/provider-facts.md).
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = kBaseMrMode | (a.virt_addr ? FI_MR_VIRT_ADDR : 0);
  hints->domain_attr->threading = a.thread_safe ? FI_THREAD_SAFE : FI_THREAD_DOMAIN;
  hints->domain_attr->resource_mgmt = FI_RM_ENABLED;
  if (a.order_sas) {
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
  }
  // tx_attr->op_flags is left alone: FI_DELIVERY_COMPLETE is the transport's
  // per-operation decision.
  if (!config.provider.empty()) {
    // libfabric matches "TCP" but not "TCP;OFI_RXM"; provider names are all
    // lower case, so asking in lower case makes every spelling work.
    std::string name = config.provider;
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    // "tcp" alone would be libfabric's tcp;ofi_rxm for RDM: regpool's tcp is
    // net, the faster one since oversized messages cannot stall it any more
    // (FabricEndpointOptions::max_incoming_message; bench/RESULTS.md).
    if (name == "tcp") name = "net";
    // shm: directed receives let an endpoint take a removed peer's
    // unexpected messages before its region is unmapped (FabricEndpoint::
    // drain_unexpected). Receives posted for any source match as before.
    if (name == "shm") hints->caps |= FI_DIRECTED_RECV;
    hints->fabric_attr->prov_name = ::strdup(name.c_str());
    if (!hints->fabric_attr->prov_name) {
      throw Error(Status::out_of_memory, -FI_ENOMEM, "fabric domain: strdup failed");
    }
  }
  return hints;
}

std::string describe(const FabricConfig& config) {
  std::string s = "provider '" + (config.provider.empty() ? std::string("<any>") : config.provider) + "'";
  if (!config.node.empty() || !config.service.empty()) {
    s += " (node '" + config.node + "', service '" + config.service + "')";
  }
  return s;
}

// For error messages only: the RDM providers that exist at all.
std::string available_rdm_providers() {
  InfoPtr hints(fi_allocinfo());
  if (!hints) return "?";
  hints->ep_attr->type = FI_EP_RDM;
  fi_info* list = nullptr;
  if (fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &list) != 0 || !list) return "none";
  InfoPtr owner(list);
  std::vector<std::string> names;
  for (fi_info* i = list; i; i = i->next) {
    if (i->fabric_attr && i->fabric_attr->prov_name) names.emplace_back(i->fabric_attr->prov_name);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

std::uint64_t fi_access(Access access) noexcept {
  // Local access is implied (see Access): a registration the owner cannot
  // use locally is useless, and FI_MR_LOCAL providers need it for
  // descriptors.
  std::uint64_t a = FI_SEND | FI_RECV | FI_READ | FI_WRITE;
  if (grants(access, Access::remote_read)) a |= FI_REMOTE_READ;
  if (grants(access, Access::remote_write)) a |= FI_REMOTE_WRITE;
  // Atomics read and write the target; fetching atomics return the old value.
  if (grants(access, Access::remote_atomic)) a |= FI_REMOTE_READ | FI_REMOTE_WRITE;
  return a;
}

// Core (first) provider of a possibly layered name such as "tcp;ofi_rxm".
std::string_view core_provider(std::string_view name) noexcept {
  return name.substr(0, name.find(';'));
}

}  // namespace

FabricDomain::FabricDomain(const FabricConfig& config) {
  const char* node = config.node.empty() ? nullptr : config.node.c_str();
  const char* service = config.service.empty() ? nullptr : config.service.c_str();
  const std::uint64_t flags = (node || service) ? FI_SOURCE : 0;

  // Fallback order, most wanted first: the preferred addressing mode, then
  // atomics, then FI_THREAD_SAFE, then FI_ORDER_SAS, then FI_SOURCE. Declaring
  // FI_MR_VIRT_ADDR only says we can use virtual addresses; the provider's
  // answer decides. When offsets are preferred we still retry with it, since
  // some providers (verbs) require it.
  std::vector<bool> vaddr_options = config.prefer_virtual_address ? std::vector<bool>{true}
                                                                  : std::vector<bool>{false, true};
  std::vector<bool> atomic_options = config.want_atomics ? std::vector<bool>{true, false}
                                                         : std::vector<bool>{false};
  fi_info* found = nullptr;
  auto search = [&](const FabricConfig& cfg) -> int {
    int rc = -FI_ENODATA;
    for (bool va : vaddr_options) {
      for (bool at : atomic_options) {
        for (bool ts : {true, false}) {
          for (bool sas : {true, false}) {
            // FI_SOURCE last: the least wanted (receives then report
            // kAnyPeer), and shm and tcp;ofi_rxm grant it.
            for (bool src : {true, false}) {
              InfoPtr hints = make_hints(cfg, Attempt{va, at, ts, sas, src});
              found = nullptr;
              rc = fi_getinfo(kApiVersion, node, service, flags, hints.get(), &found);
              if (rc == 0 && found) return 0;
              // Only "nothing matches" is worth relaxing the hints for.
              if (rc != -FI_ENODATA) return rc;
            }
          }
        }
      }
    }
    return rc;
  };
  int rc = search(config);
  if (rc == 0 && found && config.provider.empty() && found->fabric_attr && found->fabric_attr->prov_name &&
      std::string_view(found->fabric_attr->prov_name) == "shm") {
    // shm chosen by libfabric: ask again by name, for the capabilities
    // regpool asks of shm alone (make_hints: directed receives).
    fi_info* first = found;
    FabricConfig named = config;
    named.provider = "shm";
    if (search(named) == 0 && found) {
      fi_freeinfo(first);
    } else {
      if (found) fi_freeinfo(found);
      found = first;
      rc = 0;
    }
  }
  if (rc != 0 || !found) {
    if (found) fi_freeinfo(found);
    if (rc == 0) rc = -FI_ENODATA;
    const Status st = rc == -FI_ENODATA ? Status::unsupported : Status::transport_error;
    throw Error(st, rc,
                "fabric domain: fi_getinfo found no RDM endpoint with MSG+RMA for " + describe(config) + ": " +
                    fi_message(rc) + "; RDM providers available: " + available_rdm_providers());
  }

  // Keep only the first (best) answer.
  InfoPtr list(found);
  info_ = fi_dupinfo(found);
  list.reset();
  if (!info_) throw Error(Status::out_of_memory, -FI_ENOMEM, "fabric domain: fi_dupinfo failed");

  provider_ = info_->fabric_attr && info_->fabric_attr->prov_name ? info_->fabric_attr->prov_name : "";
  mr_mode_ = static_cast<std::uint64_t>(static_cast<unsigned>(info_->domain_attr->mr_mode));
  mode_ = (mr_mode_ & FI_MR_VIRT_ADDR) ? AddressMode::virtual_address : AddressMode::offset;
  has_atomics_ = config.want_atomics && (info_->caps & FI_ATOMIC) != 0;
  thread_safe_ = info_->domain_attr->threading == FI_THREAD_SAFE;
  const std::size_t key_size = info_->domain_attr->mr_key_size;
  if (key_size > 0 && key_size < sizeof(std::uint64_t)) max_key_ = (std::uint64_t{1} << (8 * key_size)) - 1;

  rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr);
  if (rc != 0) {
    fabric_ = nullptr;
    close_all();
    throw Error(Status::transport_error, rc, "fabric domain: fi_fabric failed for provider '" + provider_ + "': " +
                                                 fi_message(rc));
  }
  rc = fi_domain(fabric_, info_, &domain_, nullptr);
  if (rc != 0) {
    domain_ = nullptr;
    close_all();
    throw Error(Status::transport_error, rc, "fabric domain: fi_domain failed for provider '" + provider_ + "': " +
                                                 fi_message(rc));
  }
}

void FabricDomain::close_all() noexcept {
  // Registrations keep the domain alive, so none are live here unless the
  // transport leaked an endpoint binding; fi_close then reports -FI_EBUSY and
  // there is nothing better to do than carry on.
  if (domain_) (void)fi_close(&domain_->fid);
  if (fabric_) (void)fi_close(&fabric_->fid);
  if (info_) fi_freeinfo(info_);
  domain_ = nullptr;
  fabric_ = nullptr;
  info_ = nullptr;
}

FabricDomain::~FabricDomain() { close_all(); }

std::string FabricDomain::name() const { return "fabric:" + provider_; }

bool FabricDomain::pins_memory() const noexcept {
  // Software providers keep a key table and pin nothing (docs/provider-facts.md: RSS and
  // VmLck unchanged). Layered names are judged by their core provider, so
  // "verbs;ofi_rxm" pins and "tcp;ofi_rxm" does not.
  const std::string_view core = core_provider(provider_);
  for (std::string_view soft : {"tcp", "shm", "sockets", "udp", "net", "ofi_rxm", "ofi_rxd"}) {
    if (core == soft) return false;
  }
  return true;
}

bool FabricDomain::needs_local_descriptor() const noexcept { return (mr_mode_ & FI_MR_LOCAL) != 0; }

bool FabricDomain::needs_endpoint_binding() const noexcept { return (mr_mode_ & FI_MR_ENDPOINT) != 0; }

std::uint64_t FabricDomain::random_key_bits() {
  // One getrandom(2) per kKeyBatch keys: the system call was about 90% of a
  // scoped exposure's cost (perf record, bench-expose), and the keys come
  // from the same generator either way. The batch lives in this domain only.
  std::lock_guard<std::mutex> g(key_mutex_);
  if (keys_left_ == 0) {
    std::size_t got = 0;
    auto* bytes = reinterpret_cast<unsigned char*>(key_batch_.data());
    while (got < sizeof key_batch_) {
      const ssize_t n = ::getrandom(bytes + got, sizeof key_batch_ - got, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        throw Error(Status::registration_failed, err,
                    "fabric domain '" + provider_ + "': getrandom for registration keys failed: " +
                        std::strerror(err));
      }
      got += static_cast<std::size_t>(n);
    }
    keys_left_ = key_batch_.size();
  }
  const std::uint64_t bits = key_batch_[--keys_left_];
  key_batch_[keys_left_] = 0;  // a used key does not linger in memory
  return bits;
}

Domain::Native FabricDomain::do_register(void* addr, std::size_t length, Access access) {
  // libfabric's software providers accept a zero length (and an unmapped
  // address) silently; a zero-length registration is always a caller bug.
  if (length == 0) {
    throw Error(Status::invalid_argument, 0, "fabric domain '" + provider_ + "': cannot register 0 bytes");
  }
  if (addr == nullptr) {
    throw Error(Status::invalid_argument, 0, "fabric domain '" + provider_ + "': cannot register a null address");
  }

  const bool prov_key = (mr_mode_ & FI_MR_PROV_KEY) != 0;
  const std::uint64_t acc = fi_access(access);

  // Registrations and their closes are serialised whatever the domain's
  // threading level. Under FI_THREAD_DOMAIN that is our duty; under
  // FI_THREAD_SAFE it is because libfabric 1.17's net provider, which
  // grants it, crashed (SIGSEGV inside fi_mr_reg) or hung in 2 of 60 runs
  // of four threads registering at once (registration-fabric, 2026-11-26).
  // A registration costs microseconds and is never on the data path, so
  // the mutex costs nothing that matters.
  std::lock_guard<std::mutex> reg_lock(reg_mutex_);

  fid_mr* mr = nullptr;
  int rc = 0;
  // Random keys (FI_MR_PROV_KEY aside): a key guessed from another one (as
  // sequential keys allowed) opens nothing. A key already taken in this
  // domain answers -FI_ENOKEY: draw again. With 8-byte keys a collision is
  // astronomically rare; small key spaces fill up, hence the bound.
  constexpr int kKeyTries = 64;
  for (int tries = 0; tries < kKeyTries; ++tries) {
    std::uint64_t key = 0;
    if (!prov_key) {
      key = random_key_bits() & max_key_;
      // FI_KEY_NOTAVAIL (all ones) means "no key" to libfabric.
      if (key == FI_KEY_NOTAVAIL) continue;
    }
    mr = nullptr;
    rc = fi_mr_reg(domain_, addr, length, acc, 0, key, 0, &mr, nullptr);
    if (rc != -FI_ENOKEY || prov_key) break;
  }
  if (rc != 0) {
    throw Error(Status::registration_failed, rc,
                "fabric domain '" + provider_ + "': fi_mr_reg of " + std::to_string(length) +
                    " bytes failed: " + fi_message(rc));
  }

  auto fail = [&](int code, const std::string& what) {
    (void)fi_close(&mr->fid);
    throw Error(Status::registration_failed, code, "fabric domain '" + provider_ + "': " + what);
  };

  bool enabled = true;
  if (needs_endpoint_binding()) {
    std::lock_guard<std::mutex> lock(endpoints_mutex_);
    for (fid_ep* ep : endpoints_) {
      rc = fi_mr_bind(mr, &ep->fid, 0);
      if (rc != 0) break;
    }
    // With no endpoint yet the region stays disabled until attach_endpoint.
    enabled = !endpoints_.empty();
    if (rc == 0 && enabled) rc = fi_mr_enable(mr);
    if (rc != 0) fail(rc, "binding a registration to its endpoints failed: " + fi_message(rc));
    live_mrs_.push_back(LiveMr{mr, enabled});
  }

  Native n;
  n.handle = mr;
  n.desc = fi_mr_desc(mr);  // handed out even without FI_MR_LOCAL (header)
  n.rkey = fi_mr_key(mr);
  n.lkey = 0;
  n.mode = mode_;
  if (n.rkey == FI_KEY_NOTAVAIL && enabled) {
    if (needs_endpoint_binding()) {
      std::lock_guard<std::mutex> lock(endpoints_mutex_);
      std::erase_if(live_mrs_, [mr](const LiveMr& l) { return l.mr == mr; });
    }
    fail(-FI_ENOKEY, "provider returned no key for the registration");
  }
  return n;
}

void FabricDomain::do_deregister(const Native& native, void* /*addr*/, std::size_t /*length*/) noexcept {
  auto* mr = static_cast<fid_mr*>(native.handle);
  if (!mr) return;
  std::lock_guard<std::mutex> reg_lock(reg_mutex_);  // see do_register
  if (needs_endpoint_binding()) {
    std::lock_guard<std::mutex> lock(endpoints_mutex_);
    std::erase_if(live_mrs_, [mr](const LiveMr& l) { return l.mr == mr; });
  }
  (void)fi_close(&mr->fid);
}

void FabricDomain::attach_endpoint(fid_ep* ep) {
  if (!needs_endpoint_binding() || ep == nullptr) return;
  std::lock_guard<std::mutex> reg_lock(reg_mutex_);  // see do_register
  std::lock_guard<std::mutex> lock(endpoints_mutex_);
  if (std::find(endpoints_.begin(), endpoints_.end(), ep) != endpoints_.end()) return;
  for (LiveMr& l : live_mrs_) {
    int rc = fi_mr_bind(l.mr, &ep->fid, 0);
    if (rc == 0 && !l.enabled) {
      rc = fi_mr_enable(l.mr);
      if (rc == 0) l.enabled = true;
    }
    if (rc != 0) {
      throw Error(Status::transport_error, rc,
                  "fabric domain '" + provider_ + "': binding a live registration to a new endpoint failed: " +
                      fi_message(rc));
    }
  }
  endpoints_.push_back(ep);
}

void FabricDomain::detach_endpoint(fid_ep* ep) noexcept {
  if (!needs_endpoint_binding() || ep == nullptr) return;
  std::lock_guard<std::mutex> lock(endpoints_mutex_);
  std::erase(endpoints_, ep);
}

}  // namespace regpool
