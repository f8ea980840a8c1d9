// Listener / connect / peer events on libfabric shm and tcp (suite fabric):
// clients are forked processes that join a server at any time, move bytes,
// leave cleanly, crash (SIGKILL) and rejoin as a new incarnation. Every
// child runs under alarm() and every wait in the parent is bounded, so
// nothing can hang.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "regpool/membership.hpp"
#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::PeerEvent;
using regpool::PeerEventKind;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kKey = "membership-test-key-0123456789";

// What a client sends the server first: who it is, as the server knows it.
struct Hello {
  std::uint64_t client_id;
  std::uint32_t id_at_server;
  std::uint32_t pad;
  std::uint64_t epoch;
};

regpool::ListenerConfig listener_config(std::vector<std::string>* log = nullptr) {
  regpool::ListenerConfig c;
  c.key = kKey;
  c.key_from_environment = false;
  if (log) c.log = [log](const std::string& l) { log->push_back(l); };
  return c;
}

regpool::ConnectConfig connect_config(std::uint16_t port, std::uint64_t client_id, const char* key = kKey) {
  regpool::ConnectConfig c;
  c.port = port;
  c.client_id = client_id;
  c.key = key;
  c.key_from_environment = false;
  c.timeout = 10s;
  return c;
}

// Child: join, send a Hello, wait for the server's 8-byte answer (the
// epoch echoed), then either leave cleanly or stop (and be killed).
int client_main(const std::string& backend, std::uint16_t port, std::uint64_t client_id, bool leave) {
  rpt::Stack s(backend);
  auto conn = regpool::connect(*s.ep, connect_config(port, client_id));
  RPT_CHECK(conn->connected());
  RPT_CHECK(conn->epoch() > 0);
  regpool::Ldo reply = s.alloc(64);
  auto rt = s.ep->post_recv(rpt::slice_or_die(regpool::Slice::data(reply)));
  RPT_CHECK(rt.ok());
  regpool::Ldo msg = s.alloc(sizeof(Hello));
  const Hello h{client_id, conn->id_at_server(), 0, conn->epoch()};
  std::memcpy(msg.data().data(), &h, sizeof h);
  const auto sent = rpt::wait_ok(*s.ep, s.ep->send(conn->server(), rpt::slice_or_die(regpool::Slice::data(msg))), 10s);
  RPT_CHECK(sent.status == regpool::Status::ok);
  const auto got = s.ep->wait(*rt, 10s);
  RPT_CHECK(got.status == regpool::Status::ok);
  std::uint64_t echoed = 0;
  std::memcpy(&echoed, reply.data().data(), sizeof echoed);
  RPT_CHECK(echoed == conn->epoch());
  if (!leave) {
    // Serve nothing, stay connected: the parent kills this process.
    for (;;) ::pause();
  }
  conn->leave();
  RPT_CHECK(!conn->connected());
  return 0;
}

// The server side of the tests: a listener, a few posted receives, events
// collected with their arrival times.
struct Server {
  rpt::Stack stack;
  std::vector<std::string> log;
  std::unique_ptr<regpool::Listener> listener;
  struct Seen {
    PeerEvent ev;
    Clock::time_point at;
  };
  std::vector<Seen> events;
  std::vector<Hello> hellos;
  std::vector<regpool::Ldo> rx;
  std::vector<regpool::Token> rx_tokens;

