// shm puts and gets that the endpoint moves itself, by its own
// process_vm_writev/readv (FabricEndpointOptions::shm_direct_rma): the
// bytes, with the option on and off; batches and kept operations;
// references the target's memory does not back; delivery-complete puts,
// which stay on the provider; a target process that is gone; and whose
// memory a copy may touch at all: a name whose pid is not the process
// behind its region is refused. Endpoints in
// this process copy from this process to itself, which the kernel treats
// as any other pair; the rest of the fabric suite runs shm puts and gets
// between processes with the option on (its default).
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "regpool/fabric_endpoint.hpp"
#include "transport/fabric_shm.hpp"
#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::BatchOp;
using regpool::Completion;
using regpool::FabricEndpointOptions;
using regpool::RemoteAccess;
using regpool::RemoteRef;
using regpool::Slice;
using regpool::Status;
using regpool::Token;

namespace {

constexpr std::uint64_t kTarget = (std::uint64_t{1} << 20) + 64;

struct End {
  std::shared_ptr<regpool::FabricDomain> domain;
  std::unique_ptr<regpool::FabricEndpoint> ep;
  std::unique_ptr<regpool::Pool> pool;
  explicit End(bool direct,
               FabricEndpointOptions::DeliveryComplete dc = FabricEndpointOptions::DeliveryComplete::automatic,
               std::chrono::milliseconds peer_checks = 50ms, bool rings = true) {
    domain = regpool::FabricDomain::open(rpt::fabric_config("shm"));
    FabricEndpointOptions o;
    o.shm_direct_rma = direct;
    o.shm_rings = rings;
    o.delivery_complete = dc;
    o.peer_check_interval = peer_checks;
    regpool::EndpointConfig ec;
    ec.op_timeout = 10s;
    ec.post_timeout = 1ms;  // a post refused for want of the target's progress: post() drives it
    ep = regpool::FabricEndpoint::open(domain, ec, o);
    regpool::PoolConfig pc;
    pc.arena_size = std::size_t{16} << 20;
    pool = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain}, pc);
  }
  ~End() {
    ep.reset();
    pool.reset();
  }
  regpool::Ldo alloc(std::uint64_t n) { return std::move(*pool->allocate(n)); }
};

// Waits on `t` of `from` while driving `to` too: one thread plays both
// processes (an op through the provider may need the target's progress).
Completion finish(End& from, End& to, Token t) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    (void)to.ep->progress();
    const Completion c = from.ep->wait(t, 1ms);
    if (c.status != Status::in_progress || std::chrono::steady_clock::now() > until) return c;
  }
}

// Posts by `fn`, driving the target `to` between tries: shm's first
// operation to a peer through the provider is refused until the target's
// progress has taken the peer in.
template <class Fn>
regpool::Result<Token> post(End& to, Fn&& fn) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    auto t = fn();
    if (t.ok() || (t.status() != Status::would_block && t.status() != Status::timeout) ||
        std::chrono::steady_clock::now() > until) {
      return t;
    }
    (void)to.ep->progress();
  }
}

// An initiator and a target with one exposed object, each knowing the other.
struct Pair {
  End a, b;
  regpool::PeerId peer;
  regpool::Ldo target;
  regpool::Exposure exposure;
  explicit Pair(bool direct,
                FabricEndpointOptions::DeliveryComplete dc = FabricEndpointOptions::DeliveryComplete::automatic)
      : a(direct, dc), b(direct), peer(a.ep->insert_peer(b.ep->name())), target(b.alloc(kTarget)) {
    (void)b.ep->insert_peer(a.ep->name());
    std::memset(target.data().data(), 0, kTarget);
    auto e = b.ep->expose(rpt::slice_or_die(Slice::data(target)), RemoteAccess::read_write);
    REQUIRE(e.ok());
    exposure = std::move(*e);
  }
  const RemoteRef& ref() const { return exposure.ref(); }
  std::span<const std::byte> at(std::uint64_t offset, std::uint64_t n) const {
    return target.data().subspan(offset, n);
  }
};

bool same(std::span<const std::byte> x, std::span<const std::byte> y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size()) == 0;
}

}  // namespace

