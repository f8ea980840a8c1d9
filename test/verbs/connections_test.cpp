// Verbs connections on demand and released when idle (EndpointConfig::
// idle_release): no RC queue pair until the first operation to or from a
// peer, one per pair of endpoints however they connect (one side first,
// both at once), released once both sides left it idle, never while an
// operation or a window bound on it is outstanding, and made again by the
// next operation. Every byte moved is checked.
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <thread>

#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::RemoteAccess;
using regpool::Slice;
using regpool::Status;
using regpool::VerbsConnectionStats;
using regpool::VerbsEndpoint;

namespace {

regpool::EndpointConfig cfg(std::chrono::milliseconds idle) {
  regpool::EndpointConfig c;
  c.progress_thread = true;  // both sides answer connection and release requests
  c.progress_idle_sleep = 500us;  // two spinning threads would starve the emulated guest
  c.op_timeout = 20s;
  c.idle_release = idle;
  return c;
}

VerbsConnectionStats stats(rpt::Stack& s) { return dynamic_cast<VerbsEndpoint&>(*s.ep).connection_stats(); }

// Waits up to `bound` for `pred`, sleeping in between (the progress threads
// do the work).
bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds bound) {
  const auto end = std::chrono::steady_clock::now() + bound;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// A put of `n` pattern bytes (seed) from `from` into `to`'s exposure at
// offset 0, checked byte for byte at the target.
void put_checked(rpt::Stack& from, regpool::PeerId peer, rpt::Stack& to, const regpool::Exposure& e,
                 regpool::Ldo& target, std::uint64_t n, std::uint64_t seed) {
  auto src = from.alloc(n);
  rpt::fill(src.data().subspan(0, n), seed);
  std::memset(target.data().data(), 0, n);
  const auto c = rpt::wait_ok(*from.ep, from.ep->put(rpt::slice_or_die(Slice::data(src)), peer, e.ref(), 0), 20s);
  REQUIRE(c.status == Status::ok);
  (void)to;
  CHECK(std::memcmp(target.data().data(), src.data().data(), n) == 0);
}

}  // namespace

TEST_CASE("a queue pair is made on first use, released when idle, made again on the next use", "[verbs]") {
  rpt::Stack a("verbs", cfg(300ms));
  rpt::Stack b("verbs", cfg(300ms));
  const auto peer = a.ep->insert_peer(b.ep->name());
  // Inserting makes nothing: no queue pair on either side.
  CHECK(stats(a).queue_pairs == 0);
  CHECK(stats(b).queue_pairs == 0);
  auto target = b.alloc(4096);
  auto e = b.ep->expose(rpt::slice_or_die(Slice::data(target)), RemoteAccess::read_write);
  REQUIRE(e.ok());
  std::this_thread::sleep_for(100ms);
  CHECK(stats(a).queue_pairs == 0);

  // The first put makes one on each side (b's from a's request).
  put_checked(a, peer, b, *e, target, 4096, 1);
  CHECK(stats(a).queue_pairs == 1);
  CHECK(stats(a).created == 1);
  CHECK(stats(b).queue_pairs == 1);
  CHECK(stats(b).created == 1);

  // Idle on both sides: both give theirs back.
  REQUIRE(eventually([&] { return stats(a).queue_pairs == 0 && stats(b).queue_pairs == 0; }, 10s));
  CHECK(stats(a).released == 1);
  CHECK(stats(b).released == 1);
  CHECK(a.ep->usable(peer));

  // The next put connects again; the bytes arrive.
  put_checked(a, peer, b, *e, target, 4096, 2);
  CHECK(stats(a).queue_pairs == 1);
  CHECK(stats(a).created == 2);
  CHECK(stats(b).queue_pairs == 1);
  CHECK(stats(b).created == 2);

  // And a message the other way (b inserts a; its first send reuses the
  // queue pair a's put made, or makes one after another release).
  const auto back = b.ep->insert_peer(a.ep->name());
  auto rbuf = a.alloc(512);
  std::memset(rbuf.data().data(), 0, 512);
  auto rt = a.ep->post_recv(rpt::slice_or_die(Slice::data(rbuf)));
  REQUIRE(rt.ok());
  auto msg = b.alloc(512);
  rpt::fill(msg.data().subspan(0, 512), 3);
  REQUIRE(rpt::wait_ok(*b.ep, b.ep->send(back, rpt::slice_or_die(Slice::data(msg))), 20s).status == Status::ok);
  const auto rc = a.ep->wait(*rt, 20s);
  REQUIRE(rc.status == Status::ok);
  CHECK(rc.bytes == 512);
  CHECK(rc.peer == peer);
  CHECK(std::memcmp(rbuf.data().data(), msg.data().data(), 512) == 0);
  CHECK(stats(a).queue_pairs <= 1);
  CHECK(stats(b).queue_pairs <= 1);
}

