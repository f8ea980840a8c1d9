// Endpoint conformance between two (or three) real processes, for every
// backend in rpt::backends(): libfabric shm and tcp (tcp;ofi_rxm) on
// loopback, or verbs on one rxe device inside the Soft-RoCE guest. Targets
// run the endpoint's progress thread: on manual-progress providers an
// operation completes only while its target progresses, verbs needs the
// target's progress for connection setup, and the targets here spend their
// time blocked in the bootstrap.

#include <catch2/catch.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <span>
#include <thread>
#include <string>
#include <vector>

#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::Completion;
using regpool::Exposure;
using regpool::RemoteAccess;
using regpool::RemoteRef;
using regpool::Slice;
using regpool::Status;

namespace {

regpool::EndpointConfig target_config() {
  regpool::EndpointConfig c;
  c.progress_thread = true;
  c.progress_idle_sleep = 0us;  // spin: targets serve peers' latency-bound traffic
  return c;
}




struct Measure {
  std::uint64_t size;
  std::uint64_t offset;
  std::uint64_t hash;
};

constexpr std::uint64_t kMessages = 3000;
constexpr std::uint64_t kMaxMsg = 4096;
constexpr std::size_t kRecvs = 64;
constexpr std::size_t kWindow = 32;
std::uint64_t msg_size(std::uint64_t i) { return 8 + (i * 37) % (kMaxMsg - 8); }

const std::vector<std::uint64_t> kSizes = {1, 3, 4096 + 1, 65536 + 3, (1u << 20) + 7, (16u << 20) + 5, 64u << 20};

}  // namespace

TEST_CASE("put and get move exact bytes, 1 B to 64 MiB, at unaligned offsets", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  constexpr std::uint64_t kSlack = 64;

  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov);
        auto all = b->allgather(s.ep->name(), 20s);
        auto parts = regpool::unpack_blobs(all[0]);
        const auto peer = s.ep->insert_peer(parts[0]);
        const RemoteRef ref = rpt::decode_or_die(parts[1]);
        auto src = s.alloc((64u << 20) + kSlack);
        for (std::uint64_t size : kSizes) {
          // put: local bytes at offset 3, remote offset 5 + size % 7
          const std::uint64_t lo = 3, ro = 5 + size % 7;
          auto local = rpt::slice_or_die(Slice::data(src, lo, size));
          rpt::fill(local.bytes(), size);
          const Completion c = rpt::wait_ok(*s.ep, s.ep->put(local, peer, ref, ro));
          if (c.status != Status::ok) std::fprintf(stderr, "put %llu: %s\n", (unsigned long long)size, regpool::to_string(c.status));
          RPT_CHECK(c.status == Status::ok && c.bytes == size);
          (void)b->allgather(rpt::pod_bytes(Measure{size, ro, rpt::hash(local.bytes())}), 60s);
          // get: the target wrote a fresh pattern and tells us where and its hash
          auto theirs = rpt::from_bytes<Measure>(b->allgather({}, 60s)[0]);
          RPT_CHECK(theirs.size == size);
          auto into = rpt::slice_or_die(Slice::data(src, 5, size));
          std::memset(into.address(), 0, size);
          const Completion g = rpt::wait_ok(*s.ep, s.ep->get(peer, ref, theirs.offset, into));
          RPT_CHECK(g.status == Status::ok && g.bytes == size);
          const std::uint64_t mine = rpt::hash(into.bytes());
          (void)b->allgather(rpt::pod_bytes(mine), 60s);
          RPT_CHECK(mine == theirs.hash);
        }
        return 0;
      },
      240);

  rpt::Stack s(prov, target_config());
  auto target = s.alloc((64u << 20) + kSlack);
  auto whole = rpt::slice_or_die(Slice::data(target));
  auto exposure = s.ep->expose(whole, RemoteAccess::read_write);
  REQUIRE(exposure.ok());
  auto all = boot->allgather(regpool::pack_blobs({s.ep->name(), rpt::encoded(*exposure)}), 20s);
  for (std::uint64_t size : kSizes) {
    INFO("size " << size);
    auto m = rpt::from_bytes<Measure>(boot->allgather({}, 60s)[1]);
    REQUIRE(m.size == size);
    CHECK(rpt::hash({target.data().data() + m.offset, size}) == m.hash);
    const std::uint64_t ro2 = 1 + size % 5;
    auto region = rpt::slice_or_die(Slice::data(target, ro2, size));
    rpt::fill(region.bytes(), size * 7 + 1);
    // Hash now: once the initiator has reported, its next put may already be
    // landing in this region.
    const std::uint64_t filled = rpt::hash(region.bytes());
    (void)boot->allgather(rpt::pod_bytes(Measure{size, ro2, filled}), 60s);
    auto theirs = rpt::from_bytes<std::uint64_t>(boot->allgather({}, 60s)[1]);
    CHECK(theirs == filled);
  }
  CHECK(rpt::reap(kid, 60s) == 0);
}

