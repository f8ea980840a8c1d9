// Exposures on libfabric shm and tcp (tcp;ofi_rxm, loopback): what standard
// and scoped exposures cost (domain registrations, time), what the target
// really enforces (probes that bypass the initiator's checks with forged
// references), write-only access, random keys, and the revoke quarantine
// (revoke, free, reallocate, late put: the new object stays untouched).
//
// One process, two stacks (a server with its own domain, pool and a
// progress thread; a client with its own): each side's DomainStats are its
// own, and nothing here needs a second process to be honest about the
// provider (the bytes still go through the provider's RMA path).

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "regpool/telemetry.hpp"
#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::Completion;
using regpool::Enforcement;
using regpool::Exposure;
using regpool::ExposureMode;
using regpool::PeerId;
using regpool::RemoteAccess;
using regpool::RemoteRef;
using regpool::Slice;
using regpool::Status;

namespace {

regpool::EndpointConfig server_config(std::chrono::milliseconds quarantine = 1000ms) {
  regpool::EndpointConfig c;
  c.progress_thread = true;
  c.progress_idle_sleep = 0us;
  c.revoke_quarantine = quarantine;
  return c;
}

regpool::EndpointConfig client_config() {
  regpool::EndpointConfig c;
  c.op_timeout = 10s;
  return c;
}

struct Pair {
  rpt::Stack server;
  rpt::Stack client;
  PeerId peer;
  Pair(const std::string& prov, regpool::EndpointConfig sc, std::size_t arena = std::size_t{16} << 20)
      : server(prov, sc, arena), client(prov, client_config(), arena), peer(client.ep->insert_peer(server.ep->name())) {}
  std::uint64_t registrations() const {
    return server.domain->stats().registrations + client.domain->stats().registrations;
  }
};

Status put_status(rpt::Stack& s, PeerId peer, const RemoteRef& ref, std::uint64_t off, const Slice& from) {
  return rpt::wait_ok(*s.ep, s.ep->put(from, peer, ref, off), 20s).status;
}

// After a probe the provider refused: tcp;ofi_rxm closes the connection.
// Bring the peer back and prove it works with an honest reference.
bool recover(Pair& p, const RemoteRef& good, const Slice& into) {
  for (int tries = 0; tries < 10; ++tries) {
    if (!p.client.ep->usable(p.peer)) (void)p.client.ep->reconnect(p.peer);
    if (rpt::wait_ok(*p.client.ep, p.client.ep->get(p.peer, good, 0, into), 20s).status == Status::ok) return true;
    p.client.ep->progress_for(200ms);
    (void)p.client.ep->reconnect(p.peer);
  }
  return false;
}

}  // namespace

TEST_CASE("exposure modes and enforcement are named", "[fabric]") {
  CHECK(std::string(regpool::to_string(ExposureMode::standard)) == "standard");
  CHECK(std::string(regpool::to_string(ExposureMode::scoped)) == "scoped");
  rpt::Stack shm("shm");
  // shm's CMA path reads and writes the target's memory without looking at
  // keys: nothing is enforced by the target, in any mode.
  for (auto mode : {ExposureMode::standard, ExposureMode::scoped}) {
    const Enforcement e = shm.ep->enforcement(mode);
    CHECK_FALSE((e.keys || e.bounds || e.rights || e.revocation || e.read_rights));
  }
  rpt::Stack tcp("tcp;ofi_rxm");
  const Enforcement st = tcp.ep->enforcement(ExposureMode::standard);
  CHECK(st.keys);
  CHECK_FALSE((st.bounds || st.rights || st.revocation || st.read_rights));
  const Enforcement sc = tcp.ep->enforcement(ExposureMode::scoped);
  CHECK((sc.keys && sc.bounds && sc.rights && sc.revocation));
  CHECK_FALSE(sc.read_rights);  // measured: tcp serves a get through a write-only registration
}

