#pragma once
// Layer 5: LDOs (local data objects), the handles users hold.
//
// Registered bytes of an object, all covered by one registration per domain:
//
//   offset 0              : wire header, kWireHeaderSize bytes, little-endian
//                           u32 type_id | u32 flags (0) | u64 meta_size | u64 data_size
//   offset kWireHeaderSize: meta section (meta_size bytes, padded to 8)
//   data_offset()         : data section (data_size bytes)
//
// The meta section is padded to 8 bytes so the data section is always
// 8-byte aligned: remote atomics target aligned words in it.
//
// Control blocks (refcount, owning arena, capacity, cleanup) live outside
// registered memory, so no peer holding a key can corrupt them.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "regpool/domain.hpp"
#include "regpool/error.hpp"

namespace regpool {

namespace detail {
struct ControlBlock;
struct LdoAccess;  // the library's own way in (lib/pool/access.hpp)
}
class Pool;
class Ldo;

// A failed Result<Ldo> holds an empty handle, so destroying a Result<Ldo>
// is the handle's own null test (error.hpp, kResultKeepsEmpty).
namespace detail {
template <>
inline constexpr bool kResultKeepsEmpty<Ldo> = true;
}

inline constexpr std::size_t kWireHeaderSize = 24;

// Decoded wire header. encode/decode do the little-endian conversion so the
// header means the same on every host.
struct REGPOOL_API WireHeader {
  std::uint32_t type_id = 0;
  std::uint32_t flags = 0;
  std::uint64_t meta_size = 0;
  std::uint64_t data_size = 0;

  void encode(std::byte* out) const noexcept;
  static WireHeader decode(const std::byte* in) noexcept;
};

// Where the data section starts for a given meta size.
constexpr std::uint64_t data_offset_for(std::uint64_t meta_size) noexcept {
  return kWireHeaderSize + ((meta_size + 7) & ~std::uint64_t{7});
}

// Whether a new object's bytes are cleared (see PoolConfig::zero_on_allocate
// for what exactly is covered and how).
enum class Zeroing : std::uint8_t {
  pool_default = 0,  // as PoolConfig::zero_on_allocate says
  zeroed,            // every byte after the wire header reads as zero
  uninitialized,     // may hold an earlier object's bytes (the fast path)
};

// What to allocate. capacity (0 = exact) reserves room for later resize():
// it bounds data_offset_for(meta_size) + data_size - kWireHeaderSize, i.e.
// padded meta plus data. zeroing overrides the pool's default for this one
// allocation, in either direction.
struct LdoShape {
  std::uint64_t data_size = 0;
  std::uint64_t meta_size = 0;
  std::uint32_t type_id = 0;
  std::uint64_t capacity = 0;
  Zeroing zeroing = Zeroing::pool_default;
};

// What a transport needs to use an object with one domain.
struct DomainRegion {
  void* descriptor = nullptr;       // fi_mr_desc, or nullptr
  std::uint32_t local_key = 0;      // verbs lkey
  std::uint64_t remote_key = 0;
  std::uint64_t remote_base = 0;    // peer-side address of byte 0 of the object
  AddressMode mode = AddressMode::virtual_address;
  Access access = Access::none;
  const Registration* registration = nullptr;  // owned by the arena / user block
};

// Application-owned memory wrapped as an LDO (see Ldo::wrap).
struct UserMemory {
  // Whole object: the first kWireHeaderSize bytes receive the wire header,
  // then meta and data sections follow as for pool objects.
  std::span<std::byte> memory;
  std::uint64_t data_size = 0;
  std::uint64_t meta_size = 0;
  std::uint32_t type_id = 0;
  // Runs once on the last drop, after every registration of the memory has
  // been undone. May be empty.
  std::function<void(std::span<std::byte>)> cleanup;
  // Registered now (throws on failure); any other domain is registered lazily
  // on first network use, exactly once even when threads race.
  std::vector<std::shared_ptr<Domain>> eager_domains;
  Access access = Access::all;
};

// A reference-counted handle to an LDO. Copying bumps an atomic refcount;
// the last drop returns the bytes to their pool (or runs the user cleanup).
// Ownership: each non-empty handle owns one reference; a moved-from or
// reset handle is empty (base() == nullptr). Thread-safety: distinct
// handles to one object may be copied and dropped from any threads
// concurrently; the object's bytes are shared, so concurrent writes to
// them are the application's to order. One handle object must not be
// mutated from two threads at once (like shared_ptr).
//
// The handle is two pointers: the object's control block (opaque, inside
// the library) and the address of its bytes, which never changes for the
// object's life, so base() is a read of the handle, not a call into the
// library. Everything that can change (section sizes, type id, refcount)
// stays in the control block, shared by all handles of the object.
class REGPOOL_API Ldo {
 public:
  Ldo() noexcept = default;
  Ldo(const Ldo& o) noexcept;
  Ldo(Ldo&& o) noexcept : cb_(o.cb_), base_(o.base_) {
    o.cb_ = nullptr;
    o.base_ = nullptr;
  }
  Ldo& operator=(const Ldo& o) noexcept;
  // Inline: messaging moves handles through its rings several times per
  // message, mostly into empty handles, which then costs no call.
  Ldo& operator=(Ldo&& o) noexcept {
    if (this != &o) {
      Ldo old(std::move(*this));  // dropped on return, after o is taken
      cb_ = o.cb_;
      base_ = o.base_;
      o.cb_ = nullptr;
      o.base_ = nullptr;
    }
    return *this;
  }
  ~Ldo() {
    if (cb_) drop();
  }

