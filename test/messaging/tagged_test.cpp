// Messenger (regpool/messaging.hpp) between processes. Built twice
// (test/meson.build): messaging-tagged on libfabric shm and tcp (suite
// fabric), verbs-messaging on rxe in the Soft-RoCE guest (suite verbs):
//  - eager: unexpected-before-posted and posted-before-arrival, per-pair
//    ordering, tag masks, any-source and named-source receives, truncation
//    (nothing written past the buffer), probe, zero-copy receive;
//  - budget and credits: a receiver that does not receive holds at most its
//    budget plus one credit window of messages; nothing is lost; sends
//    queued behind credits can be canceled, the rest leave in order; a
//    request canceled or timed out while its send is queued is never sent;
//  - rendezvous at 4 MiB and 64 MiB, every byte checked, exposures revoked,
//    truncation of a rendezvous, each with the receiver's split (grant,
//    the sender's puts, done) forced, never, and the backend's default;
//    many rendezvous in flight with the gets capped (the fetch queue), in
//    order;
//  - a receiver killed mid-rendezvous: the sender fails within its bound,
//    its exposure is revoked and its LDO references released; a sender
//    killed mid-rendezvous, split or not: the receive fails in bound;
//  - request/response with 3 clients, timeout, cancel, a failed peer;
//  - messages arriving ahead of their sequence (forged by a raw endpoint)
//    are held and delivered in order once the gap fills, twice in a row.
//  - split eager (a lead and parts): sent by a Messenger (split on shm,
//    whole elsewhere), unexpected and posted, into buffers, zero copy and
//    truncated; forged by a raw endpoint: early parts put in order, a new
//    message, a stray or misplaced part dropping the open message, a
//    matched receive failing malformed, a lead whose parts never come
//    failing its receive at the deadline; a sender killed between a lead
//    and its parts failing the receive in bound.

#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "messaging/messaging_wire.hpp"
#include "regpool/host_domain.hpp"
#include "regpool/messaging.hpp"
#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::MessageCompletion;
using regpool::Messenger;
using regpool::MessengerConfig;
using regpool::PeerId;
using regpool::Slice;
using regpool::Status;

namespace {

regpool::EndpointConfig ep_config() {
  regpool::EndpointConfig c;
  c.wait_mode = regpool::WaitMode::adaptive;
  c.op_timeout = 10s;
  c.revoke_quarantine = 50ms;
  return c;
}

struct Node {
  rpt::Stack s;
  Messenger m;
  Node(const std::string& prov, const MessengerConfig& mc = {}, std::size_t arena = std::size_t{32} << 20,
       bool shm_rings = true, std::uint64_t shm_ring_copy_max = 65 * 1024)
      : s(prov, ep_config(), arena, 0, true, shm_rings, true, shm_ring_copy_max), m(*s.ep, *s.pool, mc) {}
  Slice filled(std::uint64_t n, std::uint64_t seed) {
    auto l = s.alloc(n);
    rpt::fill(l.data(), seed);
    return rpt::slice_or_die(Slice::data(l));
  }
  MessageCompletion wait(regpool::Result<regpool::MessageToken> t, std::chrono::milliseconds bound = 60s) {
    if (!t) {
      MessageCompletion c;
      c.status = t.status();
      return c;
    }
    return m.wait(*t, bound);
  }
};

// b's first message to a, received: it tells a b's eager threshold (until
// then a assumes the protocol's least and sends longer messages by
// rendezvous).
void hear_limits(Node& a, PeerId to_b, Node& b, PeerId from_a) {
  auto hello = a.s.alloc(64);
  auto h = a.m.recv(to_b, 1, 0, rpt::slice_or_die(Slice::data(hello)));
  REQUIRE(b.wait(b.m.send(from_a, 1, b.filled(8, 0))).status == Status::ok);
  REQUIRE(a.wait(std::move(h)).status == Status::ok);
}

std::uint64_t word_at(std::span<const std::byte> b) {
  std::uint64_t w = 0;
  std::memcpy(&w, b.data(), 8);
  return w;
}

// The child of the flow-control cases: joins through the bootstrap on
// `port`, sends `count` messages of `size` bytes (message i: first word i,
// the rest rpt::fill(i)) with tag 5 to rank 0 without waiting, then waits
// for every one of them. `stalled`: it must have met the receiver's credit
// limit on the way.
int send_stream(const std::string& prov, const MessengerConfig& mc, std::uint16_t port, std::uint64_t count,
                std::uint64_t size, bool stalled) {
  auto b = rpt::child_bootstrap(port);
  Node n(prov, mc);
  const PeerId rx = n.s.ep->insert_peer(b->allgather(n.s.ep->name(), 30s)[0]);
  std::vector<regpool::MessageToken> t;
  for (std::uint64_t i = 0; i < count; ++i) {
    Slice s = n.filled(size, i);
    std::memcpy(s.address(), &i, 8);
    auto r = n.m.send(rx, 5, s);
    RPT_CHECK(r.ok());
    t.push_back(*r);
  }
  for (auto x : t) RPT_CHECK(n.m.wait(x, 120s).status == Status::ok);
  if (stalled) RPT_CHECK(n.m.stats().credit_stalls > 0);
  b->barrier(120s);
  return 0;
}

// The receiving side of send_stream: every message there, in order, intact.
void receive_stream(Node& n, std::uint64_t count, std::uint64_t size) {
  auto buf = n.s.alloc(size);
  for (std::uint64_t i = 0; i < count; ++i) {
    const MessageCompletion c = n.wait(n.m.recv(regpool::kAnyPeer, 5, 0, rpt::slice_or_die(Slice::data(buf))));
    REQUIRE(c.status == Status::ok);
    REQUIRE(c.received == size);
    REQUIRE(word_at(buf.data()) == i);
    std::vector<std::byte> expect(size);
    rpt::fill(expect, i);
    REQUIRE(std::memcmp(expect.data() + 8, buf.data().data() + 8, size - 8) == 0);
  }
}

// The sender of the eager test: messages i = 0..kCount-1, tag 100 + i % 3,
// size 16 + 8 * i, first word i.
constexpr std::uint64_t kCount = 24;
std::uint64_t eager_tag(std::uint64_t i) { return 100 + i % 3; }
std::uint64_t eager_size(std::uint64_t i) { return 16 + 8 * i; }

int eager_sender(const std::string& prov, std::uint16_t port) {
  auto b = rpt::child_bootstrap(port);
  Node n(prov);
  auto all = b->allgather(n.s.ep->name(), 30s);
  const PeerId rx = n.s.ep->insert_peer(all[0]);
  std::vector<regpool::MessageToken> sent;
  // Phase 1: everything arrives before any receive is posted.
  for (std::uint64_t i = 0; i < kCount; ++i) {
    Slice s = n.filled(eager_size(i), i);
    std::memcpy(s.address(), &i, 8);
    auto t = n.m.send(rx, eager_tag(i), s);
    RPT_CHECK(t.ok());
    sent.push_back(*t);
  }
  for (auto t : sent) RPT_CHECK(n.m.wait(t, 60s).status == Status::ok);
  b->barrier(60s);  // receiver has them all as unexpected
  b->barrier(60s);  // receiver posted phase 2 receives
  // Phase 2: receives were posted first.
  for (std::uint64_t i = 0; i < 4; ++i) {
    Slice s = n.filled(64, 1000 + i);
    std::memcpy(s.address(), &i, 8);
    RPT_CHECK(n.wait(n.m.send(rx, 7, s)).status == Status::ok);
  }
  // A message longer than the receive buffer posted for it.
  RPT_CHECK(n.wait(n.m.send(rx, 8, n.filled(1000, 77))).status == Status::ok);
  b->barrier(60s);
  return 0;
}

}  // namespace

TEST_CASE("tagged eager messages: ordering, masks, sources, truncation, probe, zero copy", "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn([&] { return eager_sender(prov, port); }, 240);
  Node n(prov);
  auto all = boot->allgather(n.s.ep->name(), 30s);
  const PeerId tx = n.s.ep->insert_peer(all[1]);

  // Everything arrives unexpected.
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (n.m.stats().unexpected_held < kCount && std::chrono::steady_clock::now() < until) n.m.progress();
  REQUIRE(n.m.stats().unexpected_held == kCount);
  boot->barrier(60s);

  // probe: the earliest tag-101 message, not consumed.
  auto p = n.m.probe(regpool::kAnyPeer, 101, 0);
  REQUIRE(p.ok());
  CHECK(p->peer == tx);
  CHECK(p->tag == 101);
  CHECK(p->length == eager_size(1));
  CHECK(n.m.probe(regpool::kAnyPeer, 101, 0)->length == eager_size(1));
  CHECK(n.m.probe(tx, 555, 0).status() == Status::would_block);
  CHECK(n.m.stats().unexpected_held == kCount);

  // Exact tag 101, named source: messages 1, 4, 7, ... in sending order.
  auto buf = n.s.alloc(4096);
  for (std::uint64_t i = 1; i < kCount; i += 3) {
    const MessageCompletion c = n.wait(n.m.recv(tx, 101, 0, rpt::slice_or_die(Slice::data(buf, 0, 4096))));
    REQUIRE(c.status == Status::ok);
    CHECK(c.peer == tx);
    CHECK(c.tag == 101);
    CHECK(c.length == eager_size(i));
    CHECK(c.received == eager_size(i));
    CHECK(word_at(buf.data()) == i);
  }
  // Mask: tag 100 with bit 0 ignored matches 100 (and 101, all taken): 0, 3, 6, ...
  // Zero-copy: the completion's LDO holds the message, data() is exactly it.
  for (std::uint64_t i = 0; i < kCount; i += 3) {
    const MessageCompletion c = n.wait(n.m.recv_ldo(regpool::kAnyPeer, 100, 1));
    REQUIRE(c.status == Status::ok);
    CHECK(c.tag == 100);
    REQUIRE(c.ldo);
    CHECK(c.ldo.data().size() == eager_size(i));
    CHECK(word_at(c.ldo.data()) == i);
    std::vector<std::byte> expect(eager_size(i));
    rpt::fill(expect, i);
    std::memcpy(expect.data(), &i, 8);
    CHECK(std::memcmp(expect.data(), c.ldo.data().data(), expect.size()) == 0);
  }
  // Any tag: the rest (tag 102), in order.
  for (std::uint64_t i = 2; i < kCount; i += 3) {
    const MessageCompletion c = n.wait(n.m.recv(regpool::kAnyPeer, 0, ~std::uint64_t{0}, rpt::slice_or_die(Slice::data(buf, 0, 4096))));
    REQUIRE(c.status == Status::ok);
    CHECK(c.tag == 102);
    CHECK(word_at(buf.data()) == i);
  }
  CHECK(n.m.stats().unexpected_held == 0);
  CHECK(n.m.stats().unexpected_bytes == 0);

  // Posted before arrival: the earliest posted matching receive takes the
  // earliest message.
  auto b2 = n.s.alloc(4 * 64);
  std::vector<regpool::MessageToken> r;
  for (std::uint64_t k = 0; k < 4; ++k) {
    auto t = n.m.recv(tx, 7, 0, rpt::slice_or_die(Slice::data(b2, k * 64, 64)));
    REQUIRE(t.ok());
    r.push_back(*t);
  }
  // Truncation: 1000 bytes into 100, guard bytes after the buffer untouched.
  auto b3 = n.s.alloc(200);
  std::memset(b3.data().data(), 0x5a, 200);
  auto tr = n.m.recv(tx, 8, 0, rpt::slice_or_die(Slice::data(b3, 0, 100)));
  REQUIRE(tr.ok());
  boot->barrier(60s);
  for (std::uint64_t k = 0; k < 4; ++k) {
    const MessageCompletion c = n.m.wait(r[k], 60s);
    REQUIRE(c.status == Status::ok);
    CHECK(word_at(b2.data().subspan(k * 64)) == k);
  }
  const MessageCompletion c = n.m.wait(*tr, 60s);
  CHECK(c.status == Status::truncated);
  CHECK(c.length == 1000);
  CHECK(c.received == 100);
  std::vector<std::byte> expect(1000);
  rpt::fill(expect, 77);
  CHECK(std::memcmp(b3.data().data(), expect.data(), 100) == 0);
  bool guard_intact = true;
  for (std::size_t k = 100; k < 200; ++k) guard_intact &= b3.data()[k] == std::byte{0x5a};
  CHECK(guard_intact);
  CHECK(std::string(regpool::to_string(Status::truncated)) == "truncated");
  boot->barrier(60s);
  CHECK(rpt::reap(kid, 60s) == 0);
}

// The sender of the out-of-sequence case: no Messenger, a bare endpoint
// sending Messenger eager messages it encodes itself (payload: the sequence
// number), in the order `seqs`, each completed before the next is posted
// so they arrive in that order.
constexpr std::uint64_t kEarlyTag = 9;
const std::vector<std::uint64_t> kEarlyOrder = {3, 2, 1, 4, 7, 6, 5, 8};