TEST_CASE("standard exposures register nothing; scoped ones register once each", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("provider " << prov);
  Pair p(prov, server_config());
  auto obj = p.server.alloc(4096);
  auto src = p.client.alloc(4096);
  rpt::fill(src.data(), 7);
  auto from = rpt::slice_or_die(Slice::data(src));
  {
    // Warm-up: the connection, the pools' arenas.
    auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(obj)), RemoteAccess::read_write);
    REQUIRE(e.ok());
    REQUIRE(put_status(p.client, p.peer, e->ref(), 0, from) == Status::ok);
  }
  const auto regs = p.registrations();
  const auto server_before = p.server.domain->stats();
  const auto stats_before = p.server.ep->exposure_stats();
  constexpr int kRounds = 50;
  for (int i = 0; i < kRounds; ++i) {
    auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(obj)), RemoteAccess::read_write);
    REQUIRE(e.ok());
    CHECK(put_status(p.client, p.peer, e->ref(), 0, from) == Status::ok);
    e->revoke();
  }
  CHECK(p.registrations() == regs);  // both domains
  CHECK(p.server.domain->stats().live_registrations == server_before.live_registrations);
  auto st = p.server.ep->exposure_stats();
  CHECK(st.created - stats_before.created == kRounds);
  CHECK(st.revoked - stats_before.revoked == kRounds);
  CHECK(st.registrations == 0);
  CHECK(st.live == 0);
  CHECK(std::memcmp(obj.data().data(), src.data().data(), 4096) == 0);

  // Scoped: one registration per exposure, undone by revoke; the keys of
  // two scoped exposures of the same bytes differ.
  auto a = p.server.ep->expose(rpt::slice_or_die(Slice::data(obj)), RemoteAccess::read_write, ExposureMode::scoped);
  auto b = p.server.ep->expose(rpt::slice_or_die(Slice::data(obj)), RemoteAccess::read_write, ExposureMode::scoped);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->ref().key != b->ref().key);
  CHECK(p.server.domain->stats().registrations == server_before.registrations + 2);
  CHECK(put_status(p.client, p.peer, a->ref(), 0, from) == Status::ok);
  a->revoke();
  b->revoke();
  CHECK(p.server.domain->stats().live_registrations == server_before.live_registrations);
  st = p.server.ep->exposure_stats();
  CHECK(st.registrations == 2);
  CHECK(st.scoped == 2);
  INFO(regpool::to_string(st));
  CHECK(regpool::to_string(st).find("2 registrations") != std::string::npos);
}

TEST_CASE("fabric keys are random, not counted up", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("provider " << prov);
  auto d1 = regpool::FabricDomain::open(rpt::fabric_config(prov));
  auto d2 = regpool::FabricDomain::open(rpt::fabric_config(prov));
  std::vector<std::byte> buf(1 << 16);
  std::vector<std::uint64_t> keys;
  std::vector<regpool::Registration> regs;
  for (int i = 0; i < 8; ++i) {
    for (auto& d : {d1, d2}) {
      regs.push_back(d->register_memory(buf.data() + 64 * i, 64, regpool::Access::all));
      keys.push_back(regs.back().remote_key());
    }
  }
  std::sort(keys.begin(), keys.end());
  // Sequential keys (the old next_key_++) start at 1 in every domain: two
  // domains gave equal keys, and each domain's keys were neighbours.
  CHECK(std::adjacent_find(keys.begin(), keys.end()) == keys.end());
  for (std::size_t i = 1; i < keys.size(); ++i) CHECK(keys[i] - keys[i - 1] > 1);
  CHECK(keys.back() > (std::uint64_t{1} << 32));  // 16 draws over 64 bits
}

