// Receive completions name their sender, and sleeping waits sleep.
// Built twice (test/meson.build): transport-source-wait on libfabric shm and
// tcp (suite fabric), verbs-source-wait on rxe in the Soft-RoCE guest.
//  - source: three processes send to one receiver, which inserted them all;
//    every completion's peer must be the PeerId the receiver got for the
//    rank written in the message, also after the receiver's peer table was
//    churned (inserts, removals, re-inserts) around them. A sender the receiver never inserted
//    must come out as kAnyPeer (and be counted), never as someone else;
//  - sleeping: a wait() in WaitMode::sleep for a message that comes late
//    returns with it, having used little CPU; the same receiver and senders
//    run in sleep and adaptive modes.

#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::Completion;
using regpool::PeerId;
using regpool::Slice;
using regpool::Status;
using regpool::WaitMode;

namespace {

constexpr int kSenders = 3;
constexpr std::uint64_t kPerSender = 200;
constexpr std::uint64_t kMsg = 64;

double thread_cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_THREAD, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

regpool::EndpointConfig sender_config() {
  regpool::EndpointConfig c;
  // Senders wait for their own sends; connection setup (verbs, rxm) needs
  // the receiver's progress, which its waits provide.
  c.wait_mode = WaitMode::adaptive;
  return c;
}

// What the receiver saw: per sending rank (a message's high word) how many
// arrived, how many named the right peer, and messages from no valid rank.
struct SourceCount {
  std::uint64_t named_right = 0;
  std::uint64_t bad_rank = 0;
  std::vector<std::uint64_t> per_rank;
};

// Receives `total` messages of ranks 1..senders through `recvs` receives
// reposted in turn (posted before the barrier that lets the senders go),
// checking each against id_of[rank].
SourceCount receive_all(rpt::Stack& s, regpool::TcpBootstrap& boot, std::size_t recvs, std::uint64_t total,
                        int senders, const std::vector<PeerId>& id_of) {
  auto buf = s.alloc(recvs * kMsg);
  std::vector<regpool::Token> tokens(recvs);
  auto post = [&](std::size_t k) {
    auto t = s.ep->post_recv(rpt::slice_or_die(Slice::data(buf, k * kMsg, kMsg)));
    REQUIRE(t.ok());
    tokens[k] = *t;
  };
  for (std::size_t k = 0; k < recvs; ++k) post(k);
  boot.barrier(60s);
  SourceCount out;
  out.per_rank.assign(id_of.size(), 0);
  std::uint64_t received = 0;
  for (std::size_t k = 0; received < total; k = (k + 1) % recvs) {
    const Completion c = s.ep->wait(tokens[k], 60s);
    REQUIRE(c.status == Status::ok);
    ++received;
    std::uint64_t word = 0;
    std::memcpy(&word, buf.data().data() + k * kMsg, 8);
    const auto rank = static_cast<std::size_t>(word >> 32);
    if (rank < 1 || rank > static_cast<std::size_t>(senders) || rank >= id_of.size()) {
      ++out.bad_rank;
    } else {
      ++out.per_rank[rank];
      if (c.peer == id_of[rank]) ++out.named_right;
    }
    if (received + recvs <= total) post(k);
  }
  return out;
}

// Child `rank` (1..n): insert the receiver, send `count` messages carrying
// the rank, then wait at the barrier.
int run_sender(const std::string& prov, std::uint16_t port, int rank, int size, std::uint64_t count) {
  auto b = rpt::child_bootstrap(port, rank, size);
  rpt::Stack s(prov, sender_config());
  auto all = b->allgather(s.ep->name(), 30s);
  const PeerId receiver = s.ep->insert_peer(all[0]);
  auto buf = s.alloc(kMsg);
  auto m = rpt::slice_or_die(Slice::data(buf, 0, kMsg));
  b->barrier(60s);  // the receiver's buffers are posted
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::uint64_t word = (static_cast<std::uint64_t>(rank) << 32) | i;
    std::memcpy(m.address(), &word, 8);
    const Completion c = rpt::wait_ok(*s.ep, s.ep->send(receiver, m));
    RPT_CHECK(c.status == Status::ok);
  }
  b->barrier(120s);
  return 0;
}

}  // namespace

