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

inline const char* parse_name(std::span<const std::byte> name, bool local_ethernet, WireName& out) noexcept {
  out = WireName{};
  if (name.size() != kNameSize) return "name length (not 40 bytes)";
  std::memcpy(&out, name.data(), kNameSize);
  return check_name(out, local_ethernet);
}

}  // namespace regpool::verbs_wire
