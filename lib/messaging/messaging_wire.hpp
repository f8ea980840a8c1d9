#pragma once
// The messaging protocol's header (regpool/messaging.hpp, docs/messaging.md):
// every message a Messenger sends starts with these 64 bytes, little-endian
// (a brief eager message with 32 of its own, below).
// A ready-to-send notice (rts) carries the sender's 64-byte RemoteRef right
// after the header; a grant carries the receiver's. Pure functions, so the fuzzer (test/fuzz/
// messaging_wire_fuzz.cpp) reaches the parser without an endpoint.
//
//   off size field
//    0   4   magic "RPMG" (0x474d5052 little-endian)
//    4   1   version (4)
//    5   1   type: eager 1, rts 2, fin 3, credit 4, grant 5, done 6,
//            lead 7, part 8 (a split eager message)
//    6   1   space: 0 user tags, 1 replies of request/response
//    7   1   flags (must be 0)
//    8   4   credits returned to the receiver of this message
//   12   4   status (fin: the receiver's Status; done: the sender's; else 0)
//   16   8   tag (grant, part: the offset in the message of the granted
//            range or of the part's bytes; fin/credit/done 0)
//   24   8   length: eager and part, the payload after the header; lead,
//            the whole message's payload (more than it carries); rts, the
//            exposed message (1 .. 2^40); grant, the granted range (1 ..
//            2^40, offset + length <= 2^40); fin/credit/done 0
//   32   8   message id (rts/grant/fin pairing: the sender's id of the
//            message; done: the receiver's id from the grant; eager,
//            lead: the sender's counter; part: its lead's)
//   40   8   reply id (request/response: where the reply goes; 0 = none;
//            grant: the receiver's id, echoed by the done; fin: that id
//            when a grant for the message went out, else 0)
//   48   8   seq: per sender and receiver, from 1 (eager, rts, lead, part);
//            0 otherwise
//   56   4   accept_eager: the largest eager payload the sender of this
//            message accepts (its eager threshold), kMinEager .. kMaxEager
//   60   4   grant: the credits the sender of this message grants each
//            peer (its peer_credits), 1 .. kMaxCredits; credits <= grant
//
// Split rendezvous (docs/messaging.md): the receiver of an rts may answer
// with a grant, a write-only exposure of the tail of its buffer; the sender
// puts that range and answers with a done. The receiver gets the rest and
// sends the fin when its gets are over (naming the grant, so a sender that
// sees the fin first still serves it); the sender completes on the fin and
// its puts, the receiver on its gets and the done.
//
// Split eager (docs/messaging.md, "Split eager"): where the backend sends
// messages up to some size by a faster path than longer ones (shm: its
// inject size, past which every message goes by CMA), an eager payload the
// header pushes past that size leaves as a lead (header + the first bytes,
// length = the whole payload) and parts (header + the next bytes at offset
// `tag`), with consecutive sequence numbers, each on its own credit. The
// receiver takes them in sequence (Assembly): after a lead, the peer's next
// messages are its parts, in order, until the payload is complete.
//
// Brief eager (type 9): a small eager message after the sender has
// announced its limits to this peer, in a 32-byte header, so that a ring
// record of it (16 bytes of record header, 32 of this, up to kBriefMax of
// payload) fits one 64-byte cache line. Between two processes every line a
// message spans is one more transfer between their caches; a second one
// cost a send 0.02 us near and 0.11 us far apart (bench/RESULTS.md, "brief
// eager messages").
//
//   off size field
//    0   4   magic, as above
//    4   1   version, as above
//    5   1   type: 9
//    6   1   space: 0 (user tags only; a reply goes in the full header)
//    7   1   flags (must be 0)
//    8   4   credits returned to the receiver of this message
//   12   4   reserved (must be 0)
//   16   8   tag
//   24   8   seq (from 1)
//   32       the payload: 1 .. kBriefMax bytes (its length is the rest of
//            the message); no reply id, no message id, no limits (the peer
//            keeps those it learned from the full headers before)
//
// Negotiation: both limits ride on every message but brief ones, so a peer
// learns them from the first message it gets back (never a brief one: a
// sender uses them only once a message of its own went to the peer since
// it last knew nothing of us). Until then it assumes the smallest
// limits any Messenger has (eager payloads up to kMinEager, one credit):
// a larger message goes by rendezvous, later ones wait for credits. So two
// Messengers with different thresholds or credits work together; neither
// ever sends the other more than it announced.
#include <cstddef>
#include <cstdint>
#include <span>

#include "regpool/error.hpp"
#include "transport/wire_le.hpp"

