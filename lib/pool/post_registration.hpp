#pragma once
// The registration a backend posts an LDO's bytes under (its lkey or
// descriptor), for the data path.
//
// Ldo::region() answers the same question for anyone, filling a whole
// DomainRegion (descriptor, both keys, remote base, address mode, access)
// through an out-of-line call: about 64 instructions per post, twice per
// send ping-pong round (the receive and the send), and under qemu TCG (the
// Soft-RoCE guest) every one of them costs several ns. A post needs one of
// those fields, read inline from the registration this returns: for pool
// objects, the arena's registration with the domain (no lock, nothing
// filled). User objects (registered on first use) keep going through
// region(), which registers them.

#include "pool/access.hpp"
#include "pool/pool_core.hpp"
#include "regpool/domain.hpp"
#include "regpool/error.hpp"
#include "regpool/ldo.hpp"

namespace regpool::detail {

// A pool object's registration with `domain`: its arena's (nullptr when the
// pool does not serve `domain`). Shared with Ldo::region().
[[gnu::always_inline]] inline const Registration* arena_registration(const ControlBlock& cb,
                                                                      Domain& domain) noexcept {
  const int i = cb.arena->pool()->domain_index(&domain);
  return i < 0 ? nullptr : &cb.arena->registration(static_cast<std::size_t>(i));
}

// The registration covering `ldo`'s bytes with `domain`. Statuses as
// Ldo::region(): invalid_argument for an empty handle, unsupported when the
// pool does not serve `domain`, the registration's failure for a user
// object.
[[gnu::always_inline]] inline Result<const Registration*> post_registration(const Ldo& ldo, Domain& domain) noexcept {
  const ControlBlock* cb = LdoAccess::block(ldo);
  if (cb != nullptr && cb->kind != BlockKind::user) {
    const Registration* r = arena_registration(*cb, domain);
    if (r == nullptr) return Status::unsupported;
    return r;
  }
  auto r = ldo.region(domain);
  if (!r) return r.status();
  return r->registration;
}

}  // namespace regpool::detail
