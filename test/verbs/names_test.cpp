// Verbs endpoint names from hostile peers: every field of the 40-byte name
// is checked before it feeds an address handle or a QP transition
// (lib/transport/verbs_wire.hpp). Each bad name sits right before a
// PROT_NONE page, and must be refused with Status::malformed and a message
// naming the field; the genuine name still connects and carries a put.
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "support/guard_page.hpp"
#include "transport/harness.hpp"
#include "transport/verbs_wire.hpp"

using namespace std::chrono_literals;
using regpool::RemoteAccess;
using regpool::Slice;
using regpool::Status;
namespace vw = regpool::verbs_wire;

namespace {


std::vector<std::byte> bytes_of(const vw::WireName& w) {
  const auto* p = reinterpret_cast<const std::byte*>(&w);
  return {p, p + sizeof w};
}

}  // namespace

TEST_CASE("malformed verbs names are refused, naming the field", "[verbs]") {
  rpt::Stack a("verbs");
  regpool::EndpointConfig served;
  served.progress_thread = true;
  served.op_timeout = 20s;
  rpt::Stack b("verbs", served);
  const auto good_bytes = b.ep->name();
  REQUIRE(good_bytes.size() == vw::kNameSize);
  vw::WireName good{};
  std::memcpy(&good, good_bytes.data(), sizeof good);
  const bool roce = (good.flags & vw::kFlagEthernet) != 0;

  struct Case {
    std::string label;
    std::function<void(vw::WireName&)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"magic", [](vw::WireName& w) { w.magic ^= 1; }, "name magic"},
      {"version", [](vw::WireName& w) { w.version = 9; }, "name version"},
      {"unknown flag", [](vw::WireName& w) { w.flags |= 0x80; }, "name flags"},
      {"other link layer", [](vw::WireName& w) { w.flags ^= vw::kFlagEthernet; }, "link layer"},
      {"port 0", [](vw::WireName& w) { w.port = 0; }, "name port"},
      {"mtu 0", [](vw::WireName& w) { w.mtu = 0; }, "name mtu"},
      {"mtu 9", [](vw::WireName& w) { w.mtu = 9; }, "name mtu"},
      {"reserved", [](vw::WireName& w) { w.reserved = 1; }, "reserved"},
      {"qpn 0", [](vw::WireName& w) { w.ud_qpn = 0; }, "ud_qpn"},
      {"qpn 1 (GSI)", [](vw::WireName& w) { w.ud_qpn = 1; }, "ud_qpn"},
      {"qpn above 24 bits", [](vw::WireName& w) { w.ud_qpn = 0x1000000; }, "ud_qpn"},
      {"endpoint id 0", [](vw::WireName& w) { w.endpoint_id = 0; }, "endpoint_id"},
      {"lid", [roce](vw::WireName& w) { w.lid = roce ? 5 : 0; }, "name lid"},
  };
  std::vector<Case> all = cases;
  if (roce) {
    all.push_back({"gid all zero", [](vw::WireName& w) { std::memset(w.gid, 0, 16); }, "name gid"});
    all.push_back({"gid multicast", [](vw::WireName& w) { w.gid[0] = 0xff; }, "name gid"});
  }
  for (const Case& c : all) {
    INFO("case: " << c.label);
    vw::WireName w = good;
    c.mutate(w);
    const auto blob = bytes_of(w);
    rpt::AtGuardPage g(blob);
    std::string what;
    Status st = Status::ok;
    try {
      (void)a.ep->insert_peer(g.bytes());
    } catch (const regpool::Error& e) {
      st = e.status();
      what = e.what();
    }
    INFO("message: " << what);
    CHECK(st == Status::malformed);
    CHECK(what.find(c.field) != std::string::npos);
  }
  for (std::size_t n : {std::size_t{1}, vw::kNameSize - 1, vw::kNameSize + 1}) {
    INFO("length " << n);
    std::vector<std::byte> blob(good_bytes.begin(), good_bytes.end());
    blob.resize(n);
    rpt::AtGuardPage g(blob);
    Status st = Status::ok;
    std::string what;
    try {
      (void)a.ep->insert_peer(g.bytes());
    } catch (const regpool::Error& e) {
      st = e.status();
      what = e.what();
    }
    CHECK(st == Status::malformed);
    CHECK(what.find("name length") != std::string::npos);
  }
  CHECK(a.ep->peer_count() == 0);

  // The genuine name, also at a page end, connects and carries a put.
  rpt::AtGuardPage g(good_bytes);
  const auto peer = a.ep->insert_peer(g.bytes());
  auto target = b.alloc(64);
  auto e = b.ep->expose(rpt::slice_or_die(Slice::data(target)), RemoteAccess::read_write);
  REQUIRE(e.ok());
  auto src = a.alloc(64);
  std::memset(src.data().data(), 0x5a, 64);
  CHECK(rpt::wait_ok(*a.ep, a.ep->put(rpt::slice_or_die(Slice::data(src)), peer, e->ref(), 0), 20s).status ==
        Status::ok);
  CHECK(std::memcmp(target.data().data(), src.data().data(), 64) == 0);
}
