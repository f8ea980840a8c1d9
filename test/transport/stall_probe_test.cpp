// tcp::StallProbe (lib/transport/stall_probe.hpp), the check behind net's
// dead-peer detection, against real loopback sockets: a listener that is
// there (even one that never accepts) is never called gone; once it is
// closed the probe says gone after its patience; a post that goes through
// ends a stall; addresses it cannot probe leave it inert.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <span>
#include <thread>

#include "transport/stall_probe.hpp"

using regpool::tcp::StallProbe;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// A loopback listener on an ephemeral port; never accepts.
struct Listener {
  int fd = -1;
  sockaddr_in addr{};
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd, 4) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  ~Listener() { close(); }
  std::span<const std::byte> bytes() const { return {reinterpret_cast<const std::byte*>(&addr), sizeof addr}; }
};

StallProbe::Policy quick() {
  StallProbe::Policy p;
  p.patience = 20ms;
  p.first_gap = 10ms;
  p.max_gap = 40ms;
  p.answer_within = 500ms;
  return p;
}

// Reports stalls every 2 ms for `span`; true as soon as the probe says gone.
bool stall_for(StallProbe& probe, std::chrono::milliseconds span) {
  const auto until = Clock::now() + span;
  while (Clock::now() < until) {
    if (probe.stalled(Clock::now())) return true;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

}  // namespace

TEST_CASE("a live listener is never called gone; a closed one is", "[unit]") {
  Listener l;
  StallProbe probe(quick());
  REQUIRE(probe.set_address(l.bytes()));
  REQUIRE(probe.armed());
  // Its backlog takes the probes (nobody accepts): alive, again and again.
  CHECK_FALSE(stall_for(probe, 300ms));
  CHECK(probe.probes() >= 2);
  CHECK_FALSE(probe.gone());
  l.close();
  // Nothing listens there now: refused, within a few gaps.
  CHECK(stall_for(probe, 3000ms));
  CHECK(probe.gone());
  // Once gone, stays gone (the peer's endpoint cannot come back at this
  // address for this peer: a new one is a new insert).
  probe.moving();
  CHECK(probe.stalled(Clock::now()));
}

TEST_CASE("no probe before the patience; a post that goes through ends the stall", "[unit]") {
  Listener l;
  const sockaddr_in dead = l.addr;
  l.close();
  StallProbe::Policy p = quick();
  p.patience = 200ms;
  StallProbe probe(p);
  REQUIRE(probe.set_address({reinterpret_cast<const std::byte*>(&dead), sizeof dead}));
  const auto t0 = Clock::now();
  CHECK_FALSE(probe.stalled(t0));
  CHECK_FALSE(probe.stalled(t0 + 100ms));
  CHECK(probe.probes() == 0);
  // The stall ends: the next wait starts a new one, and its patience again.
  probe.moving();
  CHECK_FALSE(probe.stalled(t0 + 150ms));
  CHECK_FALSE(probe.stalled(t0 + 300ms));
  CHECK(probe.probes() == 0);
  // Waits further apart than the patience do not add up to a stall either.
  CHECK_FALSE(probe.stalled(t0 + 600ms));
  CHECK(probe.probes() == 0);
  // A stall that lasts: probed, refused (the clock as the caller gives it,
  // with the socket's answer read on later calls).
  const auto t1 = t0 + 1000ms;
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = probe.stalled(t1 + std::chrono::milliseconds(10 * i));
    std::this_thread::sleep_for(1ms);
  }
  CHECK(gone);
  CHECK(probe.probes() >= 1);
}

TEST_CASE("addresses a probe cannot use leave it inert", "[unit]") {
  StallProbe probe(quick());
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_port = htons(9);
  CHECK_FALSE(probe.set_address({reinterpret_cast<const std::byte*>(&any), sizeof any}));  // INADDR_ANY
  sockaddr_in no_port{};
  no_port.sin_family = AF_INET;
  no_port.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK_FALSE(probe.set_address({reinterpret_cast<const std::byte*>(&no_port), sizeof no_port}));
  std::byte junk[16]{};
  CHECK_FALSE(probe.set_address(junk));
  CHECK_FALSE(probe.set_address(std::span<const std::byte>(junk, 1)));
  sockaddr_in6 six{};
  six.sin6_family = AF_INET6;
  six.sin6_port = htons(9);
  six.sin6_addr = in6addr_loopback;
  CHECK(probe.set_address({reinterpret_cast<const std::byte*>(&six), sizeof six}));
  CHECK_FALSE(probe.set_address({reinterpret_cast<const std::byte*>(&six), sizeof six - 1}));
  CHECK_FALSE(probe.armed());
  // Inert: never gone, never a socket.
  const auto t0 = Clock::now();
  for (int i = 0; i < 50; ++i) CHECK_FALSE(probe.stalled(t0 + std::chrono::milliseconds(50 * i)));
  CHECK(probe.probes() == 0);
}