  // `receives`: Hello receives kept posted (0: the test posts its own).
  explicit Server(const std::string& backend, int receives = 8) : stack(backend) {
    listener = std::make_unique<regpool::Listener>(*stack.ep, listener_config(&log));
    for (int i = 0; i < receives; ++i) post_recv();
  }
  void post_recv() {
    rx.push_back(stack.alloc(sizeof(Hello)));
    auto t = stack.ep->post_recv(rpt::slice_or_die(regpool::Slice::data(rx.back())));
    REQUIRE(t.ok());
    rx_tokens.push_back(*t);
  }
  // One round: membership, then the endpoint; answers each Hello with its epoch.
  void step() {
    listener->poll(5ms);
    while (auto ev = listener->next_event()) events.push_back({std::move(*ev), Clock::now()});
    stack.ep->progress();
    for (std::size_t i = 0; i < rx_tokens.size(); ++i) {
      const auto c = stack.ep->wait(rx_tokens[i], 0ms);
      if (c.status == regpool::Status::in_progress) continue;
      REQUIRE(c.status == regpool::Status::ok);
      Hello h{};
      std::memcpy(&h, rx[i].data().data(), sizeof h);
      hellos.push_back(h);
      rx.erase(rx.begin() + static_cast<std::ptrdiff_t>(i));
      rx_tokens.erase(rx_tokens.begin() + static_cast<std::ptrdiff_t>(i));
      post_recv();
      // Only a current incarnation is answered.
      if (listener->current(h.id_at_server, h.epoch)) {
        regpool::Ldo answer = stack.alloc(8);
        std::memcpy(answer.data().data(), &h.epoch, 8);
        auto t = stack.ep->send(h.id_at_server, rpt::slice_or_die(regpool::Slice::data(answer)),
                                [](const regpool::Completion&) {});
        REQUIRE(t.ok());
      }
      break;
    }
  }
  const Seen* find(PeerEventKind kind, std::uint64_t client_id, std::uint64_t min_epoch = 0) const {
    for (const auto& s : events) {
      if (s.ev.kind == kind && s.ev.client_id == client_id && s.ev.epoch >= min_epoch) return &s;
    }
    return nullptr;
  }
  // Step until pred() or the bound.
  template <class Pred>
  bool run_until(Pred pred, std::chrono::milliseconds bound) {
    const auto end = Clock::now() + bound;
    while (!pred()) {
      if (Clock::now() >= end) return false;
      step();
    }
    return true;
  }
};

}  // namespace

TEST_CASE("clients join, talk, leave; a killed client dies within the bound and rejoins as a new epoch",
          "[membership]") {
  const std::string backend = GENERATE(from_range(rpt::backends()));
  ::alarm(120);
  INFO("backend " << backend);
  Server srv(backend);
  const std::uint16_t port = srv.listener->port();

  // B joins, talks, then stops without leaving.
  auto b = rpt::spawn([&] { return client_main(backend, port, 2, false); }, 60);
  REQUIRE(srv.run_until([&] { return srv.hellos.size() >= 1; }, 30s));
  const auto* bj = srv.find(PeerEventKind::joined, 2);
  REQUIRE(bj != nullptr);
  const regpool::PeerId b_peer = bj->ev.peer;
  const std::uint64_t b_epoch = bj->ev.epoch;
  CHECK(srv.listener->current(b_peer, b_epoch));
  CHECK(srv.hellos[0].epoch == b_epoch);
  // Let B read its answer (it then pauses).
  srv.run_until([] { return false; }, 300ms);

  // A joins while B is being killed: the server keeps serving A.
  auto a = rpt::spawn([&] { return client_main(backend, port, 1, true); }, 60);
  REQUIRE(::kill(b.pid, SIGKILL) == 0);
  const auto killed = Clock::now();
  REQUIRE(srv.run_until([&] { return srv.find(PeerEventKind::died, 2) != nullptr; }, 10s));
  const auto* bd = srv.find(PeerEventKind::died, 2);
  CHECK(bd->ev.peer == b_peer);
  CHECK(bd->ev.epoch == b_epoch);
  CHECK(bd->at - killed < 5s);  // the default liveness bound
  CHECK_FALSE(srv.listener->current(b_peer, b_epoch));
  CHECK(rpt::reap(b, 5s) == 128 + SIGKILL);

  REQUIRE(srv.run_until([&] { return srv.find(PeerEventKind::left, 1) != nullptr; }, 30s));
  CHECK(rpt::reap(a, 10s) == 0);
  const auto* aj = srv.find(PeerEventKind::joined, 1);
  REQUIRE(aj != nullptr);
  CHECK(aj->ev.epoch != b_epoch);
  CHECK(srv.find(PeerEventKind::left, 1)->ev.reason == "clean bye");

  // B restarts: the same client id joins again as a new incarnation.
  auto b2 = rpt::spawn([&] { return client_main(backend, port, 2, true); }, 60);
  REQUIRE(srv.run_until([&] { return srv.find(PeerEventKind::left, 2) != nullptr; }, 30s));
  CHECK(rpt::reap(b2, 10s) == 0);
  const auto* b2j = srv.find(PeerEventKind::joined, 2, b_epoch + 1);
  REQUIRE(b2j != nullptr);
  CHECK(b2j->ev.epoch > b_epoch);
  // A stale hello (the old incarnation's pair) is not current.
  CHECK_FALSE(srv.listener->current(b_peer, b_epoch));
  CHECK(srv.hellos.size() == 3);

  // Everyone is gone: after one more poll nothing is left in the endpoint.
  srv.step();
  CHECK(srv.listener->members() == 0);
  CHECK(srv.stack.ep->peer_count() == 0);
  ::alarm(0);
}

