#include "platform/mapping.hpp"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "regpool_config.h"

#if REGPOOL_HAVE_NUMA
#include <numaif.h>
#endif

namespace regpool::platform {

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    reset();
    base_ = o.base_;
    size_ = o.size_;
    o.base_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void Mapping::reset() noexcept {
  if (base_) ::munmap(base_, size_);
  base_ = nullptr;
  size_ = 0;
}

namespace {

// hugetlbfs mappings: the kernel hands out whole huge pages from the
// reserved pool, naturally aligned, so no over-mapping and no THP advice.
// With `at` set the mapping replaces what lies there (MAP_FIXED): only ever
// the caller's own reservation.
void* map_huge(void* at, std::size_t size, std::size_t page_size, bool noreserve) noexcept {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;
  if (noreserve) flags |= MAP_NORESERVE;
  if (at) flags |= MAP_FIXED;
  // MAP_HUGE_SHIFT encodes log2(page size) so sizes other than the default
  // one can be asked for.
  flags |= std::countr_zero(page_size) << MAP_HUGE_SHIFT;
  return ::mmap(at, size, PROT_READ | PROT_WRITE, flags, -1, 0);
}

// Maps `keep` bytes starting on an `align` boundary (a power of two, at
// least a page): over-maps by the slack an aligned start may need and
// unmaps what lies before and after. The start, or nullptr.
std::byte* map_aligned(std::size_t keep, std::size_t align, int prot, int flags) noexcept {
  const std::size_t span = keep + (align - kPageSize);
  void* p = ::mmap(nullptr, span, prot, flags, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* raw = static_cast<std::byte*>(p);
  const auto at = reinterpret_cast<std::uintptr_t>(raw);
  auto* base = reinterpret_cast<std::byte*>((at + align - 1) & ~(align - 1));
  const auto head = static_cast<std::size_t>(base - raw);
  const std::size_t tail = span - head - keep;
  if (head) ::munmap(raw, head);
  if (tail) ::munmap(base + keep, tail);
  return base;
}

void* map_fixed(void* at, std::size_t size, bool noreserve) noexcept {
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | (noreserve ? MAP_NORESERVE : 0);
  return ::mmap(at, size, PROT_READ | PROT_WRITE, flags, -1, 0);
}

}  // namespace

Result<Mapping> Mapping::create(std::size_t size, const MapOptions& options) noexcept {
  if (size == 0) return Status::invalid_argument;
  if (options.huge_page_size) {
    const std::size_t hp = options.huge_page_size;
    if (!std::has_single_bit(hp) || hp < kPageSize) return Status::invalid_argument;
    if (size > SIZE_MAX - hp) return Status::invalid_argument;
    size = round_up(size, hp);
    void* p = map_huge(nullptr, size, hp, options.noreserve);
    if (p == MAP_FAILED) return errno == EINVAL ? Status::invalid_argument : Status::out_of_memory;
    return finish(static_cast<std::byte*>(p), size, options);
  }
  size = round_up(size, kPageSize);
  const bool align_huge = options.transparent_huge_pages && size >= kHugePageSize;
  // Started on a 2 MiB boundary; otherwise THP could back only its interior.
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (options.noreserve) flags |= MAP_NORESERVE;
  std::byte* base = map_aligned(size, align_huge ? kHugePageSize : kPageSize, PROT_READ | PROT_WRITE, flags);
  if (!base) return Status::out_of_memory;
  if (align_huge) ::madvise(base, size, MADV_HUGEPAGE);
  return finish(base, size, options);
}

std::size_t Mapping::mapped_size(std::size_t size, const MapOptions& options) noexcept {
  return round_up(size, options.huge_page_size ? options.huge_page_size : kPageSize);
}

Result<Mapping::Pair> Mapping::create_adjacent(std::size_t first_size, const MapOptions& first,
                                               std::size_t second_size, const MapOptions& second) noexcept {
  const std::size_t hp = first.huge_page_size;
  if (first_size == 0 || second_size == 0 || second.huge_page_size) return Status::invalid_argument;
  if (hp && (!std::has_single_bit(hp) || hp < kPageSize)) return Status::invalid_argument;
  // Bounds that keep every sum below from wrapping.
  if (first_size > SIZE_MAX / 4 || second_size > SIZE_MAX / 4 || hp > SIZE_MAX / 4) return Status::invalid_argument;
  const std::size_t size1 = mapped_size(first_size, first);
  const std::size_t size2 = round_up(second_size, kPageSize);
  const bool thp = !hp && first.transparent_huge_pages && size1 >= kHugePageSize;
  const std::size_t align = hp ? hp : thp ? kHugePageSize : kPageSize;
  // Address space for both, with slack to align the first and no memory
  // behind it; each part is then mapped over its share with MAP_FIXED,
  // which can only replace this reservation, so the two end up adjacent
  // whatever else the process maps meanwhile.
  std::byte* const base = map_aligned(size1 + size2, align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE);
  if (!base) return Status::out_of_memory;
  void* m = hp ? map_huge(base, size1, hp, first.noreserve) : map_fixed(base, size1, first.noreserve);
  if (m == MAP_FAILED) {
    const int err = errno;
    ::munmap(base, size1 + size2);
    return hp && err == EINVAL ? Status::invalid_argument : Status::out_of_memory;
  }
  if (map_fixed(base + size1, size2, second.noreserve) == MAP_FAILED) {
    ::munmap(base, size1 + size2);
    return Status::out_of_memory;
  }
  if (thp) ::madvise(base, size1, MADV_HUGEPAGE);
  if (second.transparent_huge_pages && size2 >= kHugePageSize) ::madvise(base + size1, size2, MADV_HUGEPAGE);
  auto one = finish(base, size1, first);  // unmaps its part on failure
  if (!one) {
    ::munmap(base + size1, size2);
    return one.status();
  }
  auto two = finish(base + size1, size2, second);
  if (!two) return two.status();  // `one` unmaps the first part as it goes
  return Pair{std::move(*one), std::move(*two)};
}

Result<Mapping> Mapping::finish(std::byte* base, std::size_t size, const MapOptions& options) noexcept {
#if REGPOOL_HAVE_NUMA
  if (options.numa_node >= 0) {
    unsigned long mask[16] = {};
    const auto node = static_cast<unsigned>(options.numa_node);
    if (node >= sizeof(mask) * 8) {
      ::munmap(base, size);
      return Status::invalid_argument;
    }
    mask[node / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
    if (::mbind(base, size, MPOL_BIND, mask, sizeof(mask) * 8, 0) != 0) {
      ::munmap(base, size);
      return Status::invalid_argument;
    }
  }
#else
  if (options.numa_node >= 0) {
    ::munmap(base, size);
    return Status::unsupported;
  }
#endif
  if (options.prefault) {
    for (std::size_t off = 0; off < size; off += kPageSize) base[off] = std::byte{0};
  }
  Mapping m;
  m.base_ = base;
  m.size_ = size;
  return m;
}

namespace {

std::uint64_t read_u64(const std::string& path, bool* ok) {
  std::ifstream f(path);
  std::uint64_t v = 0;
  if (!(f >> v)) {
    *ok = false;
    return 0;
  }
  return v;
}

}  // namespace

HugePageInfo huge_page_info(std::size_t page_size) {
  HugePageInfo info;
  const std::string dir = "/sys/kernel/mm/hugepages/hugepages-" + std::to_string(page_size / 1024) + "kB/";
  bool ok = true;
  info.reserved = read_u64(dir + "nr_hugepages", &ok);
  info.free = read_u64(dir + "free_hugepages", &ok);
  info.supported = ok && page_size >= kPageSize && std::has_single_bit(page_size);
  return info;
}

std::string huge_page_advice(std::size_t page_size, std::size_t requested) {
  const auto info = huge_page_info(page_size);
  const std::string kib = std::to_string(page_size / 1024);
  const std::uint64_t need = (requested + page_size - 1) / page_size;
  std::string s = "cannot map " + std::to_string(requested) + " bytes in hugetlbfs pages of " + kib + " KiB (" +
                  std::to_string(need) + " pages): ";
  if (!info.supported) return s + "the kernel offers no such page size (see /sys/kernel/mm/hugepages)";
  s += std::to_string(info.reserved) + " reserved, " + std::to_string(info.free) +
       " free; reserve more as root with 'echo N > /sys/kernel/mm/hugepages/hugepages-" + kib +
       "kB/nr_hugepages' (or sysctl vm.nr_hugepages for the default size, hugepages= on the kernel command "
       "line to reserve at boot), or leave PoolConfig::huge_page_size at 0";
  return s;
}

std::uint64_t memlock_limit() noexcept {
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 0;
  return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<std::uint64_t>(rl.rlim_cur);
}

bool can_exceed_memlock() noexcept {
  // CAP_IPC_LOCK is bit 14 of the effective set.
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      const auto caps = std::stoull(line.substr(7), nullptr, 16);
      return (caps >> 14) & 1U;
    }
  }
  return false;
}

std::string memlock_advice(std::size_t requested, int err) {
  const auto limit = memlock_limit();
  std::string s = "cannot pin " + std::to_string(requested) + " bytes (" + std::strerror(err) + "): RLIMIT_MEMLOCK is ";
  s += limit == UINT64_MAX ? std::string("unlimited") : std::to_string(limit) + " bytes";
  s += can_exceed_memlock() ? " and the process has CAP_IPC_LOCK" : " and the process lacks CAP_IPC_LOCK";
  s += "; raise it with 'ulimit -l unlimited' (or a 'memlock' line in /etc/security/limits.conf, "
       "LimitMEMLOCK= for systemd services), or grant CAP_IPC_LOCK";
  return s;
}

}  // namespace regpool::platform
