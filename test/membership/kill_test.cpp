// A server that clients join, leave, crash and rejoin while it serves
// others (suite fabric on shm and tcp; built again for verbs and run in the
// Soft-RoCE guest). What membership-listener does not cover:
//  - a client killed (SIGKILL) in the middle of a put, a get, a stream of
//    sends, or while it merely holds an exposure the server attached to
//    it: the server gets `died` within the liveness bound, keeps serving
//    another client the whole time, a restarted client rejoins as a new
//    epoch, and once everyone is gone the server's telemetry is back where
//    it started: pool live objects and bytes, live and quarantined
//    exposures, operations in flight;
//  - the server killed while three clients put, get and send to it: every
//    client learns it within the bound, with an event naming the server's
//    address, and its operations to the server answer peer_unreachable.
//
// Every child runs under alarm() and every wait of the parent is bounded.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>

#include "regpool/membership.hpp"
#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::PeerEvent;
using regpool::PeerEventKind;
using regpool::Slice;
using regpool::Status;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kKey = "membership-kill-test-key-0123456789";
// Death of a killed process must be seen within this (the default liveness
// bound; a killed process's kernel closes its connection at once).
constexpr auto kBound = 5s;
constexpr std::uint64_t kTarget = std::uint64_t{1} << 20;  // per-client exposed object
constexpr std::uint64_t kChunk = std::uint64_t{256} << 10;  // one put/get/send of a victim
constexpr std::uint64_t kSlot = kChunk;                      // server receive slots
constexpr int kSlots = 8;
constexpr std::uint64_t kReply = 128;

// Requests a client sends the server (the first 24 bytes of a message).
enum Kind : std::uint32_t { kHello = 1, kPing = 2, kData = 3 };
struct Request {
  std::uint32_t kind;
  std::uint32_t id_at_server;
  std::uint64_t epoch;
  std::uint64_t seq;
};

regpool::EndpointConfig endpoint_config(std::size_t max_in_flight = 64) {
  regpool::EndpointConfig ec;
  ec.op_timeout = 10s;
  // The default post_timeout (10 s) stays: on shm a client killed inside a
  // put or get to the server leaves the server's region lock held, other
  // clients' posts to the server answer would_block (retried) until the
  // server releases it (FabricEndpointOptions::stuck_lock_patience, 2 s).
  ec.max_in_flight = max_in_flight;
  // Short, so the telemetry check need not wait a second for every revoked
  // exposure's bytes to come back.
  ec.revoke_quarantine = 100ms;
  return ec;
}

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

// The server: a listener, a ring of receive slots, one exposed 1 MiB object
// per member (attached to its membership), answers to hellos (the object's
// reference) and pings (the sequence number). Single-threaded: step() is
// the whole loop. No Catch2 here: it also runs in a forked child.
struct KillServer {
  rpt::Stack stack;
  std::unique_ptr<regpool::Listener> listener;
  std::vector<std::string> log;
  struct Seen {
    PeerEvent ev;
    Clock::time_point at;
  };
  std::vector<Seen> events;
  struct Member {
    std::uint64_t epoch = 0;
    std::array<std::byte, regpool::RemoteRef::kEncodedSize> ref{};
  };
  std::map<regpool::PeerId, Member> members;
  std::vector<regpool::Ldo> rx;
  std::deque<std::pair<int, regpool::Completion>> arrived;
  std::map<std::uint64_t, std::uint64_t> pings;  // client id -> pings answered
  // Replies posted and not completed yet: each holds a slot and its object
  // (callbacks run in this thread's progress, so no atomics).
  std::uint64_t replies_in_flight = 0;
  std::uint64_t failures = 0;                     // unexpected local failures
  std::string first_failure;

