// TcpBootstrap on loopback: allgather among forked processes, and bounded
// failure when a rank never shows up or dies.

#include <poll.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>

#include "regpool/bootstrap.hpp"
#include "transport/harness.hpp"

// Set (to 1) by the build when the MPI adapter is compiled in.
#ifndef REGPOOL_HAVE_MPI
#define REGPOOL_HAVE_MPI 0
#endif

using namespace std::chrono_literals;
using regpool::Status;

TEST_CASE("tcp bootstrap allgathers blobs of different sizes among 4 processes", "[unit]") {
  constexpr int kSize = 4;
  auto root = rpt::root_bootstrap(kSize);
  const auto port = root->port();
  REQUIRE(port != 0);
  auto blob_of = [](int rank, int round) {
    std::vector<std::byte> b(static_cast<std::size_t>(rank * 1000 + round));
    rpt::fill(b, static_cast<std::uint64_t>(rank * 31 + round));
    return b;
  };
  std::vector<rpt::ChildGuard> kids;
  for (int r = 1; r < kSize; ++r) {
    kids.push_back(rpt::spawn(
        [&, r]() -> int {
          auto b = rpt::child_bootstrap(port, r, kSize);
          for (int round = 0; round < 3; ++round) {
            auto all = b->allgather(blob_of(r, round), 10s);
            RPT_CHECK(all.size() == kSize);
            for (int k = 0; k < kSize; ++k) RPT_CHECK(all[static_cast<std::size_t>(k)] == blob_of(k, round));
          }
          b->barrier(10s);
          return 0;
        },
        30));
  }
  for (int round = 0; round < 3; ++round) {
    auto all = root->allgather(blob_of(0, round), 10s);
    REQUIRE(all.size() == kSize);
    for (int k = 0; k < kSize; ++k) CHECK(all[static_cast<std::size_t>(k)] == blob_of(k, round));
  }
  root->barrier(10s);
  for (auto& k : kids) CHECK(rpt::reap(k, 10s) == 0);
}

TEST_CASE("tcp bootstrap times out when a rank never connects", "[unit]") {
  regpool::TcpBootstrapConfig c;
  c.rank = 0;
  c.size = 2;
  c.connect_timeout = 300ms;
  regpool::TcpBootstrap root(c);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)root.allgather({}, 200ms);
    FAIL("allgather should have thrown");
  } catch (const regpool::Error& e) {
    CHECK(e.status() == Status::timeout);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("tcp bootstrap reports a rank that died", "[unit]") {
  auto root = rpt::root_bootstrap(2);
  const auto port = root->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        (void)b->allgather({}, 10s);
        return 0;  // exits before the second collective
      },
      30);
  (void)root->allgather({}, 10s);
  CHECK(rpt::reap(kid, 10s) == 0);
  try {
    (void)root->allgather({}, 5s);
    FAIL("allgather should have thrown");
  } catch (const regpool::Error& e) {
    CHECK(e.status() == Status::peer_unreachable);
  }
}

