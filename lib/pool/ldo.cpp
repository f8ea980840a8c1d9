#include <bit>
#include <cstring>
#include <new>

#include "pool/pool_core.hpp"
#include "pool/post_registration.hpp"
#include "regpool/ldo.hpp"
#include "regpool/pool.hpp"

namespace regpool {
namespace detail {

namespace {
[[gnu::noinline, gnu::cold]] void destroy_user(UserBlock* ub) noexcept {
  // Deregister before the cleanup: once the application gets its memory
  // back it may free it, and a NIC must not hold a mapping to freed pages.
  for (auto& r : ub->registrations) r.reset();
  auto cleanup = std::move(ub->cleanup);
  const auto memory = ub->memory;
  delete ub;
  if (cleanup) cleanup(memory);
}

// Return the object to its pool or run the user cleanup. The two common
// drops first, each recognised by one load and one test of the block's kind
// word (kind_word): a used slab slot (whose size class comes from the same
// word) and a span the thread's span cache may keep. Neither writes into
// the block; only a fresh slot's first drop clears its flag.
[[gnu::always_inline]] inline void destroy(ControlBlock* cb) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    const std::uint32_t w = kind_word(cb);
    if ((w & kKindWordSlotMask) == 0) [[likely]] {  // slab_slot, flags 0
      PoolCore::free_slot(cb, (w >> 8) & 0xff);
      return;
    }
    if (w == kKindWordCacheableSpan) [[likely]] {
      PoolCore::free_span(cb, true);
      return;
    }
  }
  const BlockKind k = cb->kind;
  if (k == BlockKind::span) [[likely]] {
    PoolCore::free_span(cb, (cb->flags & kCacheableSpan) != 0);
    return;
  }
  if (k == BlockKind::user) [[unlikely]] {
    destroy_user(static_cast<UserBlock*>(cb));
    return;
  }
  cb->flags = 0;  // used: no longer fresh (ControlBlock::flags)
  PoolCore::free_slot(cb, cb->size_class);
}

[[gnu::always_inline]] inline void release(ControlBlock* cb) noexcept {
  // A sole owner cannot race with anyone (nobody else can copy a handle it
  // does not have), so the common single-owner drop is a load, no locked
  // RMW, and leaves refs at 1, as a free pool block keeps it (see
  // ControlBlock::refs). The last drop of a shared object puts the 1 back
  // before the block goes anywhere another thread could take it from.
  if (cb->refs.load(std::memory_order_acquire) == 1) [[likely]] {
    destroy(cb);
  } else if (cb->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    cb->refs.store(1, std::memory_order_relaxed);
    destroy(cb);
  }
}
}  // namespace

}  // namespace detail

namespace {

// The header is little-endian on the wire. On little-endian hosts (all that
// RDMA runs on in practice) that is a plain copy, which matters: the header
// is written on every allocation.
template <class T>
void put_le(std::byte* p, T v) noexcept {
  if constexpr (std::endian::native != std::endian::little) {
    T s = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) s = static_cast<T>((s << 8) | ((v >> (8 * i)) & 0xff));
    v = s;
  }
  std::memcpy(p, &v, sizeof v);
}
template <class T>
T get_le(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native != std::endian::little) {
    T s = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) s = static_cast<T>((s << 8) | ((v >> (8 * i)) & 0xff));
    v = s;
  }
  return v;
}

void write_header(const detail::ControlBlock* cb, std::byte* base) noexcept {
  WireHeader{cb->type_id, 0, cb->meta_size, cb->data_size}.encode(base);
}

}  // namespace

void WireHeader::encode(std::byte* out) const noexcept {
  put_le<std::uint32_t>(out, type_id);
  put_le<std::uint32_t>(out + 4, flags);
  put_le<std::uint64_t>(out + 8, meta_size);
  put_le<std::uint64_t>(out + 16, data_size);
}

WireHeader WireHeader::decode(const std::byte* in) noexcept {
  return WireHeader{get_le<std::uint32_t>(in), get_le<std::uint32_t>(in + 4), get_le<std::uint64_t>(in + 8),
                    get_le<std::uint64_t>(in + 16)};
}

