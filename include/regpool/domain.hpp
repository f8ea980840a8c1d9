#pragma once
// Layer 2: registration. A Domain registers byte ranges with one network
// domain (a libfabric domain, a verbs protection domain, or the host itself)
// and hands back an RAII Registration. The allocator is written against this
// interface only, never against a provider, so it can be tested with a fake
// domain and used with several real ones at once (the eRPC lesson).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "regpool/error.hpp"

namespace regpool {

// Access rights of a registration. Local access is implied by every backend
// that needs it; remote rights are what a peer's key may do.
enum class Access : std::uint32_t {
  none = 0,
  local = 1u << 0,
  remote_read = 1u << 1,
  remote_write = 1u << 2,
  remote_atomic = 1u << 3,
  all = local | remote_read | remote_write | remote_atomic,
};
constexpr Access operator|(Access a, Access b) noexcept {
  return static_cast<Access>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
constexpr Access operator&(Access a, Access b) noexcept {
  return static_cast<Access>(static_cast<std::uint32_t>(a) & static_cast<std::uint32_t>(b));
}
// True when every right in `wanted` is granted by `granted`.
constexpr bool grants(Access granted, Access wanted) noexcept { return (granted & wanted) == wanted; }

// How a peer names a byte of a registration: by its virtual address in the
// owner's process (verbs, FI_MR_VIRT_ADDR) or by its offset from the start of
// the registration (libfabric providers without FI_MR_VIRT_ADDR).
enum class AddressMode : std::uint8_t { virtual_address = 0, offset = 1 };

class Domain;

// One registered byte range. Move-only; the destructor deregisters.
// Thread-safety: a const Registration may be read from any thread; moving or
// destroying it must not race with readers.
class REGPOOL_API Registration {
 public:
  Registration() noexcept = default;
  Registration(Registration&& o) noexcept { *this = std::move(o); }
  Registration& operator=(Registration&& o) noexcept;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  ~Registration() { reset(); }

  explicit operator bool() const noexcept { return domain_ != nullptr; }
  // Deregister now (idempotent).
  void reset() noexcept;

  Domain* domain() const noexcept { return domain_.get(); }
  std::byte* base() const noexcept { return base_; }
  std::size_t length() const noexcept { return length_; }
  Access access() const noexcept { return access_; }
  // Local descriptor for data-path calls (libfabric: fi_mr_desc, handed out
  // even without FI_MR_LOCAL since some providers use it anyway; nullptr for
  // backends without descriptors).
  void* descriptor() const noexcept { return desc_; }
  // Verbs lkey; 0 elsewhere.
  std::uint32_t local_key() const noexcept { return lkey_; }
  std::uint64_t remote_key() const noexcept { return rkey_; }
  AddressMode address_mode() const noexcept { return mode_; }
  // The address a peer must use for byte `p` of this registration.
  std::uint64_t remote_address(const void* p) const noexcept {
    auto a = reinterpret_cast<std::uintptr_t>(p);
    return mode_ == AddressMode::virtual_address ? a : a - reinterpret_cast<std::uintptr_t>(base_);
  }
  bool contains(const void* p, std::size_t n) const noexcept {
    auto a = reinterpret_cast<std::uintptr_t>(p);
    auto b = reinterpret_cast<std::uintptr_t>(base_);
    return a >= b && n <= length_ && a - b <= length_ - n;
  }
  // Native handle (fid_mr*, ibv_mr*; nullptr for the host domain): an
  // escape hatch for code that calls the provider directly, like the native
  // handles of FabricDomain and VerbsDomain; owned by this registration.
  void* native() const noexcept { return native_; }

 private:
  friend class Domain;
  std::shared_ptr<Domain> domain_;  // keeps the domain alive while registered
  void* native_ = nullptr;
  void* desc_ = nullptr;
  std::byte* base_ = nullptr;
  std::size_t length_ = 0;
  std::uint64_t rkey_ = 0;
  std::uint32_t lkey_ = 0;
  Access access_ = Access::none;
  AddressMode mode_ = AddressMode::virtual_address;
};

// Counters kept by every domain. Times are wall-clock nanoseconds spent
// inside the backend's register/deregister calls.
struct DomainStats {
  std::string name;
  std::uint64_t registrations = 0;
  std::uint64_t deregistrations = 0;
  std::uint64_t failed_registrations = 0;
  std::uint64_t live_registrations = 0;
  std::uint64_t bytes_registered_total = 0;
  std::uint64_t bytes_registered_live = 0;
  std::uint64_t register_ns = 0;
  std::uint64_t deregister_ns = 0;
};

// A registration backend. Domains are shared: create them with
// std::make_shared (or the backend's open()) because every Registration keeps
// its domain alive. Thread-safety: register_memory / try_register / stats may
// be called from any thread concurrently.
class REGPOOL_API Domain : public std::enable_shared_from_this<Domain> {
 public:
  virtual ~Domain() = default;
  Domain(const Domain&) = delete;
  Domain& operator=(const Domain&) = delete;

  // Setup path: throws Error (with the backend's code and message) on failure.
  Registration register_memory(void* addr, std::size_t length, Access access);
  // Data path (lazy registration of user LDOs): never throws.
  Result<Registration> try_register(void* addr, std::size_t length, Access access) noexcept;

  DomainStats stats() const;

  // e.g. "host", "fabric:shm", "fabric:tcp;ofi_rxm", "verbs:rxe0".
  virtual std::string name() const = 0;
  // False when peers can never address this domain's memory (host pinning).
  virtual bool remote_capable() const noexcept { return true; }
  // False when registration is bookkeeping only and pins nothing (libfabric
  // software providers): tools say so instead of implying pinning happened.
  virtual bool pins_memory() const noexcept { return true; }
  // Which addressing mode this domain's registrations use.
  virtual AddressMode address_mode() const noexcept { return AddressMode::virtual_address; }

 protected:
  Domain() = default;

  struct Native {
    void* handle = nullptr;
    void* desc = nullptr;
    std::uint64_t rkey = 0;
    std::uint32_t lkey = 0;
    AddressMode mode = AddressMode::virtual_address;
  };
  // Backends implement these two. do_register throws Error on failure.
  virtual Native do_register(void* addr, std::size_t length, Access access) = 0;
  virtual void do_deregister(const Native& native, void* addr, std::size_t length) noexcept = 0;

 private:
  friend class Registration;
  void deregister(Registration& r) noexcept;

  std::atomic<std::uint64_t> registrations_{0};
  std::atomic<std::uint64_t> deregistrations_{0};
  std::atomic<std::uint64_t> failed_{0};
  std::atomic<std::uint64_t> bytes_total_{0};
  std::atomic<std::uint64_t> bytes_live_{0};
  std::atomic<std::uint64_t> register_ns_{0};
  std::atomic<std::uint64_t> deregister_ns_{0};
};

}  // namespace regpool