TEST_CASE("many clients join and leave at once", "[membership]") {
  const std::string backend = GENERATE(from_range(rpt::backends()));
  ::alarm(150);
  INFO("backend " << backend);
  Server srv(backend);
  const std::uint16_t port = srv.listener->port();
  constexpr int kClients = 6;
  std::vector<rpt::ChildGuard> kids;
  for (int i = 0; i < kClients; ++i) {
    kids.push_back(rpt::spawn([&, i] { return client_main(backend, port, 100 + static_cast<std::uint64_t>(i), true); }, 90));
  }
  REQUIRE(srv.run_until(
      [&] {
        for (int i = 0; i < kClients; ++i) {
          if (!srv.find(PeerEventKind::left, 100 + static_cast<std::uint64_t>(i))) return false;
        }
        return true;
      },
      90s));
  // Each child has left; what remains is its teardown. Under ASan with the
  // suite's other tests running, one of six (shm) once took over 10 s to
  // exit after leaving (CI, 2026-11-30; 1 of 11 loaded local runs, never
  // alone): 30 s, and each child's exit code is still required.
  for (auto& k : kids) CHECK(rpt::reap(k, 30s) == 0);
  CHECK(srv.hellos.size() == kClients);
  // Every incarnation got its own epoch.
  std::vector<std::uint64_t> epochs;
  for (const auto& e : srv.events) {
    if (e.ev.kind == PeerEventKind::joined) epochs.push_back(e.ev.epoch);
  }
  std::sort(epochs.begin(), epochs.end());
  CHECK(epochs.size() == kClients);
  CHECK(std::adjacent_find(epochs.begin(), epochs.end()) == epochs.end());
  srv.step();
  CHECK(srv.listener->members() == 0);
  CHECK(srv.stack.ep->peer_count() == 0);
  ::alarm(0);
}

