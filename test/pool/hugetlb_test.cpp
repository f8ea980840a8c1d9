// hugetlbfs-backed arenas (PoolConfig::huge_page_size).
//
// Always checked: a page size the kernel does not offer is refused at setup
// with Status::unsupported, and with no free huge pages the pool
// constructor throws Status::out_of_memory with a message that says what is
// reserved and how to reserve more.
//
// Then, to use real huge pages, the test reserves a few itself through
// /proc/sys/vm/nr_hugepages (root only) and restores the previous value
// afterwards, whatever happens. When it may not (not root, read-only
// /proc/sys, or the kernel cannot find contiguous memory) it exits 77 (SKIP)
// with the reason, after the checks above.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "platform/mapping.hpp"
#include "regpool/pool.hpp"
#include "support/fake_domain.hpp"

using namespace regpool;

namespace {

constexpr int kSkip = 77;
constexpr std::size_t kHuge = std::size_t{2} << 20;
constexpr const char* kNrPath = "/proc/sys/vm/nr_hugepages";
constexpr const char* kFreePath = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";

int failures = 0;

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                          \
    }                                                                      \
  } while (0)

bool read_u64(const char* path, std::uint64_t* v) {
  std::ifstream f(path);
  return static_cast<bool>(f >> *v);
}

bool write_u64(const char* path, std::uint64_t v) {
  std::ofstream f(path);
  f << v << "\n";
  f.flush();
  return static_cast<bool>(f);
}

bool contains(const std::string& s, const std::string& what) {
  if (s.find(what) != std::string::npos) return true;
  std::fprintf(stderr, "message lacks '%s': %s\n", what.c_str(), s.c_str());
  return false;
}

PoolConfig huge_config(std::size_t arena) {
  PoolConfig c;
  c.name = "huge";
  c.arena_size = arena;
  c.huge_page_size = kHuge;
  c.thread_cache = false;
  return c;
}

// Restores vm.nr_hugepages on every exit path once it was changed.
struct NrGuard {
  std::uint64_t original = 0;
  bool changed = false;
  ~NrGuard() {
    if (changed && !write_u64(kNrPath, original))
      std::fprintf(stderr, "could not restore %s to %llu\n", kNrPath, static_cast<unsigned long long>(original));
  }
};

void check_refusals() {
  auto d = std::make_shared<test::FakeDomain>();
  // 3 MiB is no page size at all; 1 GiB pages exist on x86-64 only when
  // the CPU has pdpe1gb and sysfs lists them, so use a size no kernel has.
  PoolConfig c = huge_config(4 << 20);
  c.huge_page_size = std::size_t{3} << 20;
  try {
    Pool p({d}, c);
    CHECK(!"a 3 MiB huge page size was accepted");
  } catch (const Error& e) {
    CHECK(e.status() == Status::unsupported);
    CHECK(contains(e.what(), "huge_page_size"));
  }
  std::uint64_t free_pages = 0;
  if (!read_u64(kFreePath, &free_pages)) {
    std::printf("no 2 MiB hugetlbfs pool in sysfs: refusal of missing pages not checked\n");
    return;
  }
  // Ask for more pages than are free: the constructor must say why.
  const std::size_t arena = static_cast<std::size_t>(free_pages + 1) * kHuge;
  try {
    Pool p({d}, huge_config(arena));
    CHECK(!"a pool larger than the free huge pages was created");
  } catch (const Error& e) {
    CHECK(e.status() == Status::out_of_memory);
    CHECK(contains(e.what(), "reserved"));
    CHECK(contains(e.what(), "nr_hugepages"));
  }
  // Nothing registered for the failed arena.
  CHECK(d->ranges().empty());
}