Ldo::Ldo(const Ldo& o) noexcept : cb_(o.cb_), base_(o.base_) {
  if (cb_) detail::retain(cb_);
}

Ldo& Ldo::operator=(const Ldo& o) noexcept {
  if (o.cb_) detail::retain(o.cb_);
  if (cb_) detail::release(cb_);
  cb_ = o.cb_;
  base_ = o.base_;
  return *this;
}

void Ldo::reset() noexcept {
  // The handle is cleared first so every call below is a tail call: the
  // drop's cache-hit path then saves no registers.
  detail::ControlBlock* cb = cb_;
  cb_ = nullptr;
  base_ = nullptr;
  if (cb) detail::release(cb);
}

void Ldo::drop() noexcept {
  // The destructor's reset(): the handle dies, so nothing is cleared.
  detail::release(cb_);
}

std::uint32_t Ldo::use_count() const noexcept { return cb_ ? cb_->refs.load(std::memory_order_relaxed) : 0; }
bool Ldo::is_user_memory() const noexcept { return cb_ && cb_->kind == detail::BlockKind::user; }
std::uint32_t Ldo::type_id() const noexcept { return cb_ ? cb_->type_id : 0; }

void Ldo::set_type_id(std::uint32_t id) noexcept {
  if (!cb_) return;
  cb_->type_id = id;
  write_header(cb_, base_);
}

std::uint64_t Ldo::meta_size() const noexcept { return cb_ ? cb_->meta_size : 0; }
std::uint64_t Ldo::data_size() const noexcept { return cb_ ? cb_->data_size : 0; }
std::uint64_t Ldo::capacity() const noexcept { return cb_ ? cb_->capacity - kWireHeaderSize : 0; }

std::span<std::byte> Ldo::meta() const noexcept {
  if (!cb_) return {};
  return {base_ + kWireHeaderSize, static_cast<std::size_t>(cb_->meta_size)};
}

std::span<std::byte> Ldo::data() const noexcept {
  if (!cb_) return {};
  return {base_ + data_offset_for(cb_->meta_size), static_cast<std::size_t>(cb_->data_size)};
}

Status Ldo::resize(std::uint64_t new_data, std::uint64_t new_meta) noexcept {
  if (!cb_) return Status::invalid_argument;
  const std::uint64_t room = cb_->capacity - kWireHeaderSize;
  if (new_meta > room || new_data > room) return Status::capacity_exceeded;
  const std::uint64_t new_off = data_offset_for(new_meta);
  if (new_off - kWireHeaderSize > room - new_data) return Status::capacity_exceeded;
  const std::uint64_t old_off = data_offset_for(cb_->meta_size);
  if (new_off != old_off) {
    std::byte* b = base_;
    const std::uint64_t keep = new_data < cb_->data_size ? new_data : cb_->data_size;
    std::memmove(b + new_off, b + old_off, static_cast<std::size_t>(keep));
  }
  cb_->meta_size = new_meta;
  cb_->data_size = new_data;
  write_header(cb_, base_);
  return Status::ok;
}

Result<Ldo> Ldo::clone(Pool& pool) const noexcept {
  if (!cb_) return Status::invalid_argument;
  auto r = pool.allocate(LdoShape{cb_->data_size, cb_->meta_size, cb_->type_id, capacity()});
  if (!r) return r.status();
  std::memcpy(r->base(), base(), static_cast<std::size_t>(wire_size()));
  return r;
}

Result<Ldo> Ldo::clone() const noexcept {
  if (!cb_) return Status::invalid_argument;
  if (cb_->kind == detail::BlockKind::user) return Status::unsupported;
  detail::PoolCore* core = cb_->arena->pool();
  auto r = core->allocate(LdoShape{cb_->data_size, cb_->meta_size, cb_->type_id, capacity()});
  if (!r) return r.status();
  Ldo copy(*r, detail::base_of(*r));
  std::memcpy(copy.base(), base(), static_cast<std::size_t>(wire_size()));
  return copy;
}