  explicit KillServer(const std::string& backend, std::size_t max_in_flight = 64)
      : stack(backend, endpoint_config(max_in_flight), std::size_t{32} << 20) {
    regpool::ListenerConfig c;
    c.key = kKey;
    c.key_from_environment = false;
    c.log = [this](const std::string& l) { log.push_back(l); };
    listener = std::make_unique<regpool::Listener>(*stack.ep, c);
    for (int i = 0; i < kSlots; ++i) {
      rx.push_back(stack.alloc(kSlot));
      post(i);
    }
  }
  // The endpoint closes (and cancels the posted receives, whose callbacks
  // touch `arrived`) before the members below are destroyed.
  ~KillServer() {
    listener.reset();
    stack.ep.reset();
  }
  void fail(const std::string& what) {
    if (failures++ == 0) first_failure = what;
  }
  void post(int i) {
    auto t = stack.ep->post_recv(rpt::slice_or_die(Slice::data(rx[static_cast<std::size_t>(i)])),
                                 [this, i](const regpool::Completion& c) { arrived.emplace_back(i, c); });
    if (!t) fail(std::string("post_recv: ") + regpool::to_string(t.status()));
  }
  std::uint64_t client_of(regpool::PeerId p) const {
    for (auto it = events.rbegin(); it != events.rend(); ++it) {
      if (it->ev.kind == PeerEventKind::joined && it->ev.peer == p) return it->ev.client_id;
    }
    return 0;
  }
  void reply(regpool::PeerId to, const void* bytes, std::size_t n) {
    auto r = stack.pool->allocate(kReply);
    if (!r) return fail("allocate reply");
    std::memcpy(r->data().data(), bytes, n);
    auto t = stack.ep->send(to, rpt::slice_or_die(Slice::data(*r)),
                            [this](const regpool::Completion&) { --replies_in_flight; });
    if (t) ++replies_in_flight;
    // A member that died a moment ago is refused: not a server failure.
    if (!t && t.status() != Status::peer_unreachable) fail(std::string("send reply: ") + regpool::to_string(t.status()));
  }
  void joined(const PeerEvent& ev) {
    auto obj = stack.pool->allocate(kTarget);
    if (!obj) return fail("allocate target");
    auto e = stack.ep->expose(rpt::slice_or_die(Slice::data(*obj)), regpool::RemoteAccess::read_write);
    if (!e) return fail(std::string("expose: ") + regpool::to_string(e.status()));
    members[ev.peer] = Member{ev.epoch, e->encode()};
    // The exposure (and with it the object) lives as long as the membership.
    const Status st = listener->attach(ev.peer, std::move(*e));
    if (st != Status::ok) fail(std::string("attach: ") + regpool::to_string(st));
  }
  void step(std::chrono::milliseconds wait = 2ms) {
    listener->poll(wait);
    while (auto ev = listener->next_event()) {
      if (ev->kind == PeerEventKind::joined) {
        joined(*ev);
      } else {
        members.erase(ev->peer);
      }
      events.push_back({std::move(*ev), Clock::now()});
    }
    stack.ep->progress();
    while (!arrived.empty()) {
      const auto [i, c] = arrived.front();
      arrived.pop_front();
      if (c.status == Status::ok && c.bytes >= sizeof(Request)) {
        Request q{};
        std::memcpy(&q, rx[static_cast<std::size_t>(i)].data().data(), sizeof q);
        // Only the provider's word on the sender counts, and only for a
        // current incarnation.
        const auto m = members.find(c.peer);
        const bool current = m != members.end() && q.id_at_server == c.peer && q.epoch == m->second.epoch &&
                             listener->current(c.peer, q.epoch);
        if (current && q.kind == kHello) reply(c.peer, m->second.ref.data(), m->second.ref.size());
        if (current && q.kind == kPing) {
          reply(c.peer, &q.seq, sizeof q.seq);
          ++pings[client_of(c.peer)];
        }
      }
      post(i);
    }
  }
  const Seen* find(PeerEventKind kind, std::uint64_t client_id, std::uint64_t min_epoch = 0) const {
    for (const auto& s : events) {
      if (s.ev.kind == kind && s.ev.client_id == client_id && s.ev.epoch >= min_epoch) return &s;
    }
    return nullptr;
  }
  template <class Pred>
  bool run_until(Pred pred, std::chrono::milliseconds bound) {
    const auto end = Clock::now() + bound;
    while (!pred()) {
      if (Clock::now() >= end) return false;
      step();
    }
    return true;
  }
  int port() const { return listener->port(); }
};