TEST_CASE("shm puts and gets move the same bytes with the endpoint's own copy and without", "[fabric]") {
  const bool direct = GENERATE(true, false);
  INFO("shm_direct_rma " << direct);
  Pair p(direct);
  std::uint64_t ops = 0;
  for (const std::uint64_t n : {std::uint64_t{1}, std::uint64_t{8}, std::uint64_t{4095}, std::uint64_t{65536},
                                (std::uint64_t{1} << 20) + 3}) {
    INFO("bytes " << n);
    constexpr std::uint64_t kOffset = 61;  // odd: nothing rests on alignment
    auto src = p.a.alloc(n);
    rpt::fill(src.data(), n);
    auto t = post(p.b, [&] { return p.a.ep->put(rpt::slice_or_die(Slice::data(src)), p.peer, p.ref(), kOffset); });
    REQUIRE(t.ok());
    // The endpoint's own copy is done when the post returns.
    const Completion c = direct ? p.a.ep->wait(*t, 0ms) : finish(p.a, p.b, *t);
    CHECK(c.status == Status::ok);
    CHECK(c.bytes == n);
    CHECK(same(p.at(kOffset, n), src.data()));
    auto dst = p.a.alloc(n);
    std::memset(dst.data().data(), 0xA5, n);
    auto g = post(p.b, [&] { return p.a.ep->get(p.peer, p.ref(), kOffset, rpt::slice_or_die(Slice::data(dst))); });
    REQUIRE(g.ok());
    const Completion cg = direct ? p.a.ep->wait(*g, 0ms) : finish(p.a, p.b, *g);
    CHECK(cg.status == Status::ok);
    CHECK(same(dst.data(), src.data()));
    ops += 2;
  }
  SECTION("kept puts and gets, reposted") {
    auto src = p.a.alloc(4096);
    auto dst = p.a.alloc(4096);
    Token t, g;
    for (std::uint64_t round = 0; round < 4; ++round) {
      // Each put's bytes, read back by the get after it.
      rpt::fill(src.data(), 100 + round);
      if (round == 0) {
        auto k = p.a.ep->put_kept(rpt::slice_or_die(Slice::data(src)), p.peer, p.ref(), 0);
        REQUIRE(k.ok());
        t = *k;
      } else {
        REQUIRE(p.a.ep->repost(t) == Status::ok);
      }
      CHECK((direct ? p.a.ep->wait(t, 0ms) : finish(p.a, p.b, t)).status == Status::ok);
      if (round == 0) {
        auto k = p.a.ep->get_kept(p.peer, p.ref(), 0, rpt::slice_or_die(Slice::data(dst)));
        REQUIRE(k.ok());
        g = *k;
      } else {
        REQUIRE(p.a.ep->repost(g) == Status::ok);
      }
      CHECK((direct ? p.a.ep->wait(g, 0ms) : finish(p.a, p.b, g)).status == Status::ok);
      CHECK(same(dst.data(), src.data()));
      ops += 2;
    }
    CHECK(p.a.ep->end_kept(t) == Status::ok);
    CHECK(p.a.ep->end_kept(g) == Status::ok);
  }
  CHECK(p.a.ep->shm_stats().direct_rma == (direct ? ops : 0));
  CHECK(p.b.ep->shm_stats().direct_rma == 0);
}

TEST_CASE("a batch of shm puts and gets moved by the endpoint completes at the next poll", "[fabric]") {
  Pair p(true);
  std::vector<regpool::Ldo> srcs;
  std::vector<Slice> slices;
  srcs.reserve(3);
  slices.reserve(4);
  for (std::uint64_t i = 0; i < 3; ++i) {
    srcs.push_back(p.a.alloc(4096));
    rpt::fill(srcs.back().data(), 7 + i);
    slices.push_back(rpt::slice_or_die(Slice::data(srcs.back())));
  }
  auto back = p.a.alloc(4096);
  slices.push_back(rpt::slice_or_die(Slice::data(back)));
  std::array<BatchOp, 4> ops{BatchOp::put(slices[0], p.peer, p.ref(), 0),
                             BatchOp::put(slices[1], p.peer, p.ref(), 4096),
                             BatchOp::put(slices[2], p.peer, p.ref(), 8192),
                             // Behind the put before it: that copy is done when its post returns.
                             BatchOp::get(p.peer, p.ref(), 8192, slices[3])};
  REQUIRE(p.a.ep->post_batch(ops) == ops.size());
  for (const BatchOp& op : ops) {
    CHECK(op.status == Status::ok);
    CHECK(p.a.ep->wait(op.token, 1s).status == Status::ok);
  }
  for (std::uint64_t i = 0; i < 3; ++i) CHECK(same(p.at(4096 * i, 4096), srcs[i].data()));
  CHECK(same(back.data(), srcs[2].data()));
  CHECK(p.a.ep->shm_stats().direct_rma == 4);
}