int early_sender(const std::string& prov, std::uint16_t port) {
  namespace mw = regpool::detail::msgwire;
  auto b = rpt::child_bootstrap(port);
  rpt::Stack s(prov, ep_config());
  const PeerId rx = s.ep->insert_peer(b->allgather(s.ep->name(), 30s)[0]);
  for (const std::uint64_t seq : kEarlyOrder) {
    auto l = s.alloc(mw::kHeaderSize + 8);
    mw::Header h;
    h.type = mw::Type::eager;
    h.tag = kEarlyTag;
    h.length = 8;
    h.msg_id = seq;
    h.seq = seq;
    mw::encode(h, l.data().data());
    std::memcpy(l.data().data() + mw::kHeaderSize, &seq, 8);
    auto t = s.ep->send(rx, rpt::slice_or_die(Slice::data(l, 0, mw::kHeaderSize + 8)));
    RPT_CHECK(t.ok());
    RPT_CHECK(s.ep->wait(*t, 30s).status == Status::ok);
  }
  b->barrier(60s);
  return 0;
}

TEST_CASE("messages ahead of their sequence are held and delivered in order", "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn([&] { return early_sender(prov, port); }, 240);
  Node n(prov);
  (void)n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  // 3 and 2 wait for 1; 7 waits for 6 and 5, after the first gap was
  // released (the per-peer count of early arrivals went back to 0 and up
  // again). Receives posted after everything arrived: every message is
  // held unexpected, in sequence order, none early.
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (n.m.stats().unexpected_held < kEarlyOrder.size() && std::chrono::steady_clock::now() < until) {
    n.m.progress();
  }
  REQUIRE(n.m.stats().unexpected_held == kEarlyOrder.size());
  auto buf = n.s.alloc(64);
  for (std::uint64_t want = 1; want <= kEarlyOrder.size(); ++want) {
    const MessageCompletion c =
        n.wait(n.m.recv(regpool::kAnyPeer, kEarlyTag, 0, rpt::slice_or_die(Slice::data(buf, 0, 64))), 10s);
    REQUIRE(c.status == Status::ok);
    CHECK(c.received == 8);
    CHECK(word_at(buf.data()) == want);
  }
  CHECK(n.m.stats().unexpected_held == 0);
  CHECK(n.m.stats().rejected == 0);
  boot->barrier(60s);
  CHECK(rpt::reap(kid, 60s) == 0);
}

// Two Messengers in one process, a waiter thread on the receiving one and a
// second thread driving its progress, so a message's callback often runs on
// the thread that does not wait for it. A waiter whose last round left
// nothing to do spins on the endpoint alone until a lock round elsewhere
// moves the Messenger's change count (Messenger::wait): here every message
// completes on the other thread, every wait must still return it, with its
// bytes, in order. (Also the Messenger's threads case for ThreadSanitizer:
// test/meson.build registers it alone in suite 'threads'.)
namespace {

// The threads cases' message i: threads_size(i) bytes, first word i, last
// word ~i. Every fourth is 5000 bytes: on shm a split eager message (a lead
// and a part), whose two messages two threads' progress rounds may take
// apart and out of order (the early path).
std::uint64_t threads_size(std::uint64_t i) { return i % 4 == 3 ? 5000 : 16; }

// Their sender: messages 0..count-1 with tag 9 from `a`, each waited for;
// message i (for i a multiple of `after_every`) only once the receiver has
// posted receive i (`posted` > i). Stops at the first failure, counted.
void send_numbered(Node& a, PeerId to, std::uint64_t count, std::uint64_t after_every,
                   const std::atomic<std::uint64_t>& posted, std::atomic<std::uint64_t>& failures) {
  Slice out = a.filled(5000, 1);
  for (std::uint64_t i = 0; i < count && failures.load() == 0; ++i) {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (i % after_every == 0 && posted.load(std::memory_order_acquire) <= i && failures.load() == 0 &&
           std::chrono::steady_clock::now() < until) {
      (void)a.m.progress();
    }
    const std::uint64_t n = threads_size(i), last = ~i;
    std::memcpy(out.address(), &i, 8);
    std::memcpy(out.address() + n - 8, &last, 8);
    const MessageCompletion c = a.wait(a.m.send(to, 9, rpt::slice_or_die(Slice::data(out.ldo(), 0, n))), 10s);
    if (c.status != Status::ok) {
      failures.fetch_add(1);
      break;
    }
  }
}

}  // namespace

TEST_CASE("threads: a waiter gets what another thread's progress delivered", "[fabric][messaging][threads]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  Node a(prov), b(prov);
  const PeerId to_b = a.s.ep->insert_peer(b.s.ep->name());
  const PeerId from_a = b.s.ep->insert_peer(a.s.ep->name());
  constexpr std::uint64_t kMessages = 2000;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> posted{0};
  std::atomic<std::uint64_t> failures{0};
  std::thread helper([&] {
    while (!stop.load(std::memory_order_relaxed)) (void)b.m.progress();
  });
  const auto size_of = threads_size;
  std::thread waiter([&] {
    auto buf = b.s.alloc(5000);
    const Slice into = rpt::slice_or_die(Slice::data(buf));
    for (std::uint64_t i = 0; i < kMessages; ++i) {
      auto t = b.m.recv(from_a, 9, 0, into);
      posted.store(i + 1, std::memory_order_release);
      const MessageCompletion c = t ? b.m.wait(*t, 10s) : MessageCompletion{};
      const std::uint64_t n = size_of(i);
      if (!t || c.status != Status::ok || c.received != n || c.peer != from_a || word_at(buf.data()) != i ||
          word_at(buf.data().subspan(n - 8)) != ~i) {
        failures.fetch_add(1);
        break;
      }
    }
  });
  // Each message after its receive is posted: it is matched on arrival,
  // inside whichever thread's progress round reads it.
  send_numbered(a, to_b, kMessages, 1, posted, failures);
  waiter.join();
  stop.store(true);
  helper.join();
  CHECK(failures.load() == 0);
  CHECK(posted.load() == kMessages);
  CHECK(b.m.stats().rejected == 0);
}

TEST_CASE("sends queued behind credits can be canceled; the rest arrive in order; queued requests that end unanswered are never sent",
          "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  MessengerConfig few;
  few.peer_credits = 3;  // b lets a have 3 messages outstanding
  Node a(prov), b(prov, few);
  const PeerId to_b = a.s.ep->insert_peer(b.s.ep->name());
  const PeerId from_a = b.s.ep->insert_peer(a.s.ep->name());
  auto a_buf = a.s.alloc(64);
  auto b_buf = b.s.alloc(64);
  const Slice a_into = rpt::slice_or_die(Slice::data(a_buf));
  const Slice b_into = rpt::slice_or_die(Slice::data(b_buf));
  // One message each way, b's side in a thread: a first send needs its
  // peer's progress (connection setup), and a learns b's grant from b's
  // message, which also returns the credit a's message took.
  {
    auto rb = b.m.recv(regpool::kAnyPeer, 1, 0, b_into);
    auto ra = a.m.recv(regpool::kAnyPeer, 2, 0, a_into);
    REQUIRE((rb.ok() && ra.ok()));
    std::atomic<int> b_side{-1};
    std::thread helper([&] {
      const bool got = b.m.wait(*rb, 30s).status == Status::ok;
      const bool sent = got && b.wait(b.m.send(from_a, 2, b.filled(8, 2)), 30s).status == Status::ok;
      b_side.store(sent ? 1 : 0);
    });
    const Status hello = a.wait(a.m.send(to_b, 1, a.filled(8, 1)), 30s).status;
    const Status answer = a.m.wait(*ra, 30s).status;
    helper.join();
    REQUIRE(hello == Status::ok);
    REQUIRE(answer == Status::ok);
    REQUIRE(b_side.load() == 1);
  }
  // b does not run now: a may send 3 messages (fewer if a credit is still
  // on its way back), the others wait for credits, in order.
  std::vector<regpool::MessageToken> t;
  auto send = [&](std::uint64_t i) {
    Slice s = a.filled(64, i);
    std::memcpy(s.address(), &i, 8);
    auto r = a.m.send(to_b, 5, s);
    REQUIRE(r.ok());
    t.push_back(*r);
  };
  const std::uint64_t stalls = a.m.stats().credit_stalls;
  for (std::uint64_t i = 0; i < 8; ++i) send(i);
  CHECK(a.m.stats().credit_stalls - stalls >= 5);
  // One from the middle of the queue and its tail; then a ninth message
  // joins behind what is left.
  CHECK(a.m.cancel(t[5]) == Status::ok);
  CHECK(a.m.cancel(t[7]) == Status::ok);
  CHECK(a.m.wait(t[5], 1s).status == Status::canceled);
  CHECK(a.m.wait(t[7], 1s).status == Status::canceled);
  send(8);
  std::vector<std::byte> expect(64);
  auto receive = [&](std::uint64_t want) {
    INFO("message " << want);
    auto r = b.m.recv(regpool::kAnyPeer, 5, 0, b_into);
    REQUIRE(r.ok());
    // Both sides progress: a's queue moves as b's credits come back.
    MessageCompletion c;
    const auto until = std::chrono::steady_clock::now() + 30s;
    do {
      (void)a.m.progress();
      c = b.m.wait(*r, 1ms);
    } while (c.status == Status::in_progress && std::chrono::steady_clock::now() < until);
    REQUIRE(c.status == Status::ok);
    REQUIRE(c.received == 64);
    CHECK(word_at(b_buf.data()) == want);
    rpt::fill(expect, want);
    CHECK(std::memcmp(expect.data() + 8, b_buf.data().data() + 8, 56) == 0);
  };
  for (std::uint64_t want : {0, 1, 2, 3, 4, 6, 8}) receive(want);
  for (std::size_t i : {0, 1, 2, 3, 4, 6, 8}) CHECK(a.m.wait(t[i], 10s).status == Status::ok);

  // Requests whose send still waits for credits, canceled or timed out:
  // their send is dropped, and b never sees them. First both sides settle,
  // then a alone takes in whatever b sent last (returned credits), so b's
  // pause starts from a known state.
  auto settle = [](Messenger& m, Messenger* other, std::chrono::milliseconds d) {
    const auto until = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < until) {
      (void)m.progress();
      if (other) (void)other->progress();
    }
  };
  settle(a.m, &b.m, 100ms);
  settle(a.m, nullptr, 100ms);
  // Fill a's credits until three sends queue: requests now queue behind
  // them. Three, b's whole grant: should credits still on their way reach
  // a while the requests wait (a's wait progresses a), the fillers take
  // them, and the requests stay queued whatever the timing.
  std::uint64_t next = 9;
  const std::uint64_t stalled = a.m.stats().credit_stalls;
  while (a.m.stats().credit_stalls - stalled < 3 && next < 9 + 12) send(next++);
  REQUIRE(a.m.stats().credit_stalls - stalled >= 3);
  auto canceled = a.m.request(to_b, 9, a.filled(8, 3), 0ms);
  auto expired = a.m.request(to_b, 9, a.filled(8, 4), 100ms);
  REQUIRE((canceled.ok() && expired.ok()));
  CHECK(a.m.cancel(*canceled) == Status::ok);
  CHECK(a.m.wait(*canceled, 1s).status == Status::canceled);
  CHECK(a.m.wait(*expired, 5s).status == Status::timeout);
  for (std::uint64_t want = 9; want < next; ++want) receive(want);
  for (std::uint64_t i = 9; i < next; ++i) CHECK(a.m.wait(t[i], 10s).status == Status::ok);
  settle(a.m, &b.m, 200ms);
  CHECK(b.m.probe(regpool::kAnyPeer, 9, 0).status() == Status::would_block);
  CHECK(b.m.stats().rejected == 0);
}

namespace {

// The serialized case's messages: i's size, first word i, the rest
// rpt::fill(i); every seventh goes by rendezvous.
constexpr std::uint64_t kSerialCount = 14;
constexpr std::uint64_t kSerialTurns = 300;
std::uint64_t serial_size(std::uint64_t i, std::uint64_t threshold) {
  static constexpr std::uint64_t kSizes[] = {8, 16, 100, 5000, 0, 40000, 8};
  const std::uint64_t n = kSizes[i % std::size(kSizes)];
  return n ? n : 4 * threshold + 5;
}

// Its sender (a child): phase 1 sends everything before waiting (the
// receiver finds them unexpected), phase 2 one at a time.
int serial_sender(const std::string& prov, std::uint16_t port) {
  auto b = rpt::child_bootstrap(port);
  MessengerConfig mc;
  mc.serialized = true;
  Node n(prov, mc);
  const PeerId rx = n.s.ep->insert_peer(b->allgather(n.s.ep->name(), 30s)[0]);
  const std::uint64_t threshold = std::max(n.m.eager_threshold(), std::uint64_t{64} << 10);
  std::vector<regpool::MessageToken> sent;
  for (std::uint64_t i = 0; i < kSerialCount; ++i) {
    Slice out = n.filled(serial_size(i, threshold), i);
    std::memcpy(out.address(), &i, 8);
    auto t = n.m.send(rx, 11, out);
    RPT_CHECK(t.ok());
    sent.push_back(*t);
  }
  for (auto t : sent) RPT_CHECK(n.m.wait(t, 60s).status == Status::ok);
  b->barrier(60s);
  for (std::uint64_t i = 0; i < kSerialTurns; ++i) {
    Slice out = n.filled(serial_size(i, threshold), 1000 + i);
    std::memcpy(out.address(), &i, 8);
    RPT_CHECK(n.wait(n.m.send(rx, 12, out), 60s).status == Status::ok);
  }
  b->barrier(60s);
  return 0;
}

}  // namespace