// What must come back to where it was once every client is gone.
struct Telemetry {
  std::uint64_t live_objects, bytes_in_use, exposures_live, quarantined, in_flight;
  static Telemetry of(KillServer& s) {
    const auto p = s.stack.pool->stats();
    const auto e = s.stack.ep->exposure_stats();
    return {p.live_objects, p.bytes_in_use, e.live, e.quarantined, s.stack.ep->stats().in_flight};
  }
  bool operator==(const Telemetry&) const = default;
};
std::ostream& operator<<(std::ostream& o, const Telemetry& t) {
  return o << "{live objects " << t.live_objects << ", bytes in use " << t.bytes_in_use << ", live exposures "
           << t.exposures_live << ", quarantined " << t.quarantined << ", in flight " << t.in_flight << "}";
}

regpool::ConnectConfig connect_config(int port, std::uint64_t client_id) {
  regpool::ConnectConfig c;
  c.port = static_cast<std::uint16_t>(port);
  c.client_id = client_id;
  c.key = kKey;
  c.key_from_environment = false;
  c.timeout = 30s;
  return c;
}

// A client's side: its connection, and the server's object.
struct Client {
  rpt::Stack s;
  std::unique_ptr<regpool::Connection> conn;
  regpool::RemoteRef ref;
  regpool::Ldo buf, msg, reply;
  std::uint64_t seq = 0;

  Client(const std::string& backend, int port, std::uint64_t id)
      : s(backend, endpoint_config(), std::size_t{16} << 20) {
    conn = regpool::connect(*s.ep, connect_config(port, id));
    buf = s.alloc(kChunk);
    msg = s.alloc(kChunk);
    reply = s.alloc(kReply);
  }
  Request request(Kind k) { return Request{k, conn->id_at_server(), conn->epoch(), ++seq}; }
  // Sends `q` and waits for the answer (bounded); false on failure.
  bool ask(const Request& q, std::chrono::milliseconds bound = 20s) {
    auto rt = s.ep->post_recv(rpt::slice_or_die(Slice::data(reply)));
    if (!rt) return false;
    std::memcpy(msg.data().data(), &q, sizeof q);
    const auto sent = rpt::wait_ok(*s.ep, s.ep->send(conn->server(), rpt::slice_or_die(rpt::slice_or_die(Slice::data(msg)).select(0, sizeof q))), bound);
    if (sent.status != Status::ok) return false;
    return s.ep->wait(*rt, bound).status == Status::ok;
  }
  bool hello() {
    if (!ask(request(kHello))) return false;
    auto r = regpool::RemoteRef::decode({reply.data().data(), regpool::RemoteRef::kEncodedSize});
    if (!r) return false;
    ref = *r;
    return true;
  }
};

enum class Victim { put, get, send, exposure };
const char* name_of(Victim v) {
  switch (v) {
    case Victim::put: return "put";
    case Victim::get: return "get";
    case Victim::send: return "send";
    case Victim::exposure: return "exposure";
  }
  return "?";
}

// The steady client: rounds of put + get (checked) + ping until the parent
// closes `stop_fd`'s other end, then a clean leave.
int steady_main(const std::string& backend, int port, int stop_fd) {
  Client c(backend, port, 1);
  RPT_CHECK(c.hello());
  regpool::Ldo back = c.s.alloc(kChunk);
  const Slice out = rpt::slice_or_die(rpt::slice_or_die(Slice::data(c.buf)).select(0, 64 << 10));
  const Slice in = rpt::slice_or_die(rpt::slice_or_die(Slice::data(back)).select(0, 64 << 10));
  for (std::uint64_t round = 1;; ++round) {
    rpt::fill(c.buf.data().subspan(0, 64 << 10), round);
    RPT_CHECK(rpt::wait_ok(*c.s.ep, c.s.ep->put(out, c.conn->server(), c.ref, 0), 20s).status == Status::ok);
    RPT_CHECK(rpt::wait_ok(*c.s.ep, c.s.ep->get(c.conn->server(), c.ref, 0, in), 20s).status == Status::ok);
    RPT_CHECK(std::memcmp(c.buf.data().data(), back.data().data(), 64 << 10) == 0);
    RPT_CHECK(c.ask(c.request(kPing)));
    std::uint64_t echoed = 0;
    std::memcpy(&echoed, c.reply.data().data(), sizeof echoed);
    RPT_CHECK(echoed == c.seq);
    c.conn->poll();
    RPT_CHECK(c.conn->connected());
    pollfd p{stop_fd, POLLIN, 0};
    if (::poll(&p, 1, 0) == 1) break;
  }
  c.conn->leave();
  return 0;
}