TEST_CASE("an shm put or get naming memory the target does not have fails in its post, and the endpoint goes on",
          "[fabric]") {
  Pair p(true);
  // A reference as a peer could make one up: well formed, but its address
  // is memory the target's process (this one) does not have.
  void* hole = ::mmap(nullptr, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(hole != MAP_FAILED);
  REQUIRE(::munmap(hole, 65536) == 0);
  RemoteRef forged = p.ref();
  forged.address = reinterpret_cast<std::uintptr_t>(hole);
  forged.length = 65536;
  REQUIRE(forged.well_formed());
  auto src = p.a.alloc(4096);
  rpt::fill(src.data(), 3);
  auto t = p.a.ep->put(rpt::slice_or_die(Slice::data(src)), p.peer, forged, 0);
  CHECK(t.status() == Status::access_denied);
  auto g = p.a.ep->get(p.peer, forged, 4096, rpt::slice_or_die(Slice::data(src)));
  CHECK(g.status() == Status::access_denied);
  // Straddling: the first bytes are the target's, the rest are not.
  RemoteRef straddle = p.ref();
  straddle.length = kTarget + 65536;
  void* after = ::mmap(nullptr, 65536, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(after != MAP_FAILED);
  const auto past_end = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(after));
  straddle.address = past_end - 4096;
  auto s = p.a.ep->put(rpt::slice_or_die(Slice::data(src)), p.peer, straddle, 2048);
  CHECK(s.status() == Status::access_denied);
  ::munmap(after, 65536);
  // Nothing counted, nothing held, and the peer still works.
  CHECK(p.a.ep->shm_stats().direct_rma == 0);
  auto ok = p.a.ep->put(rpt::slice_or_die(Slice::data(src)), p.peer, p.ref(), 0);
  REQUIRE(ok.ok());
  CHECK(p.a.ep->wait(*ok, 0ms).status == Status::ok);
  CHECK(same(p.at(0, 4096), src.data()));
}

TEST_CASE("delivery-complete shm puts go through the provider; gets still move themselves", "[fabric]") {
  // The target checks keys only for a delivery-complete put, which only the
  // provider can ask of it (docs/provider-facts.md).
  Pair p(true, FabricEndpointOptions::DeliveryComplete::on);
  auto src = p.a.alloc(4096);
  rpt::fill(src.data(), 11);
  auto t = post(p.b, [&] { return p.a.ep->put(rpt::slice_or_die(Slice::data(src)), p.peer, p.ref(), 0); });
  REQUIRE(t.ok());
  CHECK(finish(p.a, p.b, *t).status == Status::ok);
  CHECK(same(p.at(0, 4096), src.data()));
  CHECK(p.a.ep->shm_stats().direct_rma == 0);
  auto dst = p.a.alloc(4096);
  auto g = p.a.ep->get(p.peer, p.ref(), 0, rpt::slice_or_die(Slice::data(dst)));
  REQUIRE(g.ok());
  CHECK(p.a.ep->wait(*g, 0ms).status == Status::ok);
  CHECK(same(dst.data(), src.data()));
  CHECK(p.a.ep->shm_stats().direct_rma == 1);
}

TEST_CASE("an shm target process that is gone is found by the copy itself", "[fabric]") {
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        End t(true);
        auto obj = t.alloc(4096);
        auto e = t.ep->expose(rpt::slice_or_die(Slice::data(obj)), RemoteAccess::read_write);
        RPT_CHECK(e.ok());
        (void)b->allgather(regpool::pack_blobs({t.ep->name(), rpt::encoded(*e)}), 20s);
        (void)b->allgather({}, 30s);  // the parent's first put is done: leave
        return 0;
      },
      60);
  // No pid checks: only the copy's own ESRCH can tell.
  End a(true, FabricEndpointOptions::DeliveryComplete::automatic, 0ms);
  const auto parts = regpool::unpack_blobs(boot->allgather({}, 20s)[1]);
  const auto peer = a.ep->insert_peer(parts[0]);
  const RemoteRef ref = rpt::decode_or_die(parts[1]);
  auto src = a.alloc(4096);
  rpt::fill(src.data(), 5);
  auto t = a.ep->put(rpt::slice_or_die(Slice::data(src)), peer, ref, 0);
  REQUIRE(t.ok());
  CHECK(a.ep->wait(*t, 0ms).status == Status::ok);
  (void)boot->allgather({}, 20s);
  REQUIRE(rpt::reap(kid, 20s) == 0);
  auto late = a.ep->put(rpt::slice_or_die(Slice::data(src)), peer, ref, 0);
  CHECK(late.status() == Status::peer_unreachable);
  CHECK(a.ep->shm_stats().dead_peers == 1);
  auto later = a.ep->get(peer, ref, 0, rpt::slice_or_die(Slice::data(src)));
  CHECK(later.status() == Status::peer_unreachable);
  CHECK(a.ep->shm_stats().direct_rma == 1);
}