TEST_CASE("send and recv deliver many messages in order and intact", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  // shm has three message paths, which must all deliver the same: regpool's
  // own rings (the default), and with FabricEndpointOptions::shm_rings off
  // the provider's, where every message here (8 B to 4 KiB) is within its
  // inject size and goes by fi_inject unless inject_sends is off. verbs has
  // two: sends up to the inline size complete at their post
  // (VerbsEndpointOptions::inject_sends), or (off) from their own work
  // completions. Other backends have one way.
  const int path = GENERATE(0, 1, 2);
  if (path == 1 && prov != "shm") return;
  if (path == 2 && prov != "shm" && prov != "verbs") return;
  const bool rings = path == 0;
  const bool inject = path != 2;
  // Fresh receives, each posted again from its callback, and fresh sends;
  // or kept receives (post_recv_kept) that their callbacks repost, and kept
  // sends (send_kept), one per window slot, reposted from a new slice of
  // the slot's bytes for each message (lengths change every time).
  const bool kept = GENERATE(false, true);
  INFO("backend " << prov << (inject ? rings ? "" : ", provider's message path"
                                     : prov == "verbs" ? ", inject_sends off" : ", provider's message path, inject_sends off")
                   << (kept ? ", kept receives and sends" : ""));
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();

  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov, {}, std::size_t{16} << 20, 0, inject, rings);
        auto all = b->allgather(s.ep->name(), 20s);
        const auto peer = s.ep->insert_peer(all[0]);
        auto buf = s.alloc(kWindow * kMaxMsg);
        std::vector<regpool::Token> pending(kWindow);
        for (std::uint64_t i = 0; i < kMessages; ++i) {
          const std::size_t w = i % kWindow;
          if (pending[w]) RPT_CHECK(s.ep->wait(pending[w], 30s).status == Status::ok);
          auto m = rpt::slice_or_die(Slice::data(buf, w * kMaxMsg, msg_size(i)));
          rpt::fill(m.bytes(), i);
          std::memcpy(m.address(), &i, 8);
          if (kept && pending[w]) {
            RPT_CHECK(s.ep->repost(pending[w], m) == Status::ok);
            continue;
          }
          auto t = kept ? s.ep->send_kept(peer, m) : s.ep->send(peer, m);
          RPT_CHECK(t.ok());
          pending[w] = *t;
        }
        for (auto& t : pending) {
          if (t) RPT_CHECK(s.ep->wait(t, 30s).status == Status::ok);
        }
        if (kept) {
          // Each parked send holds one reference to `buf`; ending them
          // gives them back, and a second end is refused.
          RPT_CHECK(buf.use_count() == 1 + kWindow);
          for (const auto t : pending) RPT_CHECK(s.ep->end_kept(t) == Status::ok);
          for (const auto t : pending) RPT_CHECK(s.ep->end_kept(t) == Status::invalid_argument);
          RPT_CHECK(buf.use_count() == 1);
        }
        b->barrier(60s);
        return 0;
      },
      120);

  rpt::Stack s(prov, {}, std::size_t{16} << 20, 0, true, rings);
  auto all = boot->allgather(s.ep->name(), 20s);
  auto buf = s.alloc(kRecvs * kMaxMsg);
  std::uint64_t received = 0, in_order = 0, intact = 0;
  struct Ctx {
    rpt::Stack* s;
    regpool::Ldo* buf;
    std::uint64_t* received;
    std::uint64_t* in_order;
    std::uint64_t* intact;
  } ctx{&s, &buf, &received, &in_order, &intact};
  // Each receive re-posts itself from its callback (callbacks run outside the
  // endpoint's lock, so that is allowed): a new one, or the kept one again.
  std::vector<regpool::Token> kept_tokens(kRecvs);
  std::uint64_t repost_failures = 0;
  std::function<void(std::size_t)> post = [&](std::size_t k) {
    if (kept && kept_tokens[k]) {
      if (s.ep->repost(kept_tokens[k]) != Status::ok) ++repost_failures;
      return;
    }
    auto slot = rpt::slice_or_die(Slice::data(buf, k * kMaxMsg, kMaxMsg));
    auto on_message = [&ctx, &post, k](const Completion& c) {
      if (c.status != Status::ok) return;
      const std::byte* p = ctx.buf->data().data() + k * kMaxMsg;
      std::uint64_t seq = 0;
      std::memcpy(&seq, p, 8);
      if (seq == *ctx.received) ++*ctx.in_order;
      std::vector<std::byte> expect(msg_size(seq));
      rpt::fill(expect, seq);
      std::memcpy(expect.data(), &seq, 8);
      if (c.bytes == expect.size() && std::memcmp(p, expect.data(), expect.size()) == 0) ++*ctx.intact;
      ++*ctx.received;
      post(k);
    };
    auto t = kept ? s.ep->post_recv_kept(slot, on_message) : s.ep->post_recv(slot, on_message);
    REQUIRE(t.ok());
    if (kept) kept_tokens[k] = *t;
  };
  for (std::size_t k = 0; k < kRecvs; ++k) post(k);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (received < kMessages && std::chrono::steady_clock::now() < deadline) s.ep->progress();
  CHECK(received == kMessages);
  CHECK(in_order == kMessages);
  CHECK(intact == kMessages);
  CHECK(repost_failures == 0);
  if (kept) {
    // Every kept receive is posted again, holding its reference to `buf`;
    // ending them gives the references back, and a second end is refused.
    CHECK(buf.use_count() == 1 + static_cast<std::uint32_t>(kRecvs));
    for (const auto t : kept_tokens) CHECK(s.ep->end_kept(t) == Status::ok);
    for (const auto t : kept_tokens) CHECK(s.ep->end_kept(t) == Status::invalid_argument);
  }
  boot->barrier(30s);
  CHECK(rpt::reap(kid, 30s) == 0);
}

