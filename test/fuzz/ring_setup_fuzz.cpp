// Fuzzes the ring channel's setup blobs (lib/patterns/ring_wire.hpp), which
// peers hand each other over the user's bootstrap. Properties:
//  - only exact-size inputs decode, and what decodes re-encodes to exactly
//    the input bytes;
//  - a decoded consumer blob has a capacity the channel accepts and a ring
//    reference that grants writes and holds the control area plus the ring;
//  - a decoded producer blob's credit reference grants writes and holds the
//    16-byte credit word.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "patterns/ring_wire.hpp"

namespace ring = regpool::ring;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  if (auto c = ring::decode_consumer_setup(in)) {
    if (size != ring::kConsumerBlobSize) std::abort();
    if (!ring::valid_capacity(c->capacity)) std::abort();
    if (!c->ring.allows_write() || !c->ring.contains(0, ring::kControlBytes + c->capacity)) std::abort();
    const auto again = ring::encode_consumer_setup(*c);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
  }
  if (auto p = ring::decode_producer_setup(in)) {
    if (size != ring::kProducerBlobSize) std::abort();
    if (!p->credit.allows_write() || !p->credit.contains(0, ring::kWordBytes)) std::abort();
    const auto again = ring::encode_producer_setup(*p);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
  }
  return 0;
}