namespace {

// The shm region a name's data address names ("fi_shm://<region>").
std::string region_of(const std::vector<std::byte>& name) {
  const std::string text(reinterpret_cast<const char*>(name.data()), name.size());
  const std::size_t at = text.find("fi_shm://");
  REQUIRE(at != std::string::npos);
  const std::size_t end = text.find('\0', at);
  return text.substr(at + 9, end - at - 9);
}

// `name` with the pid at the front of its region replaced by `pid`, the
// data length field kept in step (the name's header: u16 at offset 4).
std::vector<std::byte> with_pid(const std::vector<std::byte>& name, pid_t pid) {
  const std::string text(reinterpret_cast<const char*>(name.data()), name.size());
  const std::size_t at = text.find("fi_shm://") + 9;
  const std::size_t colon = text.find(':', at);
  REQUIRE(colon != std::string::npos);
  const std::string digits = std::to_string(pid);
  std::vector<std::byte> out(name.begin(), name.begin() + static_cast<std::ptrdiff_t>(at));
  for (const char c : digits) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), name.begin() + static_cast<std::ptrdiff_t>(colon), name.end());
  const std::size_t len = static_cast<std::size_t>(name[4]) | (static_cast<std::size_t>(name[5]) << 8);
  const std::size_t new_len = len - (colon - at) + digits.size();
  out[4] = static_cast<std::byte>(new_len & 0xff);
  out[5] = static_cast<std::byte>(new_len >> 8);
  return out;
}

}  // namespace

TEST_CASE("process_maps_region tells the process behind an shm region from any other", "[fabric]") {
  namespace fs = regpool::fabric_shm;
  // Forked before any endpoint exists: it maps no region of ours.
  auto other = rpt::spawn([] { ::pause(); return 0; }, 60);
  End a(true);
  const std::string region = region_of(a.ep->name());
  CHECK(fs::process_maps_region(::getpid(), region) == fs::MapsRegion::yes);
  CHECK(fs::process_maps_region(other.pid, region) == fs::MapsRegion::no);
  CHECK(fs::process_maps_region(::getpid(), region + "x") == fs::MapsRegion::no);
  const pid_t gone = other.pid;
  ::kill(gone, SIGKILL);
  REQUIRE(rpt::reap(other, 10s) == 128 + SIGKILL);
  CHECK(fs::process_maps_region(gone, region) == fs::MapsRegion::gone);
  CHECK(fs::process_maps_region(0, region) == fs::MapsRegion::no);
}

TEST_CASE("an shm name naming another process than the one behind its region is refused at insert", "[fabric]") {
  // What a hostile peer would send to steer our cross-memory copies (puts,
  // gets, large messages; libfabric's own too) into a third process: its
  // name with that process's pid. The region file is there under the new
  // name (a link to the real one), and without message rings no ring file
  // is looked for: only the pid check stands between.
  auto victim = rpt::spawn([] { ::pause(); return 0; }, 60);
  const auto dc = FabricEndpointOptions::DeliveryComplete::automatic;
  End a(true, dc, 50ms, false), b(true, dc, 50ms, false);
  const auto good = b.ep->name();
  const auto forged = with_pid(good, victim.pid);
  const std::string real = "/dev/shm/" + region_of(good);
  const std::string fake = "/dev/shm/" + region_of(forged);
  REQUIRE(region_of(forged).rfind(std::to_string(victim.pid) + ":", 0) == 0);
  ::unlink(fake.c_str());  // a leftover of a run killed here, under a pid used again
  REQUIRE(::link(real.c_str(), fake.c_str()) == 0);
  std::string what;
  Status st = Status::ok;
  try {
    (void)a.ep->insert_peer(forged);
  } catch (const regpool::Error& e) {
    what = e.what();
    st = e.status();
  }
  ::unlink(fake.c_str());
  INFO(what);
  CHECK(st == Status::malformed);
  CHECK(what.find("does not map the region") != std::string::npos);
  CHECK(a.ep->peer_count() == 0);
  // The genuine name still goes in, and the peer works.
  const auto peer = a.ep->insert_peer(good);
  CHECK(a.ep->usable(peer));
  ::kill(victim.pid, SIGKILL);
  CHECK(rpt::reap(victim, 10s) == 128 + SIGKILL);
}
