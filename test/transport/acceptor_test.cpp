// The acceptor shared by bootstrap rank 0 and the membership Listener, on
// loopback without any protocol on top: the challenge every connection gets,
// which handshake an eviction picks (the oldest, never a pinned one),
// deadline expiry and the wake time, handing a connection over, and running
// out of descriptors (a low RLIMIT_NOFILE in a child process).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transport/acceptor.hpp"

namespace tcp = regpool::tcp;
namespace bw = regpool::bootwire;
using namespace std::chrono_literals;

namespace {

struct Drop {
  std::string addr;
  std::string why;
};

// The protocol state of these tests: a tag to tell handshakes apart.
struct Tag {
  int id = 0;
};
using Acceptor = tcp::Acceptor<Tag>;

struct Server {
  std::uint16_t port = 0;  // before listen_fd: listen() sets it
  int listen_fd = -1;
  std::vector<Drop> drops;
  Acceptor acc;

  Server(std::size_t max_pending, std::chrono::milliseconds timeout, bool key_required = false)
      : listen_fd(listen()),
        acc("test", listen_fd, max_pending, timeout, key_required, Tag{},
            [this](const Acceptor::Pending& p, const std::string& why) { drops.push_back({p.addr, why}); }) {}
  ~Server() { ::close(listen_fd); }

  int listen() {
    sockaddr_in a = tcp::resolve("127.0.0.1", 0, "test");
    return tcp::listen_on(a, port, "test", "listen");
  }

  // Accepts until the backlog is empty (a connection that connect() has
  // returned for is already in it).
  int accept() { return acc.accept_all(); }
};

// A blocking client connected to the server; returns the fd.
int connect_client(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a = tcp::resolve("127.0.0.1", port, "test");
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{5, 0};  // a test that goes wrong fails instead of hanging
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// How the server sees a client: its address text.
std::string addr_of(int client) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(client, reinterpret_cast<sockaddr*>(&a), &len);
  return tcp::addr_text(a);
}

// Reads the challenge; true when it parses with the expected key flag.
bool read_challenge(int client, bool key_required) {
  std::array<std::byte, bw::kChallengeSize> b;
  std::size_t got = 0;
  while (got < b.size()) {
    const ssize_t r = ::recv(client, b.data() + got, b.size() - got, 0);
    if (r <= 0) return false;
    got += static_cast<std::size_t>(r);
  }
  std::string why;
  const auto c = bw::parse_challenge(b, why);
  return c && c->key_required == key_required;
}

// After the challenge: true when the server closed the connection.
bool closed_by_server(int client) {
  char c;
  return ::recv(client, &c, 1, 0) == 0;
}

}  // namespace

TEST_CASE("every accepted connection gets a challenge with its own nonce", "[acceptor]") {
  Server s(8, 10s, true);
  const int a = connect_client(s.port);
  const int b = connect_client(s.port);
  REQUIRE(s.accept() == 0);
  REQUIRE(s.acc.live() == 2);
  CHECK(read_challenge(a, true));
  CHECK(read_challenge(b, true));
  const auto& p = s.acc.pending();
  CHECK(p[0].server_nonce != p[1].server_nonce);
  CHECK_FALSE(p[0].sending());
  CHECK(s.drops.empty());
  ::close(a);
  ::close(b);
}

TEST_CASE("beyond max_pending a new connection evicts the oldest handshake that is not pinned", "[acceptor]") {
  Server s(2, 10s);
  std::vector<int> c;
  for (int i = 0; i < 2; ++i) {
    c.push_back(connect_client(s.port));
    REQUIRE(s.accept() == 0);
    s.acc.pending().back().state.id = i;
    std::this_thread::sleep_for(2ms);  // distinct deadlines
  }
  s.acc.pending()[0].pinned = true;  // the oldest: e.g. an admitted rank
  c.push_back(connect_client(s.port));
  REQUIRE(s.accept() == 0);
  s.acc.pending().back().state.id = 2;
  REQUIRE(s.drops.size() == 1);
  CHECK(s.drops[0].addr == addr_of(c[1]));
  CHECK(s.drops[0].why == "evicted: 2 handshakes in flight");
  CHECK(read_challenge(c[1], false));
  CHECK(closed_by_server(c[1]));
  s.acc.sweep();
  REQUIRE(s.acc.live() == 2);
  CHECK(s.acc.pending()[0].state.id == 0);
  CHECK(s.acc.pending()[1].state.id == 2);

  // Unpinned, the oldest goes first.
  s.acc.pending()[0].pinned = false;
  c.push_back(connect_client(s.port));
  REQUIRE(s.accept() == 0);
  REQUIRE(s.drops.size() == 2);
  CHECK(s.drops[1].addr == addr_of(c[0]));
  CHECK(read_challenge(c[0], false));
  CHECK(closed_by_server(c[0]));
  for (int fd : c) ::close(fd);
}

