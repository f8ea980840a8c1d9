#pragma once
// libfabric registration domain. Opens a fabric and a domain for a named
// provider (or the best available one) with the capabilities the transport
// needs (FI_EP_RDM, MSG + RMA, ATOMIC where offered) and registers memory
// honouring the provider's mr_mode bits:
//  - FI_MR_LOCAL: descriptors are passed on every data-path call;
//  - FI_MR_VIRT_ADDR: peers address by virtual address, else by offset;
//  - FI_MR_PROV_KEY: the provider picks keys, else this domain draws each key
//    at random (getrandom(2)) over the provider's mr_key_size, retrying on
//    -FI_ENOKEY (taken), so a key says nothing about any other key: on
//    providers that check keys (tcp) a peer cannot guess its way into a
//    registration it was not given, arenas included;
//  - FI_MR_ENDPOINT: registrations are bound to every endpoint opened on the
//    domain (attach_endpoint) before they are enabled.
//
// Choices made when opening (see fabric_domain.cpp for the fallback order):
//  - API version FI_VERSION(1, 14), the oldest libfabric the build accepts.
//  - Threading FI_THREAD_SAFE; when the provider only offers FI_THREAD_DOMAIN
//    the domain is opened that way, thread_safe() reports false and this class
//    serialises its own fi_mr_reg/fi_close calls (the transport must serialise
//    its endpoint calls itself).
//  - msg_order FI_ORDER_SAS when offered, else none; FI_ATOMIC when asked and
//    offered (has_atomics() reflects the returned caps).
//  - FI_SOURCE when offered (shm and tcp;ofi_rxm do), so receive completions
//    name their sender (see FabricEndpoint); tried last in the fallbacks.
//  - Descriptors: fi_mr_desc is always handed out, not only under FI_MR_LOCAL.
//    Providers without FI_MR_LOCAL may ignore it, and some (rxm rendezvous,
//    shm hmem detection) use it to skip an internal registration.
//  - Local access is always granted (FI_SEND|FI_RECV|FI_READ|FI_WRITE), as
//    Access documents; remote rights map to FI_REMOTE_READ/FI_REMOTE_WRITE,
//    remote_atomic to both.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "regpool/domain.hpp"

struct fi_info;
struct fid_fabric;
struct fid_domain;
struct fid_ep;
struct fid_mr;

namespace regpool {

struct FabricConfig {
  // Provider name as fi_getinfo understands it: "shm", "net", "tcp;ofi_rxm",
  // "verbs", "efa", "cxi", in any case. "tcp" means "net" (libfabric's
  // native RDM over TCP sockets: 1.4-2.2x the speed of tcp;ofi_rxm at small
  // and medium sizes, docs/provider-facts.md); "tcp;ofi_rxm" selects the
  // rxm layer over tcp explicitly. Empty picks the best available RDM
  // provider.
  std::string provider;
  // Node/service for fi_getinfo with FI_SOURCE, e.g. "127.0.0.1" to keep
  // tcp on loopback. Empty lets the provider choose.
  std::string node;
  std::string service;
  // Ask for FI_MR_VIRT_ADDR addressing when the provider can do either.
  bool prefer_virtual_address = true;
  // Ask for FI_ATOMIC; falls back to no atomics when the provider has none.
  bool want_atomics = true;
};

// Thread-safety: as Domain; attach/detach_endpoint are internally locked.
class REGPOOL_API FabricDomain final : public Domain {
 public:
  explicit FabricDomain(const FabricConfig& config);  // throws Error
  ~FabricDomain() override;
  static std::shared_ptr<FabricDomain> open(const FabricConfig& config) {
    return std::make_shared<FabricDomain>(config);
  }

  std::string name() const override;                    // "fabric:<provider>"
  const std::string& provider_name() const noexcept { return provider_; }  // e.g. "tcp;ofi_rxm"
  bool pins_memory() const noexcept override;           // false for tcp/shm/sockets/udp/net
  AddressMode address_mode() const noexcept override { return mode_; }
  std::uint64_t mr_mode() const noexcept { return mr_mode_; }
  bool has_atomics() const noexcept { return has_atomics_; }
  // FI_THREAD_SAFE was granted (else FI_THREAD_DOMAIN).
  bool thread_safe() const noexcept { return thread_safe_; }
  bool needs_local_descriptor() const noexcept;         // FI_MR_LOCAL
  bool needs_endpoint_binding() const noexcept;         // FI_MR_ENDPOINT

  // --- Native handles: an escape hatch for code that calls libfabric
  // directly (benchmarks against raw libfabric, tests of provider
  // behaviour); not needed for regpool's own API. They stay valid for the
  // domain's lifetime and remain owned by it: do not close them. The
  // fi_info is the single answer the domain was opened with.
  fi_info* native_info() const noexcept { return info_; }
  fid_fabric* native_fabric() const noexcept { return fabric_; }
  fid_domain* native_domain() const noexcept { return domain_; }
  // For endpoints opened on native_domain() (FabricEndpoint does this
  // itself). FI_MR_ENDPOINT providers: bind every live registration to ep
  // (enabling those not yet enabled), and every later registration too.
  // Throws Error when the provider refuses the binding. No-op elsewhere.
  // Under FI_MR_ENDPOINT a registration made before any endpoint is attached
  // stays disabled (and, with FI_MR_PROV_KEY, may report no key) until the
  // first attach, so attach an endpoint before registering.
  void attach_endpoint(fid_ep* ep);
  void detach_endpoint(fid_ep* ep) noexcept;

 protected:
  Native do_register(void* addr, std::size_t length, Access access) override;
  void do_deregister(const Native& native, void* addr, std::size_t length) noexcept override;

 private:
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  std::string provider_;
  std::uint64_t mr_mode_ = 0;
  AddressMode mode_ = AddressMode::offset;
  bool has_atomics_ = false;
  bool thread_safe_ = false;
  std::uint64_t max_key_ = ~std::uint64_t{0};  // from domain_attr->mr_key_size
  // Random key bits, drawn from getrandom(2) in batches (random_key_bits()).
  std::uint64_t random_key_bits();
  std::mutex key_mutex_;
  std::array<std::uint64_t, 32> key_batch_{};
  std::size_t keys_left_ = 0;
  std::mutex reg_mutex_;  // serialises fi_mr_reg/fi_close (always: see do_register)
  std::mutex endpoints_mutex_;  // guards endpoints_ and live_mrs_
  std::vector<fid_ep*> endpoints_;
  struct LiveMr {
    fid_mr* mr;
    bool enabled;
  };
  std::vector<LiveMr> live_mrs_;  // only tracked under FI_MR_ENDPOINT

  void close_all() noexcept;
};

}  // namespace regpool