Result<DomainRegion> Ldo::region(Domain& domain) const noexcept {
  if (!cb_) return Status::invalid_argument;
  std::byte* b = base_;
  auto fill = [&](const Registration& r) {
    DomainRegion d;
    d.descriptor = r.descriptor();
    d.local_key = r.local_key();
    d.remote_key = r.remote_key();
    d.remote_base = r.remote_address(b);
    d.mode = r.address_mode();
    d.access = r.access();
    d.registration = &r;
    return d;
  };
  if (cb_->kind != detail::BlockKind::user) {
    const Registration* r = detail::arena_registration(*cb_, domain);
    if (r == nullptr) return Status::unsupported;
    return fill(*r);
  }
  auto* ub = static_cast<detail::UserBlock*>(cb_);
  auto find = [&]() -> const Registration* {
    const std::uint32_t n = ub->registered.load(std::memory_order_acquire);
    for (std::uint32_t k = 0; k < n; ++k)
      if (ub->domains[k].load(std::memory_order_relaxed) == &domain) return &ub->registrations[k];
    return nullptr;
  };
  if (const Registration* r = find()) return fill(*r);
  // First network use with this domain: register exactly once, even when
  // several threads race here.
  std::lock_guard g(ub->register_mutex);
  if (const Registration* r = find()) return fill(*r);
  const std::uint32_t n = ub->registered.load(std::memory_order_relaxed);
  if (n == detail::UserBlock::kMaxDomains) return Status::unsupported;
  auto reg = domain.try_register(ub->memory.data(), ub->memory.size(), ub->access);
  if (!reg) return reg.status();
  ub->registrations[n] = std::move(*reg);
  ub->domains[n].store(&domain, std::memory_order_relaxed);
  ub->registered.store(n + 1, std::memory_order_release);
  return fill(ub->registrations[n]);
}

Ldo Ldo::wrap(UserMemory user) {
  if (user.memory.data() == nullptr || user.memory.size() < kWireHeaderSize) {
    throw Error(Status::invalid_argument, 0,
                "Ldo::wrap: memory must hold at least the " + std::to_string(kWireHeaderSize) + "-byte wire header");
  }
  const std::uint64_t room = user.memory.size() - kWireHeaderSize;
  if (user.meta_size > room || user.data_size > room ||
      data_offset_for(user.meta_size) - kWireHeaderSize > room - user.data_size) {
    throw Error(Status::capacity_exceeded, 0,
                "Ldo::wrap: meta " + std::to_string(user.meta_size) + " + data " + std::to_string(user.data_size) +
                    " bytes do not fit in " + std::to_string(user.memory.size()) + " bytes of user memory");
  }
  if (user.eager_domains.size() > detail::UserBlock::kMaxDomains) {
    throw Error(Status::invalid_argument, 0, "Ldo::wrap: too many eager domains");
  }
  auto* ub = new detail::UserBlock();
  ub->kind = detail::BlockKind::user;
  ub->refs.store(1, std::memory_order_relaxed);
  ub->capacity = user.memory.size();
  ub->type_id = user.type_id;
  ub->meta_size = user.meta_size;
  ub->data_size = user.data_size;
  ub->memory = user.memory;
  ub->access = user.access;
  Ldo ldo(ub, ub->memory.data());  // from here on, a throw releases the block (and runs no cleanup yet)
  write_header(ub, ub->memory.data());
  for (auto& d : user.eager_domains) {
    if (!d) throw Error(Status::invalid_argument, 0, "Ldo::wrap: null domain");
    const std::uint32_t n = ub->registered.load(std::memory_order_relaxed);
    ub->registrations[n] = d->register_memory(ub->memory.data(), ub->memory.size(), ub->access);
    ub->domains[n].store(d.get(), std::memory_order_relaxed);
    ub->registered.store(n + 1, std::memory_order_release);
  }
  // Only a fully built object takes over the cleanup: if wrap throws, the
  // caller still owns its memory.
  ub->cleanup = std::move(user.cleanup);
  return ldo;
}

}  // namespace regpool
