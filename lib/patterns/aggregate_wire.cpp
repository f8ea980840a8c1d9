#include "patterns/aggregate_wire.hpp"

#include <cstring>

#include "transport/wire_le.hpp"

namespace regpool::aggregate {

Result<BatchInfo> parse_batch(std::span<const std::byte> msg) noexcept {
  if (msg.size() < kBatchHeader) return Status::malformed;
  if (le::get_u32(msg.data()) != kMagic) return Status::malformed;
  if (le::get_u16(msg.data() + 4) != kVersion) return Status::unsupported;
  if (le::get_u16(msg.data() + 6) != 0) return Status::malformed;
  BatchInfo info;
  info.count = le::get_u32(msg.data() + 8);
  info.sequence = le::get_u32(msg.data() + 12);
  // Every record takes at least its length field: a count the message cannot
  // hold is refused before walking.
  if (info.count > (msg.size() - kBatchHeader) / kRecordHeader) return Status::malformed;
  BatchCursor cur(msg);
  std::span<const std::byte> rec;
  std::uint32_t n = 0;
  while (cur.next(rec)) ++n;
  if (!cur.done() || n != info.count) return Status::malformed;
  return info;
}

bool BatchCursor::next(std::span<const std::byte>& record) noexcept {
  if (rest_.size() < kRecordHeader) return false;
  const std::uint32_t len = le::get_u32(rest_.data());
  if (len > rest_.size() - kRecordHeader) return false;
  record = rest_.subspan(kRecordHeader, len);
  rest_ = rest_.subspan(kRecordHeader + len);
  return true;
}

bool BatchWriter::append(std::span<const std::byte> record) noexcept {
  if (!fits(record.size()) || record.size() > UINT32_MAX) return false;
  le::put_u32(buf_.data() + used_, static_cast<std::uint32_t>(record.size()));
  if (!record.empty()) std::memcpy(buf_.data() + used_ + kRecordHeader, record.data(), record.size());
  used_ += record_size(record.size());
  ++count_;
  return true;
}

void BatchWriter::finish(std::uint32_t sequence) noexcept {
  le::put_u32(buf_.data(), kMagic);
  le::put_u16(buf_.data() + 4, kVersion);
  le::put_u16(buf_.data() + 6, 0);
  le::put_u32(buf_.data() + 8, count_);
  le::put_u32(buf_.data() + 12, sequence);
}

}  // namespace regpool::aggregate