TEST_CASE("serialized Messengers (no lock of their own): every receive path, threads taking turns",
          "[fabric][messaging]") {
  // MessengerConfig::serialized drops the Messenger's mutex for a flag: the
  // application promises calls never overlap. Both sides serialized;
  // messages go unexpected and posted, eager and by rendezvous, into
  // buffers and zero copy; then two receiver threads take turns under the
  // test's own mutex, one waiting, one progressing. (The child starts
  // threads after a fork, which ThreadSanitizer cannot follow: the next
  // case is this one's turn-taking for it, in one process.)
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  MessengerConfig mc;
  mc.serialized = true;
  {
    regpool::EndpointConfig ec = ep_config();
    ec.progress_thread = true;
    rpt::Stack s(prov, ec);
    CHECK_THROWS_AS(Messenger(*s.ep, *s.pool, mc), regpool::Error);
  }
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn([&] { return serial_sender(prov, port); }, 240);
  Node n(prov, mc);
  const PeerId from = n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  // Every receive takes the sender's largest message (4 x its threshold +
  // 5; thresholds here are at most 128 KiB): sizes are read from the
  // completions.
  const auto expected = [](std::uint64_t seed, std::uint64_t i, std::uint64_t size) {
    std::vector<std::byte> e(size);
    rpt::fill(e, seed);
    std::memcpy(e.data(), &i, 8);
    return e;
  };
  // Phase 1, unexpected (the sender sent them all at once): alternately
  // into a buffer and zero copy.
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (n.m.stats().unexpected == 0 && std::chrono::steady_clock::now() < until) (void)n.m.progress();
  auto big = n.s.alloc(std::uint64_t{1} << 20);
  for (std::uint64_t i = 0; i < kSerialCount; ++i) {
    INFO("message " << i);
    if (i % 2 == 1) {
      const MessageCompletion c = n.wait(n.m.recv_ldo(from, 11, 0));
      REQUIRE(c.status == Status::ok);
      const auto e = expected(i, i, c.ldo.data().size());
      CHECK(std::memcmp(c.ldo.data().data(), e.data(), e.size()) == 0);
    } else {
      const MessageCompletion c = n.wait(n.m.recv(from, 11, 0, rpt::slice_or_die(Slice::data(big))));
      REQUIRE(c.status == Status::ok);
      const auto e = expected(i, i, c.received);
      CHECK(std::memcmp(big.data().data(), e.data(), e.size()) == 0);
    }
  }
  CHECK(n.m.stats().unexpected > 0);
  boot->barrier(60s);

  // Phase 2: one thread posts and waits, another progresses; each call
  // inside `turn`.
  std::mutex turn;
  std::atomic<bool> done{false};
  std::thread progressor([&] {
    while (!done.load()) {
      {
        std::lock_guard<std::mutex> g(turn);
        (void)n.m.progress();
      }
      std::this_thread::yield();
    }
  });
  std::uint64_t got = 0;
  std::string why;
  for (; got < kSerialTurns; ++got) {
    regpool::Result<regpool::MessageToken> t = Status::invalid_argument;
    {
      std::lock_guard<std::mutex> g(turn);
      t = n.m.recv(from, 12, 0, rpt::slice_or_die(Slice::data(big)));
    }
    if (!t) {
      why = "recv refused";
      break;
    }
    const auto bound = std::chrono::steady_clock::now() + 60s;
    MessageCompletion c;
    do {
      std::lock_guard<std::mutex> g(turn);
      c = n.m.wait(*t, 0ms);
    } while (c.status == Status::in_progress && std::chrono::steady_clock::now() < bound);
    const auto e = expected(1000 + got, got, c.received);
    if (c.status != Status::ok || c.peer != from || std::memcmp(big.data().data(), e.data(), e.size()) != 0) {
      why = std::string("message ") + std::to_string(got) + ": " + regpool::to_string(c.status);
      break;
    }
  }
  done.store(true);
  progressor.join();
  INFO(why);
  CHECK(got == kSerialTurns);
  boot->barrier(60s);
  CHECK(rpt::reap(kid, 60s) == 0);
  CHECK(n.m.stats().rejected == 0);
}

TEST_CASE("threads: a serialized Messenger used by threads taking turns", "[fabric][messaging][threads]") {
  // b is serialized and used by two threads, each call inside the test's
  // mutex `turn`: the waiter posts and waits, the other progresses.
  // ThreadSanitizer follows `turn`'s happens-before as it would the
  // Messenger's own mutex. a (serialized too) is the main thread's alone.
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  MessengerConfig mc;
  mc.serialized = true;
  Node a(prov, mc), b(prov, mc);
  const PeerId to_b = a.s.ep->insert_peer(b.s.ep->name());
  const PeerId from_a = b.s.ep->insert_peer(a.s.ep->name());
  constexpr std::uint64_t kMessages = 1000;
  std::mutex turn;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> posted{0};
  std::atomic<std::uint64_t> failures{0};
  std::thread helper([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      {
        std::lock_guard<std::mutex> g(turn);
        (void)b.m.progress();
      }
      std::this_thread::yield();
    }
  });
  const auto size_of = threads_size;
  std::thread waiter([&] {
    regpool::Ldo buf;
    {
      std::lock_guard<std::mutex> g(turn);
      buf = b.s.alloc(5000);
    }
    const Slice into = rpt::slice_or_die(Slice::data(buf));
    for (std::uint64_t i = 0; i < kMessages; ++i) {
      regpool::Result<regpool::MessageToken> t = Status::invalid_argument;
      {
        std::lock_guard<std::mutex> g(turn);
        t = b.m.recv(from_a, 9, 0, into);
      }
      posted.store(i + 1, std::memory_order_release);
      MessageCompletion c;
      const auto until = std::chrono::steady_clock::now() + 10s;
      do {
        std::lock_guard<std::mutex> g(turn);
        c = t ? b.m.wait(*t, 0ms) : MessageCompletion{};
      } while (t && c.status == Status::in_progress && std::chrono::steady_clock::now() < until);
      const std::uint64_t n = size_of(i);
      if (!t || c.status != Status::ok || c.received != n || c.peer != from_a || word_at(buf.data()) != i ||
          word_at(buf.data().subspan(n - 8)) != ~i) {
        failures.fetch_add(1);
        break;
      }
    }
    std::lock_guard<std::mutex> g(turn);
    buf = regpool::Ldo();
  });
  // Every other message after its receive is posted (matched on
  // arrival), the rest possibly before (unexpected).
  send_numbered(a, to_b, kMessages, 2, posted, failures);
  waiter.join();
  stop.store(true);
  helper.join();
  CHECK(failures.load() == 0);
  CHECK(posted.load() == kMessages);
  std::lock_guard<std::mutex> g(turn);
  CHECK(b.m.stats().rejected == 0);
}

TEST_CASE("a second Messenger on one endpoint is refused", "[fabric][messaging]") {
  rpt::Stack s(rpt::backends().front(), ep_config());
  Messenger m(*s.ep, *s.pool);
  CHECK_THROWS_AS(Messenger(*s.ep, *s.pool), regpool::Error);
}

TEST_CASE("budget exhausted: the sender is flow-controlled, nothing is lost", "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  constexpr std::uint64_t kMessages = 300;
  MessengerConfig mc;
  mc.peer_credits = 4;
  mc.eager_threshold = 1024;
  mc.unexpected_budget = 8 * 1024;  // a handful of bounce LDOs
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn([&]() -> int { return send_stream(prov, mc, port, kMessages, 512, true); }, 300);
  Node n(prov, mc);
  (void)n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  // Do not receive for a while: the sender must stall, not flood us.
  const auto until = std::chrono::steady_clock::now() + 1500ms;
  std::uint64_t most = 0;
  while (std::chrono::steady_clock::now() < until) {
    n.m.progress();
    most = std::max(most, n.m.stats().unexpected_held);
  }
  const auto st = n.m.stats();
  INFO("held " << most << " messages, " << st.unexpected_bytes << " bytes");
  CHECK(st.credits_withheld > 0);
  // Budget / bounce capacity, plus one credit window.
  const std::uint64_t bounce = 64 + 1024;
  CHECK(most <= mc.unexpected_budget / bounce + 1 + mc.peer_credits);
  CHECK(most < kMessages);
  // Now receive everything: all there, in order, intact.
  receive_stream(n, kMessages, 512);
  boot->barrier(120s);
  CHECK(rpt::reap(kid, 60s) == 0);
}

TEST_CASE("small unexpected messages are held as copies, within the unexpected table, nothing dropped",
          "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  constexpr std::uint64_t kMessages = 200;
  constexpr std::uint64_t kSize = 16;
  MessengerConfig mc;
  mc.peer_credits = 4;
  mc.eager_threshold = 4096;
  mc.max_unexpected = 16;  // the byte budget (8 MiB) never binds: the table must
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn([&]() -> int { return send_stream(prov, mc, port, kMessages, kSize, false); }, 300);
  Node n(prov, mc);
  (void)n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  const auto until = std::chrono::steady_clock::now() + 1500ms;
  std::uint64_t most = 0, most_bytes = 0;
  while (std::chrono::steady_clock::now() < until) {
    n.m.progress();
    const auto st = n.m.stats();
    most = std::max(most, st.unexpected_held);
    most_bytes = std::max(most_bytes, st.unexpected_bytes);
  }
  const auto st = n.m.stats();
  INFO("held " << most << " messages, " << most_bytes << " bytes at most");
  CHECK(most > 0);
  CHECK(most <= mc.max_unexpected);
  CHECK(st.credits_withheld > 0);
  CHECK(st.rejected == 0);
  // Copies, not bounces: each held message costs far less than its bounce.
  const std::uint64_t bounce = 64 + mc.eager_threshold;
  CHECK(most_bytes <= most * bounce / 4);
  // The bounce ring itself: receive_buffers objects of at least 64 + threshold.
  CHECK(st.receive_buffer_bytes >= mc.receive_buffers * bounce);
  CHECK(st.receive_buffer_bytes <= 2 * mc.receive_buffers * bounce);
  receive_stream(n, kMessages, kSize);
  CHECK(n.m.stats().rejected == 0);
  boot->barrier(120s);
  CHECK(rpt::reap(kid, 60s) == 0);
}

TEST_CASE("mismatched thresholds and credits are negotiated: nothing refused, truncated or overrun",
          "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  // Which side has the larger eager threshold and the more credits.
  const bool sender_larger = GENERATE(true, false);
  INFO("backend " << prov << (sender_larger ? ", sender larger" : ", receiver larger"));
  MessengerConfig small;
  small.eager_threshold = 1024;
  small.peer_credits = 4;
  MessengerConfig large;
  large.eager_threshold = 32 << 10;
  large.peer_credits = 64;
  large.receive_buffers = 160;
  const MessengerConfig tx_cfg = sender_larger ? large : small;
  const MessengerConfig rx_cfg = sender_larger ? small : large;
  const std::vector<std::uint64_t> sizes = {8, 1024, 1025, 4096, 20000, 64};
  constexpr std::uint64_t kMessages = 60;
  auto size_of = [&](std::uint64_t i) { return sizes[i % sizes.size()]; };
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        Node n(prov, tx_cfg);
        const PeerId rx = n.s.ep->insert_peer(b->allgather(n.s.ep->name(), 30s)[0]);
        std::vector<regpool::MessageToken> t;
        for (std::uint64_t i = 0; i < kMessages; ++i) {
          Slice s = n.filled(size_of(i), 500 + i);
          std::memcpy(s.address(), &i, 8);
          auto r = n.m.send(rx, 11, s);
          RPT_CHECK(r.ok());
          t.push_back(*r);
        }
        for (auto x : t) RPT_CHECK(n.m.wait(x, 120s).status == Status::ok);
        // Nothing above the receiver's threshold went eager; and the first
        // message was sent before the receiver's limits were known.
        std::uint64_t over = 0;
        for (std::uint64_t i = 0; i < kMessages; ++i) over += size_of(i) > rx_cfg.eager_threshold ? 1 : 0;
        RPT_CHECK(n.m.stats().rendezvous_sent >= over);
        RPT_CHECK(n.m.stats().rejected == 0);
        b->barrier(120s);
        return 0;
      },
      300);
  Node n(prov, rx_cfg);
  (void)n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  // Hold back for a while: everything arrives unexpected first (eager
  // messages in their bounces, rendezvous notices), under the credits the
  // receiver announced.
  const auto until = std::chrono::steady_clock::now() + 1000ms;
  while (std::chrono::steady_clock::now() < until) n.m.progress();
  CHECK(n.m.stats().unexpected_held > 0);
  auto buf = n.s.alloc(20000);
  for (std::uint64_t i = 0; i < kMessages; ++i) {
    const MessageCompletion c = n.wait(n.m.recv(regpool::kAnyPeer, 11, 0, rpt::slice_or_die(Slice::data(buf))));
    REQUIRE(c.status == Status::ok);
    REQUIRE(c.length == size_of(i));
    REQUIRE(c.received == size_of(i));
    std::vector<std::byte> expect(size_of(i));
    rpt::fill(expect, 500 + i);
    std::memcpy(expect.data(), &i, 8);
    REQUIRE(std::memcmp(expect.data(), buf.data().data(), size_of(i)) == 0);
  }
  CHECK(n.m.stats().rejected == 0);
  boot->barrier(120s);
  CHECK(rpt::reap(kid, 60s) == 0);
}

