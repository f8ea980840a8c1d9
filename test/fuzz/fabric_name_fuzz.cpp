// Fuzzes fabric_wire::parse_name, the parser for the endpoint names peers
// hand each other through the (unauthenticated) bootstrap, under the address
// rules of each kind of provider: shm-like (FI_ADDR_STR "fi_shm://..."),
// tcp-like (sockaddr_in), sockaddr_in6 and fixed-length opaque addresses.
// The first input byte picks the rules, the rest is the name. Properties:
//  - never reads outside the span (ASan), never aborts on its own;
//  - an accepted name's fields add up: header + data + control == size, the
//    spans lie inside the input, control present exactly with its flag, and
//    only with the emulated-atomics flag (version 2); the version byte is
//    the one this build speaks, the flags byte has no other bits;
//  - a message limit (net's names) is present exactly with its flag, sits
//    between header and addresses, and is at least 4 KiB: the sender's
//    refusal of longer sends (Status::message_too_large) relies on it;
//  - each accepted address satisfies the rules by construction, checked
//    independently here (NUL-terminated string of the right scheme, exact
//    sockaddr length and family, ...), so fi_av_insert never reads past it;
//  - re-encoding the parsed name (fabric_wire::encode_name, what
//    FabricEndpoint::name() hands out) gives back exactly the input bytes;
//  - shm addresses: the pid the backend's dead-peer checks read from them
//    (fabric_shm::pid_from_address) is the decimal number right after the
//    scheme, 1..2^31-1, followed by ':', or 0; the region name it opens is
//    the address without scheme and NUL, and never holds a '/'.
//  - the dead-peer probe of net (tcp::StallProbe::set_address, which takes
//    a peer's accepted sockaddr, and is fed any bytes here too) arms itself
//    exactly for an AF_INET/AF_INET6 sockaddr of the right length whose port
//    is not 0 and whose address is not the unspecified one.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <span>
#include <vector>

#include "transport/fabric_shm.hpp"
#include "transport/fabric_wire.hpp"
#include "transport/stall_probe.hpp"

namespace fw = regpool::fabric_wire;