TEST_CASE("write-only exposures take puts, refuse gets and atomics at the initiator", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("provider " << prov);
  Pair p(prov, server_config());
  auto obj = p.server.alloc(4096);
  rpt::fill(obj.data(), 1);
  auto src = p.client.alloc(4096);
  rpt::fill(src.data(), 2);
  for (auto mode : {ExposureMode::standard, ExposureMode::scoped}) {
    INFO("mode " << regpool::to_string(mode));
    auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(obj)), RemoteAccess::write_only, mode);
    REQUIRE(e.ok());
    const RemoteRef ref = rpt::decode_or_die(rpt::encoded(*e));
    CHECK(ref.access == RemoteAccess::write_only);
    const auto before = p.client.ep->stats();
    CHECK(p.client.ep->get(p.peer, ref, 0, rpt::slice_or_die(Slice::data(src))).status() == Status::access_denied);
    CHECK(p.client.ep->fetch_add(p.peer, ref, 0, 1).status() == Status::access_denied);
    CHECK(p.client.ep->compare_swap(p.peer, ref, 0, 0, 1).status() == Status::access_denied);
    const auto after = p.client.ep->stats();
    CHECK(after.posted == before.posted);  // nothing reached the wire
    CHECK(after.rejected == before.rejected + 3);
    CHECK(put_status(p.client, p.peer, ref, 0, rpt::slice_or_die(Slice::data(src))) == Status::ok);
    CHECK(std::memcmp(obj.data().data(), src.data().data(), 4096) == 0);
    rpt::fill(src.data(), 3);
  }
}

