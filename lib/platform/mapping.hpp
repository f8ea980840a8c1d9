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
  // hugetlbfs page size in bytes (MAP_HUGETLB | MAP_HUGE_<size>); 0 = off.
  // The size is rounded up to it; transparent_huge_pages is then ignored.
  // Fails with Status::out_of_memory when the reserved pages run out (the
  // kernel says ENOMEM) and Status::invalid_argument for a size that is not
  // a power of two of at least one page.
  std::size_t huge_page_size = 0;
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
  // Two mappings back to back: the first placed and aligned as create()
  // would place it, the second starting exactly where the first ends. For
  // a table that must lie at a known distance from the memory it
  // describes, whatever the address the kernel picks. The second may not
  // use hugetlbfs pages (Status::invalid_argument). Each is unmapped on its
  // own, as two create() results would be.
  struct Pair;
  static Result<Pair> create_adjacent(std::size_t first_size, const MapOptions& first, std::size_t second_size,
                                      const MapOptions& second) noexcept;
  // The bytes create() maps for a request of `size` with these options.
  static std::size_t mapped_size(std::size_t size, const MapOptions& options) noexcept;

  void reset() noexcept;
  std::byte* data() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }
  explicit operator bool() const noexcept { return base_ != nullptr; }

 private:
  // NUMA binding and prefaulting of a fresh mapping; unmaps it on failure.
  static Result<Mapping> finish(std::byte* base, std::size_t size, const MapOptions& options) noexcept;

  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
};

struct Mapping::Pair {
  Mapping first;
  Mapping second;
};

// hugetlbfs pages of one size, from /sys/kernel/mm/hugepages.
struct HugePageInfo {
  bool supported = false;     // the kernel offers this page size
  std::uint64_t reserved = 0; // nr_hugepages
  std::uint64_t free = 0;     // free_hugepages
};
HugePageInfo huge_page_info(std::size_t page_size);
// A sentence naming the page size, what is reserved and free, and the fix.
std::string huge_page_advice(std::size_t page_size, std::size_t requested);

// Current soft RLIMIT_MEMLOCK in bytes (UINT64_MAX when unlimited).
std::uint64_t memlock_limit() noexcept;
// Whether this process may lock beyond the limit (CAP_IPC_LOCK).
bool can_exceed_memlock() noexcept;
// A sentence naming the limit, the request and the fix.
std::string memlock_advice(std::size_t requested, int err);

}  // namespace regpool::platform
