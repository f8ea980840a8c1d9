// The control endpoint of emulated atomics is opened only where wanted
// (FabricEndpointOptions::emulated_atomics): an endpoint that serves atomics
// opens it at construction and names it; a default (on_demand) endpoint
// opens it only when it inserts a peer that serves atomics; off never does.
// Atomics toward a peer that serves none fail at once with
// Status::unsupported, never by a timeout. Open times are measured by
// `regpool-info --open-time`, not here.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "transport/fabric_wire.hpp"
#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::FabricEndpoint;
using regpool::FabricEndpointOptions;
using regpool::Status;
using Mode = regpool::FabricEndpointOptions::EmulatedAtomics;
namespace fw = regpool::fabric_wire;

namespace {

// Two endpoints of one process on one domain: `target` exposes a word and
// progresses on its own thread, `initiator` issues atomics at it.
struct Pair {
  std::shared_ptr<regpool::FabricDomain> domain;
  std::unique_ptr<regpool::Pool> pool;
  std::unique_ptr<FabricEndpoint> target;
  std::unique_ptr<FabricEndpoint> initiator;
  regpool::Ldo word_obj;
  regpool::Exposure exposure;
  regpool::RemoteRef ref;

  Pair(const std::string& prov, Mode target_mode, Mode initiator_mode, regpool::EndpointConfig ic = {}) {
    domain = regpool::FabricDomain::open(rpt::fabric_config(prov));
    regpool::PoolConfig pc;
    pc.arena_size = std::size_t{4} << 20;
    pool = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain}, pc);
    regpool::EndpointConfig tc;
    tc.progress_thread = true;
    FabricEndpointOptions to;
    to.emulated_atomics = target_mode;
    target = FabricEndpoint::open(domain, tc, to);
    FabricEndpointOptions io;
    io.emulated_atomics = initiator_mode;
    initiator = FabricEndpoint::open(domain, ic, io);
    auto obj = pool->allocate(64);
    if (!obj) throw regpool::Error(obj.status(), 0, "test: allocate");
    word_obj = std::move(*obj);
    auto word = rpt::slice_or_die(regpool::Slice::data(word_obj, 0, 8));
    std::memset(word.address(), 0, 8);
    auto e = target->expose(word, regpool::RemoteAccess::read_write);
    if (!e) throw regpool::Error(e.status(), 0, "test: expose");
    exposure = std::move(*e);
    ref = exposure.ref();
  }
  ~Pair() {
    exposure.revoke();
    initiator.reset();
    target.reset();
    pool.reset();
  }
  std::uint64_t word() const {
    std::uint64_t v = 0;
    std::memcpy(&v, word_obj.data().data(), 8);
    return v;
  }
};

bool native(const std::string& prov) { return rpt::expects_native_atomics(prov); }

// Every atomic kind works from `p.initiator` to `p.target` and changes the word.
void check_atomics_work(Pair& p) {
  const regpool::PeerId peer = p.initiator->insert_peer(p.target->name());
  regpool::Completion c = rpt::wait_ok(*p.initiator, p.initiator->fetch_add(peer, p.ref, 0, 5), 20s);
  REQUIRE(c.status == Status::ok);
  CHECK(c.value == 0);
  c = rpt::wait_ok(*p.initiator, p.initiator->fetch_add(peer, p.ref, 0, 2), 20s);
  REQUIRE(c.status == Status::ok);
  CHECK(c.value == 5);
  c = rpt::wait_ok(*p.initiator, p.initiator->compare_swap(peer, p.ref, 0, 7, 40), 20s);
  REQUIRE(c.status == Status::ok);
  CHECK(c.value == 7);
  c = rpt::wait_ok(*p.initiator, p.initiator->compare_swap(peer, p.ref, 0, 7, 99), 20s);  // no match
  REQUIRE(c.status == Status::ok);
  CHECK(c.value == 40);
  p.target->quiesce(5s);
  CHECK(p.word() == 40);
}

// An atomic at `p.target` is refused at the post, fast, with unsupported,
// and the peer stays usable for everything else.
void check_refused_fast(Pair& p) {
  const regpool::PeerId peer = p.initiator->insert_peer(p.target->name());
  const auto before = p.initiator->stats().rejected;
  const auto t0 = std::chrono::steady_clock::now();
  auto fa = p.initiator->fetch_add(peer, p.ref, 0, 1);
  auto cs = p.initiator->compare_swap(peer, p.ref, 0, 0, 1);
  const auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(fa.ok());
  REQUIRE_FALSE(cs.ok());
  CHECK(fa.status() == Status::unsupported);
  CHECK(cs.status() == Status::unsupported);
  // Refused before the wire: no op_timeout (30 s) nor post_timeout (10 s)
  // ran out. The bound only tells "refused" from "waited for a timeout".
  CHECK(took < 2s);
  CHECK(p.initiator->stats().rejected == before + 2);
  CHECK(p.initiator->usable(peer));
  CHECK(p.target->control_stats().served == 0);
  CHECK(p.word() == 0);
}

}  // namespace