TEST_CASE("operations in flight to a client that dies complete with peer_unreachable at once", "[membership]") {
  const std::string backend = GENERATE(from_range(rpt::backends()));
  // tcp;ofi_rxm, also when its progress sees the death (and closes the
  // connection) well before the listener reports it: the probe read that
  // proves the connection closed is then refused for now, not failed (this
  // order once happened under TSan on a loaded machine).
  const bool transport_first = GENERATE(false, true);
  if (transport_first && backend != "tcp;ofi_rxm") return;
  ::alarm(120);
  INFO("backend " << backend << (transport_first ? ", transport first" : ""));
  Server srv(backend, 0);
  const std::uint16_t port = srv.listener->port();
  // The child joins, sends one message (so both providers have set up the
  // connection; it carries a reference to 1 MiB the child exposes), then
  // never posts a receive nor progresses again. An operation to it stays
  // in flight until the child dies: a 1 MiB send where the receiver must
  // take it (shm: CMA; verbs), and on tcp;ofi_rxm, which refuses sends
  // above its 16 KiB eager limit (those complete once queued), a 1 MiB get
  // that the child's progress never serves.
  const bool by_get = rpt::is_rxm(backend);
  regpool::Ldo note = srv.stack.alloc(256);
  auto rt = srv.stack.ep->post_recv(rpt::slice_or_die(regpool::Slice::data(note)));
  REQUIRE(rt.ok());
  auto child = rpt::spawn(
      [&] {
        rpt::Stack s(backend);
        auto conn = regpool::connect(*s.ep, connect_config(port, 7));
        RPT_CHECK(conn->connected());
        regpool::Ldo exposed = s.alloc(std::uint64_t{1} << 20);
        auto e = s.ep->expose(rpt::slice_or_die(regpool::Slice::data(exposed)), regpool::RemoteAccess::read_only);
        RPT_CHECK(e.ok());
        const auto ref = rpt::encoded(*e);
        regpool::Ldo msg = s.alloc(ref.size());
        std::memcpy(msg.data().data(), ref.data(), ref.size());
        const auto sent =
            rpt::wait_ok(*s.ep, s.ep->send(conn->server(), rpt::slice_or_die(regpool::Slice::data(msg))), 10s);
        RPT_CHECK(sent.status == regpool::Status::ok);
        for (;;) ::pause();
      },
      60);
  regpool::Completion noted{};
  REQUIRE(srv.run_until(
      [&] {
        noted = srv.stack.ep->wait(*rt, 0ms);
        return noted.status != regpool::Status::in_progress;
      },
      30s));
  REQUIRE(noted.status == regpool::Status::ok);
  REQUIRE(srv.run_until([&] { return srv.find(PeerEventKind::joined, 7) != nullptr; }, 5s));
  const PeerEvent joined = srv.find(PeerEventKind::joined, 7)->ev;
  regpool::Ldo big = srv.stack.alloc(std::uint64_t{1} << 20);
  const regpool::RemoteRef child_ref = rpt::decode_or_die(note.data().first(static_cast<std::size_t>(noted.bytes)));
  // (The slice is a temporary: a Slice holds a reference to its object.)
  auto op = by_get ? srv.stack.ep->get(joined.peer, child_ref, 0, rpt::slice_or_die(regpool::Slice::data(big)))
                   : srv.stack.ep->send(joined.peer, rpt::slice_or_die(regpool::Slice::data(big)));
  REQUIRE(op.ok());
  srv.stack.ep->progress_for(300ms);
  // net completes the send once queued on the socket: nothing left in
  // flight for the death to complete (the death is still checked below).
  const bool held = by_get || rpt::large_sends_wait_for_receiver(backend);
  if (held) REQUIRE(srv.stack.ep->wait(*op, 0ms).status == regpool::Status::in_progress);

  REQUIRE(::kill(child.pid, SIGKILL) == 0);
  const auto killed = Clock::now();
  if (transport_first) srv.stack.ep->progress_for(500ms);
  REQUIRE(srv.run_until([&] { return srv.find(PeerEventKind::died, 7) != nullptr; }, 10s));
  // Completed by the death, not by op_timeout (30 s).
  const auto c = srv.stack.ep->wait(*op, 1s);
  if (held) CHECK(c.status == regpool::Status::peer_unreachable);
  CHECK(Clock::now() - killed < 5s);
  // New posts to the dead peer are refused the same way until the next
  // poll removes it.
  auto again = srv.stack.ep->send(joined.peer, rpt::slice_or_die(regpool::Slice::data(big)));
  CHECK(again.status() == regpool::Status::peer_unreachable);
  CHECK(rpt::reap(child, 5s) == 128 + SIGKILL);
  srv.step();
  CHECK(srv.stack.ep->peer_count() == 0);
  // Neither shm nor tcp;ofi_rxm ever gives back a send to a dead peer
  // (measured); the backend proves the provider is done with it
  // (shm: the peer's process has finished; tcp: its connection is closed)
  // and the slot's reference to `big` goes without closing the endpoint.
  // (tcp: a probe read, sent at a liveness scan, fails once rxm has closed
  // the connection: under ASan on a loaded CI machine that once took over 5 s.)
  const bool released = srv.run_until([&] { return big.use_count() == 1; }, 15s);
  CHECK(released);
  // verbs: flushed back by the QP; net: the send had completed already;
  // tcp;ofi_rxm's get: the provider fails it itself when it closes the
  // connection (measured), so the backend has nothing to give back.
  if (backend != "verbs" && held && !by_get) CHECK(srv.stack.ep->stats().abandoned >= 1);
  CHECK(srv.stack.ep->usable());
  srv.listener.reset();
  srv.stack.ep.reset();
  CHECK(big.use_count() == 1);
  ::alarm(0);
}

