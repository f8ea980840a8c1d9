// mpi_bootstrap() under mpirun (suite 'mpi', run at 2 and 4 ranks by
// test/meson.build): the adapter initializes MPI itself (and finalizes it
// at exit), its rank and size are MPI_COMM_WORLD's, allgather moves blobs of
// different sizes, and FabricEndpoints on shm that found each other through
// it put, get and send verified bytes between all pairs of ranks.
// Started outside an MPI launcher it exits 77 (SKIP).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "regpool/bootstrap.hpp"
#include "regpool/fabric_domain.hpp"
#include "regpool/fabric_endpoint.hpp"
#include "regpool/pool.hpp"
#include "regpool/remote_ref.hpp"
#include "regpool/slice.hpp"

namespace {

using namespace std::chrono_literals;
using regpool::Slice;
using regpool::Status;

regpool::Bootstrap* g_boot = nullptr;

// Deterministic bytes per (from, to, round), so every rank can check what
// any other rank sent.
std::byte pattern_byte(int from, int to, int round, std::size_t i) {
  return static_cast<std::byte>((i * 131 + static_cast<std::size_t>(from) * 29 + static_cast<std::size_t>(to) * 7 +
                                 static_cast<std::size_t>(round) * 3 + i / 251) &
                                0xff);
}
void fill(std::span<std::byte> s, int from, int to, int round) {
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = pattern_byte(from, to, round, i);
}
bool matches(std::span<const std::byte> s, int from, int to, int round) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != pattern_byte(from, to, round, i)) return false;
  }
  return true;
}

Slice must(regpool::Result<Slice> r) {
  REQUIRE(r);
  return std::move(*r);
}

}  // namespace

TEST_CASE("mpi bootstrap: rank and size are MPI_COMM_WORLD's", "[mpi]") {
  CHECK(regpool::mpi_bootstrap_available());
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(g_boot->rank() == rank);
  CHECK(g_boot->size() == size);
}

TEST_CASE("mpi bootstrap: allgather of blobs of different sizes, empty ones included", "[mpi]") {
  const int me = g_boot->rank(), n = g_boot->size();
  for (int round = 0; round < 5; ++round) {
    // Round 2 is all empty (a barrier); in the others rank 1 contributes
    // nothing and the rest differ in size.
    auto len_of = [&](int r) -> std::size_t {
      if (round == 2 || r == 1) return 0;
      return static_cast<std::size_t>(r * 977 + round * 4099 + 1);
    };
    std::vector<std::byte> mine(len_of(me));
    fill(mine, me, -1, round);
    const auto all = g_boot->allgather(mine, 30s);
    REQUIRE(all.size() == static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      const auto& got = all[static_cast<std::size_t>(r)];
      CHECK(got.size() == len_of(r));
      CHECK(matches(got, r, -1, round));
    }
  }
}

TEST_CASE("mpi bootstrap: a second bootstrap has its own communicator", "[mpi]") {
  auto second = regpool::mpi_bootstrap();
  CHECK(second->rank() == g_boot->rank());
  CHECK(second->size() == g_boot->size());
  const std::byte mine[] = {static_cast<std::byte>(second->rank())};
  const auto all = second->allgather(mine, 30s);
  REQUIRE(all.size() == static_cast<std::size_t>(second->size()));
  for (int r = 0; r < second->size(); ++r) {
    REQUIRE(all[static_cast<std::size_t>(r)].size() == 1);
    CHECK(all[static_cast<std::size_t>(r)][0] == static_cast<std::byte>(r));
  }
}