TEST_CASE("kept receives: taken by wait or callback, reposted into the same or a new buffer, ended", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  constexpr std::uint64_t kKeptMessages = 7;
  constexpr std::uint64_t kSize = 64;
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov, target_config());
        const auto peer = s.ep->insert_peer(b->allgather(s.ep->name(), 20s)[0]);
        auto buf = s.alloc(kSize);
        for (std::uint64_t i = 0; i < kKeptMessages; ++i) {
          rpt::fill(buf.data(), 100 + i);
          RPT_CHECK(rpt::wait_ok(*s.ep, s.ep->send(peer, rpt::slice_or_die(Slice::data(buf)))).status == Status::ok);
        }
        b->barrier(60s);
        return 0;
      },
      120);
  rpt::Stack s(prov);
  (void)s.ep->insert_peer(boot->allgather(s.ep->name(), 20s)[1]);
  auto buf = s.alloc(2 * kSize);
  const Slice first = rpt::slice_or_die(Slice::data(buf, 0, kSize));
  const Slice second = rpt::slice_or_die(Slice::data(buf, kSize, kSize));
  auto holds = [&](const Slice& where, std::uint64_t seq) {
    std::vector<std::byte> expect(kSize);
    rpt::fill(expect, 100 + seq);
    return std::memcmp(where.address(), expect.data(), kSize) == 0;
  };

  // References to buf held here (buf, first, second); a live kept receive adds one.
  const auto base = buf.use_count();

  // Taken by wait(): parked after each message, reposted, once into a new buffer.
  auto t = s.ep->post_recv_kept(first);
  REQUIRE(t.ok());
  CHECK(s.ep->repost(*t) == Status::invalid_argument);  // still posted
  CHECK(s.ep->repost(regpool::Token{}) == Status::invalid_argument);
  CHECK(s.ep->end_kept(regpool::Token{t->value + (std::uint64_t{1} << 32)}) == Status::invalid_argument);
  for (std::uint64_t i = 0; i < 3; ++i) {
    const Completion c = s.ep->wait(*t, 30s);
    REQUIRE(c.status == Status::ok);
    CHECK(c.bytes == kSize);
    CHECK(c.token == *t);
    CHECK(holds(i == 2 ? second : first, i));
    CHECK(s.ep->wait(*t, 1s).status == Status::invalid_argument);  // taken: parked
    CHECK(buf.use_count() == base + 1);  // the parked receive's
    CHECK(s.ep->repost(*t, Slice{}) == Status::invalid_argument);  // refused, still parked
    CHECK(s.ep->repost(*t, kSize + 1) == Status::invalid_argument);  // past the buffer
    CHECK(s.ep->repost(*t, std::uint64_t{0}) == Status::invalid_argument);
    // Message 1 into the whole buffer by its length; message 2 into the new one.
    const Status st = i == 0 ? s.ep->repost(*t, kSize) : i == 1 ? s.ep->repost(*t, second) : s.ep->end_kept(*t);
    CHECK(st == Status::ok);
  }
  // Ended while parked: its reference is gone, and it cannot come back.
  CHECK(buf.use_count() == base);
  CHECK(s.ep->repost(*t) == Status::invalid_argument);
  CHECK(s.ep->end_kept(*t) == Status::invalid_argument);

  // Ended while posted: its next message completes it for the last time.
  auto u = s.ep->post_recv_kept(first);
  REQUIRE(u.ok());
  CHECK(s.ep->end_kept(*u) == Status::ok);
  const Completion last = s.ep->wait(*u, 30s);
  CHECK(last.status == Status::ok);
  CHECK(holds(first, 3));
  CHECK(s.ep->repost(*u) == Status::invalid_argument);

  // Taken by a callback, which reposts into the other buffer (posted once it
  // returns), then ends it.
  struct {
    regpool::Token v{};
    std::uint64_t calls = 0, intact = 0;
    Status repost_st = Status::in_progress, end_st = Status::in_progress;
  } k;
  auto on_message = [&](const Completion& c) {
    ++k.calls;
    if (c.status == Status::ok && holds(k.calls == 1 ? first : second, 3 + k.calls)) ++k.intact;
    if (k.calls == 1) {
      k.repost_st = s.ep->repost(k.v, second);
    } else {
      // A repost asked and then an end: the end wins, and the buffer the
      // repost named is let go too.
      k.repost_st = s.ep->repost(k.v, first);
      k.end_st = s.ep->end_kept(k.v);
    }
  };
  auto r = s.ep->post_recv_kept(first, [f = &on_message](const Completion& c) { (*f)(c); });
  REQUIRE(r.ok());
  k.v = *r;
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (k.calls < 2 && std::chrono::steady_clock::now() < until) s.ep->progress();
  CHECK(k.calls == 2);
  CHECK(k.intact == 2);
  CHECK(k.repost_st == Status::ok);
  CHECK(k.end_st == Status::ok);
  CHECK(s.ep->repost(k.v) == Status::invalid_argument);
  CHECK(buf.use_count() == base);
  CHECK(s.ep->wait(k.v, 1s).status == Status::invalid_argument);  // a callback's token

  // A parked receive at the end: the endpoint's shutdown gives its reference back.
  auto w = s.ep->post_recv_kept(first);
  REQUIRE(w.ok());
  CHECK(s.ep->wait(*w, 30s).status == Status::ok);
  CHECK(holds(first, 6));
  boot->barrier(60s);
  CHECK(rpt::reap(kid, 30s) == 0);
  CHECK(buf.use_count() == base + 1);
  s.ep.reset();
  CHECK(buf.use_count() == base);
}

