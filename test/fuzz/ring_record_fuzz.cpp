// Fuzzes the ring channel's parsers of bytes a producer writes into the
// consumer's memory (lib/patterns/ring_wire.hpp): parse_record and
// decode_word. Input: 16 header bytes, then the consumer's state (head,
// tail distance, capacity, expected sequence, nonce) derived from the rest.
// Properties, not only "no crash":
//  - an accepted record lies inside the ring without wrapping, ends at or
//    before the tail, advances by at least a header, carries the expected
//    sequence, and a pad ends exactly at the end of the ring;
//  - an accepted header re-encodes to exactly the input bytes;
//  - a header built from the input's fields by encode_header is accepted
//    exactly when those fields satisfy the rules (checked independently);
//  - an accepted control word re-encodes to exactly the input bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "patterns/ring_wire.hpp"

namespace ring = regpool::ring;

namespace {
std::uint64_t u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}
std::uint32_t u32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  std::memcpy(&v, p, 4);
  return v;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 48) return 0;
  const std::span<const std::byte, 16> header(reinterpret_cast<const std::byte*>(data), 16);
  const std::uint64_t cap = ring::kMinCapacity + (u64(data + 32) % (std::uint64_t{1} << 20)) / 8 * 8;
  const std::uint64_t head = (u64(data + 16) % (std::uint64_t{1} << 50)) / 8 * 8;
  const std::uint64_t tail = head + (u64(data + 24) % (cap + 1)) / 8 * 8;
  const std::uint32_t seq = u32(data + 40);
  const std::uint32_t nonce = u32(data + 44);
  const std::uint64_t off = head % cap;
  const std::uint64_t room = cap - off;

  auto r = ring::parse_record(header, head, tail, cap, seq, nonce);
  if (room < ring::kHeaderBytes) {
    if (r.ok()) std::abort();  // a gap the caller must skip is never parsed
  } else if (r) {
    if (r->payload_offset != off + ring::kHeaderBytes) std::abort();
    if (r->payload_offset + r->header.length > cap) std::abort();
    if (r->advance < ring::kHeaderBytes || r->advance > tail - head || r->advance > room) std::abort();
    if (r->header.sequence != seq) std::abort();
    if (r->header.kind == ring::RecordKind::pad && (head + r->advance) % cap != 0) std::abort();
    std::byte again[16];
    ring::encode_header(std::span<std::byte, 16>(again), r->header, nonce);
    if (std::memcmp(again, data, 16) != 0) std::abort();
  }

  // Built by the encoder from the input's fields: accepted exactly when valid.
  if (room >= ring::kHeaderBytes) {
    ring::RecordHeader h;
    h.kind = (data[4] & 1) ? ring::RecordKind::pad : ring::RecordKind::data;
    h.length = u32(data) % (std::uint32_t{1} << 21);
    h.sequence = (data[5] & 1) ? seq : seq + 1;
    std::byte built[16];
    ring::encode_header(std::span<std::byte, 16>(built), h, nonce);
    const std::uint64_t need =
        h.kind == ring::RecordKind::pad ? room : ring::record_bytes(h.length);
    const bool valid = h.sequence == seq && need <= room && need <= tail - head &&
                       (h.kind != ring::RecordKind::pad || h.length == room - ring::kHeaderBytes);
    if (ring::parse_record(std::span<const std::byte, 16>(built), head, tail, cap, seq, nonce).ok() != valid) {
      std::abort();
    }
  }

  for (auto kind : {ring::WordKind::tail, ring::WordKind::credit}) {
    auto w = ring::decode_word(header, kind, nonce);
    if (!w) continue;
    if ((w->flags & ~ring::kKnownFlags) != 0) std::abort();
    std::byte again[16];
    ring::encode_word(std::span<std::byte, 16>(again), kind, *w, nonce);
    if (std::memcmp(again, data, 16) != 0) std::abort();
  }
  return 0;
}