// The probes bypass the initiator's checks with forged references (the
// checksum is no obstacle: a hostile peer computes it too), and observe the
// target's bytes: a probe is "enforced" when the bytes stayed as they were.
TEST_CASE("enforcement() says what the target really enforces", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  const ExposureMode mode = GENERATE(ExposureMode::standard, ExposureMode::scoped);
  INFO("provider " << prov << ", mode " << regpool::to_string(mode));
  Pair p(prov, server_config());
  constexpr std::uint64_t kObj = 8192;
  constexpr std::uint64_t kLen = 1024;
  auto ro_obj = p.server.alloc(kObj);
  auto rw_obj = p.server.alloc(kObj);
  rpt::fill(ro_obj.data(), 11);
  rpt::fill(rw_obj.data(), 12);
  auto good = p.server.ep->expose(rpt::slice_or_die(Slice::data(rw_obj, 4096, kLen)), RemoteAccess::read_write, mode);
  REQUIRE(good.ok());
  auto buf = p.client.alloc(kObj);
  rpt::fill(buf.data(), 99);
  auto sixteen = rpt::slice_or_die(Slice::data(buf, 0, 16));
  auto into = rpt::slice_or_die(Slice::data(buf, 1024, kLen));
  REQUIRE(recover(p, good->ref(), into));

  const Enforcement claimed = p.server.ep->enforcement(mode);
  Enforcement seen;
  // The server's progress thread moves the target's bytes (tcp: recvmsg,
  // sendmsg) under its endpoint mutex; taking that mutex (exposure_stats)
  // orders those accesses before the test's own reads and writes. The
  // kernel orders them anyway, but ThreadSanitizer cannot see through it.
  auto settle = [&p] { (void)p.server.ep->exposure_stats(); };
  auto unchanged = [&settle](const regpool::Ldo& o, std::uint64_t seed) {
    settle();
    std::vector<std::byte> expect(o.data().size());
    rpt::fill(expect, seed);
    return std::memcmp(expect.data(), o.data().data(), expect.size()) == 0;
  };

  // Wrong key: the honest reference with another key.
  {
    auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(rw_obj, 0, kLen)), RemoteAccess::read_write, mode);
    REQUIRE(e.ok());
    RemoteRef forged = e->ref();
    forged.key ^= 0x5a5a5a5a5a5a5a5aull;
    const Status st = put_status(p.client, p.peer, forged, 0, sixteen);
    seen.keys = unchanged(rw_obj, 12);
    std::fprintf(stderr, "%s %s wrong key: %s, target %s\n", prov.c_str(), regpool::to_string(mode),
                 regpool::to_string(st), seen.keys ? "untouched" : "WRITTEN");
    if (seen.keys) CHECK(st != Status::ok);
    REQUIRE(recover(p, good->ref(), into));
    settle();
    rpt::fill(rw_obj.data(), 12);
  }
  // Out of bounds: the reference claims more than was exposed; the bytes
  // just past the slice belong to the same object (and arena).
  {
    auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(rw_obj, 0, kLen)), RemoteAccess::read_write, mode);
    REQUIRE(e.ok());
    RemoteRef forged = e->ref();
    forged.length += 64;
    const Status st = put_status(p.client, p.peer, forged, kLen, sixteen);
    seen.bounds = unchanged(rw_obj, 12);
    std::fprintf(stderr, "%s %s out of bounds: %s, target %s\n", prov.c_str(), regpool::to_string(mode),
                 regpool::to_string(st), seen.bounds ? "untouched" : "WRITTEN");
    if (seen.bounds) CHECK(st != Status::ok);
    REQUIRE(recover(p, good->ref(), into));
    settle();
    rpt::fill(rw_obj.data(), 12);
  }
  // Rights: a read-only exposure claimed read-write.
  {
    auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(ro_obj, 0, kLen)), RemoteAccess::read_only, mode);
    REQUIRE(e.ok());
    RemoteRef forged = e->ref();
    forged.access = RemoteAccess::read_write;
    const Status st = put_status(p.client, p.peer, forged, 0, sixteen);
    seen.rights = unchanged(ro_obj, 11);
    std::fprintf(stderr, "%s %s put into read-only: %s, target %s\n", prov.c_str(), regpool::to_string(mode),
                 regpool::to_string(st), seen.rights ? "untouched" : "WRITTEN");
    if (seen.rights) CHECK(st != Status::ok);
    REQUIRE(recover(p, good->ref(), into));
    settle();
    rpt::fill(ro_obj.data(), 11);
  }
  // Rights, the other way: a get through a write-only exposure claimed
  // read-write. Enforced when the bytes did not come back.
  bool read_refused = false;
  {
    auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(ro_obj, 0, kLen)), RemoteAccess::write_only, mode);
    REQUIRE(e.ok());
    RemoteRef forged = e->ref();
    forged.access = RemoteAccess::read_write;
    auto got = rpt::slice_or_die(Slice::data(buf, 4096, kLen));
    std::memset(got.address(), 0, kLen);
    const Status st = rpt::wait_ok(*p.client.ep, p.client.ep->get(p.peer, forged, 0, got), 20s).status;
    read_refused = std::memcmp(got.address(), ro_obj.data().data(), kLen) != 0;
    std::fprintf(stderr, "%s %s get from write-only: %s, bytes %s\n", prov.c_str(), regpool::to_string(mode),
                 regpool::to_string(st), read_refused ? "not returned" : "RETURNED");
    if (read_refused) CHECK(st != Status::ok);
    REQUIRE(recover(p, good->ref(), into));
  }
  CHECK(read_refused == claimed.read_rights);
  // Revocation: the honest reference of a revoked exposure (the object is
  // still held by the test, so a write that goes through lands in it).
  {
    auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(rw_obj, 0, kLen)), RemoteAccess::read_write, mode);
    REQUIRE(e.ok());
    const RemoteRef old = e->ref();
    e->revoke();
    const Status st = put_status(p.client, p.peer, old, 0, sixteen);
    seen.revocation = unchanged(rw_obj, 12);
    std::fprintf(stderr, "%s %s put after revoke: %s, target %s\n", prov.c_str(), regpool::to_string(mode),
                 regpool::to_string(st), seen.revocation ? "untouched" : "WRITTEN");
    if (seen.revocation) CHECK(st != Status::ok);
    REQUIRE(recover(p, good->ref(), into));
  }
  CHECK(seen.keys == claimed.keys);
  CHECK(seen.bounds == claimed.bounds);
  CHECK(seen.rights == claimed.rights);
  CHECK(seen.revocation == claimed.revocation);
}