TEST_CASE("rendezvous at 4 MiB and 64 MiB moves every byte and revokes its exposures", "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  // The receiver decides the split: 256 KiB splits all three (the
  // truncated one too: the sender puts only up to the receive buffer's
  // end); UINT64_MAX none; 0 the backend's default (TransferTraits).
  const std::uint64_t split = GENERATE(std::uint64_t{256} << 10, ~std::uint64_t{0}, std::uint64_t{0});
  INFO("backend " << prov << " rendezvous_split " << split);
  const std::vector<std::uint64_t> sizes = {std::uint64_t{4} << 20, std::uint64_t{64} << 20, std::uint64_t{1} << 20};
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        Node n(prov);
        const PeerId rx = n.s.ep->insert_peer(b->allgather(n.s.ep->name(), 30s)[0]);
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          Slice s = n.filled(sizes[k], 40 + k);
          RPT_CHECK(n.wait(n.m.send(rx, 9, s), 120s).status == Status::ok);
          RPT_CHECK(s.ldo().use_count() <= 2);  // ours and the quarantine's at most
        }
        RPT_CHECK(n.m.stats().rendezvous_sent == sizes.size());
        RPT_CHECK(n.s.ep->exposure_stats().live == 0);
        b->barrier(120s);
        return 0;
      },
      300);
  MessengerConfig mc;
  mc.rendezvous_split = split;
  Node n(prov, mc);
  (void)n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  // 4 MiB into a posted buffer.
  {
    auto buf = n.s.alloc(sizes[0]);
    const MessageCompletion c = n.wait(n.m.recv(regpool::kAnyPeer, 9, 0, rpt::slice_or_die(Slice::data(buf))), 120s);
    REQUIRE(c.status == Status::ok);
    CHECK(c.received == sizes[0]);
    std::vector<std::byte> expect(sizes[0]);
    rpt::fill(expect, 40);
    CHECK(std::memcmp(expect.data(), buf.data().data(), sizes[0]) == 0);
  }
  // 64 MiB zero copy.
  {
    const MessageCompletion c = n.wait(n.m.recv_ldo(regpool::kAnyPeer, 9, 0), 120s);
    REQUIRE(c.status == Status::ok);
    REQUIRE(c.ldo);
    CHECK(c.ldo.data().size() == sizes[1]);
    std::vector<std::byte> expect(sizes[1]);
    rpt::fill(expect, 41);
    CHECK(std::memcmp(expect.data(), c.ldo.data().data(), sizes[1]) == 0);
  }
  // 1 MiB into 300 KiB: truncated, nothing past the buffer.
  {
    auto buf = n.s.alloc(400 << 10);
    std::memset(buf.data().data(), 0x33, buf.data().size());
    const MessageCompletion c =
        n.wait(n.m.recv(regpool::kAnyPeer, 9, 0, rpt::slice_or_die(Slice::data(buf, 0, 300 << 10))), 120s);
    CHECK(c.status == Status::truncated);
    CHECK(c.length == sizes[2]);
    CHECK(c.received == 300 << 10);
    std::vector<std::byte> expect(sizes[2]);
    rpt::fill(expect, 42);
    CHECK(std::memcmp(expect.data(), buf.data().data(), 300 << 10) == 0);
    bool guard = true;
    for (std::size_t k = 300 << 10; k < buf.data().size(); ++k) guard &= buf.data()[k] == std::byte{0x33};
    CHECK(guard);
  }
  if (split == std::uint64_t{256} << 10) CHECK(n.m.stats().rendezvous_split == sizes.size());
  if (split == ~std::uint64_t{0}) CHECK(n.m.stats().rendezvous_split == 0);
  boot->barrier(120s);
  CHECK(rpt::reap(kid, 60s) == 0);
  // The grants' exposures are revoked too.
  n.s.ep->progress_for(200ms);
  n.m.progress();
  CHECK(n.s.ep->exposure_stats().live == 0);
}

// Many rendezvous in flight to one receiver whose gets are capped below
// what the messages want (MessengerConfig::rendezvous_gets, the fetch
// queue): every byte arrives, each message in the receive its order
// matched it to, whether the receive was posted before the notice or
// after it, and every exposure is revoked.
TEST_CASE("several rendezvous in flight to one peer: gets capped, every byte, in order", "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  constexpr std::uint64_t kMessages = 12;
  auto size_of = [](std::uint64_t i) { return (std::uint64_t{256} << 10) + i * 40000; };
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        Node n(prov);
        const PeerId rx = n.s.ep->insert_peer(b->allgather(n.s.ep->name(), 30s)[0]);
        b->barrier(60s);  // the first half of the receives is posted
        std::vector<regpool::MessageToken> sent;
        for (std::uint64_t i = 0; i < kMessages; ++i) {
          auto t = n.m.send(rx, 20 + i % 2, n.filled(size_of(i), 500 + i));
          RPT_CHECK(t.ok());
          if (t) sent.push_back(*t);
        }
        for (auto t : sent) RPT_CHECK(n.m.wait(t, 120s).status == Status::ok);
        RPT_CHECK(n.m.stats().rendezvous_sent == kMessages);
        RPT_CHECK(n.s.ep->exposure_stats().live == 0);
        b->barrier(120s);
        return 0;
      },
      300);
  MessengerConfig mc;
  mc.rendezvous_chunk = 64 << 10;
  mc.rendezvous_depth = 2;
  mc.rendezvous_gets = 3;  // fewer than the messages want at once: some wait their turn
  Node n(prov, mc);
  (void)n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  // Messages alternate between tags 20 and 21; receives are per tag, so
  // the k-th receive of a tag takes message 2k (+1). The first half is
  // posted before anything is sent, the second half once the notices have
  // arrived unexpected.
  std::vector<regpool::Ldo> bufs;
  std::vector<regpool::MessageToken> recvs;
  auto post = [&](std::uint64_t i) {
    bufs.push_back(n.s.alloc(size_of(i)));
    auto t = n.m.recv(regpool::kAnyPeer, 20 + i % 2, 0, rpt::slice_or_die(Slice::data(bufs.back())));
    REQUIRE(t.ok());
    recvs.push_back(*t);
  };
  for (std::uint64_t i = 0; i < kMessages / 2; ++i) post(i);
  boot->barrier(60s);
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (n.m.stats().unexpected < kMessages / 2 && std::chrono::steady_clock::now() < until) (void)n.m.progress();
  for (std::uint64_t i = kMessages / 2; i < kMessages; ++i) post(i);
  for (std::uint64_t i = 0; i < kMessages; ++i) {
    const MessageCompletion c = n.m.wait(recvs[i], 120s);
    INFO("message " << i);
    REQUIRE(c.status == Status::ok);
    CHECK(c.received == size_of(i));
    CHECK(c.tag == 20 + i % 2);
    std::vector<std::byte> expect(size_of(i));
    rpt::fill(expect, 500 + i);
    CHECK(std::memcmp(expect.data(), bufs[i].data().data(), size_of(i)) == 0);
  }
  CHECK(n.m.stats().received == kMessages);
  boot->barrier(120s);
  CHECK(rpt::reap(kid, 60s) == 0);
}

TEST_CASE("a receiver killed mid-rendezvous: the sender fails in bound and lets go", "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  constexpr std::uint64_t kSize = std::uint64_t{64} << 20;
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        MessengerConfig mc;
        mc.rendezvous_chunk = 4096;  // slow on purpose: thousands of gets
        mc.rendezvous_depth = 1;
        Node n(prov, mc);
        (void)n.s.ep->insert_peer(b->allgather(n.s.ep->name(), 30s)[0]);
        auto buf = n.s.alloc(kSize);
        std::memset(buf.data().data(), 0, 16);
        auto t = n.m.recv(regpool::kAnyPeer, 1, 0, rpt::slice_or_die(Slice::data(buf)));
        RPT_CHECK(t.ok());
        b->barrier(60s);
        // Die as soon as the first chunk has landed.
        const auto until = std::chrono::steady_clock::now() + 60s;
        while (buf.data()[0] == std::byte{0} && std::chrono::steady_clock::now() < until) n.m.progress();
        ::raise(SIGKILL);
        return 1;
      },
      120);
  MessengerConfig mc;
  mc.rendezvous_timeout = 2s;
  Node n(prov, mc);
  const PeerId rx = n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  auto l = n.s.alloc(kSize);
  rpt::fill(l.data(), 3);
  l.data()[0] = std::byte{0xab};
  boot->barrier(60s);
  const auto t0 = std::chrono::steady_clock::now();
  const MessageCompletion c = n.wait(n.m.send(rx, 1, rpt::slice_or_die(Slice::data(l))), 60s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("send completed with " << regpool::to_string(c.status) << " after " << took << " s");
  CHECK(c.status != Status::ok);
  CHECK(c.status != Status::in_progress);
  // rendezvous_timeout + 64 MiB / min_bandwidth (2.7 s) + slack.
  CHECK(took < 8.0);
  CHECK(rpt::reap(kid, 10s) == 128 + SIGKILL);
  // Exposure revoked; after the quarantine only our handle is left.
  n.s.ep->progress_for(200ms);
  n.m.progress();
  CHECK(n.s.ep->exposure_stats().live == 0);
  CHECK(l.use_count() == 1);
}