int run_with_pages(NrGuard& guard) {
  if (::geteuid() != 0) {
    std::printf("SKIP: not root, cannot reserve huge pages through %s\n", kNrPath);
    return kSkip;
  }
  std::uint64_t free_before = 0;
  if (!read_u64(kNrPath, &guard.original) || !read_u64(kFreePath, &free_before)) {
    std::printf("SKIP: cannot read %s / %s\n", kNrPath, kFreePath);
    return kSkip;
  }
  constexpr std::uint64_t kWant = 4;  // 8 MiB: two arenas of two pages
  if (!write_u64(kNrPath, guard.original + kWant)) {
    std::printf("SKIP: cannot write %s: %s\n", kNrPath, std::strerror(errno));
    return kSkip;
  }
  guard.changed = true;
  std::uint64_t free_now = 0;
  if (!read_u64(kFreePath, &free_now) || free_now < free_before + kWant) {
    std::printf("SKIP: the kernel reserved only %llu of %llu huge pages (memory too fragmented)\n",
                static_cast<unsigned long long>(free_now - free_before), static_cast<unsigned long long>(kWant));
    return kSkip;
  }
  std::printf("reserved %llu huge pages of 2 MiB (%llu free)\n", static_cast<unsigned long long>(kWant),
              static_cast<unsigned long long>(free_now));

  auto d = std::make_shared<test::FakeDomain>();
  {
    // 3 MiB rounds up to two huge pages.
    Pool pool({d}, huge_config(std::size_t{3} << 20));
    CHECK(pool.config().arena_size == 2 * kHuge);
    auto s = pool.stats();
    CHECK(s.bytes_mapped == 2 * kHuge);
    CHECK(s.arena_capacity == 2 * kHuge);
    const auto ranges = d->ranges();
    CHECK(ranges.size() == 1);
    if (!ranges.empty()) {
      CHECK(reinterpret_cast<std::uintptr_t>(ranges[0].first) % kHuge == 0);
      CHECK(ranges[0].second == 2 * kHuge);
    }
    // One object filling the arena: touching it faults exactly two huge pages.
    auto first = pool.allocate(2 * kHuge - kWireHeaderSize);
    CHECK(first.ok());
    if (!first.ok()) return 1;
    std::memset(first->data().data(), 0x5a, first->data().size());
    std::uint64_t free_after = 0;
    CHECK(read_u64(kFreePath, &free_after) && free_after == free_now - 2);
    CHECK(static_cast<unsigned char>(first->data()[first->data().size() - 1]) == 0x5a);

    // Growth takes the remaining pages: one more arena fits, the next does
    // not, and the data path reports it without throwing.
    std::vector<Ldo> more;
    Status last = Status::ok;
    for (int i = 0; i < 4 && last == Status::ok; ++i) {
      auto r = pool.allocate(2 * kHuge - kWireHeaderSize);
      if (r) {
        std::memset(r->data().data(), i, r->data().size());
        more.push_back(std::move(*r));
      } else {
        last = r.status();
      }
    }
    CHECK(more.size() == static_cast<std::size_t>((free_now - 2) / 2));
    CHECK(last == Status::out_of_memory);
    CHECK(pool.stats().failed_allocations == 1);

    // No free pages left: a second pool is refused with the advice.
    try {
      Pool p2({d}, huge_config(kHuge));
      CHECK(!"a pool was created with no free huge pages");
    } catch (const Error& e) {
      CHECK(e.status() == Status::out_of_memory);
      CHECK(contains(e.what(), "0 free"));
    }
  }
  // Pool and objects gone: every page is back.
  std::uint64_t free_end = 0;
  CHECK(read_u64(kFreePath, &free_end) && free_end == free_now);

  // Zero on allocate with hugetlbfs arenas: memset, never MADV_DONTNEED
  // (which would hand the page back to the reserved pool, to be faulted
  // again later, when none may be left), even though this domain pins
  // nothing and the span is large enough.
  {
    auto soft = std::make_shared<test::FakeDomain>();
    soft->set_pins_memory(false);
    PoolConfig c = huge_config(2 * kHuge);
    c.zero_on_allocate = true;
    c.zero_madvise_min = 4096;
    Pool pool({soft}, c);
    // A first object of 511 pages puts the next one's whole pages on the
    // second huge page exactly, so madvise would find them aligned (and
    // succeed) if the pool tried it.
    auto head = pool.allocate(LdoShape{.data_size = 511 * 4096 - kWireHeaderSize, .zeroing = Zeroing::uninitialized});
    CHECK(head.ok());
    const std::uint64_t size = kHuge + 4096 - kWireHeaderSize;  // pages 511..1023
    std::byte* old_base = nullptr;
    {
      auto dirty = pool.allocate(LdoShape{.data_size = size, .zeroing = Zeroing::uninitialized});
      CHECK(dirty.ok());
      if (!dirty.ok()) return 1;
      std::memset(dirty->base() + kWireHeaderSize, 0x6b, dirty->capacity());
      old_base = dirty->base();
      CHECK(reinterpret_cast<std::uintptr_t>(old_base + 4096) % kHuge == 0);
    }
    std::uint64_t free_dirty = 0;
    CHECK(read_u64(kFreePath, &free_dirty));
    auto r = pool.allocate(size);
    CHECK(r.ok());
    if (!r.ok()) return 1;
    CHECK(r->base() == old_base);  // the dirtied bytes came back
    bool zero = true;
    for (std::uint64_t i = 0; i < r->capacity(); ++i) zero = zero && r->base()[kWireHeaderSize + i] == std::byte{0};
    CHECK(zero);
    const PoolStats s = pool.stats();
    CHECK(s.zeroed_allocations == 1);
    CHECK(s.zero_madvise_bytes == 0);
    CHECK(s.zero_memset_bytes == r->capacity());
    std::uint64_t free_zeroed = 0;
    CHECK(read_u64(kFreePath, &free_zeroed) && free_zeroed == free_dirty);  // no page went back
  }
  return failures ? 1 : 0;
}

}  // namespace

int main() {
  int rc = 0;
  {
    check_refusals();
    NrGuard guard;
    try {
      rc = run_with_pages(guard);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "FAIL: exception: %s\n", e.what());
      rc = 1;
    }
  }
  if (failures) rc = 1;
  if (rc == 0) std::printf("ok\n");
  return rc;
}