TEST_CASE("every receive names the inserted peer that sent it", "[fabric][source]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  const WaitMode mode = GENERATE(WaitMode::sleep, WaitMode::adaptive);
  INFO("backend " << prov << ", receiver waits " << regpool::to_string(mode));
  constexpr int kSize = kSenders + 1;
  auto boot = rpt::root_bootstrap(kSize);
  const auto port = boot->port();
  std::vector<rpt::ChildGuard> kids;
  for (int r = 1; r <= kSenders; ++r) {
    kids.push_back(rpt::spawn([&, r] { return run_sender(prov, port, r, kSize, kPerSender); }, 240));
  }

  regpool::EndpointConfig ec;
  ec.wait_mode = mode;
  rpt::Stack s(prov, ec);
  auto all = boot->allgather(s.ep->name(), 30s);
  std::vector<PeerId> id_of(kSize, regpool::kAnyPeer);
  for (int r = 1; r <= kSenders; ++r) id_of[static_cast<std::size_t>(r)] = s.ep->insert_peer(all[static_cast<std::size_t>(r)]);
  const std::uint64_t total = kSenders * kPerSender;
  const SourceCount got = receive_all(s, *boot, 32, total, kSenders, id_of);
  CHECK(got.bad_rank == 0);
  CHECK(got.named_right == total);
  for (int r = 1; r <= kSenders; ++r) CHECK(got.per_rank[static_cast<std::size_t>(r)] == kPerSender);
  CHECK(s.ep->stats().unknown_source == 0);
  boot->barrier(120s);
  for (auto& k : kids) CHECK(rpt::reap(k, 60s) == 0);
}

TEST_CASE("receive sources stay right after many peers are inserted, removed and re-inserted", "[fabric][source]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  // The receiver's peer table is churned by filler endpoints (in this
  // process, never sending) so that the senders' PeerIds and backend
  // handles are reused ones, out of order: the handle -> peer index must
  // follow every insert and removal.
  constexpr int kSize = kSenders + 1;
  constexpr std::uint64_t kEach = 40;
  constexpr std::size_t kFillers = 10;
  auto boot = rpt::root_bootstrap(kSize);
  const auto port = boot->port();
  std::vector<rpt::ChildGuard> kids;
  for (int r = 1; r <= kSenders; ++r) {
    kids.push_back(rpt::spawn([&, r] { return run_sender(prov, port, r, kSize, kEach); }, 240));
  }
  regpool::EndpointConfig ec;
  ec.wait_mode = WaitMode::adaptive;
  rpt::Stack s(prov, ec);
  // The senders first (they wait in the allgather), then the fillers (they
  // wait at the barrier, which has more time: ten tcp endpoints take
  // seconds to open on a loaded or sanitized run).
  auto all = boot->allgather(s.ep->name(), 30s);
  std::vector<std::unique_ptr<regpool::Endpoint>> fillers;
  std::vector<std::vector<std::byte>> filler_names;
  for (std::size_t i = 0; i < kFillers; ++i) {
    fillers.push_back(rpt::open_endpoint(s.domain, prov, regpool::EndpointConfig{}));
    filler_names.push_back(fillers.back()->name());
  }
  const auto name_of = [&](int rank) { return all[static_cast<std::size_t>(rank)]; };
  std::vector<PeerId> filler_id(kFillers, regpool::kAnyPeer);
  std::vector<PeerId> id_of(kSize, regpool::kAnyPeer);
  for (std::size_t i = 0; i < 4; ++i) filler_id[i] = s.ep->insert_peer(filler_names[i]);
  id_of[2] = s.ep->insert_peer(name_of(2));
  for (std::size_t i = 4; i < 7; ++i) filler_id[i] = s.ep->insert_peer(filler_names[i]);
  id_of[1] = s.ep->insert_peer(name_of(1));
  for (std::size_t i = 7; i < kFillers; ++i) filler_id[i] = s.ep->insert_peer(filler_names[i]);
  // A reconnect takes filler 0 out of the backend while it keeps its
  // PeerId (fabric: until its settle time is out, which no post ends):
  // from here on PeerIds and handles differ.
  REQUIRE(s.ep->reconnect(filler_id[0]) == Status::ok);
  for (std::size_t i : {1u, 3u, 5u}) s.ep->remove_peer(filler_id[i]);
  const bool reinsert = rpt::reinsert_is_transparent(prov);
  if (reinsert) s.ep->remove_peer(id_of[2]);
  id_of[3] = s.ep->insert_peer(name_of(3));  // a freed low PeerId and handle
  if (reinsert) id_of[2] = s.ep->insert_peer(name_of(2));
  filler_id[3] = s.ep->insert_peer(filler_names[3]);
  for (std::size_t i : {0u, 8u}) s.ep->remove_peer(filler_id[i]);
  CHECK(s.ep->peer_count() == kFillers - 4 + kSenders);  // five removed, one back
  for (int r = 1; r <= kSenders; ++r) {
    for (int q = r + 1; q <= kSenders; ++q) CHECK(id_of[static_cast<std::size_t>(r)] != id_of[static_cast<std::size_t>(q)]);
  }

  const std::uint64_t total = kSenders * kEach;
  const SourceCount got = receive_all(s, *boot, 16, total, kSenders, id_of);
  CHECK(got.bad_rank == 0);
  CHECK(got.named_right == total);
  for (int r = 1; r <= kSenders; ++r) CHECK(got.per_rank[static_cast<std::size_t>(r)] == kEach);
  CHECK(s.ep->stats().unknown_source == 0);
  boot->barrier(120s);
  for (auto& k : kids) CHECK(rpt::reap(k, 60s) == 0);
}