TEST_CASE("kept sends: sent again from the same or a new buffer, by wait or callback, ended; never to a removed peer",
          "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  constexpr std::uint64_t kKeptMessages = 12;
  constexpr std::uint64_t kSize = 64;
  constexpr std::uint64_t kShort = 40;  // the second buffer's length
  constexpr std::uint64_t kPrefix = 24;  // a repost of the first bytes only
  // Message i's length and first byte's pattern, as the sender below sends them.
  auto length_of = [](std::uint64_t i) {
    return i == 2 || i == 5 || i == 6 || i == 8 ? kShort : i == 10 ? kPrefix : kSize;
  };
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov, target_config());
        (void)s.ep->insert_peer(b->allgather(s.ep->name(), 20s)[0]);
        auto buf = s.alloc(kSize);
        const Slice in = rpt::slice_or_die(Slice::data(buf));
        for (std::uint64_t i = 0; i < kKeptMessages; ++i) {
          const Completion c = rpt::wait_ok(*s.ep, s.ep->post_recv(in));
          RPT_CHECK(c.status == Status::ok);
          RPT_CHECK(c.bytes == length_of(i));
          std::vector<std::byte> expect(c.bytes);
          rpt::fill(expect, 100 + i);
          RPT_CHECK(std::memcmp(buf.data().data(), expect.data(), expect.size()) == 0);
        }
        b->barrier(60s);
        return 0;
      },
      120);
  rpt::Stack s(prov);
  const auto peer = s.ep->insert_peer(boot->allgather(s.ep->name(), 20s)[1]);
  auto buf = s.alloc(2 * kSize);
  const Slice first = rpt::slice_or_die(Slice::data(buf, 0, kSize));
  const Slice second = rpt::slice_or_die(Slice::data(buf, kSize, kShort));
  // Message i's bytes, written into the buffer it goes out of while the
  // send is parked.
  auto write = [&](const Slice& where, std::uint64_t i) {
    std::vector<std::byte> v(where.length());
    rpt::fill(v, 100 + i);
    std::memcpy(where.address(), v.data(), v.size());
  };
  // References to buf held here (buf, first, second); a live kept send adds one.
  const auto base = buf.use_count();

  // Taken by wait(): parked after each send, written anew, reposted; once
  // from a new (shorter) buffer, then back.
  write(first, 0);
  auto t = s.ep->send_kept(peer, first);
  REQUIRE(t.ok());
  CHECK(s.ep->end_kept(regpool::Token{t->value + (std::uint64_t{1} << 32)}) == Status::invalid_argument);
  for (std::uint64_t i = 0; i < 4; ++i) {
    const Completion c = s.ep->wait(*t, 30s);
    REQUIRE(c.status == Status::ok);
    CHECK(c.token == *t);
    CHECK(c.peer == peer);
    CHECK(c.op == regpool::OpKind::send);
    CHECK(s.ep->wait(*t, 1s).status == Status::invalid_argument);  // taken: parked
    CHECK(buf.use_count() == base + 1);                             // the parked send's
    CHECK(s.ep->repost(*t, Slice{}) == Status::invalid_argument);   // refused, still parked
    if (i == 3) break;
    const Slice& next = length_of(i + 1) == kShort ? second : first;
    write(next, i + 1);
    CHECK((i == 0 ? s.ep->repost(*t) : s.ep->repost(*t, next)) == Status::ok);
  }
  CHECK(s.ep->end_kept(*t) == Status::ok);
  CHECK(buf.use_count() == base);
  CHECK(s.ep->repost(*t) == Status::invalid_argument);
  CHECK(s.ep->end_kept(*t) == Status::invalid_argument);

  // Taken by a callback, which writes the next message and reposts from
  // inside (posted once it returns), into the short buffer and back, then
  // ends it after the third.
  struct {
    regpool::Token v{};
    std::uint64_t calls = 0, ok = 0;
    Status repost_st = Status::ok, end_st = Status::in_progress;
  } k;
  auto on_sent = [&](const Completion& c) {
    ++k.calls;
    if (c.status == Status::ok) ++k.ok;
    const std::uint64_t next = 4 + k.calls;  // message 5, 6 (short), then the end
    if (k.calls < 3) {
      const Slice& where = length_of(next) == kShort ? second : first;
      write(where, next);
      const Status st = k.calls == 1 ? s.ep->repost(k.v, second) : s.ep->repost(k.v);
      if (st != Status::ok) k.repost_st = st;
    } else {
      k.end_st = s.ep->end_kept(k.v);
    }
  };
  write(first, 4);
  auto r = s.ep->send_kept(peer, first, [f = &on_sent](const Completion& c) { (*f)(c); });
  REQUIRE(r.ok());
  k.v = *r;
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (k.calls < 3 && std::chrono::steady_clock::now() < until) s.ep->progress();
  CHECK(k.calls == 3);
  CHECK(k.ok == 3);
  CHECK(k.repost_st == Status::ok);
  CHECK(k.end_st == Status::ok);
  CHECK(buf.use_count() == base);
  CHECK(s.ep->repost(k.v) == Status::invalid_argument);
  CHECK(s.ep->wait(k.v, 1s).status == Status::invalid_argument);  // a callback's token

  // Ended while posted: its completion is its last.
  write(first, 7);
  auto u = s.ep->send_kept(peer, first);
  REQUIRE(u.ok());
  CHECK(s.ep->repost(*u) == Status::invalid_argument);  // still posted (or not yet taken)
  CHECK(s.ep->end_kept(*u) == Status::ok);
  CHECK(s.ep->wait(*u, 30s).status == Status::ok);
  CHECK(s.ep->repost(*u) == Status::invalid_argument);
  CHECK(buf.use_count() == base);

  // Sent from the first bytes of its buffer (a buffer rewritten in place
  // with a new length): kShort of it first, then all of it, then kPrefix;
  // never more than the buffer, never nothing.
  CHECK(s.ep->send_kept(peer, first, kSize + 1).status() == Status::invalid_argument);
  CHECK(s.ep->send_kept(peer, first, 0).status() == Status::invalid_argument);
  write(first, 8);
  auto x = s.ep->send_kept(peer, first, kShort);
  REQUIRE(x.ok());
  for (std::uint64_t i = 8; i <= 10; ++i) {
    const Completion c = s.ep->wait(*x, 30s);
    REQUIRE(c.status == Status::ok);
    CHECK(c.bytes == length_of(i));
    if (i == 10) break;
    CHECK(s.ep->repost(*x, std::uint64_t{0}) == Status::invalid_argument);
    CHECK(s.ep->repost(*x, kSize + 1) == Status::invalid_argument);  // refused, still parked
    write(first, i + 1);
    CHECK(s.ep->repost(*x, length_of(i + 1)) == Status::ok);
  }
  CHECK(s.ep->end_kept(*x) == Status::ok);
  CHECK(buf.use_count() == base);

  // Parked at the end: the peer is removed and another endpoint's name
  // takes its id. The kept send never goes there: peer_unreachable, and it
  // stays parked until ended (or the endpoint shuts down).
  write(first, 11);
  auto w = s.ep->send_kept(peer, first);
  REQUIRE(w.ok());
  CHECK(s.ep->wait(*w, 30s).status == Status::ok);
  boot->barrier(60s);  // the receiver has all twelve messages
  CHECK(rpt::reap(kid, 30s) == 0);
  s.ep->remove_peer(peer);
  CHECK(s.ep->repost(*w) == Status::peer_unreachable);
  rpt::Stack other(prov);
  CHECK(s.ep->insert_peer(other.ep->name()) == peer);  // the lowest free id
  CHECK(s.ep->repost(*w) == Status::peer_unreachable);
  CHECK(buf.use_count() == base + 1);
  s.ep.reset();
  CHECK(buf.use_count() == base);
}