TEST_CASE("a sender killed mid-rendezvous: the receive fails in bound and lets go", "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  // Split: the receive also waits for the dead sender's done.
  const bool split = GENERATE(false, true);
  INFO("backend " << prov << (split ? " split" : " not split"));
  constexpr std::uint64_t kSize = std::uint64_t{64} << 20;
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        Node n(prov);
        const PeerId rx = n.s.ep->insert_peer(b->allgather(n.s.ep->name(), 30s)[0]);
        auto l = n.s.alloc(kSize);
        rpt::fill(l.data(), 5);
        l.data()[0] = std::byte{0xcd};
        b->barrier(60s);
        auto t = n.m.send(rx, 1, rpt::slice_or_die(Slice::data(l)));
        RPT_CHECK(t.ok());
        (void)n.m.wait(*t, 60s);  // serves the gets (tcp) until the parent kills us
        return 1;
      },
      120);
  MessengerConfig mc;
  mc.rendezvous_chunk = 4096;  // thousands of gets: the kill lands mid-transfer
  mc.rendezvous_depth = 1;
  mc.rendezvous_split = split ? std::uint64_t{1} << 20 : ~std::uint64_t{0};
  Node n(prov, mc);
  const PeerId sender = n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  auto buf = n.s.alloc(kSize);
  std::memset(buf.data().data(), 0, 16);
  auto t = n.m.recv(regpool::kAnyPeer, 1, 0, rpt::slice_or_die(Slice::data(buf)));
  REQUIRE(t.ok());
  boot->barrier(60s);
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (buf.data()[0] == std::byte{0} && std::chrono::steady_clock::now() < until) n.m.progress();
  REQUIRE(buf.data()[0] == std::byte{0xcd});  // the first chunk landed
  ::kill(kid.pid, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  const MessageCompletion c = n.m.wait(*t, 60s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("receive completed with " << regpool::to_string(c.status) << " after " << took << " s");
  CHECK(c.status != Status::ok);
  CHECK(c.status != Status::in_progress);
  // op_timeout (10 s) + 4 KiB / min_bandwidth, and slack.
  CHECK(took < 15.0);
  CHECK(rpt::reap(kid, 10s) == 128 + SIGKILL);
  // The Messenger holds nothing; a get the endpoint failed early (the shm
  // backend saw the process die) keeps its slot's reference until the
  // provider lets go of it, at the latest when the endpoint closes. A split
  // receive's grant was a write-only exposure of its tail: revoked when the
  // receive failed, its bytes stay held while the revocation settles (the
  // quarantine, 1 s; verbs: until the window's invalidation completes, which
  // on a dead peer's queue pair is when the connection goes). What the
  // membership layer does with a dead client is remove it: then everything
  // goes within a bound.
  n.s.ep->remove_peer(sender);
  const auto settle = std::chrono::steady_clock::now() + 20s;
  n.s.ep->progress_for(200ms);
  while (buf.use_count() > 1 + mc.rendezvous_depth && std::chrono::steady_clock::now() < settle) {
    n.s.ep->progress_for(50ms);
  }
  INFO("buffer references after the failure: " << buf.use_count());
  CHECK(buf.use_count() <= 1 + mc.rendezvous_depth);
  n.s.ep.reset();
  CHECK(buf.use_count() == 1);
}

namespace {
constexpr int kClients = 3;
constexpr std::uint64_t kRequests = 40;

int rpc_client(const std::string& prov, std::uint16_t port, int rank) {
  auto b = rpt::child_bootstrap(port, rank, kClients + 1);
  Node n(prov);
  const PeerId server = n.s.ep->insert_peer(b->allgather(n.s.ep->name(), 30s)[0]);
  const std::uint64_t big = n.m.eager_threshold() * 4;  // a rendezvous request and reply
  for (std::uint64_t i = 0; i < kRequests; ++i) {
    const std::uint64_t size = i % 10 == 9 ? big : 64;
    Slice s = n.filled(size, static_cast<std::uint64_t>(rank) * 1000 + i);
    const std::uint64_t word = (static_cast<std::uint64_t>(rank) << 32) | i;
    std::memcpy(s.address(), &word, 8);
    const MessageCompletion c = n.wait(n.m.request(server, 1, s, 30s));
    RPT_CHECK(c.status == Status::ok);
    RPT_CHECK(c.op == regpool::MessageOp::request);
    RPT_CHECK(c.ldo);
    RPT_CHECK(c.ldo.data().size() == size);
    RPT_CHECK(word_at(c.ldo.data()) == word + 1);
    RPT_CHECK(std::memcmp(c.ldo.data().data() + 8, s.address() + 8, size - 8) == 0);
  }
  // Nobody answers tag 2: timeout. Cancel. A failed peer fails its request.
  const auto t0 = std::chrono::steady_clock::now();
  RPT_CHECK(n.wait(n.m.request(server, 2, n.filled(8, 1), 300ms)).status == Status::timeout);
  RPT_CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  auto pending = n.m.request(server, 2, n.filled(8, 2), 0ms);
  RPT_CHECK(pending.ok());
  RPT_CHECK(n.m.cancel(*pending) == Status::ok);
  RPT_CHECK(n.m.wait(*pending, 5s).status == Status::canceled);
  b->barrier(60s);  // all clients done with the server
  auto doomed = n.m.request(server, 2, n.filled(8, 3), 0ms);
  RPT_CHECK(doomed.ok());
  n.s.ep->fail_peer(server);
  RPT_CHECK(n.m.wait(*doomed, 5s).status == Status::peer_unreachable);
  return 0;
}
}  // namespace

TEST_CASE("request/response with 3 clients, timeout, cancel, a failed peer", "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap(kClients + 1);
  const auto port = boot->port();
  std::vector<rpt::ChildGuard> kids;
  for (int r = 1; r <= kClients; ++r) kids.push_back(rpt::spawn([&, r] { return rpc_client(prov, port, r); }, 240));
  Node n(prov);
  auto all = boot->allgather(n.s.ep->name(), 30s);
  std::vector<PeerId> ids;
  for (int r = 1; r <= kClients; ++r) ids.push_back(n.s.ep->insert_peer(all[static_cast<std::size_t>(r)]));
  std::uint64_t served = 0;
  std::vector<std::uint64_t> per(kClients + 1, 0);
  while (served < kClients * kRequests) {
    MessageCompletion c = n.wait(n.m.recv_ldo(regpool::kAnyPeer, 1, 0), 60s);
    REQUIRE(c.status == Status::ok);
    REQUIRE(c.request_id != 0);
    const std::uint64_t word = word_at(c.ldo.data());
    const auto rank = static_cast<int>(word >> 32);
    REQUIRE(rank >= 1);
    REQUIRE(rank <= kClients);
    CHECK(c.peer == ids[static_cast<std::size_t>(rank - 1)]);
    CHECK((word & 0xffffffffu) == per[static_cast<std::size_t>(rank)]);  // in order per client
    ++per[static_cast<std::size_t>(rank)];
    const std::uint64_t reply_word = word + 1;
    std::memcpy(c.ldo.data().data(), &reply_word, 8);
    // The request's own LDO goes back as the reply (zero copy both ways).
    const MessageCompletion r = n.wait(n.m.reply(c.peer, c.request_id, rpt::slice_or_die(Slice::data(c.ldo))));
    REQUIRE(r.status == Status::ok);
    ++served;
  }
  boot->barrier(60s);
  for (auto& k : kids) CHECK(rpt::reap(k, 60s) == 0);
}

// ------------------------------------------------------------ kept eager sends
// Small eager messages sent from send() itself go through one kept send per
// peer (messenger.cpp, kKeptSends): reposted with each message's length.
namespace {

// Message i's payload size: small ones (kept), one above the spare payload
// (192: a fresh message object), each rewriting the kept buffer with a new
// length.
std::uint64_t kept_size(std::uint64_t i) {
  static constexpr std::uint64_t kSizes[] = {8, 192, 9, 100, 300, 64, 16};
  return kSizes[i % std::size(kSizes)];
}
constexpr std::uint64_t kKeptPingPongs = 70;
constexpr std::uint64_t kKeptBurst = 40;

// The receiving side: each message's sequence word, length and bytes, in
// order; the ping-pong's messages answered with their length. Every
// ping-pong message finds its receive posted, so each is taken in place:
// on shm with message rings where it lies in the ring, elsewhere as its
// bounce receive completes (before the bounce's callback).
int kept_receiver(const std::string& prov, std::uint16_t port, bool rings) {
  auto b = rpt::child_bootstrap(port);
  Node n(prov, {}, std::size_t{32} << 20, rings);
  const PeerId tx = n.s.ep->insert_peer(b->allgather(n.s.ep->name(), 30s)[0]);
  // Each message's receive is posted before the message that lets the
  // sender send it (our limits, the previous pong): every ping-pong
  // message finds it posted. Same tag: matched in posting order.
  regpool::Ldo bufs[2] = {n.s.alloc(512), n.s.alloc(512)};
  auto post = [&](std::uint64_t i) { return n.m.recv(tx, 5, 0, rpt::slice_or_die(Slice::data(bufs[i % 2]))); };
  auto next = post(0);
  RPT_CHECK(n.wait(n.m.send(tx, 1, n.filled(8, 1))).status == Status::ok);  // our limits
  constexpr std::uint64_t kAll = kKeptPingPongs + kKeptBurst;
  for (std::uint64_t i = 0; i < kAll; ++i) {
    const MessageCompletion c = n.wait(std::move(next));
    RPT_CHECK(c.status == Status::ok);
    RPT_CHECK(c.length == kept_size(i));
    std::vector<std::byte> expect(kept_size(i));
    rpt::fill(expect, 1000 + i);
    RPT_CHECK(std::memcmp(bufs[i % 2].data().data(), expect.data(), expect.size()) == 0);
    if (i + 1 < kAll) next = post(i + 1);
    if (i < kKeptPingPongs) RPT_CHECK(n.wait(n.m.send(tx, 6, n.filled(8, i))).status == Status::ok);
  }
  const regpool::MessengerStats st = n.m.stats();
  RPT_CHECK(st.received_in_place >= kKeptPingPongs);
  // The waits above spin before most messages arrive: those are handed
  // straight to them.
  RPT_CHECK(st.handed_off > 0);
  RPT_CHECK(st.rejected == 0);
  b->barrier(60s);
  return 0;
}

// The sending side's burst after its ping-pong: kKeptBurst messages to rx
// without waiting, then every send waited for (kept_receiver checks them).
void send_burst(Node& n, PeerId rx) {
  std::vector<regpool::MessageToken> burst;
  for (std::uint64_t i = kKeptPingPongs; i < kKeptPingPongs + kKeptBurst; ++i) {
    auto t = n.m.send(rx, 5, n.filled(kept_size(i), 1000 + i));
    REQUIRE(t.ok());
    burst.push_back(*t);
  }
  for (auto t : burst) CHECK(n.m.wait(t, 60s).status == Status::ok);
}

}  // namespace

TEST_CASE("small eager sends go through one kept send per peer: every length, in order, ended with the peer",
          "[fabric][messaging]") {
  // shm with its message rings copies small sends instead (next case).
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn([&] { return kept_receiver(prov, port, false); }, 240);
  Node n(prov, {}, std::size_t{32} << 20, false);
  const PeerId rx = n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  auto hello = n.s.alloc(64);
  REQUIRE(n.wait(n.m.recv(rx, 1, 0, rpt::slice_or_die(Slice::data(hello)))).status == Status::ok);
  auto reply = n.s.alloc(64);

  // A ping-pong: every small message finds the kept buffer free.
  std::uint64_t small = 0;
  for (std::uint64_t i = 0; i < kKeptPingPongs; ++i) {
    if (kept_size(i) <= 192) ++small;
    auto answer = n.m.recv(rx, 6, 0, rpt::slice_or_die(Slice::data(reply)));
    REQUIRE(n.wait(n.m.send(rx, 5, n.filled(kept_size(i), 1000 + i))).status == Status::ok);
    REQUIRE(n.wait(std::move(answer)).status == Status::ok);
  }
  const auto kept = n.m.stats().eager_kept;
  const auto taken = n.m.stats().kept_sends_taken;
  INFO(kept << " of " << small << " small messages through the kept send, " << taken
            << " of its completions taken as delivered");
  CHECK(kept >= small - 1);  // all of them once the kept send's first completion is in
  CHECK(kept <= small);
  // The kept send's completions go to the Messenger as the endpoint
  // delivers them (MessageSink::sent), all but the first (its callback
  // brings the token): one thread, so the Messenger's lock is never busy
  // then, which would leave a completion to its callback.
  CHECK(taken == kept - 1);

  // A burst: messages find the kept buffer in flight and go as before; all
  // arrive, in order (the receiver checks).
  send_burst(n, rx);
  boot->barrier(60s);
  CHECK(rpt::reap(kid, 60s) == 0);

  // The peer fails: its kept send ends, and its buffer goes back to the
  // pool (spares topped up first, so only that object moves).
  for (int r = 0; r < 50; ++r) (void)n.m.progress();
  const auto live = n.s.pool->stats().live_objects;
  n.m.fail_peer(rx);
  for (int r = 0; r < 50; ++r) (void)n.m.progress();
  CHECK(n.s.pool->stats().live_objects == live - 1);
}

namespace {

// Gathered eager sends (MessengerConfig::eager_gather): payload sizes about
// the default threshold (4 KiB) and up to the receiver's eager threshold
// `eager` (larger ones go by rendezvous). Message i carries rpt::fill(seed)
// with its first word i.
std::vector<std::uint64_t> gather_sizes(std::uint64_t eager) {
  std::vector<std::uint64_t> v;
  for (std::uint64_t n : {200, 4095, 4096, 4097, 8192, 12345, 16384, 40000, 65536, 100000}) {
    if (n <= eager) v.push_back(n);
  }
  return v;
}
constexpr std::uint64_t kGatherMax = 100000;
// Rounds of the sizes: a ping-pong, a burst, a burst whose slices the
// sender drops as it sends.
constexpr std::uint64_t kGatherRounds = 3;

// The receiving side: its limits first (so the sender sends eagerly up to
// our threshold), then every message of every round checked byte for byte.
// Two credits only: the bursts wait for them, so their later messages
// leave from the credit queue.
int gather_receiver(const std::string& prov, std::uint16_t port, bool rings) {
  auto b = rpt::child_bootstrap(port);
  MessengerConfig mc;
  mc.peer_credits = 2;
  Node n(prov, mc, std::size_t{32} << 20, rings);
  const PeerId tx = n.s.ep->insert_peer(b->allgather(n.s.ep->name(), 30s)[0]);
  const auto sizes = gather_sizes(n.m.eager_threshold());
  auto limits = n.filled(8, 1);
  std::memcpy(limits.address(), &sizes.back(), 8);  // the sender learns the sizes from us
  RPT_CHECK(n.wait(n.m.send(tx, 1, limits)).status == Status::ok);
  auto buf = n.s.alloc(kGatherMax);
  for (std::uint64_t round = 0; round < kGatherRounds; ++round) {
    if (round > 0) {
      b->barrier(60s);  // the burst is sent: much of it arrives before its receive
      for (int r = 0; r < 200; ++r) (void)n.m.progress();
    }
    for (std::uint64_t i = 0; i < sizes.size(); ++i) {
      const MessageCompletion c = n.wait(n.m.recv(tx, 5, 0, rpt::slice_or_die(Slice::data(buf))));
      RPT_CHECK(c.status == Status::ok);
      RPT_CHECK(c.length == sizes[i]);
      std::vector<std::byte> expect(sizes[i]);
      rpt::fill(expect, 100 * round + i);
      std::memcpy(expect.data(), &i, 8);
      RPT_CHECK(std::memcmp(buf.data().data(), expect.data(), sizes[i]) == 0);
      if (round == 0) RPT_CHECK(n.wait(n.m.send(tx, 6, n.filled(8, i))).status == Status::ok);
    }
  }
  RPT_CHECK(n.m.stats().rejected == 0);
  b->barrier(60s);
  return 0;
}

// The sending side of round `round`, message i of `size` bytes.
Slice gather_message(Node& n, std::uint64_t round, std::uint64_t i, std::uint64_t size) {
  Slice s = n.filled(size, 100 * round + i);
  std::memcpy(s.address(), &i, 8);
  return s;
}

}  // namespace

TEST_CASE("gathered eager sends: the header and the caller's bytes uncopied, on every path, on, capped and off",
          "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  // shm: with regpool's rings (no gathering there) and through the
  // provider (two-entry iovecs, as everywhere else).
  const bool rings = GENERATE(true, false);
  // The longest payload sent gathered (MessengerConfig::eager_gather_max):
  // the backend's default, none, 16 KiB; or no gathering at all.
  enum class Mode { on, unlimited, capped, off };
  const Mode mode = GENERATE(Mode::on, Mode::unlimited, Mode::capped, Mode::off);
  const bool on = mode != Mode::off;
  if (prov != "shm" && !rings) return;
  INFO("backend " << prov << (rings ? "" : ", no rings") << ", gathering mode " << static_cast<int>(mode));
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn([&] { return gather_receiver(prov, port, rings); }, 240);
  MessengerConfig mc;
  if (!on) mc.eager_gather = ~std::uint64_t{0};
  if (mode == Mode::unlimited) mc.eager_gather_max = ~std::uint64_t{0};
  if (mode == Mode::capped) mc.eager_gather_max = 16384;
  mc.eager_split = ~std::uint64_t{0};  // shm without rings would split 4-16 KiB payloads first
  Node n(prov, mc, std::size_t{32} << 20, rings);
  // The backend's own limit is the measured one (tcp: 64 KiB payloads are
  // copied, not gathered, unless the config lifts the limit).
  const std::uint64_t traits_limit = n.s.ep->transfer_traits().gather_limit;
  CHECK(traits_limit == rpt::default_gather_limit(prov));
  const std::uint64_t gather_max = mode == Mode::capped      ? 16384
                                   : mode == Mode::unlimited ? ~std::uint64_t{0}
                                   : traits_limit == ~std::uint64_t{0} ? traits_limit
                                                                       : traits_limit - 64;
  const PeerId rx = n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  auto limits = n.s.alloc(8);
  REQUIRE(n.wait(n.m.recv(rx, 1, 0, rpt::slice_or_die(Slice::data(limits)))).status == Status::ok);
  std::uint64_t largest = 0;
  std::memcpy(&largest, limits.data().data(), 8);
  const auto sizes = gather_sizes(largest);
  REQUIRE(sizes.back() == largest);

  // Round 0, a ping-pong: each send from send() itself, its receive
  // posted. The 8 KiB message's bytes come from a pool the endpoint's
  // domain never registered: copied into a message, never gathered (its
  // gathered send would fail the post).
  regpool::Pool elsewhere({regpool::HostDomain::open({.lock_pages = false})});
  auto ack = n.s.alloc(8);
  for (std::uint64_t i = 0; i < sizes.size(); ++i) {
    Slice msg = gather_message(n, 0, i, sizes[i]);
    if (sizes[i] == 8192) {
      auto other = elsewhere.allocate(sizes[i]);
      REQUIRE(other.ok());
      std::memcpy(other->data().data(), msg.address(), sizes[i]);
      msg = rpt::slice_or_die(Slice::data(*other));
    }
    auto answer = n.m.recv(rx, 6, 0, rpt::slice_or_die(Slice::data(ack)));
    REQUIRE(n.wait(n.m.send(rx, 5, msg)).status == Status::ok);
    REQUIRE(n.wait(std::move(answer)).status == Status::ok);
  }
  // Round 1, a burst: past the receiver's two credits the sends wait in
  // the credit queue and leave from there, holding the caller's slice.
  // Round 2: the same, each slice dropped by us as it is sent, and the
  // next one allocated (and filled) at once: the send's own reference is
  // what keeps its bytes from being reused before they are out.
  for (std::uint64_t round = 1; round < kGatherRounds; ++round) {
    std::vector<regpool::MessageToken> burst;
    std::vector<Slice> held;
    for (std::uint64_t i = 0; i < sizes.size(); ++i) {
      Slice s = gather_message(n, round, i, sizes[i]);
      auto t = n.m.send(rx, 5, s);
      REQUIRE(t.ok());
      burst.push_back(*t);
      if (round == 1) held.push_back(std::move(s));
    }
    boot->barrier(60s);
    for (auto t : burst) CHECK(n.m.wait(t, 60s).status == Status::ok);
  }
  boot->barrier(60s);
  CHECK(rpt::reap(kid, 60s) == 0);

  const regpool::MessengerStats st = n.m.stats();
  std::uint64_t expected = 0;
  for (std::uint64_t size : sizes) expected += size >= 4096 && size <= gather_max ? kGatherRounds : 0;
  expected -= 1;  // round 0's 8 KiB message, from the unregistered pool (8 KiB: within every cap)
  INFO(st.eager_gathered << " gathered of " << st.eager_sent << " eager sends");
  CHECK(st.rendezvous_sent == 0);
  if (on && rpt::gathers_sends(prov, rings)) {
    CHECK(st.eager_gathered == expected);
  } else {
    CHECK(st.eager_gathered == 0);
  }
}

TEST_CASE("messages in place: sends copied into the ring, receives matched where they lie, in order with the rest",
          "[fabric][messaging]") {
  // shm with message rings: eager sends are copied into the peer's ring
  // (no send operation) and a message whose receive is posted is copied
  // from the ring into it (no bounce). The burst's messages meet exhausted
  // credits, a fuller ring and receives not yet posted: those take the
  // posted paths (queued sends, bounces, unexpected messages), and every
  // one still arrives in order with its bytes (the receiver checks). Other
  // backends copy no sends; their messages are taken in place as their
  // bounce receives complete (before the bounce's callback), each copied
  // once into its posted receive there too.
  const std::string prov = GENERATE(from_range(rpt::backends()));
  const bool in_place = prov == "shm";
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn([&] { return kept_receiver(prov, port, true); }, 240);
  Node n(prov);
  const PeerId rx = n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  auto hello = n.s.alloc(64);
  REQUIRE(n.wait(n.m.recv(rx, 1, 0, rpt::slice_or_die(Slice::data(hello)))).status == Status::ok);
  auto reply = n.s.alloc(64);
  for (std::uint64_t i = 0; i < kKeptPingPongs; ++i) {
    auto answer = n.m.recv(rx, 6, 0, rpt::slice_or_die(Slice::data(reply)));
    REQUIRE(n.wait(n.m.send(rx, 5, n.filled(kept_size(i), 1000 + i))).status == Status::ok);
    const MessageCompletion c = n.wait(std::move(answer));
    REQUIRE(c.status == Status::ok);
    CHECK(c.length == 8);
    std::vector<std::byte> expect(8);
    rpt::fill(expect, i);
    CHECK(std::memcmp(reply.data().data(), expect.data(), 8) == 0);
  }
  // The Messenger lets go of the last receive's buffer at its next call.
  n.m.progress();
  CHECK(reply.use_count() == 1);
  const regpool::MessengerStats ping = n.m.stats();
  INFO(ping.eager_copied << " copied, " << ping.received_in_place << " received in place, " << ping.eager_kept
                         << " kept");
  if (in_place) {
    CHECK(ping.eager_copied == kKeptPingPongs);
    CHECK(ping.eager_kept == 0);
    CHECK(ping.received_in_place >= kKeptPingPongs);  // every reply's receive was posted before its ping
    CHECK(ping.handed_off > 0);  // replies that came while their wait spun
    CHECK(ping.handed_off <= ping.received_in_place);
    CHECK(ping.eager_brief > 0);  // the 8, 9 and 16-byte pings after the first
  } else {
    CHECK(ping.eager_copied == 0);
    CHECK(ping.received_in_place >= kKeptPingPongs);  // from the bounces, as they completed
    CHECK(ping.handed_off > 0);
    CHECK(ping.handed_off <= ping.received_in_place);
    CHECK(ping.eager_brief == 0);
  }
  send_burst(n, rx);
  boot->barrier(60s);
  CHECK(rpt::reap(kid, 60s) == 0);
  CHECK(n.m.stats().rejected == 0);
}

TEST_CASE("a sender with a lower shm copy limit: its longer messages are read from its buffer, on every receive path",
          "[fabric][messaging]") {
  // FabricEndpointOptions::shm_ring_copy_max is the sender's alone: above
  // it a message (a Messenger's control messages too, with a limit of 0)
  // goes as a large record that the receiver copies out of the sender's
  // memory, and the send completes once read. The receiver keeps the
  // default. Unexpected, then posted; every byte checked.
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  if (prov != "shm") {
    SUCCEED("the copy limit is the shm rings' (other backends: the tagged eager case)");
    return;
  }
  const std::uint64_t limit = GENERATE(std::uint64_t{0}, std::uint64_t{16} << 10);
  INFO("sender's copy limit " << limit);
  Node a(prov, {}, std::size_t{32} << 20, true, limit), b(prov);
  REQUIRE(a.s.ep->transfer_traits().fast_message_limit == limit);
  const PeerId to_b = a.s.ep->insert_peer(b.s.ep->name());
  const PeerId from_a = b.s.ep->insert_peer(a.s.ep->name());
  static constexpr std::uint64_t kSizes[] = {8, 4096, 16384, 16385, 40000, 65536};
  constexpr std::uint64_t kCount = std::size(kSizes);
  for (int phase = 0; phase < 2; ++phase) {
    INFO((phase == 0 ? "unexpected" : "posted"));
    std::vector<regpool::Ldo> bufs;
    std::vector<regpool::Result<regpool::MessageToken>> recvs;
    if (phase == 1) {
      for (const std::uint64_t n : kSizes) {
        bufs.push_back(b.s.alloc(n));
        recvs.push_back(b.m.recv(from_a, 7, 0, rpt::slice_or_die(Slice::data(bufs.back()))));
      }
    }
    // Sent without waiting: a message read from a's buffer completes only
    // once b has read it, which b's progress below does.
    std::vector<regpool::Result<regpool::MessageToken>> sends;
    for (std::uint64_t i = 0; i < kCount; ++i) sends.push_back(a.m.send(to_b, 7, a.filled(kSizes[i], 10 * phase + i)));
    if (phase == 0) {
      const auto until = std::chrono::steady_clock::now() + 30s;
      while (b.m.stats().unexpected_held < kCount && std::chrono::steady_clock::now() < until) {
        (void)b.m.progress();
        (void)a.m.progress();
      }
      REQUIRE(b.m.stats().unexpected_held == kCount);
      for (const std::uint64_t n : kSizes) {
        bufs.push_back(b.s.alloc(n));
        recvs.push_back(b.m.recv(from_a, 7, 0, rpt::slice_or_die(Slice::data(bufs.back()))));
      }
    }
    for (std::uint64_t i = 0; i < kCount; ++i) {
      const MessageCompletion c = b.wait(std::move(recvs[i]));
      INFO("message " << i << ", " << kSizes[i] << " bytes");
      REQUIRE(c.status == Status::ok);
      CHECK(c.length == kSizes[i]);
      std::vector<std::byte> expect(kSizes[i]);
      rpt::fill(expect, 10 * phase + i);
      CHECK(std::memcmp(bufs[i].data().data(), expect.data(), kSizes[i]) == 0);
    }
    for (auto& t : sends) CHECK(a.wait(std::move(t)).status == Status::ok);
  }
#if REGPOOL_HAVE_FABRIC
  const auto* fa = dynamic_cast<const regpool::FabricEndpoint*>(a.s.ep.get());
  REQUIRE(fa != nullptr);
  // Every message above the limit, both phases (and with 0, the protocol's
  // own messages too).
  CHECK(fa->shm_stats().ring_large_sends >= 2 * (limit == 0 ? kCount : 3));
#endif
  CHECK(b.m.stats().rejected == 0);
  CHECK(b.m.stats().unexpected_held == 0);
}

TEST_CASE("a Messenger that takes messages where they lie has its long ones copied or sent by rendezvous, never large",
          "[fabric][messaging]") {
  // FabricEndpointOptions::shm_ring_adaptive (on by default) lets a send
  // over 16 KiB go as a read from the sender's buffer now and then, to
  // measure that path. A receiver whose Messenger takes such messages in
  // place asks for no large records (a read into a bounce costs it a
  // posted receive and a copy more): after the first message, none is
  // sent large. The sending Messenger instead chooses between the copy
  // and a rendezvous, whose receive reads straight into the receiver's
  // buffer (MessengerConfig::rendezvous_choice: on by default, or off):
  // while nothing says the read is cheaper, it probes with rendezvous at
  // the 63rd and 64th messages.
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  if (prov != "shm") {
    SUCCEED("the choice of path is the shm rings'");
    return;
  }
  const bool choice = GENERATE(true, false);
  INFO("rendezvous_choice " << (choice ? "default (16 KiB)" : "UINT64_MAX (never)"));
  MessengerConfig mc;
  if (!choice) mc.rendezvous_choice = ~std::uint64_t{0};
  Node a(prov, mc), b(prov);
  const PeerId to_b = a.s.ep->insert_peer(b.s.ep->name());
  const PeerId from_a = b.s.ep->insert_peer(a.s.ep->name());
  hear_limits(a, to_b, b, from_a);
  // Four times the first probe's distance: without the receiver's word,
  // several would have gone large.
  constexpr std::uint64_t kMessages = 256;
  constexpr std::uint64_t kSize = 32 * 1024;
  auto in = b.s.alloc(kSize);
  std::vector<std::byte> expect(kSize);
  for (std::uint64_t i = 0; i < kMessages; ++i) {
    auto r = b.m.recv(from_a, 9, 0, rpt::slice_or_die(Slice::data(in)));
    auto t = a.m.send(to_b, 9, a.filled(kSize, i));
    const MessageCompletion c = b.wait(std::move(r));
    REQUIRE(c.status == Status::ok);
    REQUIRE(c.length == kSize);
    rpt::fill(expect, i);
    REQUIRE(std::memcmp(in.data().data(), expect.data(), kSize) == 0);
    REQUIRE(a.wait(std::move(t)).status == Status::ok);
  }
#if REGPOOL_HAVE_FABRIC
  const auto* fa = dynamic_cast<const regpool::FabricEndpoint*>(a.s.ep.get());
  REQUIRE(fa != nullptr);
  CHECK(fa->shm_stats().ring_sends >= kMessages);
  CHECK(fa->shm_stats().ring_large_sends == 0);
  // Each rendezvous's receive read the message by the receiver's own
  // cross-memory copy, the path whose cost it publishes.
  const auto* fb = dynamic_cast<const regpool::FabricEndpoint*>(b.s.ep.get());
  REQUIRE(fb != nullptr);
  CHECK(fb->shm_stats().direct_rma >= a.m.stats().rendezvous_chosen);
#endif
  const regpool::MessengerStats st = a.m.stats();
  INFO(st.eager_sent << " eager (" << st.eager_copied << " copied), " << st.rendezvous_chosen << " by rendezvous of "
                       << st.rendezvous_sent);
  CHECK(st.rendezvous_chosen == st.rendezvous_sent);
  CHECK(st.eager_sent + st.rendezvous_chosen == kMessages);
  if (choice) {
    CHECK(st.rendezvous_chosen >= 1);
  } else {
    CHECK(st.rendezvous_sent == 0);
  }
  CHECK(b.m.stats().rejected == 0);
}

TEST_CASE("copied eager: send() copies payloads up to eager_copy into the ring, longer ones are posted",
          "[fabric][messaging]") {
  // MessengerConfig::eager_copy: by default every eager payload the ring
  // takes (up to 64 KiB here) is copied straight from the caller's buffer,
  // the send done as send() returns; at 8 KiB the longer ones are built in
  // a message object and posted; UINT64_MAX copies none. Sent one at a
  // time (the ring empty each time: streams post theirs above 16 KiB),
  // each received into a posted receive and checked byte for byte, from
  // sources at offsets that would alias the ring's copy (a record's payload
  // starts 80 bytes into the ring when the ring starts over).
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  if (prov != "shm") {
    SUCCEED("only shm with regpool's rings copies sends into the transport");
    return;
  }
  const std::uint64_t copy = GENERATE(std::uint64_t{0}, std::uint64_t{8192}, ~std::uint64_t{0});
  INFO("eager_copy " << copy);
  MessengerConfig mc;
  mc.eager_copy = copy;
  Node a(prov, mc), b(prov);
  const PeerId to_b = a.s.ep->insert_peer(b.s.ep->name());
  const PeerId from_a = b.s.ep->insert_peer(a.s.ep->name());
  hear_limits(a, to_b, b, from_a);
  static constexpr std::uint64_t kSizes[] = {4096, 8192, 12000, 40000, 65536};
  static constexpr std::uint64_t kOffsets[] = {0, 16, 80, 2048, 4000};
  std::uint64_t expect_copied = 0, seed = 0;
  auto out = a.s.alloc(65536 + 4096);
  auto in = b.s.alloc(65536);
  for (const std::uint64_t n : kSizes) {
    for (const std::uint64_t at : kOffsets) {
      INFO(n << " bytes from offset " << at);
      const Slice src = rpt::slice_or_die(rpt::slice_or_die(Slice::data(out)).select(at, n));
      rpt::fill(src.bytes(), ++seed);
      auto r = b.m.recv(from_a, 4, 0, rpt::slice_or_die(Slice::data(in)));
      auto t = a.m.send(to_b, 4, src);
      const MessageCompletion c = b.wait(std::move(r));
      REQUIRE(c.status == Status::ok);
      REQUIRE(c.length == n);
      std::vector<std::byte> expect(n);
      rpt::fill(expect, seed);
      REQUIRE(std::memcmp(in.data().data(), expect.data(), n) == 0);
      REQUIRE(a.wait(std::move(t)).status == Status::ok);
      expect_copied += copy == 0 || n <= copy;
    }
  }
  if (copy == ~std::uint64_t{0}) expect_copied = 0;
  CHECK(a.m.stats().eager_copied == expect_copied);
  CHECK(a.m.stats().eager_sent == std::size(kSizes) * std::size(kOffsets));
  CHECK(b.m.stats().rejected == 0);
}

// ------------------------------------------------------------ split eager
// Split eager (messaging_wire.hpp, "Split eager"): messages the header
// pushes past the backend's fast message limit (shm) leave as a lead and
// parts; every backend's receiver reassembles them, so the forged cases
// below run on all of them.
namespace {

const std::vector<std::uint64_t> kSplitSizes = {4096, 5000, 8192, 16384};

int split_sender(const std::string& prov, std::uint16_t port, bool rings) {
  auto b = rpt::child_bootstrap(port);
  Node n(prov, {}, std::size_t{32} << 20, rings);
  const PeerId rx = n.s.ep->insert_peer(b->allgather(n.s.ep->name(), 30s)[0]);
  // The receiver's first message teaches us its threshold and credits.
  auto hello = n.s.alloc(64);
  RPT_CHECK(n.wait(n.m.recv(rx, 1, 0, rpt::slice_or_die(Slice::data(hello)))).status == Status::ok);
  // Phase 1: unexpected; phase 2: posted (the receiver says when).
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<regpool::MessageToken> t;
    for (std::size_t k = 0; k < kSplitSizes.size(); ++k) {
      auto r = n.m.send(rx, 20 + k, n.filled(kSplitSizes[k], 100 * phase + k));
      RPT_CHECK(r.ok());
      t.push_back(*r);
    }
    for (auto x : t) RPT_CHECK(n.m.wait(x, 60s).status == Status::ok);
    b->barrier(60s);  // phase 0: the receiver took them and posted phase 1's receives
  }
  const auto split = n.m.stats().eager_split;
  // Split where the backend measured it to pay (shm's provider path; not
  // shm's rings, whose fast path takes every message up to 64 KiB).
  RPT_CHECK(n.s.ep->transfer_traits().split_crossover != 0 ? split == 2 * kSplitSizes.size() : split == 0);
  return 0;
}

bool holds(std::span<const std::byte> got, std::uint64_t size, std::uint64_t seed) {
  std::vector<std::byte> expect(size);
  rpt::fill(expect, seed);
  return got.size() >= size && std::memcmp(got.data(), expect.data(), size) == 0;
}

}  // namespace

