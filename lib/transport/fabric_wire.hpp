#pragma once
// Wire formats of FabricEndpoint, as pure functions (no libfabric calls) so
// the fuzzers in test/fuzz reach them directly:
//  - the endpoint name peers hand each other through an unauthenticated
//    bootstrap ("RP" blob wrapping the provider's own address(es));
//  - the control messages of emulated atomics (CtrlMsg), which any process
//    that knows a target's name can send to its control endpoint.
// Every byte of both comes from another process. The checks here are what
// stands between those bytes and fi_av_insert / the target's memory: a
// provider address is accepted only in the format and length the local
// provider itself reports (FabricAddrRules, built from our own fi_getname
// and fi_info::addr_format), so libfabric never reads past what we hand it.
//
// Every check returns the name of the offending field (a static string) or
// nullptr when the input is valid; callers put it into their Error message.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "transport/wire_le.hpp"

namespace regpool::fabric_wire {

// How the local provider spells addresses (from fi_info::addr_format).
enum class AddrKind : std::uint8_t {
  sockaddr_in,   // FI_SOCKADDR_IN: struct sockaddr_in, 16 bytes
  sockaddr_in6,  // FI_SOCKADDR_IN6: struct sockaddr_in6, 28 bytes
  string,        // FI_ADDR_STR: "scheme://rest" with its terminating NUL (shm)
  opaque,        // anything else: exactly the length our own name has
};

// Largest provider address accepted at all. Providers may read up to their
// own maximum address length from the pointer given to fi_av_insert (shm
// copies SMR_NAME_MAX = 256 bytes), so callers copy a validated address
// into a zero-filled buffer of this size before handing it over.
constexpr std::size_t kMaxProviderAddr = 256;

struct AddrRules {
  AddrKind kind = AddrKind::opaque;
  // sockaddr/opaque: the exact length; string: the largest length, NUL
  // included (kMaxProviderAddr at most).
  std::size_t length = 0;
  // string: the scheme our own name starts with, e.g. "fi_shm://".
  std::string_view scheme;
};

constexpr std::uint16_t kAfInet = 2;    // AF_INET on Linux
constexpr std::uint16_t kAfInet6 = 10;  // AF_INET6 on Linux

// One provider address, against the rules of the local provider.
inline const char* check_address(std::span<const std::byte> a, const AddrRules& r) noexcept {
  if (a.empty()) return "address length (0)";
  if (a.size() > kMaxProviderAddr) return "address length (above the largest provider address)";
  auto u16 = [&](std::size_t at) { return le::get_u16(a.data() + at); };
  switch (r.kind) {
    case AddrKind::sockaddr_in: {
      if (a.size() != 16) return "address length (not a sockaddr_in)";
      if (u16(0) != kAfInet) return "address family (not AF_INET)";
      if (a[2] == std::byte{0} && a[3] == std::byte{0}) return "address port (0)";
      for (std::size_t i = 8; i < 16; ++i) {
        if (a[i] != std::byte{0}) return "address padding (sin_zero not zero)";
      }
      return nullptr;
    }
    case AddrKind::sockaddr_in6: {
      if (a.size() != 28) return "address length (not a sockaddr_in6)";
      if (u16(0) != kAfInet6) return "address family (not AF_INET6)";
      if (a[2] == std::byte{0} && a[3] == std::byte{0}) return "address port (0)";
      return nullptr;
    }
    case AddrKind::string: {
      if (a.size() > r.length) return "address length (longer than the provider's names)";
      if (a.back() != std::byte{0}) return "address string (not NUL-terminated)";
      const std::size_t n = a.size() - 1;  // characters before the NUL
      if (n <= r.scheme.size() ||
          std::memcmp(a.data(), r.scheme.data(), r.scheme.size()) != 0) {
        return "address scheme (not this provider's)";
      }
      // After the scheme: the provider's own spelling (digits, letters and
      // separators). No '/' (shm names become shm_open paths), no NUL.
      for (std::size_t i = r.scheme.size(); i < n; ++i) {
        const auto c = static_cast<unsigned char>(a[i]);
        const bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (!alnum && c != ':' && c != '.' && c != '_' && c != '-') return "address string (unexpected character)";
      }
      return nullptr;
    }
    case AddrKind::opaque: return a.size() == r.length ? nullptr : "address length (not the provider's)";
  }
  return "address format";
}

// ------------------------------------------------------------- names
// "RP", version, flags, u16 data address length, u16 control address
// length (little endian), then the addresses.
// Flags (version 2):
//  - bit 1 (kNameEmulates): the endpoint's atomics are emulated (control
//    messages), not the provider's own. Both ends of a pair must agree;
//  - bit 0 (kNameHasCtrl): the endpoint serves emulated atomics, and its
//    control address follows the data address. Set only with bit 1. An
//    emulating endpoint without it takes no atomics (initiators refuse
//    them at once with Status::unsupported) and may still issue them.
//  - bit 2 (kNameLimit): a u32 (little endian) follows the header, before
//    the addresses: the largest message this endpoint accepts, in bytes
//    (at least kMinMessageLimit). Set where a longer message would harm
//    the receiver rather than fail its own receive (net stalls on a
//    message longer than its receive + regpool's overflow area;
//    tcp;ofi_rxm crashes in the next receive when the sender of a
//    rendezvous-size message dies before it is matched): senders refuse
//    such a send locally (Status::message_too_large). Without the bit the
//    endpoint takes any length the provider carries.
//  - bit 3 (kNameRings): shm only: the endpoint sends and receives its
//    messages through regpool's own rings (transport/shm_rings.hpp), in a
//    file named after its address. Both ends of a pair must agree.
// Version 1 (regpool before the control endpoint became optional) had bit
// 0 only, meaning "emulates and serves"; its names are refused ("name
// version"): peers must run the same name version, nothing is negotiated.
constexpr std::uint8_t kNameVersion = 2;
constexpr std::size_t kNameHeader = 8;
constexpr std::uint8_t kNameHasCtrl = 1;
constexpr std::uint8_t kNameEmulates = 2;
constexpr std::uint8_t kNameLimit = 4;
constexpr std::uint8_t kNameRings = 8;
constexpr std::size_t kNameLimitField = 4;
// Smallest message limit a name may carry (and an endpoint may be opened
// with): below it no control message or small payload would pass.
constexpr std::uint64_t kMinMessageLimit = 4096;
constexpr std::uint64_t kMaxMessageLimit = 0xffffffffu;
// A control address must fit a control message (CtrlMsg::name).
constexpr std::size_t kCtrlNameMax = 64;

struct ParsedName {
  std::span<const std::byte> data;
  std::span<const std::byte> ctrl;  // empty unless the endpoint serves emulated atomics
  bool has_ctrl = false;            // serves emulated atomics (ctrl is its control address)
  bool emulates = false;            // its atomics are emulated
  std::uint64_t message_limit = 0;  // largest message it accepts; 0: no limit
  bool rings = false;               // shm: its messages go through regpool's rings
};

inline const char* parse_name(std::span<const std::byte> name, const AddrRules& rules, ParsedName& out) noexcept {
  out = ParsedName{};
  if (name.size() < kNameHeader) return "name length (shorter than the header)";
  if (name[0] != std::byte{'R'} || name[1] != std::byte{'P'}) return "name magic (not a regpool fabric name)";
  if (name[2] != std::byte{kNameVersion}) {
    return name[2] == std::byte{1} ? "name version (1: a regpool older than this one, which speaks 2)"
                                   : "name version (unknown)";
  }
  const auto flags = static_cast<std::uint8_t>(name[3]);
  if ((flags & ~(kNameHasCtrl | kNameEmulates | kNameLimit | kNameRings)) != 0) return "name flags (unknown bits)";
  const bool has_ctrl = (flags & kNameHasCtrl) != 0;
  const bool emulates = (flags & kNameEmulates) != 0;
  const std::size_t head = kNameHeader + ((flags & kNameLimit) != 0 ? kNameLimitField : 0);
  if (has_ctrl && !emulates) return "name flags (control address without emulated atomics)";
  if (name.size() < head) return "name length (shorter than the message limit field)";
  const std::uint64_t limit = head > kNameHeader ? le::get_u32(name.data() + kNameHeader) : 0;
  if (head > kNameHeader && limit < kMinMessageLimit) return "message limit (below 4 KiB)";
  const std::size_t data_len = le::get_u16(name.data() + 4);
  const std::size_t ctrl_len = le::get_u16(name.data() + 6);
  if (head + data_len + ctrl_len != name.size()) return "name length (fields do not add up)";
  if (has_ctrl != (ctrl_len > 0)) return "control address length (disagrees with the flags)";
  if (ctrl_len > kCtrlNameMax) return "control address length (above 64)";
  const auto data = name.subspan(head, data_len);
  const auto ctrl = name.subspan(head + data_len, ctrl_len);
  if (const char* why = check_address(data, rules)) return why;
  if (has_ctrl) {
    if (const char* why = check_address(ctrl, rules)) return why;
  }
  out.data = data;
  out.ctrl = ctrl;
  out.has_ctrl = has_ctrl;
  out.emulates = emulates;
  out.message_limit = limit;
  out.rings = (flags & kNameRings) != 0;
  return nullptr;
}

// The name FabricEndpoint hands out (the inverse of parse_name for valid
// input; ctrl empty unless `serves`; message_limit 0 for none, else within
// kMinMessageLimit..kMaxMessageLimit, which the caller checked).
inline std::vector<std::byte> encode_name(std::span<const std::byte> data, std::span<const std::byte> ctrl,
                                          bool emulates, std::uint64_t message_limit, bool rings = false) {
  std::vector<std::byte> name(kNameHeader + (message_limit != 0 ? kNameLimitField : 0));
  name[0] = std::byte{'R'};
  name[1] = std::byte{'P'};
  name[2] = std::byte{kNameVersion};
  std::uint8_t flags = emulates ? kNameEmulates : 0;
  if (!ctrl.empty()) flags |= kNameHasCtrl;
  if (message_limit != 0) flags |= kNameLimit;
  if (rings) flags |= kNameRings;
  name[3] = std::byte{flags};
  le::put_u16(&name[4], static_cast<std::uint16_t>(data.size()));
  le::put_u16(&name[6], static_cast<std::uint16_t>(ctrl.size()));
  if (message_limit != 0) le::put_u32(&name[kNameHeader], static_cast<std::uint32_t>(message_limit));
  name.insert(name.end(), data.begin(), data.end());
  name.insert(name.end(), ctrl.begin(), ctrl.end());
  return name;
}

// ------------------------------------------------------------- control messages
constexpr std::uint32_t kCtrlMagic = 0x54415052;  // "RPAT"
constexpr std::uint8_t kCtrlRequest = 1;
constexpr std::uint8_t kCtrlReply = 2;
// OpKind values of the two atomics (checked against the enum where it is
// visible: fabric_endpoint.cpp).
constexpr std::uint8_t kOpFetchAdd = 4;
constexpr std::uint8_t kOpCompareSwap = 5;
// Largest Status value a reply may carry (Status::transport_error).
constexpr std::uint8_t kMaxStatus = 18;

struct CtrlMsg {
  std::uint32_t magic;
  std::uint8_t type;
  std::uint8_t op;
  std::uint8_t status;    // replies: a Status; requests: 0
  std::uint8_t name_len;  // requests: the requester's control address; replies: 0
  std::uint32_t index;    // the requester's slot, echoed in the reply
  std::uint32_t reserved;
  std::uint64_t token;
  std::uint64_t key;
  std::uint64_t address;
  std::uint64_t operand;
  std::uint64_t compare;
  std::uint64_t value;
  std::uint8_t name[kCtrlNameMax];
};
constexpr std::size_t kCtrlMsgSize = 128;
static_assert(sizeof(CtrlMsg) == kCtrlMsgSize);
static_assert(std::is_trivially_copyable_v<CtrlMsg>);

// Checks a received control message (`bytes` is what arrived, any length).
// `max_index`: replies must name one of our slots (index < max_index).
// Requests' reply addresses must satisfy `rules`. On success `out` holds the
// message; fields not listed as meaningful for its type are zero.
inline const char* parse_ctrl(std::span<const std::byte> bytes, const AddrRules& rules, std::uint32_t max_index,
                              CtrlMsg& out) noexcept {
  if (bytes.size() != kCtrlMsgSize) return "control message length";
  std::memcpy(&out, bytes.data(), kCtrlMsgSize);
  if (out.magic != kCtrlMagic) return "control message magic";
  if (out.reserved != 0) return "control message reserved field";
  if (out.type == kCtrlRequest) {
    if (out.op != kOpFetchAdd && out.op != kOpCompareSwap) return "control request op";
    if (out.status != 0) return "control request status (not 0)";
    if (out.value != 0) return "control request value (not 0)";
    if (out.token == 0) return "control request token (0)";
    if (out.name_len == 0 || out.name_len > kCtrlNameMax) return "control request name_len";
    for (std::size_t i = out.name_len; i < kCtrlNameMax; ++i) {
      if (out.name[i] != 0) return "control request name padding";
    }
    const std::span<const std::byte> name(reinterpret_cast<const std::byte*>(out.name), out.name_len);
    if (const char* why = check_address(name, rules)) return why;
    return nullptr;
  }
  if (out.type == kCtrlReply) {
    if (out.op != kOpFetchAdd && out.op != kOpCompareSwap) return "control reply op";
    if (out.status > kMaxStatus) return "control reply status";
    if (out.index >= max_index) return "control reply index";
    if (out.token == 0) return "control reply token (0)";
    if (out.name_len != 0 || out.key != 0 || out.address != 0 || out.operand != 0 || out.compare != 0) {
      return "control reply request fields (not 0)";
    }
    for (std::uint8_t c : out.name) {
      if (c != 0) return "control reply name (not empty)";
    }
    return nullptr;
  }
  return "control message type";
}

}  // namespace regpool::fabric_wire