TEST_CASE("a sender that was never inserted is reported as kAnyPeer, never as another peer", "[fabric][source]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  // Rank 1 is inserted by the receiver (the first peer it has), rank 2 is not.
  constexpr int kSize = 3;
  constexpr std::uint64_t kEach = 5;
  auto boot = rpt::root_bootstrap(kSize);
  const auto port = boot->port();
  std::vector<rpt::ChildGuard> kids;
  for (int r = 1; r < kSize; ++r) {
    kids.push_back(rpt::spawn([&, r] { return run_sender(prov, port, r, kSize, kEach); }, 240));
  }
  regpool::EndpointConfig ec;
  ec.wait_mode = WaitMode::sleep;
  rpt::Stack s(prov, ec);
  auto all = boot->allgather(s.ep->name(), 30s);
  const PeerId known = s.ep->insert_peer(all[1]);
  constexpr std::size_t kRecvs = 2 * kEach;
  auto buf = s.alloc(kRecvs * kMsg);
  std::vector<regpool::Token> tokens;
  for (std::size_t k = 0; k < kRecvs; ++k) {
    auto t = s.ep->post_recv(rpt::slice_or_die(Slice::data(buf, k * kMsg, kMsg)));
    REQUIRE(t.ok());
    tokens.push_back(*t);
  }
  boot->barrier(60s);
  std::uint64_t from_known = 0, from_unknown = 0;
  for (std::size_t k = 0; k < kRecvs; ++k) {
    const Completion c = s.ep->wait(tokens[k], 60s);
    REQUIRE(c.status == Status::ok);
    std::uint64_t word = 0;
    std::memcpy(&word, buf.data().data() + k * kMsg, 8);
    if ((word >> 32) == 1) {
      CHECK(c.peer == known);
      ++from_known;
    } else {
      CHECK(c.peer == regpool::kAnyPeer);
      ++from_unknown;
    }
  }
  CHECK(from_known == kEach);
  CHECK(from_unknown == kEach);
  CHECK(s.ep->stats().unknown_source == kEach);
  boot->barrier(120s);
  for (auto& k : kids) CHECK(rpt::reap(k, 60s) == 0);
}

TEST_CASE("a sleeping wait returns with a late message and uses little CPU meanwhile", "[fabric][wait]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  constexpr auto kLate = 400ms;
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov, sender_config());
        auto all = b->allgather(s.ep->name(), 30s);
        const PeerId receiver = s.ep->insert_peer(all[0]);
        auto buf = s.alloc(kMsg);
        auto m = rpt::slice_or_die(Slice::data(buf, 0, kMsg));
        b->barrier(60s);
        // One message at once (connection setup), one late.
        RPT_CHECK(rpt::wait_ok(*s.ep, s.ep->send(receiver, m)).status == Status::ok);
        std::this_thread::sleep_for(kLate);
        RPT_CHECK(rpt::wait_ok(*s.ep, s.ep->send(receiver, m)).status == Status::ok);
        b->barrier(60s);
        return 0;
      },
      120);
  regpool::EndpointConfig ec;
  ec.wait_mode = WaitMode::sleep;
  rpt::Stack s(prov, ec);
  (void)boot->allgather(s.ep->name(), 30s);
  auto buf = s.alloc(2 * kMsg);
  auto first = s.ep->post_recv(rpt::slice_or_die(Slice::data(buf, 0, kMsg)));
  auto second = s.ep->post_recv(rpt::slice_or_die(Slice::data(buf, kMsg, kMsg)));
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  boot->barrier(60s);
  REQUIRE(s.ep->wait(*first, 60s).status == Status::ok);
  const auto sleeps_before = s.ep->stats().sleeps;
  const double cpu0 = thread_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  const Completion c = s.ep->wait(*second, 60s);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = thread_cpu_seconds() - cpu0;
  CHECK(c.status == Status::ok);
  INFO("waited " << wall << " s, used " << cpu << " s of CPU, " << (s.ep->stats().sleeps - sleeps_before) << " sleeps");
  CHECK(wall > 0.2);
  // Spinning uses about the whole wait; sleeping a few per cent.
  CHECK(cpu < 0.25 * wall);
  CHECK(s.ep->stats().sleeps > sleeps_before);
  boot->barrier(60s);
  CHECK(rpt::reap(kid, 30s) == 0);
}