// The reproducer: revoke, free the object, allocate a new one of the
// same size, and a late put with the old reference. Where the target cannot
// revoke, the quarantine keeps the old bytes away from the allocator, so the
// new object cannot sit where the late put lands.
TEST_CASE("a late put after revoke never lands in a new object (quarantine)", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  const ExposureMode mode = GENERATE(ExposureMode::standard, ExposureMode::scoped);
  INFO("provider " << prov << ", mode " << regpool::to_string(mode));
  constexpr auto kQuarantine = 300ms;
  Pair p(prov, server_config(kQuarantine));
  constexpr std::uint64_t kSize = 4096;
  auto src = p.client.alloc(kSize);
  rpt::fill(src.data(), 5);
  auto from = rpt::slice_or_die(Slice::data(src));
  auto into = rpt::slice_or_die(Slice::data(p.client.alloc(kSize)));
  const bool target_revokes = p.server.ep->enforcement(mode).revocation;

  auto old_obj = p.server.alloc(kSize);
  const std::byte* old_addr = old_obj.data().data();
  auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(old_obj)), RemoteAccess::read_write, mode);
  REQUIRE(e.ok());
  const RemoteRef ref = rpt::decode_or_die(rpt::encoded(*e));
  REQUIRE(put_status(p.client, p.peer, ref, 0, from) == Status::ok);  // connection up, honest use
  const auto live_before = p.server.pool->stats().live_objects;

  e->revoke();
  old_obj.reset();  // the server frees the object...
  auto fresh = p.server.alloc(kSize);  // ...and allocates a new one of the same size
  rpt::fill(fresh.data(), 6);
  const auto st = p.server.ep->exposure_stats();
  if (!target_revokes) {
    CHECK(st.quarantined == 1);
    CHECK(st.quarantined_bytes == kSize);
    CHECK(fresh.data().data() != old_addr);
    CHECK(p.server.pool->stats().live_objects == live_before + 1);  // old one held
  } else {
    CHECK(st.quarantined == 0);
  }
  rpt::fill(src.data(), 8);
  const Status late = put_status(p.client, p.peer, ref, 0, from);
  std::fprintf(stderr, "%s %s late put: %s\n", prov.c_str(), regpool::to_string(mode), regpool::to_string(late));
  std::vector<std::byte> expect(kSize);
  rpt::fill(expect, 6);
  CHECK(std::memcmp(fresh.data().data(), expect.data(), kSize) == 0);  // the new object is untouched
  if (target_revokes) CHECK(late != Status::ok);

  // After the interval, progress releases the old bytes.
  std::this_thread::sleep_for(kQuarantine + 50ms);
  p.server.ep->progress_for(10ms);  // the progress thread runs anyway; harmless
  const auto later = p.server.ep->exposure_stats();
  CHECK(later.quarantined == 0);
  CHECK(later.quarantined_bytes == 0);
  CHECK(later.quarantine_released == (target_revokes ? 0u : 1u));
  CHECK(p.server.pool->stats().live_objects == live_before);
  (void)into;
}

