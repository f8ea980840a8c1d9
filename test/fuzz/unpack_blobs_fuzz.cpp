// Fuzzes regpool::unpack_blobs, which splits one allgather contribution
// from another process into its blobs. Properties checked on every input:
//  - it either returns blobs or throws Error(Status::malformed), nothing else;
//  - whatever it returns packs back (pack_blobs) to exactly the input;
//  - the blobs' sizes plus their 4-byte lengths add up to the input size.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "regpool/bootstrap.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto parts = regpool::unpack_blobs(in);
    std::size_t total = 0;
    for (const auto& p : parts) total += 4 + p.size();
    if (total != size) std::abort();
    const auto again = regpool::pack_blobs(parts);
    if (again.size() != size || (size && std::memcmp(again.data(), data, size) != 0)) std::abort();
  } catch (const regpool::Error& e) {
    if (e.status() != regpool::Status::malformed) std::abort();
  }
  return 0;
}