TEST_CASE("endpoints that both serve atomics use them on each other", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("provider " << prov);
  Pair p(prov, Mode::serve, Mode::serve);
  CHECK(p.target->serves_atomics());
  CHECK(p.target->control_open() == !native(prov));
  check_atomics_work(p);
  if (!native(prov)) CHECK(p.target->control_stats().served == 4);
}

TEST_CASE("a default endpoint serves no atomics and opens its control endpoint only for a serving peer",
          "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("provider " << prov);
  Pair p(prov, Mode::serve, Mode::on_demand);
  // Nothing opened at construction: the open costs on tcp what the data
  // endpoint costs (docs/provider-facts.md).
  CHECK_FALSE(p.initiator->control_open());
  CHECK(p.initiator->serves_atomics() == native(prov));
  // Inserting a serving peer opens it (setup path), so the atomics work.
  check_atomics_work(p);
  CHECK(p.initiator->control_open() == !native(prov));
}

TEST_CASE("a control endpoint opened on demand wakes a sleeping wait", "[fabric]") {
  // Its completion queue joins the wait set after the endpoint opened.
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("provider " << prov);
  regpool::EndpointConfig ic;
  ic.wait_mode = regpool::WaitMode::sleep;
  Pair p(prov, Mode::serve, Mode::on_demand, ic);
  check_atomics_work(p);
  CHECK(p.initiator->control_open() == !native(prov));
}

TEST_CASE("an on-demand endpoint that meets only non-serving peers never opens a control endpoint", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("provider " << prov);
  Pair p(prov, Mode::on_demand, Mode::on_demand);
  (void)p.initiator->insert_peer(p.target->name());
  (void)p.target->insert_peer(p.initiator->name());
  CHECK_FALSE(p.initiator->control_open());
  CHECK_FALSE(p.target->control_open());
}

TEST_CASE("an atomic toward a peer that serves none fails at once with unsupported", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("provider " << prov);
  SECTION("target on_demand (the default)") {
    Pair p(prov, Mode::on_demand, Mode::serve);
    if (native(prov)) {
      check_atomics_work(p);  // native atomics: the provider serves them
    } else {
      CHECK_FALSE(p.target->serves_atomics());
      check_refused_fast(p);
    }
  }
  SECTION("target off") {
    Pair p(prov, Mode::off, Mode::serve);
    if (native(prov)) {
      check_atomics_work(p);
    } else {
      CHECK_FALSE(p.target->serves_atomics());
      check_refused_fast(p);
    }
  }
  SECTION("initiator off, target serving") {
    Pair p(prov, Mode::serve, Mode::off);
    if (native(prov)) {
      check_atomics_work(p);
    } else {
      check_refused_fast(p);
      CHECK_FALSE(p.initiator->control_open());  // off: not even a serving peer opens it
    }
  }
}

TEST_CASE("the name says whether a control address is present", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("provider " << prov);
  Pair p(prov, Mode::serve, Mode::on_demand);
  // The atomics bits; a message limit (net) and shm's message rings are
  // other matters (hostile, shm-rings).
  auto flags_of = [](const std::vector<std::byte>& n) {
    return static_cast<std::uint8_t>(static_cast<std::uint8_t>(n[3]) & ~(fw::kNameLimit | fw::kNameRings));
  };
  auto ctrl_len = [](const std::vector<std::byte>& n) {
    return static_cast<std::size_t>(n[6]) | (static_cast<std::size_t>(n[7]) << 8);
  };
  const auto serving = p.target->name();
  const auto plain = p.initiator->name();
  REQUIRE(serving.size() > fw::kNameHeader);
  CHECK(serving[2] == std::byte{fw::kNameVersion});
  if (native(prov)) {
    CHECK(flags_of(serving) == 0);
    CHECK(flags_of(plain) == 0);
    CHECK(ctrl_len(serving) == 0);
  } else {
    CHECK(flags_of(serving) == (fw::kNameEmulates | fw::kNameHasCtrl));
    CHECK(ctrl_len(serving) > 0);
    CHECK(flags_of(plain) == fw::kNameEmulates);
    CHECK(ctrl_len(plain) == 0);
    CHECK(plain.size() < serving.size());
  }
  CHECK(ctrl_len(plain) == 0);
}
