// Fuzzes the bootstrap's frame reader (header, then payload arriving in
// pieces) and rank 0's allgather reply (unpack_gathered). Input layout: byte
// 0 picks the piece size, bytes 1-2 the job size and bound, the rest is the
// stream. Properties checked on every input:
//  - feeding the stream in pieces gives the same outcome as feeding it whole
//    (same state, same payload, same error);
//  - the reader never consumes past its frame, and a finished frame's
//    payload is exactly the bytes after the header;
//  - the announced length never exceeds the bound, and memory held is in
//    proportion to bytes received, never to the announced length;
//  - unpack_gathered accepts only what pack_gathered would produce (round
//    trip) and always says why it refused.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "transport/bootstrap_wire.hpp"

namespace bw = regpool::bootwire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const std::size_t piece = 1 + data[0] % 37;
  const std::size_t count = 1 + data[1] % 4;
  const std::uint64_t bound = data[2] % 2 ? 1024 : (std::uint64_t{64} << 20);
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data) + 3, size - 3);

  bw::FrameReader whole(1, bound);
  const std::size_t used_whole = whole.feed(in);
  bw::FrameReader parts(1, bound);
  std::size_t used = 0;
  while (used < in.size() && parts.wanted() > 0) {
    const std::size_t n = std::min(piece, in.size() - used);
    const std::size_t u = parts.feed(in.subspan(used, n));
    if (u > n) std::abort();
    used += u;
    if (parts.state() == bw::FrameReader::State::payload &&
        parts.capacity() > 2 * parts.received() + 2 * piece + 64) {
      std::abort();  // memory out of proportion to what arrived
    }
  }
  if (used != used_whole || parts.state() != whole.state() || parts.error() != whole.error()) std::abort();
  if (whole.state() == bw::FrameReader::State::failed && whole.error().empty()) std::abort();
  if (whole.state() != bw::FrameReader::State::header && whole.state() != bw::FrameReader::State::failed &&
      whole.length() > bound) {
    std::abort();
  }
  if (whole.state() == bw::FrameReader::State::done) {
    if (used_whole != bw::kFrameHeaderSize + whole.length()) std::abort();
    const auto p1 = whole.take();
    const auto p2 = parts.take();
    if (p1 != p2) std::abort();
    if (!p1.empty() && std::memcmp(p1.data(), in.data() + bw::kFrameHeaderSize, p1.size()) != 0) std::abort();
    std::string why;
    auto all = bw::unpack_gathered(p1, count, why);
    if (all) {
      if (all->size() != count || bw::pack_gathered(*all) != p1) std::abort();
    } else if (why.empty()) {
      std::abort();
    }
  }
  // The reply parser straight on the stream as well (no frame around it).
  std::string why;
  if (auto all = bw::unpack_gathered(in, count, why)) {
    const auto again = bw::pack_gathered(*all);
    if (again.size() != in.size() || std::memcmp(again.data(), in.data(), in.size()) != 0) std::abort();
  }
  return 0;
}
