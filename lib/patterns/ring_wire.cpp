#include "patterns/ring_wire.hpp"

#include <cstring>

#include "transport/wire_le.hpp"

namespace regpool::ring {
namespace {

// A 32-bit finaliser (murmur3's): cheap enough for every record header, and
// every input bit changes about half the output bits, so a torn or stale
// header or word fails the check unless it happens to match by chance.
constexpr std::uint32_t fmix32(std::uint32_t h) noexcept {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}
constexpr std::uint32_t mix(std::uint64_t a, std::uint32_t b, std::uint32_t c, std::uint32_t d) noexcept {
  std::uint32_t h = fmix32(static_cast<std::uint32_t>(a) ^ 0x9e3779b9u);
  h = fmix32(h ^ static_cast<std::uint32_t>(a >> 32));
  h = fmix32(h ^ b);
  h = fmix32(h ^ c);
  return fmix32(h ^ d);
}

std::uint32_t header_check(const RecordHeader& h, std::uint32_t nonce) noexcept {
  return mix(h.length, static_cast<std::uint32_t>(h.kind), h.sequence, nonce ^ 0x5245434fu);
}

}  // namespace

void encode_word(std::span<std::byte, kWordBytes> out, WordKind kind, ControlWord w, std::uint32_t nonce) noexcept {
  le::put_u64(out.data(), w.position);
  le::put_u32(out.data() + 8, w.flags);
  le::put_u32(out.data() + 12, mix(w.position, w.flags, static_cast<std::uint32_t>(kind), nonce));
}

Result<ControlWord> decode_word(std::span<const std::byte, kWordBytes> in, WordKind kind,
                                std::uint32_t nonce) noexcept {
  ControlWord w;
  w.position = le::get_u64(in.data());
  w.flags = le::get_u32(in.data() + 8);
  if (le::get_u32(in.data() + 12) != mix(w.position, w.flags, static_cast<std::uint32_t>(kind), nonce)) {
    return Status::malformed;
  }
  if ((w.flags & ~kKnownFlags) != 0) return Status::malformed;
  return w;
}

void encode_header(std::span<std::byte, kHeaderBytes> out, const RecordHeader& h, std::uint32_t nonce) noexcept {
  le::put_u32(out.data(), h.length);
  le::put_u16(out.data() + 4, static_cast<std::uint16_t>(h.kind));
  le::put_u16(out.data() + 6, 0);
  le::put_u32(out.data() + 8, h.sequence);
  le::put_u32(out.data() + 12, header_check(h, nonce));
}

Result<ParsedRecord> parse_record(std::span<const std::byte, kHeaderBytes> header, std::uint64_t head,
                                  std::uint64_t tail, std::uint64_t capacity, std::uint32_t expected_sequence,
                                  std::uint32_t nonce) noexcept {
  if (!valid_capacity(capacity) || head % kAlign != 0 || tail < head || tail - head > capacity) {
    return Status::invalid_argument;
  }
  const std::uint64_t offset = head % capacity;
  const std::uint64_t room = capacity - offset;  // bytes before the end of the ring
  if (room < kHeaderBytes) return Status::invalid_argument;  // a gap the caller skips
  RecordHeader h;
  h.length = le::get_u32(header.data());
  const std::uint16_t kind = le::get_u16(header.data() + 4);
  if (le::get_u16(header.data() + 6) != 0) return Status::malformed;
  h.sequence = le::get_u32(header.data() + 8);
  if (kind != static_cast<std::uint16_t>(RecordKind::data) && kind != static_cast<std::uint16_t>(RecordKind::pad)) {
    return Status::malformed;
  }
  h.kind = static_cast<RecordKind>(kind);
  if (le::get_u32(header.data() + 12) != header_check(h, nonce)) return Status::malformed;
  if (h.sequence != expected_sequence) return Status::malformed;
  ParsedRecord r;
  r.header = h;
  r.payload_offset = offset + kHeaderBytes;
  if (h.kind == RecordKind::pad) {
    // A pad fills exactly the rest of the ring.
    if (std::uint64_t{h.length} != room - kHeaderBytes) return Status::malformed;
    r.advance = room;
  } else {
    if (record_bytes(h.length) > room) return Status::malformed;
    r.advance = record_bytes(h.length);
  }
  if (r.advance > tail - head) return Status::malformed;
  return r;
}

namespace {

void put_ref(std::byte* p, const RemoteRef& ref) noexcept {
  const auto e = ref.encode();
  std::memcpy(p, e.data(), e.size());
}

bool reserved_zero(std::span<const std::byte> in, std::size_t at, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    if (in[at + i] != std::byte{0}) return false;
  }
  return true;
}

// Magic, version and checksum common to both blobs.
Status check_frame(std::span<const std::byte> in, std::size_t size, std::uint32_t magic) noexcept {
  if (in.size() != size) return Status::malformed;
  if (le::get_u32(in.data()) != magic) return Status::malformed;
  if (le::get_u32(in.data() + size - 4) != crc32c(in.first(size - 4))) return Status::malformed;
  if (le::get_u16(in.data() + 4) != kVersion) return Status::unsupported;
  if (!reserved_zero(in, 6, 2) || !reserved_zero(in, 12, 4) || !reserved_zero(in, size - 8, 4)) {
    return Status::malformed;
  }
  return Status::ok;
}

}  // namespace