// The victim: joins, fetches its object's reference, says "ready" on
// `ready_fd` after a few operations and keeps going until it is killed.
// `rounds` > 0: a restarted victim that does that many rounds and leaves.
int victim_main(const std::string& backend, int port, Victim what, int ready_fd, int rounds) {
  Client c(backend, port, 2);
  RPT_CHECK(c.hello());
  const Slice chunk = rpt::slice_or_die(Slice::data(c.buf));
  // As long as the server accepts (tcp;ofi_rxm: its 16 KiB eager limit).
  const Slice data = rpt::slice_or_die(Slice::data(c.msg, 0, rpt::accepted_send_size(backend, kChunk)));
  const Request d = c.request(kData);
  std::memcpy(c.msg.data().data(), &d, sizeof d);
  auto once = [&](std::uint64_t i) -> Status {
    const std::uint64_t off = (i % (kTarget / kChunk)) * kChunk;
    switch (what) {
      case Victim::put: return rpt::wait_ok(*c.s.ep, c.s.ep->put(chunk, c.conn->server(), c.ref, off), 20s).status;
      case Victim::get: return rpt::wait_ok(*c.s.ep, c.s.ep->get(c.conn->server(), c.ref, off, chunk), 20s).status;
      case Victim::send: return rpt::wait_ok(*c.s.ep, c.s.ep->send(c.conn->server(), data), 20s).status;
      case Victim::exposure: return Status::ok;
    }
    return Status::invalid_argument;
  };
  for (std::uint64_t i = 0; i < 4; ++i) RPT_CHECK(once(i) == Status::ok);
  if (rounds > 0) {
    for (int i = 0; i < rounds; ++i) RPT_CHECK(once(static_cast<std::uint64_t>(i)) == Status::ok);
    c.conn->leave();
    return 0;
  }
  const char one = 1;
  RPT_CHECK(::write(ready_fd, &one, 1) == 1);
  if (what == Victim::exposure) {
    for (;;) ::pause();
  }
  // The server's send receives are shared by every client and a 256 KiB
  // message occupies a slot: keep several in flight so the kill lands in one.
  for (std::uint64_t i = 4;; ++i) {
    const Status st = once(i);
    RPT_CHECK(st == Status::ok);
  }
}

// A client that joins, says "ready" and then only progresses, never posting
// a receive: the server's large sends to it stay in the provider's
// rendezvous (tcp;ofi_rxm: the RTS arrives, no ACK ever comes; shm: the
// command waits in its queue for a cross-memory read that never happens)
// until it is killed.
int sink_main(const std::string& backend, int port, int ready_fd) {
  Client c(backend, port, 3);
  RPT_CHECK(c.hello());
  const char one = 1;
  RPT_CHECK(::write(ready_fd, &one, 1) == 1);
  for (;;) {
    c.s.ep->progress();
    c.conn->poll(1ms);
  }
}

bool readable(int fd, std::chrono::milliseconds bound) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(bound.count())) == 1;
}

// Serves until a child says through `fd` that it is ready.
bool serve_until_ready(KillServer& srv, int fd, std::chrono::milliseconds bound) {
  bool is_ready = false;
  return srv.run_until(
      [&] {
        if (!is_ready) is_ready = readable(fd, 0ms);
        return is_ready;
      },
      bound);
}

}  // namespace

