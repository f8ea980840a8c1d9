// Fuzzes what an shm endpoint reads from a peer's message-ring file
// (lib/transport/shm_rings.hpp): the file's header, its directory, the
// records of its ring for us, and the consumed position it publishes for
// ours. Everything in that file is the peer's bytes.
//
// Input: byte 0 picks what the rest is:
//  - 0: a header (header_ok against a pid taken from the input);
//  - 1: a directory (find_entry for a nonce taken from the input);
//  - 2: a ring: a start offset, then bytes laid into a ring from there; a
//       receiver then reads records from it as Link::peek does, checking
//       every record it accepts stays inside the ring and every position
//       stays aligned, and that reading always ends;
//  - 3: consumed positions (consumed_ok), large records' fields, a
//       record's kind word with its gap (parse_record) and the gap a
//       sender would choose (placement_gap), and the costs a receiver
//       publishes for its sender (prefer_large), with the running figures
//       they come from (cost_average).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "transport/shm_rings.hpp"

namespace sr = regpool::shm_rings;

namespace {

std::uint64_t take_u64(const std::uint8_t*& data, std::size_t& size) {
  std::uint64_t v = 0;
  const std::size_t n = size < 8 ? size : 8;
  std::memcpy(&v, data, n);
  data += n;
  size -= n;
  return v;
}

void fuzz_header(const std::uint8_t* data, std::size_t size) {
  const auto pid = static_cast<std::int64_t>(take_u64(data, size));
  std::vector<std::byte> head(size);
  if (size) std::memcpy(head.data(), data, size);
  if (!sr::header_ok(head, pid)) return;
  // Accepted: exactly our layout, naming that pid.
  std::uint64_t magic = 0, ring = 0, nonce = 0;
  std::uint32_t version = 0, slots = 0;
  std::int64_t owner = 0;
  std::memcpy(&magic, head.data() + sr::kMagicOffset, 8);
  std::memcpy(&version, head.data() + sr::kVersionOffset, 4);
  std::memcpy(&slots, head.data() + sr::kSlotsOffset, 4);
  std::memcpy(&ring, head.data() + sr::kRingOffset, 8);
  std::memcpy(&nonce, head.data() + sr::kNonceOffset, 8);
  std::memcpy(&owner, head.data() + sr::kPidOffset, 8);
  if (magic != sr::kMagic || version != sr::kVersion || slots != sr::kSlots || ring != sr::kRingBytes ||
      nonce == 0 || owner != pid) {
    std::abort();
  }
}

void fuzz_directory(const std::uint8_t* data, std::size_t size) {
  const std::uint64_t nonce = take_u64(data, size);
  static std::vector<std::uint64_t> dir(sr::kSlots * sr::kEntryBytes / 8);
  std::fill(dir.begin(), dir.end(), 0);
  std::memcpy(dir.data(), data, std::min(size, dir.size() * 8));
  const auto* entries = reinterpret_cast<const std::byte*>(dir.data());
  std::uint64_t state = 0;
  const int e = sr::find_entry(entries, nonce, state);
  if (e < 0) return;
  if (e >= static_cast<int>(sr::kSlots) || nonce == 0) std::abort();
  const std::uint64_t* w = dir.data() + static_cast<std::size_t>(e) * (sr::kEntryBytes / 8);
  const auto st = static_cast<sr::EntryState>(state & 0xff);
  if (w[1] != nonce || w[0] != state || (st != sr::EntryState::live && st != sr::EntryState::retired)) std::abort();
}

void fuzz_ring(const std::uint8_t* data, std::size_t size) {
  static std::vector<std::uint64_t> words(sr::kRingBytes / 8);
  std::fill(words.begin(), words.end(), 0);
  auto* ring = reinterpret_cast<std::byte*>(words.data());
  const std::uint64_t start = (take_u64(data, size) % (sr::kRingBytes / sr::kRecordAlign)) * sr::kRecordAlign;
  const std::uint64_t seq = take_u64(data, size) % 4;
  // The input laid in from `start`, wrapping at the end of the ring.
  for (std::size_t i = 0; i < size; ++i) ring[(start + i) % sr::kRingBytes] = static_cast<std::byte>(data[i]);
  std::uint64_t pos = start;
  std::uint64_t expected = seq;
  // A ring holds at most kRingBytes / kRecordAlign records: a reader that
  // goes round more than twice has been made to loop.
  for (std::uint64_t n = 0; n < 2 * sr::kRingBytes / sr::kRecordAlign + 2; ++n) {
    sr::Incoming in;
    const std::uint64_t offset = pos % sr::kRingBytes;
    const sr::Read r = sr::read_record(ring, offset, expected, in);
    if (r != sr::Read::ready) return;
    if (in.advance == 0 || in.advance % sr::kRecordAlign != 0 || offset + in.advance > sr::kRingBytes) std::abort();
    switch (in.kind) {
      case sr::RecordKind::data: {
        if (in.length > sr::kEagerMax) std::abort();
        if (in.data < ring + offset + sr::kRecordHeader || in.data + in.length > ring + sr::kRingBytes) std::abort();
        if (in.gap > sr::kGapMax || in.gap % sr::kRecordAlign != 0 ||
            in.data != ring + offset + sr::kRecordHeader + in.gap) {
          std::abort();
        }
        // Touch every byte the receiver would copy.
        volatile std::byte sink{};
        for (std::uint64_t i = 0; i < in.length; ++i) sink = in.data[i];
        (void)sink;
        break;
      }
      case sr::RecordKind::large:
        if (!sr::large_ok(in.address, in.length)) std::abort();
        break;
      case sr::RecordKind::pad:
        if (offset + in.advance != sr::kRingBytes) std::abort();
        break;
      default: std::abort();
    }
    pos += in.advance;
    ++expected;
  }
  std::abort();  // more records than a ring can hold
}

void fuzz_positions(const std::uint8_t* data, std::size_t size) {
  const std::uint64_t consumed = take_u64(data, size);
  const std::uint64_t previous = take_u64(data, size);
  const std::uint64_t head = take_u64(data, size);
  if (sr::consumed_ok(consumed, previous, head) && (consumed < previous || consumed > head)) std::abort();
  const std::uint64_t address = take_u64(data, size);
  const std::uint64_t length = take_u64(data, size);
  if (sr::large_ok(address, length) &&
      (length == 0 || length > sr::kLargeMax || address == 0 || address + length < address)) {
    std::abort();
  }
  sr::Record r;
  const auto kind = static_cast<std::uint32_t>(take_u64(data, size));
  const auto len = static_cast<std::uint32_t>(take_u64(data, size));
  const std::uint64_t offset = take_u64(data, size);
  if (sr::parse_record(kind, len, offset, r) &&
      (offset % sr::kRecordAlign != 0 || offset + r.advance > sr::kRingBytes ||
       offset + sr::kRecordHeader + r.gap + r.length > sr::kRingBytes || r.gap > sr::kGapMax ||
       (r.gap != 0 && r.kind != sr::RecordKind::data))) {
    std::abort();
  }
  // A sender's placement, for any payload address and source: a gap the
  // receiver accepts, putting the two clear of each other.
  const std::uint64_t at = take_u64(data, size);
  const std::uint64_t source = take_u64(data, size);
  const std::uint64_t gap = sr::placement_gap(at, source);
  const std::uint64_t apart = (at + gap - source) % 4096;
  if (gap % sr::kRecordAlign != 0 || gap > sr::kGapMax || apart < sr::kAliasClear || apart > 4096 - sr::kAliasClear) {
    std::abort();
  }
  // The peer's costs word only ever picks between paths: never large or
  // a rendezvous on a figure not measured, never large with the ring-only
  // bit set.
  const auto copy_in = static_cast<std::uint32_t>(take_u64(data, size));
  const std::uint64_t costs = take_u64(data, size);
  const bool unmeasured = copy_in == 0 || static_cast<std::uint32_t>(costs) == 0 ||
                          ((costs & ~sr::kCostsRingOnly) >> 32) == 0;
  if (sr::prefer_large(copy_in, costs) && (unmeasured || (costs & sr::kCostsRingOnly) != 0)) std::abort();
  if (sr::prefer_read(copy_in, costs) && (unmeasured || !sr::prefer_large(copy_in, costs & ~sr::kCostsRingOnly))) {
    std::abort();  // a rendezvous needs a wider margin than a large record
  }
  // A sample never makes a figure "not measured", and never raises it by
  // more than a sixteenth (rounded up).
  const auto average = static_cast<std::uint32_t>(take_u64(data, size));
  const std::uint64_t ticks = take_u64(data, size);
  const std::uint64_t bytes = take_u64(data, size);
  const std::uint32_t next = sr::cost_average(average, ticks, bytes);
  if (bytes == 0 ? next != average : next == 0) std::abort();
  if (average != 0 && next > average && next - average > average / 16 + 1) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t what = data[0] % 4;
  ++data;
  --size;
  switch (what) {
    case 0: fuzz_header(data, size); break;
    case 1: fuzz_directory(data, size); break;
    case 2: fuzz_ring(data, size); break;
    default: fuzz_positions(data, size); break;
  }
  return 0;
}