TEST_CASE("kept puts and gets: the same transfer again, shorter, from a new buffer no longer than the first; never to a "
          "removed peer",
          "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  constexpr std::uint64_t kTarget = 128;
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  // The target: its object holds pattern 7 until the initiator's puts land
  // in [64, 88); it progresses (thread) while blocked in the bootstrap.
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov, target_config());
        auto target = s.alloc(kTarget);
        rpt::fill(target.data(), 7);
        auto exposure = s.ep->expose(rpt::slice_or_die(Slice::data(target)), RemoteAccess::read_write);
        RPT_CHECK(exposure.ok());
        (void)b->allgather(regpool::pack_blobs({s.ep->name(), rpt::encoded(*exposure)}), 20s);
        b->barrier(120s);  // the initiator is done
        return 0;
      },
      180);
  rpt::Stack s(prov);
  auto parts = regpool::unpack_blobs(boot->allgather({}, 20s)[1]);
  const auto peer = s.ep->insert_peer(parts[0]);
  const RemoteRef ref = rpt::decode_or_die(parts[1]);
  std::vector<std::byte> theirs(kTarget);
  rpt::fill(theirs, 7);  // what the target holds at first
  auto buf = s.alloc(256);
  rpt::fill(buf.data(), 1);
  const Slice first = rpt::slice_or_die(Slice::data(buf, 0, 32));
  const Slice shorter = rpt::slice_or_die(Slice::data(buf, 100, 8));
  const Slice longer = rpt::slice_or_die(Slice::data(buf, 128, 33));
  const Slice out = rpt::slice_or_die(Slice::data(buf, 40, 24));
  const Slice back = rpt::slice_or_die(Slice::data(buf, 200, 24));
  const auto base = buf.use_count();  // buf and the slices above
  auto holds = [&](const Slice& where, std::uint64_t remote_offset, std::uint64_t n) {
    return std::memcmp(where.address(), theirs.data() + remote_offset, n) == 0;
  };

  // A get of remote [8, 40), read again as it is, then only its first 16
  // bytes, then into a new shorter buffer; a longer one is refused
  // (out_of_bounds, still parked), as is a repost while posted.
  auto g = s.ep->get_kept(peer, ref, 8, first);
  REQUIRE(g.ok());
  CHECK(s.ep->repost(*g) == Status::invalid_argument);  // posted (or not yet taken)
  Completion c = s.ep->wait(*g, 30s);
  REQUIRE(c.status == Status::ok);
  CHECK(c.op == regpool::OpKind::get);
  CHECK(c.bytes == 32);
  CHECK(holds(first, 8, 32));
  CHECK(buf.use_count() == base + 1);  // the parked get's reference
  std::memset(first.address(), 0, 32);
  REQUIRE(s.ep->repost(*g) == Status::ok);
  c = s.ep->wait(*g, 30s);
  REQUIRE(c.status == Status::ok);
  CHECK(holds(first, 8, 32));
  std::memset(first.address(), 0, 32);
  REQUIRE(s.ep->repost(*g, std::uint64_t{16}) == Status::ok);
  c = s.ep->wait(*g, 30s);
  REQUIRE(c.status == Status::ok);
  CHECK(c.bytes == 16);
  CHECK(holds(first, 8, 16));
  CHECK(std::all_of(first.bytes().begin() + 16, first.bytes().end(), [](std::byte b) { return b == std::byte{0}; }));
  CHECK(s.ep->repost(*g, longer) == Status::out_of_bounds);  // remote [8, 41) was never checked
  CHECK(s.ep->repost(*g, std::uint64_t{33}) == Status::invalid_argument);  // past its buffer
  REQUIRE(s.ep->repost(*g, shorter) == Status::ok);
  c = s.ep->wait(*g, 30s);
  REQUIRE(c.status == Status::ok);
  CHECK(c.bytes == 8);
  CHECK(holds(shorter, 8, 8));
  CHECK(s.ep->end_kept(*g) == Status::ok);
  CHECK(buf.use_count() == base);

  // Checked once, when kept, as put() is: a range past the exposure.
  CHECK(s.ep->put_kept(first, peer, ref, kTarget - 31).status() == Status::out_of_bounds);
  CHECK(buf.use_count() == base);

  // A put of 24 bytes to remote [64, 88), rewritten in place and put
  // again, then its first 8 bytes only, each read back by a kept get of
  // the same range.
  auto p = s.ep->put_kept(out, peer, ref, 64);
  REQUIRE(p.ok());
  auto r = s.ep->get_kept(peer, ref, 64, back);  // may pass the put: unordered
  REQUIRE(r.ok());
  REQUIRE(s.ep->wait(*p, 30s).status == Status::ok);
  REQUIRE(s.ep->wait(*r, 30s).status == Status::ok);
  std::memcpy(theirs.data() + 64, out.address(), 24);
  for (std::uint64_t round = 0; round < 2; ++round) {
    rpt::fill(out.bytes(), 20 + round);
    std::memcpy(theirs.data() + 64, out.address(), round == 0 ? 24 : 8);
    REQUIRE((round == 0 ? s.ep->repost(*p) : s.ep->repost(*p, std::uint64_t{8})) == Status::ok);
    c = s.ep->wait(*p, 30s);
    REQUIRE(c.status == Status::ok);
    CHECK(c.op == regpool::OpKind::put);
    CHECK(c.bytes == (round == 0 ? 24u : 8u));
    std::memset(back.address(), 0, 24);
    REQUIRE(s.ep->repost(*r) == Status::ok);  // after the put's completion: reads what it wrote
    REQUIRE(s.ep->wait(*r, 30s).status == Status::ok);
    CHECK(holds(back, 64, 24));
  }

  // The target goes and its peer is removed; another endpoint's name takes
  // the id. The parked put and get never go there: peer_unreachable, and
  // they stay parked (their references held) until ended.
  boot->barrier(120s);
  CHECK(rpt::reap(kid, 30s) == 0);
  s.ep->remove_peer(peer);
  CHECK(s.ep->repost(*p) == Status::peer_unreachable);
  rpt::Stack other(prov);
  CHECK(s.ep->insert_peer(other.ep->name()) == peer);
  CHECK(s.ep->repost(*r) == Status::peer_unreachable);
  CHECK(buf.use_count() == base + 2);
  CHECK(s.ep->end_kept(*p) == Status::ok);
  s.ep.reset();
  CHECK(buf.use_count() == base);
}

