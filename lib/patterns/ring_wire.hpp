#pragma once
// Wire formats of the ring-buffer channel (regpool/ring_channel.hpp), as
// pure functions over bytes so that each parser can be fuzzed on its own
// (test/fuzz/ring_record_fuzz.cpp, ring_setup_fuzz.cpp). Everything a peer
// writes into our memory, or hands us as a setup blob, goes through here
// before any of it is used as a length or an offset.
//
// Consumer's exposed object (data section):
//   [0, 16)          tail word, written by the producer
//   [16, 64)         reserved
//   [64, 64 + cap)   the ring: records at monotonic byte positions, stored at
//                    position % cap
// Producer's exposed object (data section):
//   [0, 16)          credit word, written by the consumer (head)
//
// Control word (tail and credit, 16 bytes, little-endian):
//   0 u64 position (tail: bytes published; credit: bytes consumed)
//   8 u32 flags (kWantCredit: the producer waits for space)
//  12 u32 check = mix of (position, flags, channel nonce, word kind)
// Written by a single put; the check lets a reader reject a torn or stale
// read (it reads again later) rather than trust it.
//
// Record header (16 bytes, little-endian, at an 8-byte aligned position):
//   0 u32 payload length     4 u16 kind (1 data, 2 pad)   6 u16 reserved (0)
//   8 u32 sequence (record number, mod 2^32)             12 u32 check
// followed by the payload, padded to a multiple of 8. A record never wraps:
// when fewer than 16 bytes are left before the end of the ring the position
// skips to the start (both sides compute it); when a record does not fit
// before the end, a pad record fills the rest.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "regpool/error.hpp"
#include "regpool/remote_ref.hpp"

namespace regpool::ring {

inline constexpr std::uint64_t kControlBytes = 64;  // before the ring in the consumer's object
inline constexpr std::uint64_t kWordBytes = 16;
inline constexpr std::uint64_t kHeaderBytes = 16;
inline constexpr std::uint64_t kAlign = 8;
inline constexpr std::uint64_t kMinCapacity = 256;
inline constexpr std::uint32_t kWantCredit = 1u;
inline constexpr std::uint32_t kKnownFlags = kWantCredit;

enum class WordKind : std::uint32_t { tail = 0x7461696c, credit = 0x63726564 };
enum class RecordKind : std::uint16_t { data = 1, pad = 2 };

constexpr std::uint64_t align_up(std::uint64_t n) noexcept { return (n + kAlign - 1) & ~(kAlign - 1); }
// Bytes a record with `length` payload bytes occupies in the ring.
constexpr std::uint64_t record_bytes(std::uint64_t length) noexcept { return kHeaderBytes + align_up(length); }
// A capacity the channel accepts: a multiple of 8, at least kMinCapacity,
// small enough that positions never come near wrapping 64 bits in practice.
constexpr bool valid_capacity(std::uint64_t cap) noexcept {
  return cap >= kMinCapacity && cap % kAlign == 0 && cap <= (std::uint64_t{1} << 40);
}
// Largest payload one record may carry in a ring of `cap` bytes.
constexpr std::uint64_t max_payload(std::uint64_t cap) noexcept { return cap - kHeaderBytes; }

struct ControlWord {
  std::uint64_t position = 0;
  std::uint32_t flags = 0;
};
void encode_word(std::span<std::byte, kWordBytes> out, WordKind kind, ControlWord w, std::uint32_t nonce) noexcept;
// malformed: check mismatch (torn, stale from another channel, or forged
// without the nonce) or unknown flags. Bounds against the channel's state are
// the caller's (they need its positions).
Result<ControlWord> decode_word(std::span<const std::byte, kWordBytes> in, WordKind kind, std::uint32_t nonce) noexcept;

struct RecordHeader {
  RecordKind kind = RecordKind::data;
  std::uint32_t length = 0;
  std::uint32_t sequence = 0;
};
void encode_header(std::span<std::byte, kHeaderBytes> out, const RecordHeader& h, std::uint32_t nonce) noexcept;

// Where the record at `head` lies, once parsed and validated.
struct ParsedRecord {
  RecordHeader header;
  std::uint64_t payload_offset = 0;  // in the ring, [0, cap)
  std::uint64_t advance = 0;         // bytes from head to the next record
};

// Parses the header found at ring offset head % cap. The caller has copied
// the 16 header bytes out of the shared ring (so a peer writing them again
// cannot change them between check and use), and tail is the published
// position, already checked to lie in [head, head + cap]. Checks: the offset
// leaves room for a header (the caller skips such gaps itself), the check
// field, kind, reserved bits, sequence == expected, the record lies inside
// the ring without wrapping, a pad record fills exactly to the end, and the
// record ends at or before tail. Any violation: malformed. Pure.
Result<ParsedRecord> parse_record(std::span<const std::byte, kHeaderBytes> header, std::uint64_t head,
                                  std::uint64_t tail, std::uint64_t capacity, std::uint32_t expected_sequence,
                                  std::uint32_t nonce) noexcept;

// Setup blobs, carried by the user over their own bootstrap or membership.
// Consumer -> producer (kConsumerBlobSize bytes):
//   0 u32 magic "RPRC"  4 u16 version  6 u16 reserved (0)  8 u32 nonce
//  12 u32 reserved (0) 16 u64 capacity 24 RemoteRef (64 bytes, the ring
//  object: control + ring)  88 u32 reserved (0)  92 u32 CRC-32C of 0..91
// Producer -> consumer (kProducerBlobSize bytes):
//   0 u32 magic "RPRP"  4 u16 version  6 u16 reserved (0)  8 u32 nonce (echo)
//  12 u32 reserved (0) 16 RemoteRef (64 bytes, the credit word)
//  80 u32 reserved (0) 84 u32 CRC-32C of 0..83
inline constexpr std::size_t kConsumerBlobSize = 96;
inline constexpr std::size_t kProducerBlobSize = 88;
inline constexpr std::uint32_t kConsumerMagic = 0x43525052;  // "RPRC"
inline constexpr std::uint32_t kProducerMagic = 0x50525052;  // "RPRP"
inline constexpr std::uint16_t kVersion = 1;

struct ConsumerSetup {
  std::uint32_t nonce = 0;
  std::uint64_t capacity = 0;
  RemoteRef ring;
};
struct ProducerSetup {
  std::uint32_t nonce = 0;
  RemoteRef credit;
};
std::vector<std::byte> encode_consumer_setup(const ConsumerSetup& s);
std::vector<std::byte> encode_producer_setup(const ProducerSetup& s);
// malformed for a wrong size, magic, checksum, reserved bits, a capacity the
// channel refuses, a reference that does not decode, grants no write, or is
// too short for what it must hold; unsupported for another version.
Result<ConsumerSetup> decode_consumer_setup(std::span<const std::byte> in) noexcept;
Result<ProducerSetup> decode_producer_setup(std::span<const std::byte> in) noexcept;

}  // namespace regpool::ring
