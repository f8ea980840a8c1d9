// The liveness bound when a client vanishes without its kernel closing the
// connection (host crash, cut link): inside a private network namespace,
// the server admits a client, then the namespace's only link (lo) goes
// down while both processes stay alive. Only TCP keep-alive /
// TCP_USER_TIMEOUT can notice that; the server must report `died` within
// ListenerConfig::liveness_timeout (3 s here) plus a poll or two.
//
// Own main: exits 77 (SKIP) with the reason when a network namespace is not
// available (not root, no CAP_NET_ADMIN) or ip(8) is missing.
// Everything runs in a forked child, so the test process's own network
// namespace is never touched.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "regpool/membership.hpp"
#include "transport/harness.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kSkip = 77;
constexpr auto kBound = 3s;

int scenario() {
  if (::unshare(CLONE_NEWNET) != 0) {
    std::printf("SKIP: cannot create a network namespace (%s): needs root or CAP_NET_ADMIN\n", std::strerror(errno));
    return kSkip;
  }
  if (std::system("ip link set lo up") != 0) {
    std::printf("SKIP: cannot bring up lo in the namespace (ip from iproute2 missing?)\n");
    return kSkip;
  }
  rpt::Stack server("shm");
  regpool::ListenerConfig lc;
  lc.key_from_environment = false;
  lc.liveness_timeout = kBound;
  lc.log = [](const std::string&) {};
  regpool::Listener listener(*server.ep, lc);
  const std::uint16_t port = listener.port();
  auto client = rpt::spawn(
      [port] {
        rpt::Stack s("shm");
        regpool::ConnectConfig cc;
        cc.port = port;
        cc.key_from_environment = false;
        cc.client_id = 5;
        cc.liveness_timeout = kBound;
        auto conn = regpool::connect(*s.ep, cc);
        for (;;) ::pause();  // alive, silent: never closes its socket
        return 0;
      },
      60);
  std::optional<regpool::PeerEvent> joined;
  for (auto end = Clock::now() + 20s; !joined && Clock::now() < end;) {
    listener.poll(10ms);
    joined = listener.next_event();
  }
  if (!joined || joined->kind != regpool::PeerEventKind::joined) {
    std::fprintf(stderr, "the client did not join\n");
    return 1;
  }
  // The link goes away under both processes (no FIN, no RST reaches
  // anyone): every packet to 127.0.0.1 is now undeliverable.
  if (std::system("ip link set lo down") != 0) {
    std::fprintf(stderr, "cannot take lo down in the namespace\n");
    return 1;
  }
  const auto cut = Clock::now();
  std::optional<regpool::PeerEvent> died;
  while (!died && Clock::now() - cut < 30s) {
    listener.poll(50ms);
    died = listener.next_event();
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - cut);
  if (!died || died->kind != regpool::PeerEventKind::died || died->peer != joined->peer) {
    std::fprintf(stderr, "no died event within 30 s of cutting the link\n");
    return 1;
  }
  std::printf("died %lld ms after the link was cut (bound %lld ms): %s\n", static_cast<long long>(took.count()),
              static_cast<long long>(std::chrono::milliseconds(kBound).count()), died->reason.c_str());
  // The client is still alive: only the keep-alive machinery noticed.
  if (::kill(client.pid, 0) != 0) {
    std::fprintf(stderr, "the client process died, so this did not test keep-alive\n");
    return 1;
  }
  // Whole-second keep-alive granularity plus one poll.
  if (took > kBound + 1500ms) {
    std::fprintf(stderr, "died noticed after %lld ms, bound %lld ms\n", static_cast<long long>(took.count()),
                 static_cast<long long>(std::chrono::milliseconds(kBound).count()));
    return 1;
  }
  return 0;
}

}  // namespace

int main() {
  ::setenv("FI_TCP_IFACE", "lo", 0);
  auto child = rpt::spawn(scenario, 90);
  const int rc = rpt::reap(child, 100s);
  if (rc == kSkip) return kSkip;
  if (rc != 0) std::fprintf(stderr, "liveness scenario failed (exit %d)\n", rc);
  return rc == 0 ? 0 : 1;
}