TEST_CASE("brief eager messages: small payloads in one ring line, on every receive path, in order",
          "[fabric][messaging]") {
  // shm with message rings: once a peer has had a full header from us,
  // payloads of up to 16 bytes are copied into its ring behind a 32-byte
  // header (one cache line with the record's). They must arrive like any
  // eager message: taken in place, held unexpected (the bounce's payload
  // moved to where a full header's would be), handed over by recv_ldo,
  // truncated, in order with the larger ones around them.
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  if (prov != "shm") {
    SUCCEED("brief headers are the shm rings' copy path (other backends: the messages-in-place case)");
    return;
  }
  Node a(prov), b(prov);
  const PeerId to_b = a.s.ep->insert_peer(b.s.ep->name());
  const PeerId from_a = b.s.ep->insert_peer(a.s.ep->name());
  // Each side's first message announces its limits with a full header.
  auto hello_in = b.s.alloc(64);
  auto hello_t = b.m.recv(from_a, 1, 0, rpt::slice_or_die(Slice::data(hello_in)));
  REQUIRE(a.wait(a.m.send(to_b, 1, a.filled(8, 1))).status == Status::ok);
  REQUIRE(b.wait(std::move(hello_t)).status == Status::ok);
  auto back_in = a.s.alloc(64);
  auto back_t = a.m.recv(to_b, 2, 0, rpt::slice_or_die(Slice::data(back_in)));
  REQUIRE(b.wait(b.m.send(from_a, 2, b.filled(8, 2))).status == Status::ok);
  REQUIRE(a.wait(std::move(back_t)).status == Status::ok);
  const std::uint64_t brief_before = a.m.stats().eager_brief;
  CHECK(brief_before == 0);  // both were first messages

  // Unexpected: nothing posted at b while these arrive.
  static constexpr std::uint64_t kSizes[] = {1, 8, 15, 16, 17, 40, 3, 16, 9, 64, 12, 2};
  constexpr std::uint64_t kCount = std::size(kSizes);
  std::uint64_t brief_sent = 0;
  for (std::uint64_t i = 0; i < kCount; ++i) {
    REQUIRE(a.wait(a.m.send(to_b, 3, a.filled(kSizes[i], 100 + i))).status == Status::ok);
    if (kSizes[i] <= 16) ++brief_sent;
  }
  CHECK(a.m.stats().eager_brief == brief_before + brief_sent);
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (b.m.stats().unexpected_held < kCount && std::chrono::steady_clock::now() < until) (void)b.m.progress();
  REQUIRE(b.m.stats().unexpected_held == kCount);
  for (std::uint64_t i = 0; i < kCount; ++i) {
    const std::uint64_t n = kSizes[i];
    std::vector<std::byte> expect(n);
    rpt::fill(expect, 100 + i);
    INFO("message " << i << ", " << n << " bytes");
    if (i % 3 == 1) {
      // Zero copy: the bounce (or held copy) itself, its data() exactly the payload.
      const MessageCompletion c = b.wait(b.m.recv_ldo(from_a, 3, 0));
      REQUIRE(c.status == Status::ok);
      CHECK(c.length == n);
      REQUIRE(c.ldo.data().size() == n);
      CHECK(std::memcmp(c.ldo.data().data(), expect.data(), n) == 0);
    } else if (i % 3 == 2 && n > 2) {
      // A buffer two bytes short: the first n - 2 bytes, truncated.
      auto buf = b.s.alloc(n - 2);
      const MessageCompletion c = b.wait(b.m.recv(from_a, 3, 0, rpt::slice_or_die(Slice::data(buf))));
      CHECK(c.status == Status::truncated);
      CHECK(c.length == n);
      CHECK(c.received == n - 2);
      CHECK(std::memcmp(buf.data().data(), expect.data(), n - 2) == 0);
    } else {
      auto buf = b.s.alloc(64);
      const MessageCompletion c = b.wait(b.m.recv(from_a, 3, 0, rpt::slice_or_die(Slice::data(buf))));
      REQUIRE(c.status == Status::ok);
      CHECK(c.length == n);
      CHECK(c.received == n);
      CHECK(std::memcmp(buf.data().data(), expect.data(), n) == 0);
    }
  }
  // Posted first: taken where it lies in the ring, copied once.
  const std::uint64_t in_place_before = b.m.stats().received_in_place;
  for (std::uint64_t i = 0; i < 8; ++i) {
    auto buf = b.s.alloc(64);
    auto t = b.m.recv(from_a, 4, 0, rpt::slice_or_die(Slice::data(buf)));
    REQUIRE(a.wait(a.m.send(to_b, 4, a.filled(1 + i * 2, 200 + i))).status == Status::ok);
    const MessageCompletion c = b.wait(std::move(t));
    REQUIRE(c.status == Status::ok);
    CHECK(c.length == 1 + i * 2);
    std::vector<std::byte> expect(1 + i * 2);
    rpt::fill(expect, 200 + i);
    CHECK(std::memcmp(buf.data().data(), expect.data(), expect.size()) == 0);
  }
  CHECK(b.m.stats().received_in_place >= in_place_before + 8);
  CHECK(a.m.stats().eager_brief == brief_before + brief_sent + 8);
  CHECK(b.m.stats().rejected == 0);
  CHECK(b.m.stats().unexpected_held == 0);
}

