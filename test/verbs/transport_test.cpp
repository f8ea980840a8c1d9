// Verbs-only transport behaviour, two endpoints in one process on one
// device: selective signalling (unsignalled inline puts all complete, the
// tail closed by a fence) and recovery from the QP ERROR state, where the
// peer follows the reconnect by itself.
#include <catch2/catch.hpp>
#include <atomic>
#include <cstring>

#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::Completion;
using regpool::RemoteAccess;
using regpool::Slice;
using regpool::Status;

namespace {
regpool::EndpointConfig served() {
  regpool::EndpointConfig c;
  c.progress_thread = true;
  c.op_timeout = 20s;
  return c;
}
}  // namespace

TEST_CASE("unsignalled inline puts all complete, in order, and nothing stays in flight", "[verbs]") {
  rpt::Stack a("verbs");
  rpt::Stack b("verbs", served());
  const auto pb = a.ep->insert_peer(b.ep->name());
  auto target = b.alloc(4096);
  std::memset(target.data().data(), 0, 4096);
  auto e = b.ep->expose(rpt::slice_or_die(Slice::data(target)), RemoteAccess::read_write);
  REQUIRE(e.ok());
  auto* va = dynamic_cast<regpool::VerbsEndpoint*>(a.ep.get());
  REQUIRE(va != nullptr);
  auto src = a.alloc(4096);
  constexpr int kPuts = 1000;
  std::atomic<int> ok{0}, bad{0};
  struct Counter {
    std::atomic<int>* ok;
    std::atomic<int>* bad;
    void operator()(const Completion& c) const { (c.status == Status::ok ? *ok : *bad) += 1; }
  };
  for (int i = 0; i < kPuts; ++i) {
    auto sl = rpt::slice_or_die(Slice::data(src, (i % 64) * 32, 32));
    std::memcpy(sl.address(), &i, sizeof i);
    auto t = a.ep->put(sl, pb, e->ref(), (i % 64) * 32, Counter{&ok, &bad});
    REQUIRE(t.ok());
  }
  REQUIRE(a.ep->quiesce(30s) == Status::ok);
  CHECK(ok.load() == kPuts);
  CHECK(bad.load() == 0);
  CHECK(a.ep->stats().in_flight == 0);
  CHECK(va->max_inline_data() >= 32);  // the puts above went inline
  // Each 32-byte cell holds the last index written to it, in posting order.
  for (int cell = 0; cell < 64; ++cell) {
    int v = -1;
    std::memcpy(&v, target.data().data() + cell * 32, sizeof v);
    int last = cell;
    while (last + 64 < kPuts) last += 64;
    CHECK(v == last);
  }
}

TEST_CASE("after a remote access error both QPs recover: reconnect on one side, the peer follows", "[verbs]") {
  rpt::Stack a("verbs", served());
  rpt::Stack b("verbs", served());
  const auto pb = a.ep->insert_peer(b.ep->name());
  const auto pa = b.ep->insert_peer(a.ep->name());
  auto ta = a.alloc(256), tb = b.alloc(256);
  auto ea = a.ep->expose(rpt::slice_or_die(Slice::data(ta)), RemoteAccess::read_write);
  auto eb = b.ep->expose(rpt::slice_or_die(Slice::data(tb)), RemoteAccess::read_only, regpool::ExposureMode::scoped);
  REQUIRE(ea.ok());
  REQUIRE(eb.ok());
  auto src = a.alloc(64);
  auto s16 = rpt::slice_or_die(Slice::data(src, 0, 16));
  // Both directions work.
  REQUIRE(rpt::wait_ok(*a.ep, a.ep->get(pb, eb->ref(), 0, s16)).status == Status::ok);
  auto bsrc = b.alloc(64);
  auto b16 = rpt::slice_or_die(Slice::data(bsrc, 0, 16));
  REQUIRE(rpt::wait_ok(*b.ep, b.ep->put(b16, pa, ea->ref(), 0)).status == Status::ok);
  // A forged write through the read-only (scoped) key: rejected by B's device.
  auto forged = eb->ref();
  forged.access = RemoteAccess::read_write;
  const auto before = rpt::hash(tb.data());
  CHECK(rpt::wait_ok(*a.ep, a.ep->put(s16, pb, forged, 0)).status == Status::bad_key);
  CHECK(rpt::hash(tb.data()) == before);
  CHECK_FALSE(a.ep->usable(pb));
  CHECK(a.ep->put(s16, pb, eb->ref(), 0).status() != Status::ok);  // broken: refused before the wire
  // A reconnects; B's QP (also in ERROR after the NAK) is reset by B's own
  // progress when the REQ with the new epoch arrives.
  REQUIRE(a.ep->reconnect(pb) == Status::ok);
  CHECK(rpt::wait_ok(*a.ep, a.ep->get(pb, eb->ref(), 0, s16)).status == Status::ok);
  Completion c{};
  for (int i = 0; i < 20; ++i) {
    if (!b.ep->usable(pa)) (void)b.ep->reconnect(pa);
    c = rpt::wait_ok(*b.ep, b.ep->put(b16, pa, ea->ref(), 0), 10s);
    if (c.status == Status::ok) break;
    std::this_thread::sleep_for(50ms);
  }
  CHECK(c.status == Status::ok);
  CHECK(a.ep->stats().reconnects >= 1);
}

TEST_CASE("reconnect with unsignalled ops outstanding answers every op and returns promptly", "[verbs]") {
  rpt::Stack a("verbs");
  rpt::Stack b("verbs", served());
  const auto pb = a.ep->insert_peer(b.ep->name());
  auto target = b.alloc(4096);
  auto e = b.ep->expose(rpt::slice_or_die(Slice::data(target)), RemoteAccess::read_write);
  REQUIRE(e.ok());
  auto src = a.alloc(4096);
  auto s8 = rpt::slice_or_die(Slice::data(src, 0, 8));
  REQUIRE(rpt::wait_ok(*a.ep, a.ep->put(s8, pb, e->ref(), 0)).status == Status::ok);  // connected
  std::vector<regpool::Token> tokens;
  // Fewer than kSignalInterval, posted without a poll in between: the first
  // goes signalled (it is alone on the QP), then each op may go unsignalled
  // only while its run stays under half of the WRs in flight ahead of it
  // (S S S U S U U U): the last three are an unsignalled tail, no fence yet.
  for (int i = 0; i < 8; ++i) {
    auto t = a.ep->put(s8, pb, e->ref(), 8 * i);
    REQUIRE(t.ok());
    tokens.push_back(*t);
  }
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(a.ep->reconnect(pb) == Status::ok);
  CHECK(std::chrono::steady_clock::now() - t0 < 1500ms);
  for (auto t : tokens) {
    const auto c = a.ep->wait(t, 5s);
    CHECK((c.status == Status::ok || c.status == Status::peer_unreachable));
  }
  // Their slots come back once progress reaps the old QP's flushed WRs
  // (reconnect does not drain them under the endpoint's mutex).
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (a.ep->stats().in_flight > 0 && std::chrono::steady_clock::now() < until) (void)a.ep->progress();
  CHECK(a.ep->stats().in_flight == 0);
  CHECK(rpt::wait_ok(*a.ep, a.ep->put(s8, pb, e->ref(), 0)).status == Status::ok);
}