TEST_CASE("mpi bootstrap: shm endpoints found through it put, get and send verified bytes", "[mpi]") {
  constexpr std::size_t kSlot = 256 << 10;  // what each rank puts into each other rank
  constexpr std::size_t kMsg = 8 << 10;     // what each rank sends to each other rank
  const int me = g_boot->rank(), n = g_boot->size();

  regpool::FabricConfig fc;
  fc.provider = "shm";
  auto domain = regpool::FabricDomain::open(fc);
  regpool::PoolConfig pc;
  pc.name = "mpi-test";
  pc.arena_size = 16 << 20;
  regpool::Pool pool({domain}, pc);
  regpool::EndpointConfig ec;
  ec.progress_thread = true;  // targets serve the others while they wait
  regpool::FabricEndpointOptions fo;
  fo.delivery_complete = regpool::FabricEndpointOptions::DeliveryComplete::on;  // put done = applied at the target
  auto ep = regpool::FabricEndpoint::open(domain, ec, fo);

  // Rank r's put lands in slot r of every other rank's target.
  auto target = *pool.allocate(kSlot * static_cast<std::size_t>(n));
  std::memset(target.data().data(), 0, target.data().size());
  auto exposure = ep->expose(must(Slice::data(target)), regpool::RemoteAccess::read_write);
  REQUIRE(exposure);
  std::vector<regpool::Ldo> inbox;
  std::vector<regpool::Token> recvs;
  for (int i = 0; i < n - 1; ++i) {
    inbox.push_back(*pool.allocate(kMsg));
    auto t = ep->post_recv(must(Slice::data(inbox.back())));
    REQUIRE(t);
    recvs.push_back(*t);
  }
  const auto ref = exposure->encode();
  const auto name = ep->name();
  const auto all = g_boot->allgather(
      regpool::pack_blobs({name, std::vector<std::byte>(ref.begin(), ref.end())}), 60s);
  REQUIRE(all.size() == static_cast<std::size_t>(n));

  struct Remote {
    regpool::PeerId peer;
    regpool::RemoteRef ref;
  };
  std::vector<Remote> remotes(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    const auto parts = regpool::unpack_blobs(all[static_cast<std::size_t>(q)]);
    REQUIRE(parts.size() == 2);
    auto decoded = regpool::RemoteRef::decode(parts[1]);
    REQUIRE(decoded);
    remotes[static_cast<std::size_t>(q)] = {ep->insert_peer(parts[0]), *decoded};
  }

  const auto before = pool.stats();
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    const auto& rq = remotes[static_cast<std::size_t>(q)];
    auto out = *pool.allocate(kSlot);
    fill(out.data(), me, q, 0);
    auto put = ep->put(must(Slice::data(out)), rq.peer, rq.ref, kSlot * static_cast<std::size_t>(me));
    REQUIRE(put);
    CHECK(ep->wait(*put, 30s).status == Status::ok);
    auto msg = *pool.allocate(kMsg);
    fill(msg.data(), me, q, 1);
    auto sent = ep->send(rq.peer, must(Slice::data(msg)));
    REQUIRE(sent);
    CHECK(ep->wait(*sent, 30s).status == Status::ok);
  }
  g_boot->barrier(60s);  // every put has been applied everywhere

  for (int q = 0; q < n; ++q) {
    const auto slot = target.data().subspan(kSlot * static_cast<std::size_t>(q), kSlot);
    if (q == me) {
      CHECK(std::all_of(slot.begin(), slot.end(), [](std::byte b) { return b == std::byte{0}; }));
    } else {
      CHECK(matches(slot, q, me, 0));
    }
  }
  std::vector<bool> heard(static_cast<std::size_t>(n), false);
  for (std::size_t i = 0; i < recvs.size(); ++i) {
    const auto c = ep->wait(recvs[i], 30s);
    REQUIRE(c.status == Status::ok);
    REQUIRE(c.bytes == kMsg);
    // The sender is whoever's pattern it carries.
    int from = -1;
    for (int q = 0; q < n; ++q) {
      if (q != me && matches(inbox[i].data(), q, me, 1)) from = q;
    }
    REQUIRE(from >= 0);
    CHECK_FALSE(heard[static_cast<std::size_t>(from)]);
    heard[static_cast<std::size_t>(from)] = true;
  }
  // Read back what we put, from every peer.
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    const auto& rq = remotes[static_cast<std::size_t>(q)];
    auto back = *pool.allocate(kSlot);
    auto got = ep->get(rq.peer, rq.ref, kSlot * static_cast<std::size_t>(me), must(Slice::data(back)));
    REQUIRE(got);
    CHECK(ep->wait(*got, 30s).status == Status::ok);
    CHECK(matches(back.data(), me, q, 0));
  }
  // The data phase allocated from the pool but registered nothing new.
  CHECK(pool.stats().registrations == before.registrations);
  g_boot->barrier(60s);  // nobody tears down an endpoint another rank still reads
}

// Last on purpose: rank 0 leaves an abandoned collective pending on its own
// communicator for the rest of the job (MPI cannot cancel one), and no other
// test should run next to it.
TEST_CASE("mpi bootstrap: ranks that do not join make allgather time out, not hang", "[mpi]") {
  auto late = regpool::mpi_bootstrap();
  const std::byte mine[] = {static_cast<std::byte>(late->rank() + 1)};
  if (late->rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      (void)late->allgather(mine, 300ms);
      FAIL("allgather returned although the other ranks had not joined");
    } catch (const regpool::Error& e) {
      CHECK(e.status() == Status::timeout);
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 20s);
    // That bootstrap is now unusable, and says so at once.
    try {
      (void)late->allgather(mine, 30s);
      FAIL("an abandoned bootstrap ran another collective");
    } catch (const regpool::Error& e) {
      CHECK(e.status() == Status::timeout);
    }
  }
  // The other ranks never join `late`; they wait here until rank 0 gave up.
  g_boot->barrier(60s);
}

int main(int argc, char** argv) {
  // Only meaningful under a launcher: a singleton MPI_Init would just make
  // a 1-rank job (and in a container may fail to start its daemon).
  if (!std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMI_SIZE") && !std::getenv("PMIX_RANK")) {
    std::printf("SKIP: not started by an MPI launcher (run it as: mpirun -n 2 %s)\n", argv[0]);
    return 77;
  }
  int rc = 1;
  try {
    auto boot = regpool::mpi_bootstrap();  // initializes MPI; it finalizes at exit
    if (boot->size() < 2) {
      std::printf("SKIP: needs at least 2 ranks, got %d\n", boot->size());
      return 77;
    }
    g_boot = boot.get();
    rc = Catch::Session().run(argc, argv);
    std::fflush(stdout);
  } catch (const regpool::Error& e) {
    std::fprintf(stderr, "mpi bootstrap test: %s\n", e.what());
    rc = 1;
  }
  return rc;
}