TEST_CASE("without quarantine the reproducer does corrupt the new object where the target cannot revoke",
          "[fabric]") {
  // The control for the test above: proves that the hazard is real on these
  // providers (so the quarantine test can fail), not assumed.
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("provider " << prov);
  Pair p(prov, server_config(0ms));
  REQUIRE_FALSE(p.server.ep->enforcement(ExposureMode::standard).revocation);
  constexpr std::uint64_t kSize = 4096;
  auto src = p.client.alloc(kSize);
  auto from = rpt::slice_or_die(Slice::data(src));
  auto old_obj = p.server.alloc(kSize);
  const std::byte* old_addr = old_obj.data().data();
  auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(old_obj)), RemoteAccess::read_write);
  REQUIRE(e.ok());
  const RemoteRef ref = e->ref();
  REQUIRE(put_status(p.client, p.peer, ref, 0, from) == Status::ok);
  e->revoke();
  old_obj.reset();
  auto fresh = p.server.alloc(kSize);
  REQUIRE(fresh.data().data() == old_addr);  // the pool reuses the bytes at once
  rpt::fill(fresh.data(), 6);
  rpt::fill(src.data(), 8);
  CHECK(put_status(p.client, p.peer, ref, 0, from) == Status::ok);
  CHECK(std::memcmp(fresh.data().data(), src.data().data(), kSize) == 0);  // landed: the bug
  CHECK(p.server.ep->exposure_stats().quarantine_total == 0);
}

TEST_CASE("closing an endpoint releases quarantined bytes without waiting", "[fabric]") {
  rpt::Stack s("shm", server_config(1h));
  auto obj = s.alloc(4096);
  const auto live = s.pool->stats().live_objects;
  {
    auto e = s.ep->expose(rpt::slice_or_die(Slice::data(obj)), RemoteAccess::read_write);
    REQUIRE(e.ok());
  }  // revoked: quarantined for an hour
  obj.reset();
  CHECK(s.pool->stats().live_objects == live);
  CHECK(s.ep->exposure_stats().quarantined == 1);
  const auto t0 = std::chrono::steady_clock::now();
  s.ep.reset();
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(s.pool->stats().live_objects == live - 1);
}

// The key-value pattern: a server with 1000 objects of mixed sizes
// exposes one per PUT (write) and one per GET (read); after warm-up no
// domain registration happens on either side.
TEST_CASE("key-value pattern: 1000 objects, an exposure per put and per get, 0 registrations", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("provider " << prov);
  constexpr int kObjects = 1000;
  Pair p(prov, server_config(), std::size_t{64} << 20);
  std::vector<regpool::Ldo> objects;
  objects.reserve(kObjects);
  std::uint64_t max_size = 0;
  std::uint64_t total = 0;
  for (int i = 0; i < kObjects; ++i) {
    // 64 B .. 1 MiB, mostly small (as a cache's values are).
    const std::uint64_t size = i % 100 == 0 ? (std::uint64_t{1} << 20) : 64u << (i % 11);
    objects.push_back(p.server.alloc(size));
    max_size = std::max(max_size, size);
    total += size;
  }
  auto value = p.client.alloc(max_size);
  auto back = p.client.alloc(max_size);
  {
    auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(objects[0])), RemoteAccess::write_only);
    REQUIRE(e.ok());
    REQUIRE(put_status(p.client, p.peer, e->ref(), 0, rpt::slice_or_die(Slice::data(value, 0, 64))) == Status::ok);
  }
  const auto server_regs = p.server.domain->stats().registrations;
  const auto client_regs = p.client.domain->stats().registrations;
  const auto before = p.server.ep->exposure_stats();
  int mismatches = 0;
  for (int i = 0; i < kObjects; ++i) {
    const std::uint64_t size = objects[i].data_size();
    auto v = rpt::slice_or_die(Slice::data(value, 0, size));
    rpt::fill(v.bytes(), 1000 + i);
    {  // PUT
      auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(objects[i])), RemoteAccess::write_only);
      REQUIRE(e.ok());
      REQUIRE(put_status(p.client, p.peer, rpt::decode_or_die(rpt::encoded(*e)), 0, v) == Status::ok);
    }
    {  // GET
      auto e = p.server.ep->expose(rpt::slice_or_die(Slice::data(objects[i])), RemoteAccess::read_only);
      REQUIRE(e.ok());
      auto b = rpt::slice_or_die(Slice::data(back, 0, size));
      REQUIRE(rpt::wait_ok(*p.client.ep, p.client.ep->get(p.peer, rpt::decode_or_die(rpt::encoded(*e)), 0, b)).status ==
              Status::ok);
      if (std::memcmp(b.address(), v.address(), size) != 0) ++mismatches;
    }
  }
  CHECK(mismatches == 0);
  CHECK(p.server.domain->stats().registrations == server_regs);
  CHECK(p.client.domain->stats().registrations == client_regs);
  const auto after = p.server.ep->exposure_stats();
  CHECK(after.created - before.created == 2 * kObjects);
  CHECK(after.registrations == 0);
  std::fprintf(stderr, "%s key-value: %d objects (%llu bytes), %llu exposures, 0 registrations; %s", prov.c_str(),
               kObjects, static_cast<unsigned long long>(total),
               static_cast<unsigned long long>(after.created - before.created), regpool::to_string(after).c_str());
}