TEST_CASE("a client killed mid-put, mid-get, mid-send or holding an exposure: died within the bound, the others "
          "served, telemetry back to baseline",
          "[membership]") {
  const std::string backend = GENERATE(from_range(rpt::backends()));
  const Victim what = GENERATE(Victim::put, Victim::get, Victim::send, Victim::exposure);
  ::alarm(240);
  INFO("backend " << backend << ", victim killed during " << name_of(what));
  KillServer srv(backend);
  const int port = srv.port();
  srv.step();
  const Telemetry baseline = Telemetry::of(srv);
  INFO("baseline " << baseline);

  int stop[2], ready[2];
  REQUIRE(::pipe(stop) == 0);
  REQUIRE(::pipe(ready) == 0);
  auto steady = rpt::spawn([&] { return steady_main(backend, port, stop[0]); }, 200);
  REQUIRE(srv.run_until([&] { return srv.pings[1] >= 3; }, 60s));

  auto victim = rpt::spawn([&] { return victim_main(backend, port, what, ready[1], 0); }, 200);
  REQUIRE(serve_until_ready(srv, ready[0], 60s));
  const auto* vj = srv.find(PeerEventKind::joined, 2);
  REQUIRE(vj != nullptr);
  const PeerEvent victim_joined = vj->ev;
  // With the victim's object exposed: two live exposures, two objects more.
  CHECK(srv.stack.ep->exposure_stats().live == baseline.exposures_live + 2);

  // Let the victim's operations run a little, then kill it in the middle.
  std::mt19937 rng(std::random_device{}());
  const auto until = Clock::now() + std::chrono::milliseconds(std::uniform_int_distribution<int>(20, 120)(rng));
  srv.run_until([&] { return Clock::now() >= until; }, 1s);
  const std::uint64_t pings_at_kill = srv.pings[1];
  REQUIRE(::kill(victim.pid, SIGKILL) == 0);
  const auto killed = Clock::now();
  REQUIRE(srv.run_until([&] { return srv.find(PeerEventKind::died, 2) != nullptr; }, 2 * kBound));
  const auto* vd = srv.find(PeerEventKind::died, 2);
  const auto noticed = vd->at - killed;
  INFO("died after " << std::chrono::duration_cast<std::chrono::milliseconds>(noticed).count() << " ms: "
                     << vd->ev.reason);
  CHECK(noticed < kBound);
  CHECK(vd->ev.peer == victim_joined.peer);
  CHECK(vd->ev.epoch == victim_joined.epoch);
  CHECK_FALSE(srv.listener->current(victim_joined.peer, victim_joined.epoch));
  CHECK(rpt::reap(victim, 5s) == 128 + SIGKILL);
  // The victim's exposure went with its membership.
  CHECK(srv.stack.ep->exposure_stats().live == baseline.exposures_live + 1);

  // The steady client was served meanwhile and still is.
  const bool served = srv.run_until([&] { return srv.pings[1] >= pings_at_kill + 5; }, 30s);
  INFO("steady client: " << srv.pings[1] << " pings answered, " << pings_at_kill << " at the kill");
  REQUIRE(served);

  // The victim restarts: the same client id, a new incarnation, served
  // while the steady client goes on; it leaves cleanly.
  auto again = rpt::spawn([&] { return victim_main(backend, port, what, -1, 8); }, 120);
  REQUIRE(srv.run_until([&] { return srv.find(PeerEventKind::left, 2, victim_joined.epoch + 1) != nullptr; }, 60s));
  CHECK(rpt::reap(again, 10s) == 0);
  CHECK(srv.find(PeerEventKind::joined, 2, victim_joined.epoch + 1)->ev.epoch > victim_joined.epoch);

  // The steady client stops and leaves (a byte, not a close: every child
  // holds a copy of the write end).
  const char one = 1;
  REQUIRE(::write(stop[1], &one, 1) == 1);
  REQUIRE(srv.run_until([&] { return srv.find(PeerEventKind::left, 1) != nullptr; }, 30s));
  CHECK(rpt::reap(steady, 10s) == 0);
  for (int fd : {stop[0], stop[1], ready[0], ready[1]}) ::close(fd);

  // Nobody is left: after the quarantine of the revoked exposures (100 ms)
  // and the answers' completions, the telemetry is the baseline's.
  const bool back = srv.run_until([&] { return Telemetry::of(srv) == baseline; }, 10s);
  INFO("now " << Telemetry::of(srv));
  CHECK(back);
  CHECK(srv.listener->members() == 0);
  CHECK(srv.stack.ep->peer_count() == 0);
  CHECK(srv.stack.ep->usable());
  INFO("first server failure: " << srv.first_failure);
  CHECK(srv.failures == 0);
  ::alarm(0);
}

