// Fuzzes RemoteRef::decode, the parser for the 64-byte references peers send
// each other. Properties checked on every input, not just "no crash":
//  - decode never reads past the span (ASan) and never aborts;
//  - whatever decodes re-encodes to exactly the same bytes (so no field is
//    silently normalised and two encodings never mean the same reference);
//  - range checks on a decoded reference cannot overflow: contains() for
//    offsets derived from the input agrees with 128-bit arithmetic;
//  - every decoded reference is one an endpoint accepts (well_formed()),
//    and the address of its last byte does not wrap;
//  - the rights it grants are consistent: something is granted, atomics
//    only with both read and write, and the registration rights an owner
//    needs for it cover exactly what it allows.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "regpool/remote_ref.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto r = regpool::RemoteRef::decode(bytes);
  if (!r) return 0;
  if (size != regpool::RemoteRef::kEncodedSize) std::abort();  // only exact-size inputs may decode
  const auto again = r->encode();
  if (std::memcmp(again.data(), data, again.size()) != 0) std::abort();
  if (!r->well_formed()) std::abort();
  if (r->address_at(r->length - 1) < r->address) std::abort();
  using regpool::Access;
  if (!r->allows_read() && !r->allows_write()) std::abort();
  if (r->allows_atomics() && !(r->allows_read() && r->allows_write())) std::abort();
  const Access need = regpool::registration_access(r->access);
  if (regpool::grants(need, Access::remote_read) != r->allows_read()) std::abort();
  if (regpool::grants(need, Access::remote_write) != r->allows_write()) std::abort();
  if (regpool::grants(need, Access::remote_atomic) != r->allows_atomics()) std::abort();
  // Offsets and lengths taken from the input's own bytes (checksum field
  // ends up varied by the fuzzer, so these cover the whole 64-bit range).
  std::uint64_t off = 0;
  std::uint64_t len = 0;
  std::memcpy(&off, data + 8, sizeof off);
  std::memcpy(&len, data + 16, sizeof len);
  const unsigned __int128 end = static_cast<unsigned __int128>(off) + len;
  const bool expect = end <= r->length;
  if (r->contains(off, len) != expect) std::abort();
  return 0;
}