// Cost of expose + revoke, per mode (median of many; printed for
// bench/RESULTS.md). Standard mode registers nothing, so its cost is the
// endpoint's bookkeeping; scoped mode pays one registration each.
TEST_CASE("expose + revoke cost per mode", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  rpt::Stack s(prov, server_config());
  auto obj = s.alloc(4096);
  auto slice = rpt::slice_or_die(Slice::data(obj));
  for (auto mode : {ExposureMode::standard, ExposureMode::scoped}) {
    constexpr int kRounds = 20000;
    std::vector<double> ns;
    ns.reserve(kRounds);
    const auto regs = s.domain->stats().registrations;
    for (int i = 0; i < kRounds; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      {
        auto e = s.ep->expose(slice, RemoteAccess::read_write, mode);
        if (!e) FAIL("expose failed");
        e->revoke();
      }
      ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ns.begin(), ns.end());
    const auto made = s.domain->stats().registrations - regs;
    std::fprintf(stderr, "%s %s expose+revoke: median %.0f ns, p99 %.0f ns, %llu registrations for %d exposures\n",
                 prov.c_str(), regpool::to_string(mode), ns[ns.size() / 2], ns[ns.size() * 99 / 100],
                 static_cast<unsigned long long>(made), kRounds);
    CHECK(made == (mode == ExposureMode::standard ? 0u : static_cast<std::uint64_t>(kRounds)));
  }
}

TEST_CASE("a standard exposure cannot grant rights its object's registration lacks", "[fabric]") {
  auto d = regpool::FabricDomain::open(rpt::fabric_config("shm"));
  regpool::PoolConfig pc;
  pc.arena_size = std::size_t{4} << 20;
  pc.access = regpool::Access::local | regpool::Access::remote_read;
  regpool::Pool pool({d}, pc);
  auto ep = regpool::FabricEndpoint::open(d);
  auto obj = *pool.allocate(256);
  auto slice = rpt::slice_or_die(Slice::data(obj));
  CHECK(ep->expose(slice, RemoteAccess::read_only).ok());
  CHECK(ep->expose(slice, RemoteAccess::read_write).status() == Status::access_denied);
  CHECK(ep->expose(slice, RemoteAccess::write_only).status() == Status::access_denied);
  // Scoped exposures register the slice themselves, with the rights asked.
  CHECK(ep->expose(slice, RemoteAccess::read_write, ExposureMode::scoped).ok());
  CHECK(ep->expose(slice, static_cast<RemoteAccess>(9)).status() == Status::invalid_argument);
  CHECK(ep->expose(slice, RemoteAccess::read_only, static_cast<ExposureMode>(7)).status() ==
        Status::invalid_argument);
}