namespace {

// A client of the killed-server test: joins, then puts, gets or sends in a
// loop, polling its connection between waits. When the server dies it
// writes what it saw to `report_fd` and checks that operations to the
// server now answer peer_unreachable.
struct Report {
  std::int32_t code = 0;          // 0 = consistent
  std::uint32_t event_kind = 99;  // PeerEventKind of the event at the client
  std::uint64_t event_ns = 0;     // steady_clock when the event arrived
  std::uint64_t op_ns = 0;        // when an operation first failed (0: none did)
  std::uint32_t op_status = 0;
  char address[64] = {};
  char reason[128] = {};
};

int doomed_client_main(const std::string& backend, int port, std::uint64_t id, Victim what, int ready_fd,
                       int report_fd) {
  Client c(backend, port, id);
  RPT_CHECK(c.hello());
  const Slice chunk = rpt::slice_or_die(Slice::data(c.buf));
  Report rep;
  bool said_ready = false;
  std::uint64_t i = 0;
  std::optional<PeerEvent> ev;
  while (!ev) {
    const std::uint64_t off = (i++ % (kTarget / kChunk)) * kChunk;
    regpool::Result<regpool::Token> t = Status::invalid_argument;
    if (what == Victim::put) t = c.s.ep->put(chunk, c.conn->server(), c.ref, off);
    if (what == Victim::get) t = c.s.ep->get(c.conn->server(), c.ref, off, chunk);
    if (what == Victim::send) {
      const Request q = c.request(kData);
      std::memcpy(c.buf.data().data(), &q, sizeof q);
      // As long as the server accepts (tcp;ofi_rxm: 16 KiB).
      t = c.s.ep->send(c.conn->server(),
                       rpt::slice_or_die(Slice::data(c.buf, 0, rpt::accepted_send_size(backend, kChunk))));
    }
    Status st = t.status();
    if (t) {
      // Wait in slices, watching the membership connection meanwhile.
      for (;;) {
        const auto comp = c.s.ep->wait(*t, 10ms);
        if (comp.status != Status::in_progress) {
          st = comp.status;
          break;
        }
        if (c.conn->poll() > 0) ev = c.conn->next_event();
      }
    }
    if (st != Status::ok && rep.op_ns == 0) {
      rep.op_ns = now_ns();
      rep.op_status = static_cast<std::uint32_t>(st);
    }
    if (!ev && st != Status::ok) {
      // The operation saw it first; the event follows within the bound.
      const auto end = Clock::now() + kBound;
      while (!ev && Clock::now() < end) {
        if (c.conn->poll(10ms) > 0) ev = c.conn->next_event();
      }
      RPT_CHECK(ev.has_value());
    }
    if (!ev && c.conn->poll() > 0) ev = c.conn->next_event();
    if (!said_ready && i >= 4) {
      const char one = 1;
      RPT_CHECK(::write(ready_fd, &one, 1) == 1);
      said_ready = true;
    }
  }
  rep.event_ns = now_ns();
  rep.event_kind = static_cast<std::uint32_t>(ev->kind);
  std::snprintf(rep.address, sizeof rep.address, "%s", ev->address.c_str());
  std::snprintf(rep.reason, sizeof rep.reason, "%s", ev->reason.c_str());
  RPT_CHECK(!c.conn->connected());
  RPT_CHECK(ev->peer == c.conn->server());
  RPT_CHECK(ev->epoch == c.conn->epoch());
  // Until the next poll the server is still in the endpoint, refused.
  RPT_CHECK(c.s.ep->put(chunk, c.conn->server(), c.ref, 0).status() == Status::peer_unreachable);
  c.conn->poll();
  RPT_CHECK(c.s.ep->peer_count() == 0);
  RPT_CHECK(::write(report_fd, &rep, sizeof rep) == static_cast<ssize_t>(sizeof rep));
  return 0;
}

}  // namespace