TEST_CASE("split eager messages: unexpected, posted, zero copy, truncated, every byte", "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  // shm: through regpool's rings (nothing split) and the provider's path.
  const bool rings = GENERATE(true, false);
  if (!rings && prov != "shm") return;
  INFO("backend " << prov << (rings ? "" : ", provider's message path"));
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn([&] { return split_sender(prov, port, rings); }, 240);
  Node n(prov, {}, std::size_t{32} << 20, rings);
  const PeerId tx = n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  auto buf = n.s.alloc(16384);
  REQUIRE(n.wait(n.m.send(tx, 1, n.filled(8, 0))).status == Status::ok);
  // Phase 1: all four arrive unexpected, each held whole once its parts are in.
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (n.m.stats().unexpected_held < kSplitSizes.size() && std::chrono::steady_clock::now() < until) {
    n.m.progress();
  }
  REQUIRE(n.m.stats().unexpected_held == kSplitSizes.size());
  for (std::size_t k = 0; k < kSplitSizes.size(); ++k) {
    const std::uint64_t size = kSplitSizes[k];
    if (k % 2 == 0) {
      const MessageCompletion c = n.wait(n.m.recv(tx, 20 + k, 0, rpt::slice_or_die(Slice::data(buf))));
      REQUIRE(c.status == Status::ok);
      CHECK(c.received == size);
      CHECK(holds(buf.data(), size, k));
    } else {
      const MessageCompletion c = n.wait(n.m.recv_ldo(tx, 20 + k, 0));
      REQUIRE(c.status == Status::ok);
      REQUIRE(c.ldo);
      CHECK(c.ldo.data().size() == size);
      CHECK(holds(c.ldo.data(), size, k));
    }
  }
  CHECK(n.m.stats().unexpected_held == 0);
  // Phase 2: receives posted first: into a buffer, zero copy, and two
  // truncated (a 5000-byte message into 3000 bytes: its parts past the
  // buffer are dropped; 16384 into 10000), guard bytes intact.
  auto small = n.s.alloc(3000 + 64);
  auto mid = n.s.alloc(10000 + 64);
  std::memset(small.data().data(), 0x5a, small.data().size());
  std::memset(mid.data().data(), 0x5a, mid.data().size());
  auto r0 = n.m.recv(tx, 20, 0, rpt::slice_or_die(Slice::data(buf)));
  auto r1 = n.m.recv(tx, 21, 0, rpt::slice_or_die(Slice::data(small, 0, 3000)));
  auto r2 = n.m.recv_ldo(tx, 22, 0);
  auto r3 = n.m.recv(tx, 23, 0, rpt::slice_or_die(Slice::data(mid, 0, 10000)));
  REQUIRE((r0.ok() && r1.ok() && r2.ok() && r3.ok()));
  boot->barrier(60s);
  MessageCompletion c = n.m.wait(*r0, 60s);
  REQUIRE(c.status == Status::ok);
  CHECK(holds(buf.data(), 4096, 100));
  c = n.m.wait(*r1, 60s);
  CHECK(c.status == Status::truncated);
  CHECK(c.length == 5000);
  CHECK(c.received == 3000);
  CHECK(holds(small.data(), 3000, 101));
  bool guard = true;
  for (std::size_t k = 3000; k < small.data().size(); ++k) guard &= small.data()[k] == std::byte{0x5a};
  for (std::size_t k = 10000; k < mid.data().size(); ++k) guard &= mid.data()[k] == std::byte{0x5a};
  c = n.m.wait(*r2, 60s);
  REQUIRE(c.status == Status::ok);
  REQUIRE(c.ldo);
  CHECK(c.ldo.data().size() == 8192);
  CHECK(holds(c.ldo.data(), 8192, 102));
  c = n.m.wait(*r3, 60s);
  CHECK(c.status == Status::truncated);
  CHECK(c.received == 10000);
  CHECK(holds(mid.data(), 10000, 103));
  CHECK(guard);
  CHECK(n.m.stats().rejected == 0);
  boot->barrier(60s);
  CHECK(rpt::reap(kid, 60s) == 0);
}

