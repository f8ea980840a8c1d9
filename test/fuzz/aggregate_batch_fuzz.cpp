// Fuzzes the aggregation buffer's batch parser (lib/patterns/aggregate_wire.hpp),
// run on every message a sender delivers. Properties:
//  - an accepted batch's records, walked with BatchCursor, are exactly
//    `count`, lie inside the message and cover it to the last byte;
//  - rebuilding the batch with BatchWriter from those records and the
//    sequence gives exactly the input bytes (no two encodings of one batch);
//  - BatchCursor on any input (accepted or not) never leaves the message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "patterns/aggregate_wire.hpp"

namespace agg = regpool::aggregate;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  const std::byte* lo = in.data();
  const std::byte* hi = in.data() + size;
  agg::BatchCursor any(in);
  std::span<const std::byte> rec;
  while (any.next(rec)) {
    if (rec.data() < lo || rec.data() + rec.size() > hi) std::abort();
  }
  auto info = agg::parse_batch(in);
  if (!info) return 0;
  std::vector<std::byte> rebuilt(size);
  agg::BatchWriter w(rebuilt);
  agg::BatchCursor cur(in);
  std::uint32_t n = 0;
  std::size_t covered = agg::kBatchHeader;
  while (cur.next(rec)) {
    if (rec.data() < lo || rec.data() + rec.size() > hi) std::abort();
    if (!w.append(rec)) std::abort();
    covered += agg::kRecordHeader + rec.size();
    ++n;
  }
  if (n != info->count || covered != size || !cur.done()) std::abort();
  w.finish(info->sequence);
  if (w.size() != size || std::memcmp(rebuilt.data(), data, size) != 0) std::abort();
  return 0;
}
