// Fuzzes verbs_wire::parse_name, the parser for the 40-byte verbs endpoint
// names peers exchange (and that every connection request carries as its
// sender). The first input byte says whether the local port is RoCE; the
// rest is the name. Properties:
//  - no reads outside the input, no abort of its own;
//  - only exact 40-byte names are accepted, parsed without normalisation
//    (the struct equals the input bytes);
//  - an accepted name has a link layer matching the local port, a real
//    ibv_mtu, a QP number in 2..2^24-1, a non-zero endpoint id, and the
//    address fields of its link layer (RoCE: unicast non-zero GID and no
//    LID; InfiniBand: a unicast LID).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "transport/verbs_wire.hpp"

namespace vw = regpool::verbs_wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool ethernet = (data[0] & 1) != 0;
  const std::span<const std::byte> name(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  vw::WireName w;
  const char* why = vw::parse_name(name, ethernet, w);
  if (why != nullptr) {
    if (*why == '\0') std::abort();
    return 0;
  }
  if (name.size() != vw::kNameSize || std::memcmp(&w, name.data(), vw::kNameSize) != 0) std::abort();
  if (w.magic != vw::kNameMagic || w.version != vw::kNameVersion || w.reserved != 0) std::abort();
  if (((w.flags & vw::kFlagEthernet) != 0) != ethernet || (w.flags & ~vw::kFlagEthernet) != 0) std::abort();
  if (w.port == 0 || w.mtu < vw::kMtuMin || w.mtu > vw::kMtuMax) std::abort();
  if (w.ud_qpn < 2 || w.ud_qpn > vw::kQpnMax || w.endpoint_id == 0) std::abort();
  if (ethernet) {
    if (w.lid != 0 || w.gid[0] == 0xff) std::abort();
    bool any = false;
    for (std::uint8_t b : w.gid) any = any || b != 0;
    if (!any) std::abort();
  } else if (w.lid == 0 || w.lid > vw::kLidUnicastMax) {
    std::abort();
  }
  return 0;
}