TEST_CASE("a killed server: every client fails within the bound, told which server died", "[membership]") {
  const std::string backend = GENERATE(from_range(rpt::backends()));
  ::alarm(180);
  INFO("backend " << backend);
  int port_pipe[2], ready[2], report[2];
  REQUIRE(::pipe(port_pipe) == 0);
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(report) == 0);
  auto server = rpt::spawn(
      [&] {
        KillServer s(backend);
        const std::uint16_t p = static_cast<std::uint16_t>(s.port());
        RPT_CHECK(::write(port_pipe[1], &p, sizeof p) == static_cast<ssize_t>(sizeof p));
        for (;;) s.step();
        return 0;
      },
      170);
  std::uint16_t port = 0;
  REQUIRE(readable(port_pipe[0], 60s));
  REQUIRE(::read(port_pipe[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port));

  const std::vector<Victim> kinds = {Victim::put, Victim::get, Victim::send};
  std::vector<rpt::ChildGuard> clients;
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    clients.push_back(rpt::spawn(
        [&, k] { return doomed_client_main(backend, port, 10 + k, kinds[k], ready[1], report[1]); }, 170));
  }
  // Every client is in the middle of its operations.
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    REQUIRE(readable(ready[0], 90s));
    char one = 0;
    REQUIRE(::read(ready[0], &one, 1) == 1);
  }
  std::this_thread::sleep_for(50ms);
  // The time is read before the signal, not after: the clients run on their
  // own, and on a busy machine this process can lose its core between
  // kill() and a clock read while a client notices the death (CI saw a
  // client's event 1.7 ms before a killed_ns read after kill()).
  const std::uint64_t killed_ns = now_ns();
  REQUIRE(::kill(server.pid, SIGKILL) == 0);
  CHECK(rpt::reap(server, 5s) == 128 + SIGKILL);

  const std::string address = "127.0.0.1:" + std::to_string(port);
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    REQUIRE(readable(report[0], 2 * kBound));
    Report r;
    REQUIRE(::read(report[0], &r, sizeof r) == static_cast<ssize_t>(sizeof r));
    const double event_ms = static_cast<double>(r.event_ns - killed_ns) / 1e6;
    INFO("client report: event after " << event_ms << " ms at " << r.address << ": " << r.reason
                                       << "; first failed op: "
                                       << (r.op_ns ? regpool::to_string(static_cast<Status>(r.op_status)) : "none"));
    CHECK(r.event_kind == static_cast<std::uint32_t>(PeerEventKind::died));
    CHECK(std::string(r.address) == address);
    CHECK(std::string(r.reason).size() > 0);
    CHECK(r.event_ns > killed_ns);
    CHECK(std::chrono::nanoseconds(r.event_ns - killed_ns) < kBound);
    if (r.op_ns) CHECK(std::chrono::nanoseconds(r.op_ns - killed_ns) < kBound);
  }
  for (auto& c : clients) CHECK(rpt::reap(c, 10s) == 0);
  for (int fd : {port_pipe[0], port_pipe[1], ready[0], ready[1], report[0], report[1]}) ::close(fd);
  ::alarm(0);
}

