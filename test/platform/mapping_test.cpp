// platform::Mapping (lib/platform/mapping.hpp): create_adjacent() puts its
// second mapping exactly where the first ends, aligns the first as create()
// would, leaves both usable and independently unmappable, and refuses what
// it cannot honour. The pool relies on the adjacency for its arenas'
// control-block tables (Arena::block_distance).

#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <vector>

#include "platform/mapping.hpp"

using regpool::Status;
using regpool::platform::kHugePageSize;
using regpool::platform::kPageSize;
using regpool::platform::MapOptions;
using regpool::platform::Mapping;

namespace {

std::uintptr_t address(const Mapping& m) { return reinterpret_cast<std::uintptr_t>(m.data()); }

// Whether [p, p + n) is mapped in this process: mincore fails with ENOMEM
// on any unmapped page of the range.
bool mapped(const std::byte* p, std::size_t n) {
  std::vector<unsigned char> v((n + kPageSize - 1) / kPageSize);
  return ::mincore(const_cast<std::byte*>(p), n, v.data()) == 0;
}

MapOptions table_options() {
  MapOptions o;
  o.transparent_huge_pages = false;
  o.noreserve = true;
  return o;
}

}  // namespace

TEST_CASE("create_adjacent maps the second mapping where the first ends", "[unit]") {
  struct Case {
    std::size_t first;
    bool thp;
  };
  // Sizes that are and are not page or huge-page multiples, with and
  // without THP (which aligns the first to 2 MiB from 2 MiB on).
  const Case cases[] = {{kPageSize, false},      {5000, false},          {kHugePageSize, true},
                        {3 * kHugePageSize, true}, {kHugePageSize + 1, true}, {kHugePageSize - kPageSize, true}};
  for (const Case& c : cases) {
    CAPTURE(c.first, c.thp);
    MapOptions memory;
    memory.transparent_huge_pages = c.thp;
    const std::size_t second = c.first / 64 + 2048;  // as an arena's table
    // Several at once, so the kernel's choice of addresses varies and a
    // pair is never the only mapping in its neighbourhood.
    std::vector<Mapping::Pair> pairs;
    for (int i = 0; i < 4; ++i) {
      auto r = Mapping::create_adjacent(c.first, memory, second, table_options());
      REQUIRE(r.ok());
      const Mapping::Pair& p = *r;
      CHECK(p.first.size() == Mapping::mapped_size(c.first, memory));
      CHECK(p.first.size() % kPageSize == 0);
      CHECK(p.first.size() >= c.first);
      CHECK(p.second.size() == (second + kPageSize - 1) / kPageSize * kPageSize);
      CHECK(address(p.second) == address(p.first) + p.first.size());
      const std::size_t align = c.thp && p.first.size() >= kHugePageSize ? kHugePageSize : kPageSize;
      CHECK(address(p.first) % align == 0);
      // Both writable end to end, and each keeps its own bytes.
      std::memset(p.first.data(), 0x11, p.first.size());
      std::memset(p.second.data(), 0x22, p.second.size());
      CHECK(p.first.data()[p.first.size() - 1] == std::byte{0x11});
      CHECK(p.second.data()[0] == std::byte{0x22});
      pairs.push_back(std::move(*r));
    }
  }
}

TEST_CASE("the two halves of an adjacent pair are unmapped on their own", "[unit]") {
  auto r = Mapping::create_adjacent(kHugePageSize, MapOptions{}, 3 * kPageSize, table_options());
  REQUIRE(r.ok());
  Mapping first = std::move(r->first);
  Mapping second = std::move(r->second);
  std::byte* const a = first.data();
  const std::size_t a_size = first.size();
  std::byte* const b = second.data();
  CHECK(mapped(a, a_size));
  CHECK(mapped(b, second.size()));
  first.reset();
  CHECK_FALSE(mapped(a, kPageSize));
  CHECK_FALSE(mapped(a + a_size - kPageSize, kPageSize));
  CHECK(mapped(b, 3 * kPageSize));
  b[0] = std::byte{1};  // still writable
  const std::size_t b_size = second.size();
  second.reset();
  CHECK_FALSE(mapped(b, b_size));
}

TEST_CASE("create_adjacent refuses what it cannot honour", "[unit]") {
  CHECK(Mapping::create_adjacent(0, MapOptions{}, kPageSize, table_options()).status() == Status::invalid_argument);
  CHECK(Mapping::create_adjacent(kPageSize, MapOptions{}, 0, table_options()).status() == Status::invalid_argument);
  // hugetlbfs pages for the second mapping: not supported.
  MapOptions huge_second = table_options();
  huge_second.huge_page_size = kHugePageSize;
  CHECK(Mapping::create_adjacent(kPageSize, MapOptions{}, kPageSize, huge_second).status() ==
        Status::invalid_argument);
  // A first page size that is no power of two, or below a page.
  MapOptions odd;
  odd.huge_page_size = 3 * kPageSize;
  CHECK(Mapping::create_adjacent(kPageSize, odd, kPageSize, table_options()).status() == Status::invalid_argument);
  odd.huge_page_size = 512;
  CHECK(Mapping::create_adjacent(kPageSize, odd, kPageSize, table_options()).status() == Status::invalid_argument);
  // Sizes whose sums would wrap.
  CHECK(Mapping::create_adjacent(SIZE_MAX - kPageSize, MapOptions{}, kPageSize, table_options()).status() ==
        Status::invalid_argument);
  CHECK(Mapping::create_adjacent(kPageSize, MapOptions{}, SIZE_MAX / 2, table_options()).status() ==
        Status::invalid_argument);
  // More address space than the machine has: out of memory, nothing left mapped.
  const std::size_t huge = std::size_t{1} << 60;
  CHECK(Mapping::create_adjacent(huge, MapOptions{}, kPageSize, table_options()).status() == Status::out_of_memory);
}

TEST_CASE("mapped_size rounds as create does", "[unit]") {
  CHECK(Mapping::mapped_size(1, MapOptions{}) == kPageSize);
  CHECK(Mapping::mapped_size(kPageSize, MapOptions{}) == kPageSize);
  CHECK(Mapping::mapped_size(kHugePageSize + 1, MapOptions{}) == kHugePageSize + kPageSize);
  MapOptions huge;
  huge.huge_page_size = kHugePageSize;
  CHECK(Mapping::mapped_size(1, huge) == kHugePageSize);
  CHECK(Mapping::mapped_size(kHugePageSize + 1, huge) == 2 * kHugePageSize);
  auto m = Mapping::create(5000, MapOptions{});
  REQUIRE(m.ok());
  CHECK(m->size() == Mapping::mapped_size(5000, MapOptions{}));
}
