#pragma once
// Layer 1: page-granular mappings. Knows nothing of networks.

#include <cstddef>
#include <cstdint>
#include <string>

#include "regpool/error.hpp"

namespace regpool::platform {

inline constexpr std::size_t kPageSize = 4096;
inline constexpr std::size_t kHugePageSize = std::size_t{2} << 20;

constexpr std::size_t round_up(std::size_t n, std::size_t align) noexcept { return (n + align - 1) / align * align; }

struct MapOptions {
  bool transparent_huge_pages = true;
  int numa_node = -1;
  bool prefault = false;
  // Side tables: reserve address space, let pages appear on first touch.
  bool noreserve = false;
};

// An anonymous private mapping, page aligned (2 MiB aligned when THP is
// requested, so huge pages can actually back it). Move-only.
class Mapping {
 public:
  Mapping() noexcept = default;
  Mapping(Mapping&& o) noexcept : base_(o.base_), size_(o.size_) { o.base_ = nullptr; o.size_ = 0; }
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { reset(); }

  // Data-path friendly: returns Status::out_of_memory instead of throwing.
  static Result<Mapping> create(std::size_t size, const MapOptions& options) noexcept;

  void reset() noexcept;
  std::byte* data() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }
  explicit operator bool() const noexcept { return base_ != nullptr; }

 private:
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
};

// Current soft RLIMIT_MEMLOCK in bytes (UINT64_MAX when unlimited).
std::uint64_t memlock_limit() noexcept;
// Whether this process may lock beyond the limit (CAP_IPC_LOCK).
bool can_exceed_memlock() noexcept;
// A sentence naming the limit, the request and the fix.
std::string memlock_advice(std::size_t requested, int err);

}  // namespace regpool::platform
