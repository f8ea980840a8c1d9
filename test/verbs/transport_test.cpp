// Verbs-only transport behaviour, two endpoints in one process on one
// device: selective signalling (unsignalled inline puts all complete, the
// tail closed by a fence), recovery from the QP ERROR state, where the
// peer follows the reconnect by itself, and inline sends that complete at
// their post (inject_sends).
#include <catch2/catch.hpp>
#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

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

// VerbsEndpointOptions::inject_sends: a send up to the inline size completes
// inside its post, its WR unsignalled but for every kSignalInterval-th, so
// the send queue keeps turning by those completions alone; a tail of them is
// fenced once the connection is quiet, so an idle queue pair is still
// released; and a peer that goes away is reported on later operations.
TEST_CASE("inline sends complete at their post, keep the send queue turning and let an idle queue pair go",
          "[verbs]") {
  regpool::EndpointConfig quiet = served();
  quiet.progress_idle_sleep = 500us;  // two spinning threads would starve the emulated guest
  quiet.idle_release = 300ms;
  rpt::Stack a("verbs", quiet);
  rpt::Stack b("verbs", quiet);
  const auto pb = a.ep->insert_peer(b.ep->name());
  auto* va = dynamic_cast<regpool::VerbsEndpoint*>(a.ep.get());
  REQUIRE(va != nullptr);

  // b takes every message into one of kRecvs kept receives, checks that
  // message i carries i in its first 8 bytes and reposts the receive.
  constexpr int kRecvs = 64;
  constexpr std::uint64_t kSends = 3000;  // far more than the send queue holds
  auto rbuf = b.alloc(kRecvs * 64);
  std::atomic<std::uint64_t> got{0}, bad{0};
  std::vector<regpool::Token> kept(kRecvs);
  struct Take {
    regpool::Endpoint* ep;
    std::vector<regpool::Token>* kept;
    regpool::Ldo* buf;
    int slot;
    std::atomic<std::uint64_t>* got;
    std::atomic<std::uint64_t>* bad;
    void operator()(const Completion& c) const {
      if (c.status == Status::closed || c.status == Status::canceled) return;
      std::uint64_t v = ~std::uint64_t{0};
      if (c.status == Status::ok && c.bytes == 8) std::memcpy(&v, buf->data().data() + slot * 64, 8);
      if (v != got->fetch_add(1)) *bad += 1;
      (void)ep->repost((*kept)[static_cast<std::size_t>(slot)]);
    }
  };
  for (int k = 0; k < kRecvs; ++k) {
    auto t = b.ep->post_recv_kept(rpt::slice_or_die(Slice::data(rbuf, k * 64, 64)),
                                  Take{b.ep.get(), &kept, &rbuf, k, &got, &bad});
    REQUIRE(t.ok());
    kept[static_cast<std::size_t>(k)] = *t;
  }

  auto msg = a.alloc(8);
  const Slice m = rpt::slice_or_die(Slice::data(msg));
  REQUIRE(va->max_inline_data() >= 8);
  // The first send connects (the post is retried until the queue pair is
  // up); from then on each completes inside its post: nothing of it is in
  // flight once send() returns, and its completion is already there.
  std::uint64_t v = 0;
  std::memcpy(msg.data().data(), &v, 8);
  REQUIRE(rpt::wait_ok(*a.ep, a.ep->send(pb, m), 20s).status == Status::ok);
  for (v = 1; v < kSends; ++v) {
    // Receives are kRecvs deep: stay within them (RNR retries would only slow this down).
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (v - got.load() >= kRecvs / 2 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    std::memcpy(msg.data().data(), &v, 8);
    auto t = a.ep->send(pb, m);
    REQUIRE(t.ok());
    const auto c = a.ep->wait(*t, 0ms);
    REQUIRE(c.status == Status::ok);
    CHECK(c.bytes == 8);
  }
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (got.load() < kSends && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  CHECK(got.load() == kSends);
  CHECK(bad.load() == 0);
  CHECK(a.ep->stats().in_flight == 0);

  // Quiet now: the unsignalled tail is fenced, retires, and both queue pairs
  // go back after idle_release.
  const auto gone = std::chrono::steady_clock::now() + 10s;
  while ((va->connection_stats().queue_pairs != 0 ||
          dynamic_cast<regpool::VerbsEndpoint&>(*b.ep).connection_stats().queue_pairs != 0) &&
         std::chrono::steady_clock::now() < gone) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK(va->connection_stats().queue_pairs == 0);
  CHECK(va->connection_stats().released >= 1);

  // The next send connects again and arrives.
  v = kSends;
  std::memcpy(msg.data().data(), &v, 8);
  REQUIRE(rpt::wait_ok(*a.ep, a.ep->send(pb, m), 20s).status == Status::ok);
  const auto last = std::chrono::steady_clock::now() + 20s;
  while (got.load() < kSends + 1 && std::chrono::steady_clock::now() < last) std::this_thread::sleep_for(1ms);
  CHECK(got.load() == kSends + 1);
  CHECK(bad.load() == 0);
}

TEST_CASE("an injected send to a peer that went away: the failure reaches later operations", "[verbs]") {
  regpool::EndpointConfig ac = served();
  ac.op_timeout = 1s;  // the bound on a send queue that retires nothing
  rpt::Stack a("verbs", ac);
  auto b = std::make_unique<rpt::Stack>("verbs", served());
  const auto pb = a.ep->insert_peer(b->ep->name());
  auto rbuf = b->alloc(64);
  auto rt = b->ep->post_recv(rpt::slice_or_die(Slice::data(rbuf)));
  REQUIRE(rt.ok());
  auto msg = a.alloc(8);
  const Slice m = rpt::slice_or_die(Slice::data(msg));
  REQUIRE(rpt::wait_ok(*a.ep, a.ep->send(pb, m), 20s).status == Status::ok);  // connected
  REQUIRE(b->ep->wait(*rt, 20s).status == Status::ok);
  b.reset();  // its queue pair is gone: nothing answers a's packets any more
  // Each send completes ok at its post (its payload is in the work request).
  // rxe reports nothing for WRs to a dead peer (no error, no success), so
  // the send queue stops retiring; once it has retired nothing for
  // op_timeout the connection fails, and from then on sends to the peer
  // answer peer_unreachable.
  Status last = Status::ok;
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (last == Status::ok && std::chrono::steady_clock::now() < until) {
    auto t = a.ep->send(pb, m);
    if (!t.ok()) {
      last = t.status();
      break;
    }
    last = a.ep->wait(*t, 5s).status;
    std::this_thread::sleep_for(20ms);
  }
  CHECK(last == Status::peer_unreachable);
  CHECK_FALSE(a.ep->usable(pb));
}