TEST_CASE("both sides connecting at once share one queue pair each", "[verbs]") {
  rpt::Stack a("verbs", cfg(0ms));
  rpt::Stack b("verbs", cfg(0ms));
  const auto pb = a.ep->insert_peer(b.ep->name());
  const auto pa = b.ep->insert_peer(a.ep->name());
  auto ta = a.alloc(8192);
  auto tb = b.alloc(8192);
  auto ea = a.ep->expose(rpt::slice_or_die(Slice::data(ta)), RemoteAccess::read_write);
  auto eb = b.ep->expose(rpt::slice_or_die(Slice::data(tb)), RemoteAccess::read_write);
  REQUIRE(ea.ok());
  REQUIRE(eb.ok());
  for (int round = 0; round < 3; ++round) {
    auto sa = a.alloc(8192);
    auto sb = b.alloc(8192);
    rpt::fill(sa.data().subspan(0, 8192), 10 + static_cast<std::uint64_t>(round));
    rpt::fill(sb.data().subspan(0, 8192), 20 + static_cast<std::uint64_t>(round));
    Status st_a = Status::transport_error;
    Status st_b = Status::transport_error;
    // Both first operations start together, each from its own thread.
    std::thread ta_thread([&] {
      st_a = rpt::wait_ok(*a.ep, a.ep->put(rpt::slice_or_die(Slice::data(sa)), pb, eb->ref(), 0), 20s).status;
    });
    st_b = rpt::wait_ok(*b.ep, b.ep->put(rpt::slice_or_die(Slice::data(sb)), pa, ea->ref(), 0), 20s).status;
    ta_thread.join();
    REQUIRE(st_a == Status::ok);
    REQUIRE(st_b == Status::ok);
    CHECK(std::memcmp(tb.data().data(), sa.data().data(), 8192) == 0);
    CHECK(std::memcmp(ta.data().data(), sb.data().data(), 8192) == 0);
    // One queue pair per side, connected to each other: no duplicate.
    CHECK(stats(a).queue_pairs == 1);
    CHECK(stats(b).queue_pairs == 1);
    CHECK(stats(a).created == 1);
    CHECK(stats(b).created == 1);
  }
  // idle_release = 0: never given back.
  std::this_thread::sleep_for(1s);
  CHECK(stats(a).queue_pairs == 1);
  CHECK(stats(a).released == 0);
  CHECK(stats(b).released == 0);
}

TEST_CASE("no release while operations flow or a window is bound on the queue pair", "[verbs]") {
  rpt::Stack a("verbs", cfg(400ms));
  rpt::Stack b("verbs", cfg(400ms));
  const auto peer = a.ep->insert_peer(b.ep->name());
  const auto pa = b.ep->insert_peer(a.ep->name());
  auto target = b.alloc(1024);
  auto e = b.ep->expose(rpt::slice_or_die(Slice::data(target)), RemoteAccess::read_write);
  REQUIRE(e.ok());

  // A put every 100 ms for three idle periods: the connection stays.
  for (std::uint64_t i = 0; i < 12; ++i) {
    put_checked(a, peer, b, *e, target, 1024, 100 + i);
    std::this_thread::sleep_for(100ms);
  }
  CHECK(stats(a).created == 1);
  CHECK(stats(a).released == 0);
  CHECK(stats(b).released == 0);

  // A window b bound for a on this queue pair keeps it, whichever side
  // asks: a (idle) asks and b refuses; b does not ask.
  auto wtarget = b.alloc(256);
  auto w = b.ep->expose(rpt::slice_or_die(Slice::data(wtarget)), RemoteAccess::read_write, pa);
  REQUIRE(w.ok());
  std::this_thread::sleep_for(1500ms);
  CHECK(stats(a).queue_pairs == 1);
  CHECK(stats(b).queue_pairs == 1);
  CHECK(stats(b).released == 0);
  // The window still works, byte for byte.
  put_checked(a, peer, b, *w, wtarget, 256, 7);

  // Revoked: nothing holds the connection any more.
  w->revoke();
  REQUIRE(eventually([&] { return stats(a).queue_pairs == 0 && stats(b).queue_pairs == 0; }, 10s));
  CHECK(stats(a).released == 1);
  CHECK(stats(b).released == 1);
  // Exposures to any peer outlive the release: the next put reconnects.
  put_checked(a, peer, b, *e, target, 1024, 9);
  CHECK(stats(a).created == 2);
}