// Issue 11: a server must not lose an operation slot (and the object it
// holds) for every client that dies with a large send from the server in
// flight to it. libfabric 1.17 never gives such a send back (shm: no cancel
// of sends; tcp;ofi_rxm: a rendezvous send waits for an ACK for ever); the
// fabric backend proves the provider is done with it (shm: the peer's
// process has finished, and only it would have read the bytes; tcp: the
// peer's AV entry is removed, which closes its connection) and the base
// takes the slot back. Rounds of sends to killed clients add up to more
// than max_in_flight, so without that the later rounds cannot even post.
TEST_CASE("clients killed with the server's large sends in flight: slots and objects come back, the endpoint "
          "stays open and serves others",
          "[membership]") {
  const std::string backend = GENERATE(from_range(rpt::backends()));
  INFO("backend " << backend);
  // net completes a large send once its bytes are on the socket, receiver
  // or not (measured: all four 1 MiB sends done within the 300 ms below):
  // nothing stays in flight for the kill to strand.
  if (!rpt::large_sends_wait_for_receiver(backend)) return;
  ::alarm(300);
  // The server's 8 receives, room for the 4 sends of one round and for the
  // steady client's answers: 3 rounds of 4 sends need 12 slots, 6 are free.
  constexpr std::size_t kMaxInFlight = kSlots + 6;
  constexpr int kSends = 4;
  constexpr int kRounds = 3;
  constexpr std::uint64_t kLarge = std::uint64_t{1} << 20;  // rendezvous on tcp, CMA on shm
  KillServer srv(backend, kMaxInFlight);
  const int port = srv.port();
  srv.step();
  const Telemetry baseline = Telemetry::of(srv);
  INFO("baseline " << baseline);

  int stop[2];
  REQUIRE(::pipe(stop) == 0);
  auto steady = rpt::spawn([&] { return steady_main(backend, port, stop[0]); }, 250);
  REQUIRE(srv.run_until([&] { return srv.pings[1] >= 3; }, 60s));
  const auto abandoned_before = srv.stack.ep->stats().abandoned;

  for (int round = 0; round < kRounds; ++round) {
    INFO("round " << round);
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    auto sink = rpt::spawn([&] { return sink_main(backend, port, ready[1]); }, 200);
    REQUIRE(serve_until_ready(srv, ready[0], 60s));
    ::close(ready[0]);
    ::close(ready[1]);
    // The newest member with client id 3.
    const PeerEvent* joined = nullptr;
    for (const auto& e : srv.events) {
      if (e.ev.kind == PeerEventKind::joined && e.ev.client_id == 3) joined = &e.ev;
    }
    REQUIRE(joined != nullptr);
    const regpool::PeerId peer = joined->peer;
    const std::uint64_t epoch = joined->epoch;

    // Large sends the client will never receive; the server keeps no
    // reference to their objects: only the slots do.
    std::vector<Status> done;
    for (int i = 0; i < kSends; ++i) {
      auto obj = srv.stack.pool->allocate(kLarge);
      REQUIRE(obj.ok());
      rpt::fill(obj->data(), static_cast<std::uint64_t>(round * kSends + i));
      auto t = srv.stack.ep->send(peer, rpt::slice_or_die(Slice::data(*obj)),
                                  [&done](const regpool::Completion& c) { done.push_back(c.status); });
      INFO("send " << i << ": " << regpool::to_string(t.status()));
      REQUIRE(t.ok());
    }
    // Long enough for the provider to start its rendezvous; none completes.
    const auto until = Clock::now() + 300ms;
    srv.run_until([&] { return Clock::now() >= until; }, 1s);
    REQUIRE(done.empty());
    REQUIRE(srv.stack.ep->stats().in_flight >= baseline.in_flight + kSends);

    REQUIRE(::kill(sink.pid, SIGKILL) == 0);
    REQUIRE(srv.run_until(
        [&] {
          for (const auto& e : srv.events) {
            if (e.ev.kind == PeerEventKind::died && e.ev.peer == peer && e.ev.epoch == epoch) return true;
          }
          return false;
        },
        2 * kBound));
    CHECK(rpt::reap(sink, 5s) == 128 + SIGKILL);
    // Every send was answered peer_unreachable, and its slot and object
    // come back while the endpoint stays open.
    REQUIRE(srv.run_until([&] { return done.size() == static_cast<std::size_t>(kSends); }, 5s));
    for (const Status st : done) CHECK(st == Status::peer_unreachable);
    // The steady client keeps pinging: its reply in flight (a slot and a
    // 128-byte object) comes and goes, so it is counted out. A reply can
    // complete inside its post (shm's inject), its callback still to run:
    // progress first, so the count holds only replies not completed.
    const bool back = srv.run_until(
        [&] {
          (void)srv.stack.ep->progress();
          const auto t = Telemetry::of(srv);
          return t.in_flight == baseline.in_flight + srv.replies_in_flight &&
                 t.live_objects == baseline.live_objects + 1 + srv.replies_in_flight && t.quarantined == 0;
        },
        10s);
    INFO("now " << Telemetry::of(srv) << " with " << srv.replies_in_flight
                << " replies in flight (the steady client's object is the one above the baseline)");
    REQUIRE(back);
  }
  // Verbs gets them back from the provider itself (removing the peer moves
  // its QP to error, which flushes every work request); the fabric
  // providers never report them, so the base took them back.
  if (backend != "verbs") CHECK(srv.stack.ep->stats().abandoned >= abandoned_before + kSends * kRounds);
  CHECK(srv.stack.ep->usable());

  // The steady client is still served (the server's replies are sends).
  const auto pings = srv.pings[1];
  REQUIRE(srv.run_until([&] { return srv.pings[1] >= pings + 5; }, 30s));
  const char one = 1;
  REQUIRE(::write(stop[1], &one, 1) == 1);
  REQUIRE(srv.run_until([&] { return srv.find(PeerEventKind::left, 1) != nullptr; }, 30s));
  CHECK(rpt::reap(steady, 10s) == 0);
  ::close(stop[0]);
  ::close(stop[1]);
  const bool back = srv.run_until([&] { return Telemetry::of(srv) == baseline; }, 10s);
  INFO("now " << Telemetry::of(srv));
  CHECK(back);
  INFO("first server failure: " << srv.first_failure);
  CHECK(srv.failures == 0);
  ::alarm(0);
}
