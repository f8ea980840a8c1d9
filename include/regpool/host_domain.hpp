#pragma once
// The host domain pins pages with mlock(2) and issues no remote key. It exists
// for host-only pools and to measure what pinning really costs on a machine
// (libfabric's software providers pin nothing).

#include <cstddef>
#include <memory>
#include <string>

#include "regpool/domain.hpp"

namespace regpool {

struct HostDomainConfig {
  // When false the domain only counts; useful to separate mapping cost from
  // pinning cost in measurements.
  bool lock_pages = true;
};

// Thread-safety: as Domain. Note that the kernel does not reference-count
// mlock: two registrations sharing a page unlock it together. Arenas are
// page-aligned and disjoint, so pools never hit this; user memory might.
class REGPOOL_API HostDomain final : public Domain {
 public:
  explicit HostDomain(HostDomainConfig config = {}) : config_(config) {}
  static std::shared_ptr<HostDomain> open(HostDomainConfig config = {}) {
    return std::make_shared<HostDomain>(config);
  }

  std::string name() const override { return "host"; }
  bool remote_capable() const noexcept override { return false; }
  bool pins_memory() const noexcept override { return config_.lock_pages; }

 protected:
  Native do_register(void* addr, std::size_t length, Access access) override;
  void do_deregister(const Native& native, void* addr, std::size_t length) noexcept override;

 private:
  HostDomainConfig config_;
};

}  // namespace regpool