TEST_CASE("lost_peer names a rank killed between collectives, on both sides", "[unit]") {
  auto root = rpt::root_bootstrap(2);
  const auto port = root->port();
  int fds[2], acks[2];
  REQUIRE(::pipe(fds) == 0);
  REQUIRE(::pipe(acks) == 0);
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        (void)b->allgather({}, 10s);
        RPT_CHECK(b->lost_peer().empty());
        const char ok = 1;
        RPT_CHECK(::write(acks[1], &ok, 1) == 1);
        char c = 0;
        RPT_CHECK(::read(fds[0], &c, 1) == 1);  // rank 0 says it is about to exit
        const auto end = std::chrono::steady_clock::now() + 5s;
        while (b->lost_peer().empty() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(5ms);
        const std::string lost = b->lost_peer();
        RPT_CHECK(lost.find("rank 0 (127.0.0.1:") == 0);
        RPT_CHECK(lost.find("closed its connection") != std::string::npos);
        for (;;) ::pause();  // killed by the parent
      },
      30);
  (void)root->allgather({}, 10s);
  CHECK(root->lost_peer().empty());
  pollfd pa{acks[0], POLLIN, 0};
  REQUIRE(::poll(&pa, 1, 10000) == 1);  // the child saw rank 0 alive
  char ack = 0;
  REQUIRE(::read(acks[0], &ack, 1) == 1);
  // Rank 0 goes away: the child sees it (then passes its own checks).
  const char one = 1;
  REQUIRE(::write(fds[1], &one, 1) == 1);
  root.reset();
  std::this_thread::sleep_for(300ms);
  // A fresh rank 0 whose rank 1 is killed between collectives.
  auto root2 = rpt::root_bootstrap(2);
  const auto port2 = root2->port();
  auto kid2 = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port2);
        (void)b->allgather({}, 10s);
        for (;;) ::pause();
      },
      30);
  (void)root2->allgather({}, 10s);
  CHECK(root2->lost_peer().empty());
  REQUIRE(::kill(kid2.pid, SIGKILL) == 0);
  CHECK(rpt::reap(kid2, 10s) == 128 + SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  while (root2->lost_peer().empty() && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(5ms);
  const std::string lost = root2->lost_peer();
  INFO(lost);
  CHECK(lost.find("rank 1 (127.0.0.1:") == 0);
  CHECK(lost.find("closed its connection") != std::string::npos);
  // The first child checked rank 0's departure; it is still pausing.
  ::kill(kid.pid, SIGKILL);
  CHECK(rpt::reap(kid, 10s) == 128 + SIGKILL);
  for (int fd : {fds[0], fds[1], acks[0], acks[1]}) ::close(fd);
}

TEST_CASE("tcp bootstrap validates its configuration", "[unit]") {
  regpool::TcpBootstrapConfig c;
  c.rank = 2;
  c.size = 2;
  CHECK_THROWS_AS(regpool::TcpBootstrap(c), regpool::Error);
  c.rank = 1;
  c.port = 0;
  CHECK_THROWS_AS(regpool::TcpBootstrap(c), regpool::Error);
  c.rank = 0;
  c.size = 1;
  regpool::TcpBootstrap solo(c);
  auto all = solo.allgather(std::vector<std::byte>(3), 1s);
  CHECK(all.size() == 1);
  CHECK(all[0].size() == 3);
}

// The MPI adapter itself runs under mpirun in suite 'mpi' (test/mpi). Here:
// the library reports what it was built with, and without MPI refuses with
// Status::unsupported and a message saying how to get it.
TEST_CASE("mpi bootstrap availability matches the build", "[unit]") {
  CHECK(regpool::mpi_bootstrap_available() == static_cast<bool>(REGPOOL_HAVE_MPI));
  if (!regpool::mpi_bootstrap_available()) {
    try {
      (void)regpool::mpi_bootstrap();
      FAIL("mpi_bootstrap() returned without MPI");
    } catch (const regpool::Error& e) {
      CHECK(e.status() == Status::unsupported);
      CHECK(std::string(e.what()).find("-Dmpi") != std::string::npos);
    }
  }
}

TEST_CASE("several blobs travel in one contribution", "[unit]") {
  const std::vector<std::vector<std::byte>> parts = {
      {std::byte{1}, std::byte{2}}, {}, std::vector<std::byte>(300, std::byte{7})};
  const auto packed = regpool::pack_blobs(parts);
  CHECK(packed.size() == 3 * 4 + 2 + 300);
  CHECK(packed[0] == std::byte{2});  // little-endian length
  CHECK(regpool::unpack_blobs(packed) == parts);
  CHECK(regpool::unpack_blobs({}).empty());
  // Bytes from another process may be cut short anywhere.
  for (std::size_t cut = 1; cut < packed.size(); ++cut) {
    if (cut == 6 || cut == 10) continue;  // blob boundaries: a valid shorter list
    CHECK_THROWS_AS(regpool::unpack_blobs(std::span<const std::byte>(packed.data(), cut)), regpool::Error);
  }
  CHECK(regpool::unpack_blobs(std::span<const std::byte>(packed.data(), 10)).size() == 2);
}

TEST_CASE("the job key comes from the config, else from REGPOOL_BOOTSTRAP_KEY", "[unit]") {
  struct EnvGuard {
    EnvGuard() { ::setenv("REGPOOL_BOOTSTRAP_KEY", "from-env", 1); }
    ~EnvGuard() { ::unsetenv("REGPOOL_BOOTSTRAP_KEY"); }
  } env;
  regpool::TcpBootstrapConfig c;
  c.size = 2;
  c.connect_timeout = 20s;
  c.log = [](const std::string&) {};
  {
    regpool::TcpBootstrap from_env(c);
    CHECK(from_env.uses_key());
    c.key_from_environment = false;
    regpool::TcpBootstrap none(c);
    CHECK_FALSE(none.uses_key());
    c.key_from_environment = true;
  }
  // Rank 0 takes the environment's key; a rank given the same key in its
  // config gets in, and one that ignores the environment is refused.
  regpool::TcpBootstrap root(c);
  const auto port = root.port();
  auto refused = rpt::spawn(
      [port]() -> int {
        regpool::TcpBootstrapConfig k;
        k.rank = 1;
        k.size = 2;
        k.port = port;
        k.key_from_environment = false;
        try {
          regpool::TcpBootstrap b(k);
        } catch (const regpool::Error& e) {
          RPT_CHECK(e.status() == Status::access_denied);
          return 0;
        }
        return 1;
      },
      30);
  auto admitted = rpt::spawn(
      [port]() -> int {
        std::this_thread::sleep_for(300ms);  // after the refused one
        ::unsetenv("REGPOOL_BOOTSTRAP_KEY");
        regpool::TcpBootstrapConfig k;
        k.rank = 1;
        k.size = 2;
        k.port = port;
        k.key = "from-env";
        regpool::TcpBootstrap b(k);
        RPT_CHECK(b.uses_key());
        (void)b.allgather({}, 10s);
        return 0;
      },
      30);
  (void)root.allgather({}, 10s);
  CHECK(rpt::reap(refused, 10s) == 0);
  CHECK(rpt::reap(admitted, 10s) == 0);
}
