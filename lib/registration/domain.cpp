#include <chrono>

#include "regpool/domain.hpp"

namespace regpool {
namespace {

std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

}  // namespace

Registration& Registration::operator=(Registration&& o) noexcept {
  if (this != &o) {
    reset();
    domain_ = std::move(o.domain_);
    native_ = o.native_;
    desc_ = o.desc_;
    base_ = o.base_;
    length_ = o.length_;
    rkey_ = o.rkey_;
    lkey_ = o.lkey_;
    access_ = o.access_;
    mode_ = o.mode_;
    o.domain_.reset();
    o.native_ = o.desc_ = nullptr;
    o.base_ = nullptr;
    o.length_ = 0;
  }
  return *this;
}

void Registration::reset() noexcept {
  if (domain_) {
    domain_->deregister(*this);
    domain_.reset();
  }
}

Registration Domain::register_memory(void* addr, std::size_t length, Access access) {
  // Registrations keep their domain alive; a domain not owned by a
  // shared_ptr could vanish under them, so refuse it at setup time.
  std::shared_ptr<Domain> self = weak_from_this().lock();
  if (!self) {
    throw Error(Status::invalid_argument, 0,
                "regpool: domain '" + name() + "' must be owned by std::shared_ptr (use make_shared or open())");
  }
  const auto t0 = now_ns();
  Native n;
  try {
    n = do_register(addr, length, access);
  } catch (...) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
  register_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
  registrations_.fetch_add(1, std::memory_order_relaxed);
  bytes_total_.fetch_add(length, std::memory_order_relaxed);
  bytes_live_.fetch_add(length, std::memory_order_relaxed);

  Registration r;
  r.domain_ = std::move(self);
  r.native_ = n.handle;
  r.desc_ = n.desc;
  r.base_ = static_cast<std::byte*>(addr);
  r.length_ = length;
  r.rkey_ = n.rkey;
  r.lkey_ = n.lkey;
  r.access_ = access;
  r.mode_ = n.mode;
  return r;
}

Result<Registration> Domain::try_register(void* addr, std::size_t length, Access access) noexcept {
  try {
    return register_memory(addr, length, access);
  } catch (const Error& e) {
    return e.status();
  } catch (...) {
    return Status::registration_failed;
  }
}

void Domain::deregister(Registration& r) noexcept {
  Native n;
  n.handle = r.native_;
  n.desc = r.desc_;
  n.rkey = r.rkey_;
  n.lkey = r.lkey_;
  n.mode = r.mode_;
  const auto t0 = now_ns();
  do_deregister(n, r.base_, r.length_);
  deregister_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
  deregistrations_.fetch_add(1, std::memory_order_relaxed);
  bytes_live_.fetch_sub(r.length_, std::memory_order_relaxed);
}

DomainStats Domain::stats() const {
  DomainStats s;
  s.name = name();
  s.registrations = registrations_.load(std::memory_order_relaxed);
  s.deregistrations = deregistrations_.load(std::memory_order_relaxed);
  s.failed_registrations = failed_.load(std::memory_order_relaxed);
  s.live_registrations = s.registrations - s.deregistrations;
  s.bytes_registered_total = bytes_total_.load(std::memory_order_relaxed);
  s.bytes_registered_live = bytes_live_.load(std::memory_order_relaxed);
  s.register_ns = register_ns_.load(std::memory_order_relaxed);
  s.deregister_ns = deregister_ns_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace regpool
