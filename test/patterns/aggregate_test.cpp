// Aggregation buffer (regpool/aggregator.hpp) on shm and tcp, and on verbs
// in the Soft-RoCE guest (verbs-patterns-aggregate): every record
// delivered once and in order (two processes); a batch goes out on each
// trigger (size, deadline, demand) and not before; a malformed batch is
// dropped whole and the receiver goes on.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "patterns/aggregate_wire.hpp"
#include "regpool/aggregator.hpp"
#include "patterns/local_pair.hpp"

using namespace std::chrono_literals;
using regpool::AggregateReceiver;
using regpool::Aggregator;
using regpool::AggregatorConfig;
using regpool::Slice;
using regpool::Status;
using Clock = std::chrono::steady_clock;
using rpt::is_record;
using rpt::make_record;
using rpt::quick_config;

namespace {

// Progress both sides for `rounds`, collecting what arrives.
std::vector<std::vector<std::byte>> collect(rpt::LocalPair& pr, Aggregator& a, AggregateReceiver& r, int rounds) {
  std::vector<std::vector<std::byte>> out;
  for (int i = 0; i < rounds; ++i) {
    REQUIRE(a.progress() == Status::ok);
    for (;;) {
      auto rec = r.next();
      if (!rec) {
        REQUIRE(rec.status() == Status::would_block);
        break;
      }
      CHECK(rec->peer == pr.to_ep2);
      out.emplace_back(rec->bytes.begin(), rec->bytes.end());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("aggregate: every record is delivered once, in order, intact", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  const std::uint64_t kRecords = rpt::scaled(50000);
  constexpr std::size_t kMax = 120;
  AggregatorConfig cfg;
  cfg.batch_bytes = 4096;
  cfg.buffers = 8;
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov, quick_config());
        const auto peer = s.ep->insert_peer(b->allgather(s.ep->name(), 20s)[0]);
        b->barrier(20s);  // the receiver's receives are posted
        Aggregator a(*s.ep, *s.pool, peer, cfg);
        for (std::uint64_t i = 0; i < kRecords; ++i) {
          const auto rec = make_record(i, kMax);
          Status st;
          while ((st = a.append(rec)) == Status::would_block) RPT_CHECK(a.progress() == Status::ok);
          RPT_CHECK(st == Status::ok);
        }
        RPT_CHECK(a.drain(20s) == Status::ok);
        RPT_CHECK(a.stats().records == kRecords);
        RPT_CHECK(a.stats().by_size > 0);
        RPT_CHECK(a.stats().by_demand == 1);  // the last, partial batch
        (void)b->allgather(rpt::pod_bytes(a.stats().batches), 30s);
        return 0;
      },
      120);
  rpt::Stack s(prov, quick_config());
  const auto sender = s.ep->insert_peer(boot->allgather(s.ep->name(), 20s)[1]);
  AggregateReceiver r(*s.ep, *s.pool, cfg);
  boot->barrier(20s);
  std::uint64_t got = 0, intact = 0;
  const auto deadline = Clock::now() + 90s;
  while (got < kRecords && Clock::now() < deadline) {
    auto rec = r.next();
    if (!rec) {
      if (rec.status() != Status::would_block) FAIL("next: " << regpool::to_string(rec.status()));
      continue;
    }
    if (rec->peer != sender) FAIL("record from peer " << rec->peer);
    if (is_record(rec->bytes, got, kMax)) ++intact;
    ++got;
  }
  CHECK(got == kRecords);
  CHECK(intact == kRecords);
  CHECK(r.stats().out_of_order == 0);
  CHECK(r.stats().malformed == 0);
  const auto sent = rpt::from_bytes<std::uint64_t>(boot->allgather({}, 30s)[1]);
  CHECK(r.stats().batches == sent);
  CHECK(r.next().status() == Status::would_block);  // nothing twice
  CHECK(rpt::reap(kid, 30s) == 0);
}

TEST_CASE("aggregate: a batch goes out on each trigger and not before", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  rpt::LocalPair pr(prov);
  AggregatorConfig rcfg;
  rcfg.batch_bytes = 1024;
  AggregateReceiver r(*pr.s.ep, *pr.s.pool, rcfg);

  SECTION("demand: nothing moves until flush()") {
    Aggregator a(*pr.ep2, *pr.s.pool, pr.to_ep1, rcfg);
    for (std::uint64_t i = 0; i < 3; ++i) REQUIRE(a.append(make_record(i, 50)) == Status::ok);
    CHECK(collect(pr, a, r, 200).empty());
    CHECK(a.stats().batches == 0);
    REQUIRE(a.flush() == Status::ok);
    std::vector<std::vector<std::byte>> got;
    const auto deadline = Clock::now() + 10s;
    while (got.size() < 3 && Clock::now() < deadline) {
      auto more = collect(pr, a, r, 1);
      got.insert(got.end(), more.begin(), more.end());
    }
    REQUIRE(got.size() == 3);
    for (std::uint64_t i = 0; i < 3; ++i) CHECK(is_record(got[i], i, 50));
    CHECK(a.stats().by_demand == 1);
    CHECK(a.stats().by_size == 0);
    CHECK(a.stats().by_deadline == 0);
  }
  SECTION("size: a batch leaves once it holds flush_bytes") {
    AggregatorConfig cfg = rcfg;
    cfg.flush_bytes = 100;  // 16-byte header + 24 per 20-byte record: the 4th record closes it
    Aggregator a(*pr.ep2, *pr.s.pool, pr.to_ep1, cfg);
    std::vector<std::byte> rec(20);
    for (int i = 0; i < 3; ++i) REQUIRE(a.append(rec) == Status::ok);
    CHECK(a.stats().batches == 0);
    REQUIRE(a.append(rec) == Status::ok);
    CHECK(a.stats().by_size == 1);
    std::size_t got = 0;
    for (int i = 0; i < 36; ++i) {
      while (a.append(rec) == Status::would_block) got += collect(pr, a, r, 1).size();
    }
    CHECK(a.stats().by_size == 10);
    const auto deadline = Clock::now() + 10s;
    while (got < 40 && Clock::now() < deadline) got += collect(pr, a, r, 1).size();
    CHECK(got == 40);
    CHECK(r.stats().batches == 10);
    CHECK(a.stats().by_demand == 0);
  }
  SECTION("deadline: a lone record leaves once it has waited the deadline") {
    AggregatorConfig cfg = rcfg;
    cfg.deadline = 20ms;
    Aggregator a(*pr.ep2, *pr.s.pool, pr.to_ep1, cfg);
    const auto t0 = Clock::now();
    REQUIRE(a.append(make_record(7, 50)) == Status::ok);
    std::vector<std::vector<std::byte>> got;
    while (got.empty() && Clock::now() - t0 < 5s) {
      auto more = collect(pr, a, r, 1);
      got.insert(got.end(), more.begin(), more.end());
    }
    const auto waited = Clock::now() - t0;
    REQUIRE(got.size() == 1);
    CHECK(is_record(got[0], 7, 50));
    CHECK(waited >= 20ms);
    CHECK(waited < 2s);
    CHECK(a.stats().by_deadline == 1);
    CHECK(a.stats().by_size + a.stats().by_demand == 0);
  }
}

TEST_CASE("aggregate: a malformed batch is dropped whole, the receiver goes on", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  rpt::LocalPair pr(prov);
  AggregatorConfig cfg;
  cfg.batch_bytes = 512;
  AggregateReceiver r(*pr.s.ep, *pr.s.pool, cfg);
  // A batch whose second record runs past the end of the message.
  auto bad = pr.s.alloc(64);
  regpool::aggregate::BatchWriter w(bad.data().first(64));
  std::vector<std::byte> rec(8, std::byte{1});
  REQUIRE(w.append(rec));
  REQUIRE(w.append(rec));
  w.finish(0);
  bad.data()[16 + 12] = std::byte{200};  // second record's length
  // Posted without waiting: the receiver's progress below completes it.
  auto raw = pr.ep2->send(pr.to_ep1, rpt::slice_or_die(Slice::data(bad, 0, w.size())), [](const regpool::Completion&) {});
  REQUIRE(raw.ok());
  Aggregator a(*pr.ep2, *pr.s.pool, pr.to_ep1, cfg);
  REQUIRE(a.append(make_record(3, 40)) == Status::ok);
  REQUIRE(a.flush() == Status::ok);
  std::vector<std::vector<std::byte>> got;
  const auto deadline = Clock::now() + 10s;
  while (got.empty() && Clock::now() < deadline) got = collect(pr, a, r, 1);
  REQUIRE(got.size() == 1);
  CHECK(is_record(got[0], 3, 40));
  CHECK(r.stats().malformed == 1);
  CHECK(r.stats().records == 1);
}