namespace {

fw::AddrRules rules_for(std::uint8_t selector) {
  fw::AddrRules r;
  switch (selector % 4) {
    case 0:
      r.kind = fw::AddrKind::string;
      r.length = fw::kMaxProviderAddr;
      r.scheme = "fi_shm://";
      break;
    case 1:
      r.kind = fw::AddrKind::sockaddr_in;
      r.length = 16;
      break;
    case 2:
      r.kind = fw::AddrKind::sockaddr_in6;
      r.length = 28;
      break;
    default:
      r.kind = fw::AddrKind::opaque;
      r.length = 1 + selector / 4;  // 1..64
      break;
  }
  return r;
}

void check_shm_pid(std::span<const std::byte> a, const fw::AddrRules& r) {
  const std::int64_t pid = regpool::fabric_shm::pid_from_address(a, r.scheme);
  if (pid < 0 || pid > 0x7fffffff) std::abort();
  if (pid != 0) {
    char digits[16];
    const int n = std::snprintf(digits, sizeof digits, "%lld:", static_cast<long long>(pid));
    if (a.size() < r.scheme.size() + static_cast<std::size_t>(n) ||
        std::memcmp(a.data() + r.scheme.size(), digits, static_cast<std::size_t>(n)) != 0) {
      std::abort();
    }
  }
  const std::string name = regpool::fabric_shm::region_name(a, r.scheme);
  if (name.find('/') != std::string::npos) std::abort();
  // The doorbell's file name (fabric_shm::bell_name): prefix + region, one
  // path component, or nothing.
  const std::string bell = regpool::fabric_shm::bell_name(name);
  if (!bell.empty() && (bell.size() > 255 || bell.find('/') != std::string::npos ||
                        bell.compare(0, regpool::fabric_shm::kBellPrefix.size(), regpool::fabric_shm::kBellPrefix) != 0 ||
                        bell.compare(regpool::fabric_shm::kBellPrefix.size(), std::string::npos, name) != 0)) {
    std::abort();
  }
  if (bell.empty() && !name.empty() && name.size() + regpool::fabric_shm::kBellPrefix.size() <= 255) std::abort();
  if (!name.empty() && (name.size() + r.scheme.size() + 1 != a.size() ||
                        std::memcmp(name.data(), a.data() + r.scheme.size(), name.size()) != 0)) {
    std::abort();
  }
}

void check_stall_address(std::span<const std::byte> a) {
  regpool::tcp::StallProbe probe;
  const bool armed = probe.set_address(a);
  auto zero = [&](std::size_t from, std::size_t n) {
    for (std::size_t i = from; i < from + n; ++i) {
      if (a[i] != std::byte{0}) return false;
    }
    return true;
  };
  bool want = false;
  if (a.size() == 16 && a[0] == std::byte{2} && a[1] == std::byte{0}) {
    want = !zero(2, 2) && !zero(4, 4);  // port, sin_addr
  } else if (a.size() == 28 && a[0] == std::byte{10} && a[1] == std::byte{0}) {
    want = !zero(2, 2) && !zero(8, 16);  // port, sin6_addr
  }
  if (armed != want || probe.armed() != armed || probe.gone() || probe.probes() != 0) std::abort();
}

void check_address_invariants(std::span<const std::byte> a, const fw::AddrRules& r) {
  if (a.empty() || a.size() > fw::kMaxProviderAddr) std::abort();
  switch (r.kind) {
    case fw::AddrKind::string: {
      if (a.back() != std::byte{0}) std::abort();
      if (std::memchr(a.data(), 0, a.size() - 1) != nullptr) std::abort();  // one NUL, at the end
      if (a.size() - 1 <= r.scheme.size() || std::memcmp(a.data(), r.scheme.data(), r.scheme.size()) != 0) {
        std::abort();
      }
      if (std::memchr(a.data() + r.scheme.size(), '/', a.size() - 1 - r.scheme.size()) != nullptr) std::abort();
      check_shm_pid(a, r);
      break;
    }
    case fw::AddrKind::sockaddr_in:
      if (a.size() != 16 || a[0] != std::byte{2} || a[1] != std::byte{0}) std::abort();
      check_stall_address(a);
      break;
    case fw::AddrKind::sockaddr_in6:
      if (a.size() != 28 || a[0] != std::byte{10} || a[1] != std::byte{0}) std::abort();
      check_stall_address(a);
      break;
    case fw::AddrKind::opaque:
      if (a.size() != r.length) std::abort();
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const fw::AddrRules rules = rules_for(data[0]);
  const std::span<const std::byte> name(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  {
    // A mapped bell's first bytes, as a peer may have written them.
    std::uint64_t magic = 0;
    if (name.size() >= sizeof magic) std::memcpy(&magic, name.data(), sizeof magic);
    const bool want = name.size() >= sizeof magic && magic == regpool::fabric_shm::kBellMagic;
    if (regpool::fabric_shm::bell_layout_ok(name) != want) std::abort();
  }
  {
    // A file name under /dev/shm (anyone's), as the dead-region sweep reads
    // it: a pid only for "<digits>:<digits>:<digits>", and then the first
    // field's value.
    const std::string_view file(reinterpret_cast<const char*>(data + 1), size - 1);
    const std::int64_t pid = regpool::fabric_shm::region_file_pid(file);
    if (pid < 0 || pid > 0x7fffffff) std::abort();
    if (pid > 0) {
      const std::size_t c1 = file.find(':');
      const std::size_t c2 = c1 == std::string_view::npos ? c1 : file.find(':', c1 + 1);
      if (c1 == 0 || c2 == std::string_view::npos || c2 == c1 + 1 || c2 + 1 >= file.size() ||
          file.find(':', c2 + 1) != std::string_view::npos ||
          file.find_first_not_of("0123456789:") != std::string_view::npos) {
        std::abort();
      }
      std::string_view first = file.substr(0, c1);
      while (first.size() > 1 && first.front() == '0') first.remove_prefix(1);
      if (std::to_string(pid) != first) std::abort();
    }
  }
  check_stall_address(name);
  fw::ParsedName p;
  const char* why = fw::parse_name(name, rules, p);
  if (why != nullptr) {
    if (*why == '\0') std::abort();  // a refusal always names its field
    if (!p.data.empty() || !p.ctrl.empty()) std::abort();
    return 0;
  }
  const auto* lo = name.data();
  const auto* hi = name.data() + name.size();
  auto inside = [&](std::span<const std::byte> s) { return s.data() >= lo && s.data() + s.size() <= hi; };
  if (!inside(p.data) || !inside(p.ctrl)) std::abort();
  const std::size_t head = fw::kNameHeader + (p.message_limit != 0 ? fw::kNameLimitField : 0);
  if (head + p.data.size() + p.ctrl.size() != name.size()) std::abort();
  // A limit is there only with its flag, and never below the minimum.
  if (p.message_limit != 0 && (p.message_limit < fw::kMinMessageLimit || p.message_limit > fw::kMaxMessageLimit)) {
    std::abort();
  }
  if (p.has_ctrl != !p.ctrl.empty() || p.ctrl.size() > fw::kCtrlNameMax) std::abort();
  if (p.has_ctrl && !p.emulates) std::abort();  // a control address serves emulated atomics only
  if (name[2] != std::byte{fw::kNameVersion}) std::abort();
  const auto flags = static_cast<std::uint8_t>(name[3]);
  if (flags != ((p.has_ctrl ? fw::kNameHasCtrl : 0) | (p.emulates ? fw::kNameEmulates : 0) |
                (p.message_limit != 0 ? fw::kNameLimit : 0) | (p.rings ? fw::kNameRings : 0))) {
    std::abort();
  }
  check_address_invariants(p.data, rules);
  if (p.has_ctrl) check_address_invariants(p.ctrl, rules);
  // Re-encode as FabricEndpoint::name() does.
  const std::vector<std::byte> again = fw::encode_name(p.data, p.ctrl, p.emulates, p.message_limit, p.rings);
  if (again.size() != name.size() || std::memcmp(again.data(), name.data(), again.size()) != 0) std::abort();
  return 0;
}