std::vector<std::byte> encode_consumer_setup(const ConsumerSetup& s) {
  std::vector<std::byte> out(kConsumerBlobSize, std::byte{0});
  le::put_u32(out.data(), kConsumerMagic);
  le::put_u16(out.data() + 4, kVersion);
  le::put_u32(out.data() + 8, s.nonce);
  le::put_u64(out.data() + 16, s.capacity);
  put_ref(out.data() + 24, s.ring);
  le::put_u32(out.data() + kConsumerBlobSize - 4, crc32c(std::span(out).first(kConsumerBlobSize - 4)));
  return out;
}

std::vector<std::byte> encode_producer_setup(const ProducerSetup& s) {
  std::vector<std::byte> out(kProducerBlobSize, std::byte{0});
  le::put_u32(out.data(), kProducerMagic);
  le::put_u16(out.data() + 4, kVersion);
  le::put_u32(out.data() + 8, s.nonce);
  put_ref(out.data() + 16, s.credit);
  le::put_u32(out.data() + kProducerBlobSize - 4, crc32c(std::span(out).first(kProducerBlobSize - 4)));
  return out;
}

Result<ConsumerSetup> decode_consumer_setup(std::span<const std::byte> in) noexcept {
  if (const Status st = check_frame(in, kConsumerBlobSize, kConsumerMagic); st != Status::ok) return st;
  ConsumerSetup s;
  s.nonce = le::get_u32(in.data() + 8);
  s.capacity = le::get_u64(in.data() + 16);
  if (!valid_capacity(s.capacity)) return Status::malformed;
  auto ref = RemoteRef::decode(in.subspan(24, RemoteRef::kEncodedSize));
  if (!ref) return Status::malformed;
  if (!ref->allows_write() || ref->length < kControlBytes + s.capacity) return Status::malformed;
  s.ring = *ref;
  return s;
}

Result<ProducerSetup> decode_producer_setup(std::span<const std::byte> in) noexcept {
  if (const Status st = check_frame(in, kProducerBlobSize, kProducerMagic); st != Status::ok) return st;
  ProducerSetup s;
  s.nonce = le::get_u32(in.data() + 8);
  auto ref = RemoteRef::decode(in.subspan(16, RemoteRef::kEncodedSize));
  if (!ref) return Status::malformed;
  if (!ref->allows_write() || ref->length < kWordBytes) return Status::malformed;
  s.credit = *ref;
  return s;
}

}  // namespace regpool::ring
