#pragma once
// The library's own access to what the public Ldo and Pool classes keep
// private: an LDO's control block and a pool's core. Users never need these
// (and cannot name them without this internal header); inside the library
// they are the one door to those internals, so a grep for LdoAccess or
// PoolAccess finds every place that reaches through.

#include "pool/control_block.hpp"
#include "regpool/ldo.hpp"
#include "regpool/pool.hpp"

namespace regpool::detail {

struct LdoAccess {
  // A handle that takes over one reference the caller holds on `cb`, whose
  // object starts at `base` (base_of(cb); callers usually have it already).
  static Ldo adopt(ControlBlock* cb, std::byte* base) noexcept { return Ldo(cb, base); }
  static ControlBlock* block(const Ldo& ldo) noexcept { return ldo.control_block(); }
  // Gives up the handle's reference without dropping it: the caller now
  // owns it (and gives it back with adopt()).
  static ControlBlock* release(Ldo& ldo) noexcept { return ldo.release_control_block(); }
};

struct PoolAccess {
  // nullptr for a moved-from pool.
  static PoolCore* core(const Pool& pool) noexcept { return pool.core_; }
};

}  // namespace regpool::detail