  // Wrap application memory. Throws Error when the memory cannot hold the
  // header and sections or an eager registration fails (setup path).
  static Ldo wrap(UserMemory user);

  explicit operator bool() const noexcept { return cb_ != nullptr; }
  REGPOOL_HOT void reset() noexcept;
  std::uint32_t use_count() const noexcept;
  bool is_user_memory() const noexcept;

  std::uint32_t type_id() const noexcept;
  void set_type_id(std::uint32_t id) noexcept;
  std::uint64_t meta_size() const noexcept;
  std::uint64_t data_size() const noexcept;
  std::uint64_t data_offset() const noexcept { return data_offset_for(meta_size()); }
  // Room for padded meta + data (what resize may grow into).
  std::uint64_t capacity() const noexcept;
  // Header + padded meta + data: the bytes a transfer of the whole object moves.
  std::uint64_t wire_size() const noexcept { return data_offset() + data_size(); }

  std::byte* base() const noexcept { return base_; }  // the wire header; nullptr if empty
  std::span<std::byte> meta() const noexcept;
  REGPOOL_HOT std::span<std::byte> data() const noexcept;
  std::span<std::byte> wire() const noexcept { return {base(), static_cast<std::size_t>(wire_size())}; }

  // Change section sizes within capacity. Data bytes (up to the smaller
  // size) are preserved even when the meta size moves the data section.
  Status resize(std::uint64_t data_size, std::uint64_t meta_size) noexcept;
  Status resize_data(std::uint64_t data_size) noexcept { return resize(data_size, meta_size()); }

  // Deep copy (header, meta, data) into a new object from `pool`.
  Result<Ldo> clone(Pool& pool) const noexcept;
  // Deep copy into the pool this object came from (user LDOs: unsupported).
  Result<Ldo> clone() const noexcept;

  // Registration with `domain`: for pool objects, the arena's; for user
  // objects, registers now if this is the first use (exactly once). Returns
  // Status::unsupported when the pool does not serve that domain.
  Result<DomainRegion> region(Domain& domain) const noexcept;

 private:
  // Library-internal (reached through detail::LdoAccess): adopt a reference,
  // look at or give up the control block.
  // Hidden: a build without inlining (-O0) emits them out of line, and
  // they name an internal type (api-exports-symbols).
  friend struct detail::LdoAccess;
  REGPOOL_LOCAL Ldo(detail::ControlBlock* adopted, std::byte* base) noexcept : cb_(adopted), base_(base) {}
  // Drops the reference of a non-empty handle that is going away (reset()
  // without clearing it).
  REGPOOL_HOT void drop() noexcept;
  REGPOOL_LOCAL detail::ControlBlock* control_block() const noexcept { return cb_; }
  REGPOOL_LOCAL detail::ControlBlock* release_control_block() noexcept {
    auto* c = cb_;
    cb_ = nullptr;
    base_ = nullptr;
    return c;
  }

  detail::ControlBlock* cb_ = nullptr;
  std::byte* base_ = nullptr;  // the object's first byte (its wire header); null iff cb_ is
};

}  // namespace regpool
