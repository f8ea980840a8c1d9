#pragma once
// Control blocks: everything the library must be able to trust about an
// object. They live in unregistered side mappings (pool objects) or on the
// heap (user objects), never in registered memory: a peer holding a key can
// scribble over an object's bytes, including its wire header, but never over
// its refcount, its sizes or the allocator's free lists (Lunasa kept these
// inside remotely writable memory).

#include <array>
#include <atomic>
#include <bit>
#include <cstring>
#include <boost/intrusive/list.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <type_traits>

#include "regpool/domain.hpp"
#include "regpool/ldo.hpp"

namespace regpool::detail {

namespace bi = boost::intrusive;

class Arena;

enum class BlockKind : std::uint8_t { slab_slot, span, user };

using FreeHook = bi::list_member_hook<bi::link_mode<bi::normal_link>>;

struct alignas(64) ControlBlock {
  // References held by handles. A pool block keeps 1 while it is free (a
  // sole owner's drop does not write it; a shared object's last drop puts
  // the 1 back), so allocation from a thread cache need not write it.
  std::atomic<std::uint32_t> refs{0};
  BlockKind kind = BlockKind::slab_slot;
  std::uint8_t size_class = 0;
  // Slab slots: kFreshSlot while the slot has never been handed out since
  // its slab was carved from pages no object had used (so its bytes are
  // still the kernel's zeros); cleared by every drop of a slot (so an
  // allocation, which would have to test it, never writes it).
  std::uint16_t flags = 0;
  std::uint32_t span_page = 0;  // first page of the slab or span holding it
  std::uint32_t type_id = 0;
  std::uint64_t capacity = 0;   // bytes from the header on that the object owns
  // Authoritative section sizes (the wire header is only their image).
  std::uint64_t meta_size = 0;
  std::uint64_t data_size = 0;
  Arena* arena = nullptr;       // nullptr for user objects
  FreeHook hook;                // free lists: central, per-thread
};
static_assert(sizeof(ControlBlock) == 64, "one cache line per control block");

inline constexpr std::uint16_t kFreshSlot = 1;
// Spans: small enough for a thread's span cache (kSpanCacheMaxObject) and
// not in a dedicated arena, both fixed for the span's life; set when the
// span is carved, so the drop need not look at capacity or arena.
inline constexpr std::uint16_t kCacheableSpan = 2;

// kind, size_class and flags as one word, read with one load: on
// little-endian hosts kind is its low byte, size_class the next, flags the
// upper half. A used slab slot's word has kind slab_slot (0) and flags 0,
// i.e. (word & kKindWordSlotMask) == 0; a cacheable span's word is
// kKindWordCacheableSpan.
static_assert(std::is_standard_layout_v<ControlBlock>);
static_assert(offsetof(ControlBlock, size_class) == offsetof(ControlBlock, kind) + 1 &&
              offsetof(ControlBlock, flags) == offsetof(ControlBlock, kind) + 2);
static_assert(static_cast<std::uint8_t>(BlockKind::slab_slot) == 0);
inline constexpr std::uint32_t kKindWordSlotMask = 0xffff00ffu;
// The word of a span with kCacheableSpan (a span's size_class is 0).
inline constexpr std::uint32_t kKindWordCacheableSpan =
    static_cast<std::uint32_t>(BlockKind::span) | std::uint32_t{kCacheableSpan} << 16;
inline std::uint32_t kind_word(const ControlBlock* cb) noexcept {
  std::uint32_t w;
  std::memcpy(&w, reinterpret_cast<const std::byte*>(cb) + offsetof(ControlBlock, kind), sizeof w);
  return w;
}

using FreeList = bi::list<ControlBlock, bi::member_hook<ControlBlock, FreeHook, &ControlBlock::hook>,
                          bi::constant_time_size<true>>;

// Application memory wrapped as an LDO. Registrations are made lazily (or
// eagerly at wrap time), at most once per domain, and undone before cleanup.
struct UserBlock : ControlBlock {
  static constexpr std::size_t kMaxDomains = 8;
  std::span<std::byte> memory;
  Access access = Access::all;
  std::function<void(std::span<std::byte>)> cleanup;
  std::mutex register_mutex;  // serialises first registrations only
  std::atomic<std::uint32_t> registered{0};
  std::array<std::atomic<Domain*>, kMaxDomains> domains{};
  std::array<Registration, kMaxDomains> registrations;
};

// Where the object's wire header lives (defined inline in arena.hpp).
inline std::byte* base_of(const ControlBlock* cb) noexcept;


// The wire header, written on every allocation: on little-endian hosts a
// plain copy of the fields (WireHeader::encode is the portable spelling).
inline void write_wire_header(std::byte* out, std::uint32_t type_id, std::uint64_t meta_size,
                              std::uint64_t data_size) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    const std::uint32_t words[2] = {type_id, 0};
    std::memcpy(out, words, sizeof words);
    std::memcpy(out + 8, &meta_size, 8);
    std::memcpy(out + 16, &data_size, 8);
  } else {
    WireHeader{type_id, 0, meta_size, data_size}.encode(out);
  }
}

inline void retain(ControlBlock* cb) noexcept { cb->refs.fetch_add(1, std::memory_order_relaxed); }

// Dropping a reference is Ldo's (lib/pool/ldo.cpp): the drop's fast path
// lives there, inlined into the handle's operations.

}  // namespace regpool::detail
