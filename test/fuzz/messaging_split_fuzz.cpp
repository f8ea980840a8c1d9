// Fuzzes the reassembly of split eager messages (lib/messaging/
// messaging_wire.hpp, Assembly; the Messenger's arrive_split applies the
// same rule): a stream of messages from one peer, each parsed as the
// Messenger parses it, then taken in sequence. Properties checked on every
// input, not only "no crash":
//  - a lead starts a message that carries some but not all of its length,
//    within the receiver's eager limit;
//  - a part is accepted only at the offset where the bytes so far end, so
//    the accepted bytes land inside [0, length), each byte exactly once;
//  - a message completes exactly when all its bytes are in;
//  - anything else while a message is open (another message, a part of
//    another message, a misplaced part) abandons it, and a part with no
//    open message is refused.
// Input: byte 0 picks the receiver's eager limit (x 64); then records of a
// 2-byte little-endian length and that many bytes of message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "messaging/messaging_wire.hpp"

namespace mw = regpool::detail::msgwire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint64_t max_eager = std::uint64_t{data[0]} * 64;
  std::size_t at = 1;
  mw::Assembly as;
  std::vector<std::uint8_t> written;  // per byte of the open message: times written
  const auto write = [&](std::uint64_t off, std::uint64_t n) {
    if (off > written.size() || n > written.size() - off) std::abort();
    for (std::uint64_t j = off; j < off + n; ++j) {
      if (written[j]++ != 0) std::abort();
    }
  };
  while (at + 2 <= size) {
    const std::size_t len = data[at] | (std::size_t{data[at + 1]} << 8);
    at += 2;
    if (len > size - at) break;
    const std::span<const std::byte> msg{reinterpret_cast<const std::byte*>(data + at), len};
    at += len;
    mw::Header h;
    if (mw::parse(msg, max_eager, h) != regpool::Status::ok) continue;
    if (!as.active && h.type != mw::Type::lead && h.type != mw::Type::part) continue;
    if (h.type == mw::Type::part) {
      const bool open = as.active;
      const std::uint64_t before = as.got;
      if (!as.next(h)) {
        as = mw::Assembly{};  // abandoned (or there was none)
        continue;
      }
      if (!open || h.tag != before || as.got != before + h.length) std::abort();
      write(h.tag, h.length);
      if (!as.active) {
        if (as.got != as.length) std::abort();
        for (const std::uint8_t w : written) {
          if (w != 1) std::abort();
        }
        as = mw::Assembly{};
      }
      continue;
    }
    as = mw::Assembly{};  // a new message abandons the open one
    if (h.type != mw::Type::lead) continue;
    const std::uint64_t carried = mw::carried(msg, h);
    if (carried == 0 || carried >= h.length || h.length > max_eager) std::abort();
    as.start(h, carried);
    written.assign(h.length, 0);
    write(0, carried);
  }
  return 0;
}