TEST_CASE("a handshake past its deadline is dropped with the caller's reason; the wake time is the earliest deadline",
          "[acceptor]") {
  Server s(8, 300ms);
  const int a = connect_client(s.port);
  REQUIRE(s.accept() == 0);
  std::this_thread::sleep_for(5ms);
  const int b = connect_client(s.port);
  REQUIRE(s.accept() == 0);
  REQUIRE(s.acc.live() == 2);
  const auto first = s.acc.pending()[0].deadline;
  const auto second = s.acc.pending()[1].deadline;
  REQUIRE(first < second);

  std::vector<pollfd> fds{{-1, 0, 0}};  // appended after what is there
  auto wake = tcp::Clock::now() + 10s;
  const std::size_t lfd = s.acc.poll_fds(fds, wake);
  CHECK(lfd == 1);
  REQUIRE(fds.size() == 4);
  CHECK(fds[1].fd == s.listen_fd);
  CHECK(fds[1].events == POLLIN);
  CHECK(fds[2].fd == s.acc.pending()[0].fd);
  CHECK(fds[2].events == POLLIN);  // the challenge is out: waiting for the reply
  CHECK(wake == first);

  auto why = [](const Acceptor::Pending& p) { return "too slow " + std::to_string(p.state.id); };
  s.acc.expire(first - 1ms, why);
  CHECK(s.drops.empty());
  s.acc.pending()[0].state.id = 7;
  s.acc.expire(first, why);
  REQUIRE(s.drops.size() == 1);
  CHECK(s.drops[0].why == "too slow 7");
  CHECK(s.drops[0].addr == addr_of(a));
  REQUIRE(s.acc.pending().size() == 1);  // expire() sweeps
  CHECK(s.acc.pending()[0].deadline == second);
  CHECK(read_challenge(a, false));
  CHECK(closed_by_server(a));

  wake = tcp::Clock::now() + 10s;
  fds.clear();
  (void)s.acc.poll_fds(fds, wake);
  CHECK(wake == second);
  ::close(a);
  ::close(b);
}

TEST_CASE("a released connection is the caller's; close() and the destructor close the others silently",
          "[acceptor]") {
  int kept = -1;
  const int a = [&] {
    Server s(8, 10s);
    const int a = connect_client(s.port);
    const int b = connect_client(s.port);
    const int c = connect_client(s.port);
    REQUIRE(s.accept() == 0);
    REQUIRE(s.acc.live() == 3);
    kept = s.acc.release(s.acc.pending()[0]);
    s.acc.close(s.acc.pending()[1]);
    CHECK(s.acc.live() == 1);
    CHECK(read_challenge(b, false));
    CHECK(closed_by_server(b));
    ::close(b);
    ::close(c);
    CHECK(s.drops.empty());
    return a;
  }();
  CHECK(::fcntl(kept, F_GETFD) != -1);  // still open after the Acceptor is gone
  CHECK(read_challenge(a, false));
  const char ping = 'x';
  CHECK(::send(a, &ping, 1, 0) == 1);
  char got = 0;
  CHECK(::recv(kept, &got, 1, 0) == 1);
  CHECK(got == 'x');
  ::close(kept);
  ::close(a);
}

// Out of descriptors, accept4 fails with EMFILE while clients wait in the
// backlog: the oldest handshake is evicted to make room for each; when every
// handshake is pinned, accept_all() reports EMFILE and the client stays in
// the backlog. Run in a child: it lowers RLIMIT_NOFILE.
TEST_CASE("out of file descriptors, the oldest handshake makes room; with none to evict accept reports EMFILE",
          "[acceptor]") {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    auto fail = [](const char* what) {
      std::fprintf(stderr, "child: %s\n", what);
      ::_exit(1);
    };
    std::vector<Drop> drops;
    std::uint16_t port = 0;
    sockaddr_in addr = tcp::resolve("127.0.0.1", 0, "test");
    const int lfd = tcp::listen_on(addr, port, "test", "listen");
    Acceptor acc("test", lfd, 64, 10s, false, Tag{},
                 [&](const Acceptor::Pending& p, const std::string& why) { drops.push_back({p.addr, why}); });
    int c[4];
    for (int i = 0; i < 4; ++i) {
      c[i] = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (c[i] < 0) fail("socket");
    }
    addr.sin_port = htons(port);
    for (int i = 0; i < 3; ++i) {
      if (::connect(c[i], reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fail("connect");
    }
    // Room for exactly one more descriptor.
    const int probe = ::dup(2);
    if (probe < 0) fail("dup");
    ::close(probe);
    const rlimit rl{static_cast<rlim_t>(probe + 1), static_cast<rlim_t>(probe + 1)};
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) fail("setrlimit");
    if (::dup(2) != probe || ::dup(2) != -1 || errno != EMFILE) fail("the limit does not bind as computed");
    ::close(probe);

    if (acc.accept_all() != 0) fail("accept_all with evictable handshakes did not drain the backlog");
    acc.sweep();
    if (acc.live() != 1 || drops.size() != 2) {
      fail(("expected 2 evictions and 1 handshake left, got " + std::to_string(drops.size()) + " and " +
            std::to_string(acc.live()) + " (last: " + (drops.empty() ? std::string() : drops.back().why) + ")")
               .c_str());
    }
    for (const Drop& d : drops) {
      if (d.why != "evicted: out of file descriptors") fail(("wrong reason: " + d.why).c_str());
    }
    if (drops[0].addr != addr_of(c[0]) || drops[1].addr != addr_of(c[1])) fail("not the oldest evicted first");
    if (acc.pending()[0].addr != addr_of(c[2])) fail("the newest handshake is not the one kept");

    acc.pending()[0].pinned = true;
    if (::connect(c[3], reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fail("connect 4");
    const int err = acc.accept_all();
    if (err != EMFILE) fail(("with nothing to evict: expected EMFILE, got " + std::string(std::strerror(err))).c_str());
    if (!tcp::out_of_resources(err)) fail("EMFILE is not out_of_resources");
    if (drops.size() != 2 || acc.live() != 1) fail("a pinned handshake was evicted");
    // Room again: the client waiting in the backlog is accepted.
    acc.pending()[0].pinned = false;
    acc.close(acc.pending()[0]);
    if (acc.accept_all() != 0) fail("accept after making room");
    acc.sweep();
    if (acc.live() != 1 || acc.pending()[0].addr != addr_of(c[3])) fail("the waiting client was not accepted");
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
