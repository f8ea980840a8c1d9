#pragma once
// Wire format of the aggregation buffer (regpool/aggregator.hpp): one batch
// is one message. Pure functions, fuzzed by test/fuzz/aggregate_batch_fuzz.cpp.
//
// Batch (little-endian):
//   0 u32 magic "RPAG"   4 u16 version   6 u16 reserved (0)
//   8 u32 record count  12 u32 batch sequence (per sender, from 0)
//  16 records, back to back to the end of the message:
//       u32 length, then `length` payload bytes (no padding)
// A batch is valid only when its records fill the message exactly and their
// number is the count: no trailing bytes, no record running past the end.
#include <cstddef>
#include <cstdint>
#include <span>

#include "regpool/error.hpp"

namespace regpool::aggregate {

inline constexpr std::size_t kBatchHeader = 16;
inline constexpr std::size_t kRecordHeader = 4;
inline constexpr std::uint32_t kMagic = 0x47415052;  // "RPAG"
inline constexpr std::uint16_t kVersion = 1;

struct BatchInfo {
  std::uint32_t count = 0;
  std::uint32_t sequence = 0;
};

// Validates a whole batch (header and every record's bounds) before anything
// in it is used: malformed for a short message, wrong magic, reserved bits,
// a record past the end, trailing bytes or a count that does not match;
// unsupported for another version. Pure.
Result<BatchInfo> parse_batch(std::span<const std::byte> msg) noexcept;

// Walks the records of a batch parse_batch() accepted (and re-checks each
// bound, so it is safe on any bytes: false at the end or on a bad record).
class BatchCursor {
 public:
  BatchCursor() noexcept = default;
  explicit BatchCursor(std::span<const std::byte> msg) noexcept
      : rest_(msg.size() >= kBatchHeader ? msg.subspan(kBatchHeader) : std::span<const std::byte>{}) {}
  bool next(std::span<const std::byte>& record) noexcept;
  bool done() const noexcept { return rest_.empty(); }

 private:
  std::span<const std::byte> rest_;
};

// Builds a batch in a caller's buffer (an LDO's bytes).
class BatchWriter {
 public:
  BatchWriter() noexcept = default;
  explicit BatchWriter(std::span<std::byte> buffer) noexcept : buf_(buffer), used_(kBatchHeader) {}
  // Bytes a record of `length` takes in a batch.
  static constexpr std::size_t record_size(std::size_t length) noexcept { return kRecordHeader + length; }
  bool fits(std::size_t length) const noexcept { return used_ + record_size(length) <= buf_.size(); }
  // false (nothing written) when it does not fit.
  bool append(std::span<const std::byte> record) noexcept;
  // Writes the header; the batch is the first size() bytes.
  void finish(std::uint32_t sequence) noexcept;
  std::size_t size() const noexcept { return used_; }
  std::uint32_t count() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }

 private:
  std::span<std::byte> buf_;
  std::size_t used_ = 0;
  std::uint32_t count_ = 0;
};

}  // namespace regpool::aggregate
