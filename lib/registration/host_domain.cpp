#include "regpool/host_domain.hpp"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "platform/mapping.hpp"

namespace regpool {
namespace {

// Straight to the kernel: sanitizers intercept mlock/munlock and turn them
// into no-ops, which would make the host domain claim pinning it never did.
int sys_mlock(void* addr, std::size_t length) noexcept { return static_cast<int>(::syscall(SYS_mlock, addr, length)); }
int sys_munlock(void* addr, std::size_t length) noexcept {
  return static_cast<int>(::syscall(SYS_munlock, addr, length));
}

}  // namespace

Domain::Native HostDomain::do_register(void* addr, std::size_t length, Access /*access*/) {
  if (length == 0) throw Error(Status::invalid_argument, 0, "host domain: cannot register 0 bytes");
  if (config_.lock_pages && sys_mlock(addr, length) != 0) {
    const int err = errno;
    if (err == ENOMEM || err == EPERM || err == EAGAIN) {
      // The usual cause is RLIMIT_MEMLOCK; say which limit, how much was
      // asked and how to fix it, since "Cannot allocate memory" alone sends
      // people looking at the wrong thing.
      throw Error(Status::memlock_limit, -err, platform::memlock_advice(length, err));
    }
    throw Error(Status::registration_failed, -err, std::string("host domain: mlock failed: ") + std::strerror(err));
  }
  return Native{nullptr, nullptr, 0, 0, AddressMode::virtual_address};
}

void HostDomain::do_deregister(const Native& /*native*/, void* addr, std::size_t length) noexcept {
  if (config_.lock_pages) sys_munlock(addr, length);
}

}  // namespace regpool
