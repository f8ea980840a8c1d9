#pragma once
// The verbs endpoint's name (what insert_peer gets, and what every
// connection request carries as its sender), as a pure parser the fuzzer in
// test/fuzz reaches directly. Every byte comes from another process over an
// unauthenticated bootstrap or UD datagram; each field is checked before it
// feeds an address handle or a QP transition.
//
// check_name returns the name of the offending field (a static string) or
// nullptr when the name is valid for a port whose link layer is
// `local_ethernet`.
//
// Also the connection control messages (CtrlMsg), sent over the endpoints'
// UD queue pairs: REQ/REP make an RC connection, REL/REL_ACK/REL_NAK release
// an idle one (lib/transport/idle_release.hpp). parse_ctrl checks every
// field of a received datagram the same way.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

namespace regpool::verbs_wire {

constexpr std::uint32_t kNameMagic = 0x4e565052;  // "RPVN"
constexpr std::uint8_t kNameVersion = 1;
constexpr std::size_t kNameSize = 40;
constexpr std::uint8_t kFlagEthernet = 1;  // RoCE: addressed by GID
// enum ibv_mtu: IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5.
constexpr std::uint8_t kMtuMin = 1;
constexpr std::uint8_t kMtuMax = 5;
// Unicast LIDs (0 = unassigned, 0xC000 and up = multicast / permissive).
constexpr std::uint16_t kLidUnicastMax = 0xBFFF;
// QP numbers are 24 bits; 0 and 1 are the special SMI/GSI QPs.
constexpr std::uint32_t kQpnMax = 0xFFFFFF;

struct WireName {
  std::uint32_t magic;
  std::uint8_t version;
  std::uint8_t flags;  // bit 0: ethernet (RoCE)
  std::uint8_t port;
  std::uint8_t mtu;    // enum ibv_mtu
  std::uint16_t lid;
  std::uint16_t reserved;
  std::uint32_t ud_qpn;
  std::uint64_t endpoint_id;
  std::uint8_t gid[16];
};
static_assert(sizeof(WireName) == kNameSize);
static_assert(std::is_trivially_copyable_v<WireName>);

inline const char* check_name(const WireName& w, bool local_ethernet) noexcept {
  if (w.magic != kNameMagic) return "name magic (not a regpool verbs name)";
  if (w.version != kNameVersion) return "name version";
  if ((w.flags & ~kFlagEthernet) != 0) return "name flags (unknown bits)";
  const bool ethernet = (w.flags & kFlagEthernet) != 0;
  if (ethernet != local_ethernet) return "name link layer (RoCE and InfiniBand do not mix)";
  if (w.port == 0) return "name port (0)";
  if (w.mtu < kMtuMin || w.mtu > kMtuMax) return "name mtu (not an ibv_mtu)";
  if (w.reserved != 0) return "name reserved field";
  if (w.ud_qpn < 2 || w.ud_qpn > kQpnMax) return "name ud_qpn (outside 2..2^24-1)";
  if (w.endpoint_id == 0) return "name endpoint_id (0)";
  if (ethernet) {
    // RoCE addresses by GID; the LID is unassigned.
    if (w.lid != 0) return "name lid (RoCE ports have none)";
    bool zero = true;
    for (std::uint8_t b : w.gid) zero = zero && b == 0;
    if (zero) return "name gid (all zero)";
    if (w.gid[0] == 0xff) return "name gid (multicast)";
  } else if (w.lid == 0 || w.lid > kLidUnicastMax) {
    return "name lid (not a unicast LID)";
  }
  return nullptr;
}

// ---- control messages over UD ----
constexpr std::uint32_t kCtrlMagic = 0x43565052;  // "RPVC"
enum CtrlType : std::uint8_t {
  kReq = 1,      // connect: qpn/psn of the sender's RC QP, its epoch
  kRep = 2,      // answer to a REQ: qpn/psn, the epoch answered
  kRel = 3,      // release: the pair (sender's qpn, receiver's dst_qpn) is idle here
  kRelAck = 4,   // granted (or that QP is gone already): both sides destroy
  kRelNak = 5,   // refused: still in use here
};
constexpr std::uint32_t kPsnMax = 0xFFFFFF;

struct CtrlMsg {
  std::uint32_t magic;
  std::uint8_t type;
  std::uint8_t reserved[3];
  std::uint32_t qpn;      // sender's RC QP for this pair
  std::uint32_t psn;      // REQ/REP: sender's initial send PSN (else 0)
  std::uint32_t epoch;    // REQ: sender's epoch; REP: the epoch answered (else 0)
  std::uint32_t dst_qpn;  // REL*: the receiver's RC QP of the pair (REQ/REP: 0)
  std::uint64_t dst_id;   // endpoint id the message is for
  WireName src;           // the sender, so a target can answer unknown peers
};
constexpr std::size_t kCtrlSize = sizeof(CtrlMsg);
static_assert(kCtrlSize == 72);
static_assert(std::is_trivially_copyable_v<CtrlMsg>);

inline const char* parse_name(std::span<const std::byte> name, bool local_ethernet, WireName& out) noexcept {
  out = WireName{};
  if (name.size() != kNameSize) return "name length (not 40 bytes)";
  std::memcpy(&out, name.data(), kNameSize);
  return check_name(out, local_ethernet);
}

// A datagram's payload (after the GRH) as a control message for the
// endpoint `self_id`; nullptr when every field is valid.
inline const char* parse_ctrl(std::span<const std::byte> bytes, bool local_ethernet, std::uint64_t self_id,
                              CtrlMsg& out) noexcept {
  out = CtrlMsg{};
  if (bytes.size() < kCtrlSize) return "ctrl length (short)";
  std::memcpy(&out, bytes.data(), kCtrlSize);
  if (out.magic != kCtrlMagic) return "ctrl magic";
  if (out.type < kReq || out.type > kRelNak) return "ctrl type";
  if (out.reserved[0] != 0 || out.reserved[1] != 0 || out.reserved[2] != 0) return "ctrl reserved";
  if (out.dst_id != self_id) return "ctrl dst_id (not this endpoint)";
  if (out.qpn < 2 || out.qpn > kQpnMax) return "ctrl qpn (outside 2..2^24-1)";
  if (out.type == kReq || out.type == kRep) {
    if (out.psn > kPsnMax) return "ctrl psn (above 24 bits)";
    if (out.dst_qpn != 0) return "ctrl dst_qpn (set on a REQ/REP)";
  } else {
    if (out.psn != 0 || out.epoch != 0) return "ctrl psn/epoch (set on a release)";
    if (out.dst_qpn < 2 || out.dst_qpn > kQpnMax) return "ctrl dst_qpn (outside 2..2^24-1)";
  }
  if (const char* why = check_name(out.src, local_ethernet)) return why;
  if (out.src.endpoint_id == self_id) return "ctrl src (our own endpoint id)";
  return nullptr;
}

}  // namespace regpool::verbs_wire