TEST_CASE("atomics under contention from two processes", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  constexpr std::uint64_t kAdds = 2000;
  constexpr std::uint64_t kCas = 200;
  auto boot = rpt::root_bootstrap(3);
  const auto port = boot->port();

  std::vector<rpt::ChildGuard> kids;
  for (int rank = 1; rank <= 2; ++rank) {
    kids.push_back(rpt::spawn(
        [&, rank]() -> int {
          auto b = rpt::child_bootstrap(port, rank, 3);
          rpt::Stack s(prov);
          auto all = b->allgather({}, 20s);
          auto parts = regpool::unpack_blobs(all[0]);
          const auto peer = s.ep->insert_peer(parts[0]);
          const RemoteRef ref = rpt::decode_or_die(parts[1]);
          b->barrier(20s);  // start together: real contention
          std::uint64_t last = 0;
          bool first = true;
          for (std::uint64_t i = 0; i < kAdds; ++i) {
            auto c = rpt::wait_ok(*s.ep, s.ep->fetch_add(peer, ref, 8, 1));
            RPT_CHECK(c.status == Status::ok);
            RPT_CHECK(first || c.value > last);  // our own increments are ordered
            last = c.value;
            first = false;
          }
          for (std::uint64_t i = 0; i < kCas; ++i) {
            for (int tries = 0;; ++tries) {
              RPT_CHECK(tries < 100000);
              auto cur = rpt::wait_ok(*s.ep, s.ep->fetch_add(peer, ref, 8, 0));
              RPT_CHECK(cur.status == Status::ok);
              auto c = rpt::wait_ok(*s.ep, s.ep->compare_swap(peer, ref, 8, cur.value, cur.value + 1));
              RPT_CHECK(c.status == Status::ok);
              if (c.value == cur.value) break;  // swapped
            }
          }
          // A failing compare-swap returns the current value and changes nothing.
          auto w = rpt::wait_ok(*s.ep, s.ep->compare_swap(peer, ref, 0, 12345, 999));
          RPT_CHECK(w.status == Status::ok && w.value == 0x5a5a5a5a5a5a5a5aull);
          b->barrier(60s);
          return 0;
        },
        120));
  }
  rpt::Stack s(prov, target_config());
  auto obj = s.alloc(64);
  std::memset(obj.data().data(), 0, 64);
  std::memset(obj.data().data(), 0x5a, 8);  // word 0: fixed sentinel
  auto exposure = s.ep->expose(rpt::slice_or_die(Slice::data(obj)), RemoteAccess::read_write);
  REQUIRE(exposure.ok());
  (void)boot->allgather(regpool::pack_blobs({s.ep->name(), rpt::encoded(*exposure)}), 20s);
  boot->barrier(20s);
  boot->barrier(60s);
  std::uint64_t counter = 0, sentinel = 0;
  std::memcpy(&counter, obj.data().data() + 8, 8);
  std::memcpy(&sentinel, obj.data().data(), 8);
  CHECK(counter == 2 * (kAdds + kCas));
  CHECK(sentinel == 0x5a5a5a5a5a5a5a5aull);
  CHECK(s.ep->native_atomics() == rpt::expects_native_atomics(prov));
  for (auto& k : kids) CHECK(rpt::reap(k, 30s) == 0);
}

