// Fuzzes fabric_wire::parse_ctrl, the check every message arriving at an
// emulating target's control endpoint goes through (anyone who knows the
// target's name can send one). The first input byte picks the reply-address
// rules (shm-like string, sockaddr_in, sockaddr_in6), the second the number
// of local operation slots; the rest is the message. Properties:
//  - no reads outside the input (ASan), no abort of its own;
//  - only exact 128-byte messages are accepted, and the parsed message is
//    the input unchanged (no silent normalisation);
//  - an accepted request carries a known op, status/value 0, a non-zero
//    token and a reply address that satisfies the rules, NUL padding after
//    it; an accepted reply names an existing slot (index < slots), a valid
//    Status and no request fields.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "transport/fabric_wire.hpp"

namespace fw = regpool::fabric_wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  fw::AddrRules rules;
  switch (data[0] % 3) {
    case 0:
      rules.kind = fw::AddrKind::string;
      rules.length = fw::kMaxProviderAddr;
      rules.scheme = "fi_shm://";
      break;
    case 1:
      rules.kind = fw::AddrKind::sockaddr_in;
      rules.length = 16;
      break;
    default:
      rules.kind = fw::AddrKind::sockaddr_in6;
      rules.length = 28;
      break;
  }
  const std::uint32_t slots = 1u + data[1];
  const std::span<const std::byte> msg(reinterpret_cast<const std::byte*>(data + 2), size - 2);
  fw::CtrlMsg m;
  const char* why = fw::parse_ctrl(msg, rules, slots, m);
  if (why != nullptr) {
    if (*why == '\0') std::abort();
    return 0;
  }
  if (msg.size() != fw::kCtrlMsgSize || std::memcmp(&m, msg.data(), fw::kCtrlMsgSize) != 0) std::abort();
  if (m.magic != fw::kCtrlMagic || m.reserved != 0) std::abort();
  if (m.op != fw::kOpFetchAdd && m.op != fw::kOpCompareSwap) std::abort();
  if (m.token == 0) std::abort();
  if (m.type == fw::kCtrlRequest) {
    if (m.status != 0 || m.value != 0) std::abort();
    if (m.name_len == 0 || m.name_len > fw::kCtrlNameMax) std::abort();
    for (std::size_t i = m.name_len; i < fw::kCtrlNameMax; ++i) {
      if (m.name[i] != 0) std::abort();
    }
    if (fw::check_address({reinterpret_cast<const std::byte*>(m.name), m.name_len}, rules) != nullptr) std::abort();
  } else if (m.type == fw::kCtrlReply) {
    if (m.index >= slots || m.status > fw::kMaxStatus) std::abort();
    if (m.name_len != 0 || m.key != 0 || m.address != 0 || m.operand != 0 || m.compare != 0) std::abort();
  } else {
    std::abort();
  }
  return 0;
}