namespace {

// The hostile sender of split eager messages: a bare endpoint sending
// leads, parts and eager messages it encodes itself, each completed before
// the next is posted. Message payloads: byte j of message m is m + j.
struct Forged {
  regpool::detail::msgwire::Type type;
  std::uint64_t seq, tag, length, offset, carried;
};

// Sends `msgs` from the bare endpoint of `s` to rx, each completed before
// the next is posted.
int send_forged(rpt::Stack& s, PeerId rx, const std::vector<Forged>& msgs) {
  namespace mw = regpool::detail::msgwire;
  using T = mw::Type;
  for (const Forged& f : msgs) {
    auto l = s.alloc(mw::kHeaderSize + f.carried);
    mw::Header h;
    h.type = f.type;
    h.tag = f.type == T::part ? f.offset : f.tag;
    h.length = f.length;
    h.msg_id = f.type == T::eager ? f.seq : f.tag;  // a lead and its parts: the message's tag as its id
    h.seq = f.seq;
    mw::encode(h, l.data().data());
    for (std::uint64_t j = 0; j < f.carried; ++j) {
      l.data()[mw::kHeaderSize + j] = static_cast<std::byte>(f.tag + f.offset + j);
    }
    auto t = s.ep->send(rx, rpt::slice_or_die(Slice::data(l, 0, mw::kHeaderSize + f.carried)));
    RPT_CHECK(t.ok());
    RPT_CHECK(s.ep->wait(*t, 30s).status == Status::ok);
  }
  return 0;
}

int forged_split_sender(const std::string& prov, std::uint16_t port) {
  using T = regpool::detail::msgwire::Type;
  auto b = rpt::child_bootstrap(port);
  rpt::Stack s(prov, ep_config());
  const PeerId rx = s.ep->insert_peer(b->allgather(s.ep->name(), 30s)[0]);
  const auto send_all = [&](const std::vector<Forged>& msgs) { return send_forged(s, rx, msgs); };
  // For a part, `tag` is the message's tag (the forger's msg_id for it).
  RPT_CHECK(send_all({
      {T::lead, 1, 40, 100, 0, 60}, {T::part, 2, 40, 40, 60, 40},  // whole: 100 bytes
      {T::part, 5, 41, 50, 50, 50},                                 // early, waits for 3 and 4
      {T::lead, 3, 41, 100, 0, 20}, {T::part, 4, 41, 30, 20, 30},   // then 5 completes it
      {T::lead, 6, 42, 100, 0, 20}, {T::eager, 7, 43, 8, 0, 8},     // 42 abandoned, 43 arrives
      {T::part, 8, 44, 10, 20, 10},                                 // a part of nothing
      {T::lead, 9, 45, 100, 0, 20}, {T::part, 10, 45, 30, 30, 30},  // wrong offset: 45 abandoned
      {T::eager, 11, 46, 8, 0, 8},
  }) == 0);
  b->barrier(60s);  // the receiver posted a receive for tag 47
  RPT_CHECK(send_all({{T::lead, 12, 47, 100, 0, 20}, {T::eager, 13, 48, 8, 0, 8}}) == 0);
  b->barrier(60s);  // the receiver posted a receive for tag 49
  RPT_CHECK(send_all({{T::lead, 14, 49, 100, 0, 20}}) == 0);
  b->barrier(60s);  // that receive timed out
  RPT_CHECK(send_all({{T::part, 15, 49, 80, 20, 80}, {T::eager, 16, 50, 8, 0, 8}}) == 0);
  b->barrier(60s);
  return 0;
}

bool forged_bytes(std::span<const std::byte> got, std::uint64_t tag, std::uint64_t n) {
  for (std::uint64_t j = 0; j < n; ++j) {
    if (got[j] != static_cast<std::byte>(tag + j)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("split eager from a hostile peer: early parts ordered, broken messages dropped, the rest intact",
          "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn([&] { return forged_split_sender(prov, port); }, 240);
  MessengerConfig mc;
  mc.rendezvous_timeout = 300ms;  // a split message whose parts stop coming
  Node n(prov, mc);
  const PeerId tx = n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  // Held whole: 40, 41 (its early part released in order), 43, 46. Dropped:
  // 42 (a new message before its parts), the stray part, 45's misplaced part.
  const auto until = std::chrono::steady_clock::now() + 60s;
  while ((n.m.stats().unexpected_held < 4 || n.m.stats().rejected < 3) && std::chrono::steady_clock::now() < until) {
    n.m.progress();
  }
  REQUIRE(n.m.stats().unexpected_held == 4);
  CHECK(n.m.stats().rejected == 3);
  auto buf = n.s.alloc(128);
  for (const std::uint64_t tag : {40, 41}) {
    const MessageCompletion c = n.wait(n.m.recv(tx, tag, 0, rpt::slice_or_die(Slice::data(buf))), 10s);
    REQUIRE(c.status == Status::ok);
    CHECK(c.received == 100);
    CHECK(forged_bytes(buf.data(), tag, 100));
  }
  for (const std::uint64_t tag : {43, 46}) {
    const MessageCompletion c = n.wait(n.m.recv(tx, tag, 0, rpt::slice_or_die(Slice::data(buf))), 10s);
    REQUIRE(c.status == Status::ok);
    CHECK(c.received == 8);
  }
  CHECK(n.m.probe(tx, 42, 0).status() == Status::would_block);
  CHECK(n.m.probe(tx, 45, 0).status() == Status::would_block);
  // A posted receive the lead matched fails when the message breaks off.
  auto r = n.m.recv(tx, 47, 0, rpt::slice_or_die(Slice::data(buf)));
  REQUIRE(r.ok());
  boot->barrier(60s);
  CHECK(n.m.wait(*r, 30s).status == Status::malformed);
  const MessageCompletion c = n.wait(n.m.recv(tx, 48, 0, rpt::slice_or_die(Slice::data(buf))), 30s);
  CHECK(c.status == Status::ok);
  CHECK(n.m.stats().rejected == 4);
  // A lead whose parts never come: the receive it matched fails at the
  // deadline (rendezvous_timeout); its part, late, is rejected and the
  // next message arrives.
  r = n.m.recv(tx, 49, 0, rpt::slice_or_die(Slice::data(buf)));
  REQUIRE(r.ok());
  boot->barrier(60s);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(n.m.wait(*r, 30s).status == Status::timeout);
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  boot->barrier(60s);
  CHECK(n.wait(n.m.recv(tx, 50, 0, rpt::slice_or_die(Slice::data(buf))), 30s).status == Status::ok);
  CHECK(n.m.stats().rejected == 5);
  boot->barrier(60s);
  CHECK(rpt::reap(kid, 60s) == 0);
}

TEST_CASE("a sender killed between a split message's lead and its parts: the receive fails in bound",
          "[fabric][messaging]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov, ep_config());
        const PeerId rx = s.ep->insert_peer(b->allgather(s.ep->name(), 30s)[0]);
        b->barrier(60s);  // the receive is posted
        RPT_CHECK(send_forged(s, rx, {{regpool::detail::msgwire::Type::lead, 1, 60, 100, 0, 20}}) == 0);
        std::this_thread::sleep_for(60s);  // until the parent kills us
        return 1;
      },
      120);
  // On shm the endpoint sees the process die (peer_unreachable); over tcp
  // a peer we only receive from is not watched, and the deadline
  // (rendezvous_timeout) ends the receive.
  MessengerConfig mc;
  mc.rendezvous_timeout = 5s;
  Node n(prov, mc);
  (void)n.s.ep->insert_peer(boot->allgather(n.s.ep->name(), 30s)[1]);
  auto buf = n.s.alloc(128);
  auto r = n.m.recv(regpool::kAnyPeer, 60, 0, rpt::slice_or_die(Slice::data(buf)));
  REQUIRE(r.ok());
  boot->barrier(60s);
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (n.m.stats().received == 0 && std::chrono::steady_clock::now() < until) n.m.progress();
  REQUIRE(n.m.stats().received == 1);  // the lead matched
  ::kill(kid.pid, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  const MessageCompletion c = n.m.wait(*r, 60s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("receive completed with " << regpool::to_string(c.status) << " after " << took << " s");
  if (prov == "shm") {
    CHECK(c.status == Status::peer_unreachable);
    CHECK(took < 4.0);
  } else {
    CHECK((c.status == Status::peer_unreachable || c.status == Status::timeout));
  }
  CHECK(took < 15.0);
  CHECK(rpt::reap(kid, 10s) == 128 + SIGKILL);
}