namespace {

// A listener served by its own thread (connect() blocks in this one).
struct ThreadedServer {
  rpt::Stack stack;
  std::mutex mu;
  std::vector<std::string> log;
  std::vector<PeerEvent> events;
  std::unique_ptr<regpool::Listener> listener;
  std::atomic<bool> stop{false};
  std::thread thread;

  ThreadedServer(const std::string& backend, regpool::ListenerConfig cfg) : stack(backend) {
    cfg.log = [this](const std::string& l) {
      std::lock_guard<std::mutex> g(mu);
      log.push_back(l);
    };
    cfg.on_event = [this](const PeerEvent& e) {
      std::lock_guard<std::mutex> g(mu);
      events.push_back(e);
    };
    listener = std::make_unique<regpool::Listener>(*stack.ep, cfg);
    thread = std::thread([this] {
      while (!stop.load()) {
        listener->poll(5ms);
        stack.ep->progress();
      }
    });
  }
  ~ThreadedServer() {
    stop.store(true);
    thread.join();
  }
  bool logged(const std::string& what) {
    std::lock_guard<std::mutex> g(mu);
    for (const auto& l : log) {
      if (l.find(what) != std::string::npos) return true;
    }
    return false;
  }
  std::size_t joined() {
    std::lock_guard<std::mutex> g(mu);
    return static_cast<std::size_t>(
        std::count_if(events.begin(), events.end(), [](const PeerEvent& e) { return e.kind == PeerEventKind::joined; }));
  }
};

int raw_connect(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds bound) {
  const auto end = Clock::now() + bound;
  while (!pred()) {
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

}  // namespace

TEST_CASE("a silent or garbage connection does not delay a real client", "[membership]") {
  const std::string backend = GENERATE(from_range(rpt::backends()));
  ::alarm(60);
  INFO("backend " << backend);
  auto cfg = listener_config();
  cfg.handshake_timeout = 3s;
  ThreadedServer srv(backend, cfg);
  const int silent = raw_connect(srv.listener->port());
  const int garbage = raw_connect(srv.listener->port());
  const char http[] = "GET / HTTP/1.0\r\n\r\n";
  REQUIRE(::send(garbage, http, sizeof http - 1, MSG_NOSIGNAL) > 0);

  rpt::Stack client(backend);
  const auto t0 = Clock::now();
  auto conn = regpool::connect(*client.ep, connect_config(srv.listener->port(), 11));
  const auto took = Clock::now() - t0;
  CHECK(took < 2s);  // well below the silent connection's 3 s handshake bound
  CHECK(conn->connected());
  CHECK(eventually([&] { return srv.joined() == 1; }, 5s));
  CHECK(eventually([&] { return srv.logged("not a regpool membership join"); }, 5s));
  CHECK(eventually([&] { return srv.logged("no complete join within 3000 ms"); }, 6s));
  conn->leave();
  ::close(silent);
  ::close(garbage);
  ::alarm(0);
}

TEST_CASE("a join with the wrong job key is refused; a keyed client refuses a keyless server", "[membership]") {
  const std::string backend = GENERATE(from_range(rpt::backends()));
  ::alarm(60);
  INFO("backend " << backend);
  rpt::Stack client(backend);
  {
    ThreadedServer srv(backend, listener_config());
    try {
      (void)regpool::connect(*client.ep, connect_config(srv.listener->port(), 21, "not-the-key"));
      FAIL("a forged join was admitted");
    } catch (const regpool::Error& e) {
      CHECK(e.status() == regpool::Status::access_denied);
      CHECK(std::string(e.what()).find("job key does not match") != std::string::npos);
    }
    try {
      (void)regpool::connect(*client.ep, connect_config(srv.listener->port(), 22, ""));
      FAIL("a join without the key was admitted");
    } catch (const regpool::Error& e) {
      CHECK(e.status() == regpool::Status::access_denied);
    }
    CHECK(eventually([&] { return srv.logged("wrong proof of the job key"); }, 5s));
    CHECK(srv.joined() == 0);
    CHECK(srv.stack.ep->peer_count() == 0);
    CHECK(client.ep->peer_count() == 0);
  }
  {
    auto cfg = listener_config();
    cfg.key.clear();
    ThreadedServer srv(backend, cfg);
    try {
      (void)regpool::connect(*client.ep, connect_config(srv.listener->port(), 23));
      FAIL("a keyed client joined a keyless server");
    } catch (const regpool::Error& e) {
      CHECK(e.status() == regpool::Status::access_denied);
      CHECK(std::string(e.what()).find("does not require a job key") != std::string::npos);
    }
    CHECK(srv.joined() == 0);
  }
  ::alarm(0);
}

TEST_CASE("the server leaving is an event at the client", "[membership]") {
  const std::string backend = GENERATE(from_range(rpt::backends()));
  ::alarm(60);
  INFO("backend " << backend);
  rpt::Stack client(backend);
  auto srv = std::make_unique<ThreadedServer>(backend, listener_config());
  auto conn = regpool::connect(*client.ep, connect_config(srv->listener->port(), 31));
  const regpool::PeerId server = conn->server();
  CHECK(client.ep->usable(server));
  REQUIRE(eventually([&] { return srv->joined() == 1; }, 5s));
  srv.reset();  // its destructor says bye
  std::optional<PeerEvent> ev;
  const auto end = Clock::now() + 5s;
  while (!ev && Clock::now() < end) {
    conn->poll(50ms);
    ev = conn->next_event();
  }
  REQUIRE(ev.has_value());
  CHECK(ev->kind == PeerEventKind::left);
  CHECK(ev->peer == server);
  CHECK_FALSE(conn->connected());
  CHECK_FALSE(client.ep->usable(server));
  conn->poll();
  CHECK(client.ep->peer_count() == 0);
  ::alarm(0);
}

TEST_CASE("a killed server is reported died at the client within the bound", "[membership]") {
  const std::string backend = GENERATE(from_range(rpt::backends()));
  ::alarm(60);
  INFO("backend " << backend);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  auto server = rpt::spawn(
      [&] {
        ::close(fds[0]);
        rpt::Stack s(backend);
        regpool::Listener l(*s.ep, listener_config());
        const std::uint16_t port = l.port();
        RPT_CHECK(::write(fds[1], &port, sizeof port) == static_cast<ssize_t>(sizeof port));
        for (;;) {
          l.poll(5ms);
          s.ep->progress();
        }
        return 0;
      },
      50);
  ::close(fds[1]);
  std::uint16_t port = 0;
  pollfd p{fds[0], POLLIN, 0};
  REQUIRE(::poll(&p, 1, 30000) == 1);
  REQUIRE(::read(fds[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port));
  ::close(fds[0]);

  rpt::Stack client(backend);
  auto conn = regpool::connect(*client.ep, connect_config(port, 41));
  const regpool::PeerId srv = conn->server();
  REQUIRE(::kill(server.pid, SIGKILL) == 0);
  const auto killed = Clock::now();
  std::optional<PeerEvent> ev;
  while (!ev && Clock::now() - killed < 10s) {
    conn->poll(20ms);
    ev = conn->next_event();
  }
  REQUIRE(ev.has_value());
  CHECK(ev->kind == PeerEventKind::died);
  CHECK(ev->peer == srv);
  CHECK(ev->epoch == conn->epoch());
  CHECK(Clock::now() - killed < 5s);
  CHECK_FALSE(conn->connected());
  regpool::Ldo msg = client.alloc(8);
  CHECK(client.ep->send(srv, rpt::slice_or_die(regpool::Slice::data(msg))).status() ==
        regpool::Status::peer_unreachable);
  CHECK(rpt::reap(server, 5s) == 128 + SIGKILL);
  conn->poll();
  CHECK(client.ep->peer_count() == 0);
  ::alarm(0);
}