TEST_CASE("post_batch posts a prefix of mixed puts, gets and sends, each with its own completion", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  constexpr std::uint64_t kTarget = 64 << 10;
  constexpr std::uint64_t kGetA = 32768, kGetASize = 4097, kGetB = 40960, kGetBSize = 8;
  constexpr std::uint64_t kSendC = 100, kSendF = 3000;
  constexpr std::size_t kSlots = 8;  // the initiator's max_in_flight
  constexpr std::size_t kOver = kSlots + 2;

  auto kid = rpt::spawn(
      [&]() -> int {
        using regpool::BatchOp;
        auto b = rpt::child_bootstrap(port);
        regpool::EndpointConfig ec;
        ec.max_in_flight = kSlots;
        rpt::Stack s(prov, ec);
        auto all = b->allgather({}, 20s);
        auto parts = regpool::unpack_blobs(all[0]);
        const auto peer = s.ep->insert_peer(parts[0]);
        const RemoteRef ref = rpt::decode_or_die(parts[1]);
        auto buf = s.alloc(64 << 10);
        std::uint64_t at = 0;
        // A slice of buf of `size` bytes filled with `seed` (0: zeroed).
        auto piece = [&](std::uint64_t size, std::uint64_t seed) {
          auto sl = rpt::slice_or_die(Slice::data(buf, at, size));
          at += size + 5;  // odd gaps: unaligned starts
          if (seed != 0) rpt::fill(sl.bytes(), seed);
          else std::memset(sl.address(), 0, size);
          return sl;
        };
        std::vector<Measure> puts;

        // Empty batch: nothing posted, nothing counted.
        const auto before = s.ep->stats().posted;
        RPT_CHECK(s.ep->post_batch({}) == 0);
        RPT_CHECK(s.ep->stats().posted == before);

        // Mixed batch: every kind, with and without callbacks.
        auto a = piece(8, 101), d = piece(64, 102);
        auto c = piece(kSendC, 301), f = piece(kSendF, 302);
        auto ga = piece(kGetASize, 0), gb = piece(kGetBSize, 0);
        Completion seen[6] = {};
        int calls = 0;
        auto record = [&](int i) {
          return regpool::Callback([&seen, &calls, i](const Completion& cc) {
            seen[i] = cc;
            ++calls;
          });
        };
        std::array<BatchOp, 6> mixed = {
            BatchOp::put(a, peer, ref, 1, record(0)),
            BatchOp::get(peer, ref, kGetA, ga),
            BatchOp::send(peer, c, record(2)),
            BatchOp::put(d, peer, ref, 100),
            BatchOp::get(peer, ref, kGetB, gb, record(4)),
            BatchOp::send(peer, f),
        };
        RPT_CHECK(s.ep->post_batch(mixed) == mixed.size());
        for (const auto& op : mixed) RPT_CHECK(op.status == Status::ok && op.token);
        for (std::size_t i = 0; i < mixed.size(); ++i) {
          for (std::size_t j = i + 1; j < mixed.size(); ++j) RPT_CHECK(!(mixed[i].token == mixed[j].token));
        }
        for (int i : {1, 3, 5}) {
          seen[i] = s.ep->wait(mixed[i].token, 30s);
          ++calls;
        }
        const auto deadline = std::chrono::steady_clock::now() + 30s;
        while (calls < 6 && std::chrono::steady_clock::now() < deadline) s.ep->progress();
        RPT_CHECK(calls == 6);
        for (std::size_t i = 0; i < mixed.size(); ++i) {
          RPT_CHECK(seen[i].status == Status::ok);
          RPT_CHECK(seen[i].token == mixed[i].token);
          RPT_CHECK(seen[i].op == mixed[i].kind);
          RPT_CHECK(seen[i].bytes == mixed[i].local->length());
        }
        std::vector<std::byte> expect(kGetASize);
        rpt::fill(expect, 7);
        RPT_CHECK(std::memcmp(ga.address(), expect.data(), kGetASize) == 0);
        expect.resize(kGetBSize);
        rpt::fill(expect, 8);
        RPT_CHECK(std::memcmp(gb.address(), expect.data(), kGetBSize) == 0);
        puts.push_back(Measure{8, 1, rpt::hash(a.bytes())});
        puts.push_back(Measure{64, 100, rpt::hash(d.bytes())});

        // More ops than free slots: exactly the free ones are posted, the
        // next reports would_block, the rest are not attempted.
        std::vector<Slice> over;
        std::vector<BatchOp> big;
        for (std::size_t k = 0; k < kOver; ++k) over.push_back(piece(100 + k, 200 + k));
        for (std::size_t k = 0; k < kOver; ++k) big.push_back(BatchOp::put(over[k], peer, ref, 1000 + k * 200));
        const std::size_t n = s.ep->post_batch(big);
        RPT_CHECK(n == kSlots);
        RPT_CHECK(big[kSlots].status == Status::would_block && !big[kSlots].token);
        for (std::size_t k = kSlots + 1; k < kOver; ++k) RPT_CHECK(big[k].status == Status::canceled);
        for (std::size_t k = 0; k < n; ++k) RPT_CHECK(s.ep->wait(big[k].token, 30s).status == Status::ok);
        // The rest, resubmitted.
        RPT_CHECK(s.ep->post_batch(std::span(big).subspan(n)) == kOver - n);
        for (std::size_t k = n; k < kOver; ++k) RPT_CHECK(s.ep->wait(big[k].token, 30s).status == Status::ok);
        for (std::size_t k = 0; k < kOver; ++k) puts.push_back(Measure{100 + k, 1000 + k * 200, rpt::hash(over[k].bytes())});

        // A failed check ends the batch there: the ops before it are posted.
        auto g1 = piece(16, 400), g2 = piece(16, 401), g3 = piece(16, 402);
        std::array<BatchOp, 3> checked = {
            BatchOp::put(g1, peer, ref, 5000),
            BatchOp::put(g2, peer, ref, kTarget - 8),  // 8 bytes past the exposure
            BatchOp::put(g3, peer, ref, 5100),
        };
        RPT_CHECK(s.ep->post_batch(checked) == 1);
        RPT_CHECK(checked[1].status == Status::out_of_bounds && checked[2].status == Status::canceled);
        RPT_CHECK(s.ep->wait(checked[0].token, 30s).status == Status::ok);
        puts.push_back(Measure{16, 5000, rpt::hash(g1.bytes())});

        // A broken peer: nothing is posted, the first op says why.
        s.ep->fail_peer(peer);
        std::array<BatchOp, 2> broken = {BatchOp::put(g3, peer, ref, 5100), BatchOp::send(peer, c)};
        RPT_CHECK(s.ep->post_batch(broken) == 0);
        RPT_CHECK(broken[0].status == Status::peer_unreachable && broken[1].status == Status::canceled);
        RPT_CHECK(s.ep->stats().in_flight == 0);

        std::vector<std::byte> report(puts.size() * sizeof(Measure));
        std::memcpy(report.data(), puts.data(), report.size());
        (void)b->allgather(report, 60s);
        return 0;
      },
      240);

  rpt::Stack s(prov, target_config());
  auto target = s.alloc(kTarget);
  std::memset(target.data().data(), 0, kTarget);
  rpt::fill(target.data().subspan(kGetA, kGetASize), 7);
  rpt::fill(target.data().subspan(kGetB, kGetBSize), 8);
  auto exposure = s.ep->expose(rpt::slice_or_die(Slice::data(target)), RemoteAccess::read_write);
  REQUIRE(exposure.ok());
  auto inbox = s.alloc(2 * 4096);
  std::atomic<int> received{0};
  std::uint64_t got[2] = {};
  for (int k = 0; k < 2; ++k) {
    auto slot = rpt::slice_or_die(Slice::data(inbox, k * 4096, 4096));
    auto t = s.ep->post_recv(slot, [&got, &received, k](const Completion& c) {
      if (c.status == Status::ok) got[k] = c.bytes;
      received.fetch_add(1, std::memory_order_release);
    });
    REQUIRE(t.ok());
  }
  (void)boot->allgather(regpool::pack_blobs({s.ep->name(), rpt::encoded(*exposure)}), 20s);
  auto report = boot->allgather({}, 120s)[1];
  REQUIRE(report.size() % sizeof(Measure) == 0);
  REQUIRE(report.size() / sizeof(Measure) == 2 + kOver + 1);
  for (std::size_t i = 0; i < report.size() / sizeof(Measure); ++i) {
    Measure m{};
    std::memcpy(&m, report.data() + i * sizeof m, sizeof m);
    INFO("put " << i << " at " << m.offset);
    CHECK(rpt::hash({target.data().data() + m.offset, m.size}) == m.hash);
  }
  // The put after the failed check and the batch to the broken peer never
  // reached the target.
  CHECK(std::all_of(target.data().begin() + 5100, target.data().begin() + 5116,
                    [](std::byte x) { return x == std::byte{0}; }));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (received.load(std::memory_order_acquire) < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(received.load() == 2);
  CHECK(got[0] == kSendC);
  CHECK(got[1] == kSendF);
  std::vector<std::byte> expect(kSendF);
  rpt::fill(std::span(expect).first(kSendC), 301);
  CHECK(std::memcmp(inbox.data().data(), expect.data(), kSendC) == 0);
  rpt::fill(expect, 302);
  CHECK(std::memcmp(inbox.data().data() + 4096, expect.data(), kSendF) == 0);
  CHECK(rpt::reap(kid, 60s) == 0);
}