TEST_CASE("reuse_scoped: exposing the same object again registers nothing; the key dies with the quarantine",
          "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("provider " << prov);
  // Long enough for the 20 rounds below on a loaded 2-core machine (tcp
  // puts took up to 45 ms each at load 20; 300 ms was outlived there).
  constexpr auto kQuarantine = 2000ms;
  // The server's stack, by hand: the option is the fabric backend's.
  auto domain = regpool::FabricDomain::open(rpt::fabric_config(prov));
  regpool::FabricEndpointOptions opts;
  opts.reuse_scoped = true;
  auto server_ep = regpool::FabricEndpoint::open(domain, server_config(kQuarantine), opts);
  regpool::PoolConfig pc;
  pc.arena_size = std::size_t{16} << 20;
  auto server_pool = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain}, pc);
  rpt::Stack client(prov, client_config());
  const PeerId peer = client.ep->insert_peer(server_ep->name());

  const Enforcement enf = server_ep->enforcement(ExposureMode::scoped);
  CHECK_FALSE(enf.revocation);  // the key outlives revoke() by up to the quarantine
  if (rpt::checks_remote_keys(prov)) CHECK((enf.keys && enf.bounds && enf.rights));

  constexpr std::uint64_t kSize = 4096;
  auto obj = server_pool->allocate(kSize);
  REQUIRE(obj.ok());
  auto src = client.alloc(kSize);
  auto from = rpt::slice_or_die(Slice::data(src));
  auto obj_slice = rpt::slice_or_die(Slice::data(*obj));

  // The first scoped exposure registers; re-exposing the same bytes with the
  // same rights while the previous one is live or quarantined does not.
  const auto regs0 = domain->stats().registrations;
  std::uint64_t first_key = 0;
  constexpr int kRounds = 20;
  const auto rounds_start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {
    auto e = server_ep->expose(obj_slice, RemoteAccess::read_write, ExposureMode::scoped);
    REQUIRE(e.ok());
    if (i == 0) first_key = e->ref().key;
    CHECK(e->ref().key == first_key);
    rpt::fill(src.data(), static_cast<int>(i + 1));
    CHECK(put_status(client, peer, e->ref(), 0, from) == Status::ok);
    e->revoke();
  }
  // Every round inside one quarantine is what the counts below assume; a
  // machine too loaded for that says so instead of failing on timing.
  const auto rounds_took = std::chrono::steady_clock::now() - rounds_start;
  INFO("the rounds took " << std::chrono::duration_cast<std::chrono::milliseconds>(rounds_took).count() << " ms");
  if (rounds_took >= kQuarantine) WARN("rounds outlived the quarantine: counts not checked");
  auto st = server_ep->exposure_stats();
  if (rounds_took < kQuarantine) {
    CHECK(domain->stats().registrations == regs0 + 1);
    CHECK(st.registrations == 1);
    CHECK(st.quarantined == std::uint64_t{kRounds});
  }
  // Other rights are another registration (a read-only key must not write).
  {
    auto ro = server_ep->expose(obj_slice, RemoteAccess::read_only, ExposureMode::scoped);
    REQUIRE(ro.ok());
    CHECK(ro->ref().key != first_key);
    CHECK(domain->stats().registrations == regs0 + 2);
  }
  // Once the quarantine is over, the shared registration is closed (after
  // its last holder) before the bytes are released, and the next scoped
  // exposure registers afresh with a new key.
  const auto live_before = domain->stats().live_registrations;
  std::this_thread::sleep_for(kQuarantine + 100ms);
  server_ep->progress_for(20ms);
  st = server_ep->exposure_stats();
  CHECK(st.quarantined == 0);
  CHECK(domain->stats().live_registrations + 2 == live_before);
  auto again = server_ep->expose(obj_slice, RemoteAccess::read_write, ExposureMode::scoped);
  REQUIRE(again.ok());
  CHECK(again->ref().key != first_key);
  CHECK(domain->stats().registrations == regs0 + 3);
  again->revoke();
  CHECK(server_ep->exposure_stats().quarantined == 1);
  server_ep.reset();  // releases the quarantine at once, closing the key first
  // What is left registered with the server's domain is the pool's arenas.
  const auto ps = server_pool->stats();
  CHECK(domain->stats().live_registrations == ps.registrations - ps.deregistrations);
}
