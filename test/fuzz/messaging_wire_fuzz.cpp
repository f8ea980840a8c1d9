// Fuzzes the messaging protocol's header parser (lib/messaging/
// messaging_wire.hpp: every message a Messenger receives from a peer).
// Properties checked on every input, not only "no crash":
//  - whatever parses re-encodes to exactly the input's 64 header bytes (one
//    encoding per meaning);
//  - a parsed message respects the limits it was parsed with: eager length
//    equals the bytes after the header and is at most max_eager; an rts is
//    exactly header + reference with 1 <= length <= 2^40; a grant is
//    header + reference, its range (tag = offset, length) inside 1 .. 2^40
//    and status 0; fin/credit/done are a bare header with tag 0; seq != 0
//    exactly on eager/rts/lead/part; a lead carries some but not all of its
//    length (at most max_eager); a part carries exactly its length, at an
//    offset >= 1, ending within max_eager, with no reply id;
//  - the limits it announces (negotiation) are in range: accept_eager in
//    kMinEager..kMaxEager, grant in 1..kMaxCredits, credits <= grant;
//  - the limits come from the input too, and a parse that succeeds under
//    tighter limits succeeds under looser ones;
//  - a brief eager message (type 9, 32-byte header) re-encodes to its 32
//    header bytes and carries 1 .. kBriefMax bytes of a user-space eager
//    message with a sequence number.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "messaging/messaging_wire.hpp"

namespace mw = regpool::detail::msgwire;

namespace {
// A brief eager message: its 32 header bytes re-encode exactly, it
// carries 1 .. kBriefMax bytes of a user-space eager message with a
// sequence number, and no limits of its sender's.
void check_brief(std::span<const std::byte> msg, std::uint64_t max_eager, const mw::Header& h) {
  std::byte again[mw::kBriefHeaderSize];
  mw::encode_brief(h, again);
  if (std::memcmp(again, msg.data(), mw::kBriefHeaderSize) != 0) std::abort();
  if (h.type != mw::Type::eager || h.space != mw::Space::user || h.seq == 0 || h.length == 0 ||
      h.length > mw::kBriefMax || h.length > max_eager || msg.size() != mw::kBriefHeaderSize + h.length ||
      mw::carried(msg, h) != h.length || h.reply_id != 0 || h.msg_id != 0 || h.status != 0 ||
      h.credits > mw::kMaxCredits) {
    std::abort();
  }
}

// A message with the full header: its 64 header bytes re-encode exactly,
// it announces limits in range and respects those it was parsed with.
void check_full(std::span<const std::byte> msg, std::uint64_t max_eager, const mw::Header& h) {
  std::byte again[mw::kHeaderSize];
  mw::encode(h, again);
  if (std::memcmp(again, msg.data(), mw::kHeaderSize) != 0) std::abort();
  if (h.accept_eager < mw::kMinEager || h.accept_eager > mw::kMaxEager) std::abort();
  if (h.grant == 0 || h.grant > mw::kMaxCredits || h.credits > h.grant) std::abort();
  switch (h.type) {
    case mw::Type::eager:
      if (h.length > max_eager || msg.size() != mw::kHeaderSize + h.length || h.seq == 0) std::abort();
      break;
    case mw::Type::rts:
      if (msg.size() != mw::kRtsSize || h.length == 0 || h.length > mw::kMaxLength || h.seq == 0) std::abort();
      break;
    case mw::Type::lead:
      if (h.length > max_eager || msg.size() <= mw::kHeaderSize || mw::carried(msg, h) >= h.length || h.seq == 0) {
        std::abort();
      }
      break;
    case mw::Type::part:
      if (h.length == 0 || msg.size() != mw::kHeaderSize + h.length || h.tag == 0 || h.tag + h.length > max_eager ||
          h.seq == 0 || h.reply_id != 0) {
        std::abort();
      }
      break;
    case mw::Type::grant:
      if (msg.size() != mw::kRtsSize || h.length == 0 || h.length > mw::kMaxLength ||
          h.tag + h.length > mw::kMaxLength || h.seq != 0 || h.status != 0) {
        std::abort();
      }
      break;
    case mw::Type::fin:
    case mw::Type::credit:
    case mw::Type::done:
      if (msg.size() != mw::kHeaderSize || h.length != 0 || h.seq != 0 || h.tag != 0) std::abort();
      break;
    default: std::abort();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  // First two bytes pick the receiver's eager limit; the rest is the
  // message (the second byte is kept so older seeds keep their layout).
  const std::uint64_t max_eager = std::uint64_t{data[0]} * 64;
  const std::span<const std::byte> msg{reinterpret_cast<const std::byte*>(data + 2), size - 2};
  mw::Header h;
  if (mw::parse(msg, max_eager, h) != regpool::Status::ok) return 0;
  if (h.brief) {
    check_brief(msg, max_eager, h);
  } else {
    check_full(msg, max_eager, h);
  }
  mw::Header loose;
  if (mw::parse(msg, max_eager + 64, loose) != regpool::Status::ok) std::abort();
  return 0;
}