namespace regpool::detail::msgwire {

inline constexpr std::uint32_t kMagic = 0x474d5052;  // "RPMG"
inline constexpr std::uint8_t kVersion = 5;
inline constexpr std::size_t kHeaderSize = 64;
inline constexpr std::size_t kBriefHeaderSize = 32;
inline constexpr std::size_t kBriefMax = 16;  // payload bytes of a brief eager message
inline constexpr std::uint8_t kBriefType = 9;
inline constexpr std::size_t kRefSize = 64;  // RemoteRef::kEncodedSize
inline constexpr std::size_t kRtsSize = kHeaderSize + kRefSize;  // also a grant
inline constexpr std::uint64_t kMaxLength = std::uint64_t{1} << 40;
// Largest status value a fin may carry (Status::truncated is the last).
inline constexpr std::uint32_t kMaxStatus = 255;
// Announced limits: every Messenger accepts eager payloads of at least
// kMinEager (its threshold is clamped there) and grants at least 1 credit.
inline constexpr std::uint32_t kMinEager = 64;
inline constexpr std::uint32_t kMaxEager = std::uint32_t{1} << 31;
inline constexpr std::uint32_t kMaxCredits = 65535;

enum class Type : std::uint8_t { eager = 1, rts = 2, fin = 3, credit = 4, grant = 5, done = 6, lead = 7, part = 8 };
enum class Space : std::uint8_t { user = 0, reply = 1 };

struct Header {
  Type type = Type::eager;
  Space space = Space::user;
  std::uint32_t credits = 0;
  std::uint32_t status = 0;
  std::uint64_t tag = 0;
  std::uint64_t length = 0;
  std::uint64_t msg_id = 0;
  std::uint64_t reply_id = 0;
  std::uint64_t seq = 0;
  std::uint32_t accept_eager = kMinEager;
  std::uint32_t grant = 1;
  // Parsed from a brief eager message (type eager, 32-byte header): its
  // payload starts at kBriefHeaderSize, and accept_eager/grant are not the
  // sender's (it announced them before).
  bool brief = false;
  std::size_t header_size() const noexcept { return brief ? kBriefHeaderSize : kHeaderSize; }
};

inline void encode(const Header& h, std::byte* out) noexcept {
  le::put_u32(out, kMagic);
  out[4] = static_cast<std::byte>(kVersion);
  out[5] = static_cast<std::byte>(h.type);
  out[6] = static_cast<std::byte>(h.space);
  out[7] = std::byte{0};
  le::put_u32(out + 8, h.credits);
  le::put_u32(out + 12, h.status);
  le::put_u64(out + 16, h.tag);
  le::put_u64(out + 24, h.length);
  le::put_u64(out + 32, h.msg_id);
  le::put_u64(out + 40, h.reply_id);
  le::put_u64(out + 48, h.seq);
  le::put_u32(out + 56, h.accept_eager);
  le::put_u32(out + 60, h.grant);
}

// A brief eager message's header (h.type eager, h.space user, h.reply_id
// 0: the caller checked), written at `out`.
inline void encode_brief(const Header& h, std::byte* out) noexcept {
  le::put_u32(out, kMagic);
  out[4] = static_cast<std::byte>(kVersion);
  out[5] = static_cast<std::byte>(kBriefType);
  out[6] = std::byte{0};
  out[7] = std::byte{0};
  le::put_u32(out + 8, h.credits);
  le::put_u32(out + 12, 0);
  le::put_u64(out + 16, h.tag);
  le::put_u64(out + 24, h.seq);
}

// Validates a received message of `received` bytes (header included)
// against the receiver's limits: `max_eager` is the largest eager payload
// the receiver accepts (its bounce buffers, the limit it announces).
// Returns malformed for any violation: short message, bad magic/version/
// type/space/flags, a length that disagrees with the bytes received
// (eager, part), an eager payload above max_eager (the sender ignored the
// announced limit; for a lead, the whole payload), a lead carrying none or
// all of its payload, a part with no bytes, at offset 0, ending past
// max_eager or with a reply id, a length of 0 or above 2^40 (rts, grant),
// a granted range ending past 2^40, an rts or grant without its
// reference, a fin/credit/done with a length or tag, seq 0 on eager, rts,
// lead or part or non-zero on the others, announced limits out of range,
// credits above the sender's own grant, a status above kMaxStatus or
// non-zero outside fin/done. Whether a part continues the message its
// peer is sending is Assembly's to check.
inline Status parse(std::span<const std::byte> msg, std::uint64_t max_eager, Header& out) noexcept {
  if (msg.size() < kBriefHeaderSize) return Status::malformed;
  const std::byte* p = msg.data();
  if (le::get_u32(p) != kMagic) return Status::malformed;
  if (std::to_integer<std::uint8_t>(p[4]) != kVersion) return Status::malformed;
  const auto type = std::to_integer<std::uint8_t>(p[5]);
  const auto space = std::to_integer<std::uint8_t>(p[6]);
  if (type == kBriefType) {
    // A brief eager message: user space, no flags, reserved 0, seq from 1,
    // 1 .. kBriefMax payload bytes within the receiver's limit.
    const std::size_t payload = msg.size() - kBriefHeaderSize;
    if (space != 0 || std::to_integer<std::uint8_t>(p[7]) != 0 || le::get_u32(p + 12) != 0) return Status::malformed;
    if (payload == 0 || payload > kBriefMax || payload > max_eager) return Status::malformed;
    Header h;
    h.type = Type::eager;
    h.brief = true;
    h.credits = le::get_u32(p + 8);
    h.tag = le::get_u64(p + 16);
    h.seq = le::get_u64(p + 24);
    h.length = payload;
    if (h.credits > kMaxCredits || h.seq == 0) return Status::malformed;
    out = h;
    return Status::ok;
  }
  if (msg.size() < kHeaderSize) return Status::malformed;
  if (type < 1 || type > 8) return Status::malformed;
  if (space > 1) return Status::malformed;
  if (std::to_integer<std::uint8_t>(p[7]) != 0) return Status::malformed;
  Header h;
  h.type = static_cast<Type>(type);
  h.space = static_cast<Space>(space);
  h.credits = le::get_u32(p + 8);
  h.status = le::get_u32(p + 12);
  h.tag = le::get_u64(p + 16);
  h.length = le::get_u64(p + 24);
  h.msg_id = le::get_u64(p + 32);
  h.reply_id = le::get_u64(p + 40);
  h.seq = le::get_u64(p + 48);
  h.accept_eager = le::get_u32(p + 56);
  h.grant = le::get_u32(p + 60);
  if (h.accept_eager < kMinEager || h.accept_eager > kMaxEager) return Status::malformed;
  if (h.grant == 0 || h.grant > kMaxCredits || h.credits > h.grant) return Status::malformed;
  if (h.status > kMaxStatus) return Status::malformed;
  switch (h.type) {
    case Type::eager:
      if (h.length > max_eager || msg.size() != kHeaderSize + h.length) return Status::malformed;
      if (h.seq == 0 || h.status != 0) return Status::malformed;
      break;
    case Type::lead:
      if (h.length > max_eager || msg.size() <= kHeaderSize || msg.size() - kHeaderSize >= h.length) {
        return Status::malformed;
      }
      if (h.seq == 0 || h.status != 0) return Status::malformed;
      break;
    case Type::part:
      if (h.length == 0 || h.length > max_eager || msg.size() != kHeaderSize + h.length) return Status::malformed;
      if (h.tag == 0 || h.tag >= max_eager || h.length > max_eager - h.tag) return Status::malformed;
      if (h.seq == 0 || h.status != 0 || h.reply_id != 0) return Status::malformed;
      break;
    case Type::rts:
      if (msg.size() != kRtsSize || h.length == 0 || h.length > kMaxLength) return Status::malformed;
      if (h.seq == 0 || h.status != 0) return Status::malformed;
      break;
    case Type::grant:
      if (msg.size() != kRtsSize || h.length == 0 || h.length > kMaxLength || h.tag > kMaxLength - h.length) {
        return Status::malformed;
      }
      if (h.seq != 0 || h.status != 0) return Status::malformed;
      break;
    case Type::fin:
    case Type::credit:
    case Type::done:
      if (msg.size() != kHeaderSize || h.length != 0 || h.seq != 0 || h.tag != 0) return Status::malformed;
      if (h.type == Type::credit && (h.status != 0 || h.msg_id != 0)) return Status::malformed;
      break;
  }
  out = h;
  return Status::ok;
}

// The bytes a message carries after its header (what parse checked), `h`
// its parsed header.
inline std::uint64_t carried(std::span<const std::byte> msg, const Header& h) noexcept {
  return msg.size() - h.header_size();
}

// A split eager message being received from one peer: its lead started
// it; each of the peer's next in-sequence messages must be its next part.
// next() accepts a part only at the offset where the bytes so far end, of
// the same message and space, and within its length, so the parts write
// [0, length) once each, in order, and nothing else.
struct Assembly {
  bool active = false;
  Space space = Space::user;
  std::uint64_t msg_id = 0;
  std::uint64_t length = 0;  // the whole payload
  std::uint64_t got = 0;     // bytes in so far: the next part's offset

  void start(const Header& lead, std::uint64_t carried_bytes) noexcept {
    active = true;
    space = lead.space;
    msg_id = lead.msg_id;
    length = lead.length;
    got = carried_bytes;
  }
  // Part `h` (parsed) continues this message: got moves past it; complete
  // when the payload is in (active goes false). False: not this message's
  // next part (the caller abandons the message).
  bool next(const Header& h) noexcept {
    if (!active || h.type != Type::part || h.msg_id != msg_id || h.space != space || h.tag != got ||
        h.length > length - got) {
      return false;
    }
    got += h.length;
    if (got == length) active = false;
    return true;
  }
};

}  // namespace regpool::detail::msgwire
