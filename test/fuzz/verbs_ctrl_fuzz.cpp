// Fuzzes verbs_wire::parse_ctrl, the parser for the verbs endpoints'
// connection control datagrams (REQ/REP connect, REL/REL_ACK/REL_NAK idle
// release), which arrive unauthenticated on the UD queue pair. Input: byte 0
// says whether the local port is RoCE, bytes 1..8 the receiving endpoint's
// id (little-endian), the rest the datagram after its GRH. Properties:
//  - no reads outside the input, no abort of its own;
//  - an accepted message is the first 72 bytes, unchanged;
//  - it is addressed to this endpoint by another one, has a known type, zero
//    reserved bytes, a QP number in 2..2^24-1, a 24-bit PSN and no dst_qpn
//    on REQ/REP, a dst_qpn in 2..2^24-1 and no PSN/epoch on releases, and a
//    sender name that parse_name accepts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "transport/verbs_wire.hpp"

namespace vw = regpool::verbs_wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 9) return 0;
  const bool ethernet = (data[0] & 1) != 0;
  std::uint64_t self = 0;
  std::memcpy(&self, data + 1, 8);
  const std::span<const std::byte> msg(reinterpret_cast<const std::byte*>(data + 9), size - 9);
  vw::CtrlMsg c;
  const char* why = vw::parse_ctrl(msg, ethernet, self, c);
  if (why != nullptr) {
    if (*why == '\0') std::abort();
    return 0;
  }
  if (msg.size() < vw::kCtrlSize || std::memcmp(&c, msg.data(), vw::kCtrlSize) != 0) std::abort();
  if (c.magic != vw::kCtrlMagic || c.type < vw::kReq || c.type > vw::kRelNak) std::abort();
  if (c.reserved[0] != 0 || c.reserved[1] != 0 || c.reserved[2] != 0) std::abort();
  if (c.dst_id != self || c.src.endpoint_id == self) std::abort();
  if (c.qpn < 2 || c.qpn > vw::kQpnMax) std::abort();
  if (c.type == vw::kReq || c.type == vw::kRep) {
    if (c.psn > vw::kPsnMax || c.dst_qpn != 0) std::abort();
  } else if (c.psn != 0 || c.epoch != 0 || c.dst_qpn < 2 || c.dst_qpn > vw::kQpnMax) {
    std::abort();
  }
  vw::WireName n;
  const std::span<const std::byte> name(reinterpret_cast<const std::byte*>(&c.src), vw::kNameSize);
  if (vw::parse_name(name, ethernet, n) != nullptr) std::abort();
  return 0;
}
