// Recycled type-2 memory windows, two endpoints in one process on one rxe
// device: exposing to a peer binds a window kept on the connection's free
// list over the object's existing MR, so it costs no registration on either
// side; every bind gets a key no earlier binding had; a reset of the
// connection drops the cached windows; and the cost of expose+revoke with
// recycled windows, with a fresh window each time and with ibv_reg_mr.
#include <catch2/catch.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::RemoteAccess;
using regpool::Slice;
using regpool::Status;
using regpool::VerbsEndpoint;
using regpool::VerbsEndpointOptions;

namespace {

regpool::EndpointConfig served() {
  regpool::EndpointConfig c;
  c.progress_thread = true;
  c.op_timeout = 20s;
  return c;
}

VerbsEndpoint& verbs(rpt::Stack& s) {
  auto* v = dynamic_cast<VerbsEndpoint*>(s.ep.get());
  if (!v) throw regpool::Error(Status::invalid_argument, 0, "test: not a verbs endpoint");
  return *v;
}

// Progress until `done` holds or `bound` passes.
template <class F>
bool eventually(F done, std::chrono::milliseconds bound = 10s) {
  for (auto until = std::chrono::steady_clock::now() + bound; std::chrono::steady_clock::now() < until;) {
    if (done()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return done();
}

// A get through `ref` by `s` into a scratch LDO of its own.
Status get_through(rpt::Stack& s, regpool::PeerId peer, const regpool::RemoteRef& ref) {
  auto into = s.alloc(ref.length);
  return rpt::wait_ok(*s.ep, s.ep->get(peer, ref, 0, rpt::slice_or_die(Slice::data(into))), 20s).status;
}

}  // namespace

TEST_CASE("1000 exposures on one connection: no registration, windows bounded and recycled, fresh keys", "[verbs]") {
  rpt::Stack a("verbs", served());
  rpt::Stack b("verbs", served());
  const auto pb = a.ep->insert_peer(b.ep->name());
  const auto pa = b.ep->insert_peer(a.ep->name());
  constexpr std::uint64_t kPage = 4096;
  auto obj = a.alloc(16 * kPage);
  rpt::fill(obj.data(), 3);
  const auto da0 = a.domain->stats();
  const auto db0 = b.domain->stats();
  const auto w0 = verbs(a).window_stats();
  REQUIRE(w0.allocated == 0);

  constexpr int kExposures = 1000;
  std::set<std::uint64_t> keys;
  for (int i = 0; i < kExposures; ++i) {
    auto sl = rpt::slice_or_die(Slice::data(obj, (i % 16) * kPage, kPage));
    auto e = a.ep->expose(sl, i % 3 == 0 ? RemoteAccess::read_only : RemoteAccess::read_write, pb);
    INFO("exposure " << i << ": " << regpool::to_string(e.status()));
    REQUIRE(e.ok());
    // No key of any earlier binding comes back (of this window or another).
    CHECK(keys.insert(e->ref().key).second);
    if (i % 250 == 0) CHECK(get_through(b, pa, e->ref()) == Status::ok);  // the binding works
    e->revoke();
  }
  const auto da1 = a.domain->stats();
  const auto db1 = b.domain->stats();
  const auto w1 = verbs(a).window_stats();
  std::printf("1000 exposures: ibv_alloc_mw %llu, binds %llu (reused %llu), cached %llu; registrations %llu/%llu\n",
              static_cast<unsigned long long>(w1.allocated), static_cast<unsigned long long>(w1.binds),
              static_cast<unsigned long long>(w1.reused), static_cast<unsigned long long>(w1.cached),
              static_cast<unsigned long long>(da1.registrations - da0.registrations),
              static_cast<unsigned long long>(db1.registrations - db0.registrations));
  CHECK(da1.registrations == da0.registrations);
  CHECK(db1.registrations == db0.registrations);
  CHECK(w1.binds == kExposures);
  // One window at a time is live: a window serves 255 binds (its 8-bit key
  // tags) and is then replaced, so 4 windows cover 1000 exposures.
  CHECK(w1.allocated <= (kExposures + 254) / 255);
  CHECK(w1.reused == kExposures - w1.allocated);
  CHECK(w1.cached <= VerbsEndpointOptions{}.window_cache);
  CHECK(w1.cached >= 1);

  // remove_peer frees the connection's cache.
  a.ep->remove_peer(pb);
  CHECK(eventually([&] {
    const auto w = verbs(a).window_stats();
    return w.cached == 0 && w.deallocated == w.allocated;
  }));
}

TEST_CASE("a reset connection drops its cached windows and binds fresh ones", "[verbs]") {
  rpt::Stack a("verbs", served());
  rpt::Stack b("verbs", served());
  const auto pb = a.ep->insert_peer(b.ep->name());
  const auto pa = b.ep->insert_peer(a.ep->name());
  auto obj = a.alloc(4096);
  auto sl = rpt::slice_or_die(Slice::data(obj));
  {
    auto e = a.ep->expose(sl, RemoteAccess::read_write, pb);
    REQUIRE(e.ok());
    e->revoke();
  }
  REQUIRE(verbs(a).window_stats().cached == 1);
  // Bound before the reset, revoked after it: never recycled.
  auto held = a.ep->expose(sl, RemoteAccess::read_only, pb);
  REQUIRE(held.ok());
  REQUIRE(verbs(a).window_stats().cached == 0);  // it took the cached window
  REQUIRE(a.ep->reconnect(pb) == Status::ok);
  REQUIRE(eventually([&] { return a.ep->usable(pb) && b.ep->usable(pa); }));
  const auto before = verbs(a).window_stats();
  held->revoke();
  const auto after = verbs(a).window_stats();
  CHECK(after.cached == 0);
  CHECK(after.deallocated == before.deallocated + 1);

  // The reconnected connection binds a fresh window, which works.
  auto e = a.ep->expose(sl, RemoteAccess::read_write, pb);
  INFO("expose after reconnect: " << regpool::to_string(e.status()));
  REQUIRE(e.ok());
  const auto w = verbs(a).window_stats();
  CHECK(w.allocated == after.allocated + 1);
  CHECK(get_through(b, pa, e->ref()) == Status::ok);
  e->revoke();
  CHECK(verbs(a).window_stats().cached == 1);
}

TEST_CASE("cost of expose+revoke: recycled window, fresh window, ibv_reg_mr (medians)", "[verbs][bench]") {
  // The initiating endpoints either poll themselves while expose/revoke
  // wait for the bind/invalidate completion, or leave it to their progress
  // thread (which sleeps 20 us when idle).
  for (const bool thread : {false, true}) {
    regpool::EndpointConfig ec = served();
    ec.progress_thread = thread;
    rpt::Stack a("verbs", ec, std::size_t{64} << 20);
    rpt::Stack b("verbs", served());
    // A second endpoint on a's domain that allocates a window per exposure.
    VerbsEndpointOptions fresh_opts;
    fresh_opts.window_cache = 0;
    auto vd = std::dynamic_pointer_cast<regpool::VerbsDomain>(a.domain);
    REQUIRE(vd);
    auto fresh = VerbsEndpoint::open(vd, ec, fresh_opts);
    const auto pb = a.ep->insert_peer(b.ep->name());
    const auto pb2 = fresh->insert_peer(b.ep->name());
    constexpr int kRounds = 200;
    using Clock = std::chrono::steady_clock;
    auto median_us = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    auto us = [](Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
    for (const std::uint64_t size : {std::uint64_t{4096}, std::uint64_t{65536}, std::uint64_t{1} << 20}) {
      auto obj = a.alloc(size);
      auto sl = rpt::slice_or_die(Slice::data(obj));
      std::vector<double> recycled, allocated, registered, subreg;
      for (int i = 0; i < kRounds + 10; ++i) {
        auto t0 = Clock::now();
        auto e = a.ep->expose(sl, RemoteAccess::read_write, pb);
        REQUIRE(e.ok());
        e->revoke();
        auto t1 = Clock::now();
        auto f = fresh->expose(sl, RemoteAccess::read_write, pb2);
        REQUIRE(f.ok());
        f->revoke();
        auto t2 = Clock::now();
        {
          auto r = a.domain->register_memory(sl.address(), size, registration_access(RemoteAccess::read_write));
          r.reset();
        }
        auto t3 = Clock::now();
        auto g = a.ep->expose(sl, RemoteAccess::read_write);  // this branch: ibv_reg_mr of the slice
        REQUIRE(g.ok());
        g->revoke();
        auto t4 = Clock::now();
        if (i < 10) continue;  // warm-up (connection setup, first allocations)
        recycled.push_back(us(t1 - t0));
        allocated.push_back(us(t2 - t1));
        registered.push_back(us(t3 - t2));
        subreg.push_back(us(t4 - t3));
      }
      std::printf("expose+revoke %7llu B (%s): recycled window %.1f us, fresh ibv_alloc_mw %.1f us, "
                  "ibv_reg_mr+dereg %.1f us, expose without peer (sub-registration) %.1f us (medians of %d)\n",
                  static_cast<unsigned long long>(size), thread ? "progress thread" : "polling",
                  median_us(recycled), median_us(allocated), median_us(registered), median_us(subreg), kRounds);
    }
    const auto w = verbs(a).window_stats();
    const auto wf = dynamic_cast<VerbsEndpoint&>(*fresh).window_stats();
    CHECK(w.allocated <= (3 * (kRounds + 10) + 254) / 255);  // windows of 255 binds each
    CHECK(wf.allocated == wf.binds);
    CHECK(wf.cached == 0);
    fresh.reset();
  }
}
