// Ring-buffer channel (regpool/ring_channel.hpp) on shm and tcp, and on
// verbs in the Soft-RoCE guest (verbs-patterns-ring): records arrive once,
// in order and intact across many wrap-arounds (two processes); a full ring
// blocks the producer until the consumer returns credits, and the producer
// never overwrites unread records; a producer or consumer killed with
// SIGKILL is reported by the survivor within a bound; a hostile producer's
// tail or record cannot make the consumer read outside its ring; setup
// blobs are validated.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "patterns/ring_wire.hpp"
#include "regpool/ring_channel.hpp"
#include "patterns/local_pair.hpp"

using namespace std::chrono_literals;
using regpool::RingConfig;
using regpool::RingConsumer;
using regpool::RingProducer;
using regpool::Slice;
using regpool::Status;
using Clock = std::chrono::steady_clock;
using rpt::is_record;
using rpt::make_record;
using rpt::quick_config;

TEST_CASE("ring: records arrive once, in order and intact across many wrap-arounds", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  const std::uint64_t batch = GENERATE(std::uint64_t{0}, std::uint64_t{1024});
  INFO("backend " << prov << ", post_batch " << batch);
  const std::uint64_t kRecords = rpt::scaled(20000);
  constexpr std::size_t kMax = 300;
  RingConfig cfg;
  cfg.capacity = 4096;  // about 20 records: thousands of wrap-arounds, pads and gaps
  cfg.post_batch = batch;
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();

  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov, quick_config());
        const auto peer = s.ep->insert_peer(b->allgather(s.ep->name(), 20s)[0]);
        // The consumer exposes its ring to us meanwhile: connecting needs our progress.
        const auto blob = rpt::allgather_progressing(*b, *s.ep, {}, 20s)[0];
        RingProducer p(*s.ep, *s.pool, peer, blob, cfg);
        (void)b->allgather(p.setup(), 20s);
        for (std::uint64_t i = 0; i < kRecords; ++i) {
          const auto r = make_record(i, kMax);
          const Status st = p.push(r, 20s);
          if (st != Status::ok) std::fprintf(stderr, "push %llu: %s\n", static_cast<unsigned long long>(i), regpool::to_string(st));
          RPT_CHECK(st == Status::ok);
        }
        RPT_CHECK(p.drain(20s) == Status::ok);
        RPT_CHECK(p.stats().records == kRecords);
        RPT_CHECK(p.stats().pads > 0);
        b->barrier(30s);
        return 0;
      },
      120);

  rpt::Stack s(prov, quick_config());
  const auto producer = s.ep->insert_peer(boot->allgather(s.ep->name(), 20s)[1]);
  RingConsumer c(*s.ep, *s.pool, producer, cfg);
  (void)boot->allgather(c.setup(), 20s);
  c.connect(boot->allgather({}, 20s)[1]);
  std::uint64_t got = 0, intact = 0;
  const auto deadline = Clock::now() + 90s;
  while (got < kRecords && Clock::now() < deadline) {
    auto r = c.peek();
    if (!r) {
      if (r.status() != Status::would_block) FAIL("peek: " << regpool::to_string(r.status()));
      continue;
    }
    if (is_record(*r, got, kMax)) ++intact;
    ++got;
    if (c.pop() != Status::ok) FAIL("pop");
  }
  CHECK(got == kRecords);
  CHECK(intact == kRecords);
  CHECK(c.stats().records == kRecords);
  CHECK(c.stats().pads > 0);
  // Nothing more than was sent (peeking a while also serves the producer's
  // last tail put, which completes only with our progress on tcp).
  const auto grace = Clock::now() + 300ms;
  std::uint64_t extra = 0;
  while (Clock::now() < grace) extra += c.peek().status() != Status::would_block;
  CHECK(extra == 0);
  boot->barrier(30s);
  CHECK(rpt::reap(kid, 30s) == 0);
}

TEST_CASE("ring: a full ring blocks the producer, which never overwrites unread records", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  rpt::LocalPair pr(prov);
  RingConfig cfg;
  cfg.capacity = 1024;
  RingConsumer c(*pr.s.ep, *pr.s.pool, pr.to_ep2, cfg);
  RingProducer p(*pr.ep2, *pr.s.pool, pr.to_ep1, c.setup(), cfg);
  c.connect(p.setup());
  CHECK(p.max_record() == 1024 - 16);

  // 64-byte records take 80 bytes: 12 fit (960), the 13th needs a pad of the
  // last 64 bytes and then finds no room.
  auto rec64 = [](std::uint64_t i) {
    std::vector<std::byte> r(64);
    rpt::fill(r, i);
    return r;
  };
  std::uint64_t pushed = 0;
  while (p.try_push(rec64(pushed)) == Status::ok) {
    ++pushed;
    REQUIRE(pushed < 100);
  }
  CHECK(pushed == 12);
  CHECK(p.stats().full == 1);
  // However long both sides progress, no room appears while nothing is read.
  for (int i = 0; i < 200; ++i) {
    REQUIRE(p.progress() == Status::ok);
    CHECK(p.try_push(rec64(pushed)) == Status::would_block);
    (void)pr.s.ep->progress();
  }
  // Read the records in place while pushing more: each is still the one
  // written, in order.
  std::uint64_t read = 0;
  std::uint64_t next_push = pushed;
  const auto deadline = Clock::now() + 20s;
  while (read < 40 && Clock::now() < deadline) {
    (void)p.progress();
    if (next_push < 40 && p.try_push(rec64(next_push)) == Status::ok) ++next_push;
    auto rec = c.peek();
    if (!rec) {
      if (rec.status() != Status::would_block) FAIL("peek: " << regpool::to_string(rec.status()));
      continue;
    }
    CHECK(rec->size() == 64);
    CHECK(std::memcmp(rec->data(), rec64(read).data(), 64) == 0);
    ++read;
    REQUIRE(c.pop() == Status::ok);
  }
  CHECK(next_push == 40);
  CHECK(read == 40);
  CHECK(c.stats().control_puts > 0);  // credits flowed back
  CHECK(p.stats().full > 1);
}

TEST_CASE("ring: a hostile producer cannot make the consumer read outside its ring", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  const int attack = GENERATE(0, 1, 2);
  INFO("backend " << prov << ", attack " << attack);
  rpt::LocalPair pr(prov);
  RingConfig cfg;
  cfg.capacity = 1024;
  RingConsumer c(*pr.s.ep, *pr.s.pool, pr.to_ep2, cfg);
  // The attacker holds what an honest producer would: the setup blob.
  auto setup = regpool::ring::decode_consumer_setup(c.setup());
  REQUIRE(setup.ok());
  auto buf = pr.s.alloc(64);
  const Slice word = rpt::slice_or_die(Slice::data(buf, 0, 16));
  const Slice header = rpt::slice_or_die(Slice::data(buf, 16, 16));
  // The target's endpoint must progress for the first put (and every put on
  // tcp) to complete: a helper thread serves it meanwhile.
  auto put = [&](const Slice& from, std::uint64_t offset) {
    std::atomic<bool> stop{false};
    std::thread serve([&] {
      while (!stop.load()) (void)pr.s.ep->progress();
    });
    const auto done = rpt::wait_ok(*pr.ep2, pr.ep2->put(from, pr.to_ep1, setup->ring, offset), 10s);
    stop = true;
    serve.join();
    REQUIRE(done.status == Status::ok);
  };
  std::uint64_t tail = 0;
  regpool::ring::RecordHeader h{regpool::ring::RecordKind::data, 8, 0};
  switch (attack) {
    case 0: tail = 2048; break;  // a tail beyond head + capacity
    case 1: h.length = 4000; tail = 64; break;  // a record longer than the ring
    case 2: h.sequence = 7; tail = 64; break;  // a record out of sequence
  }
  regpool::ring::encode_header(header.bytes().first<16>(), h, setup->nonce);
  put(header, regpool::ring::kControlBytes);
  regpool::ring::encode_word(word.bytes().first<16>(), regpool::ring::WordKind::tail, {tail, 0}, setup->nonce);
  put(word, 0);
  Status st = Status::would_block;
  const auto deadline = Clock::now() + 10s;
  while (st == Status::would_block && Clock::now() < deadline) {
    (void)pr.ep2->progress();
    auto r = c.peek();
    st = r.status();
  }
  CHECK(st == Status::malformed);
  CHECK(c.status() == Status::malformed);
  CHECK(c.stats().records == 0);
}

TEST_CASE("ring: setup blobs are validated", "[fabric]") {
  rpt::LocalPair pr(rpt::backends().front());
  RingConfig cfg;
  cfg.capacity = 512;
  RingConsumer c(*pr.s.ep, *pr.s.pool, pr.to_ep2, cfg);
  auto blob = c.setup();
  REQUIRE(blob.size() == regpool::ring::kConsumerBlobSize);
  for (std::size_t i = 0; i < blob.size(); i += 7) {
    auto bad = blob;
    bad[i] ^= std::byte{0x10};
    CHECK_THROWS_AS(RingProducer(*pr.ep2, *pr.s.pool, pr.to_ep1, bad, cfg), regpool::Error);
  }
  CHECK_THROWS_AS(RingProducer(*pr.ep2, *pr.s.pool, pr.to_ep1, std::span(blob).first(40), cfg),
                  regpool::Error);
  RingProducer p(*pr.ep2, *pr.s.pool, pr.to_ep1, blob, cfg);
  // Another channel's producer blob (its nonce) is refused.
  RingConsumer other(*pr.s.ep, *pr.s.pool, pr.to_ep2, cfg);
  RingProducer p2(*pr.ep2, *pr.s.pool, pr.to_ep1, other.setup(), cfg);
  CHECK_THROWS_AS(c.connect(p2.setup()), regpool::Error);
  c.connect(p.setup());
  cfg.capacity = 1000 + 1;
  CHECK_THROWS_AS(RingConsumer(*pr.s.ep, *pr.s.pool, pr.to_ep2, cfg), regpool::Error);
}

namespace {

// The survivor's side of a kill test: returns the status that ended the
// channel and how long after the kill it came.
struct Outcome {
  Status status = Status::ok;
  std::chrono::milliseconds after{0};
};

constexpr auto kDeathBound = 8s;  // keepalive 200 ms + op_timeout 3 s + margin

}  // namespace

TEST_CASE("ring: a killed producer is reported to the consumer in bounded time", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  RingConfig cfg;
  cfg.capacity = 8192;
  cfg.keepalive = 200ms;
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov, quick_config());
        const auto peer = s.ep->insert_peer(b->allgather(s.ep->name(), 20s)[0]);
        RingProducer p(*s.ep, *s.pool, peer, rpt::allgather_progressing(*b, *s.ep, {}, 20s)[0], cfg);
        (void)b->allgather(p.setup(), 20s);
        for (std::uint64_t i = 0;; ++i) {
          RPT_CHECK(p.push(make_record(i, 200), 20s) == Status::ok);
        }
      },
      120);
  rpt::Stack s(prov, quick_config());
  const auto producer = s.ep->insert_peer(boot->allgather(s.ep->name(), 20s)[1]);
  RingConsumer c(*s.ep, *s.pool, producer, cfg);
  (void)boot->allgather(c.setup(), 20s);
  c.connect(boot->allgather({}, 20s)[1]);
  std::uint64_t got = 0;
  while (got < 2000) {
    auto r = c.peek();
    if (!r) {
      if (r.status() != Status::would_block) FAIL("peek: " << regpool::to_string(r.status()));
      continue;
    }
    REQUIRE(is_record(*r, got, 200));
    ++got;
    REQUIRE(c.pop() == Status::ok);
  }
  ::kill(kid.pid, SIGKILL);
  const auto killed = Clock::now();
  CHECK(rpt::reap(kid, 10s) == 128 + SIGKILL);
  Status st = Status::ok;
  while (Clock::now() - killed < 30s) {
    auto r = c.peek();
    if (r) {
      REQUIRE(is_record(*r, got, 200));  // records already in the ring are still good
      ++got;
      REQUIRE(c.pop() == Status::ok);
      continue;
    }
    if (r.status() != Status::would_block) {
      st = r.status();
      break;
    }
  }
  const auto after = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed);
  INFO("reported " << regpool::to_string(st) << " after " << after.count() << " ms");
  CHECK((st == Status::peer_unreachable || st == Status::timeout));
  CHECK(after < kDeathBound);
}

TEST_CASE("ring: a killed consumer is reported to the producer in bounded time", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  RingConfig cfg;
  cfg.capacity = 8192;
  cfg.keepalive = 200ms;
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov, quick_config());
        const auto peer = s.ep->insert_peer(b->allgather(s.ep->name(), 20s)[0]);
        RingConsumer c(*s.ep, *s.pool, peer, cfg);
        (void)b->allgather(c.setup(), 20s);
        c.connect(b->allgather({}, 20s)[0]);
        for (;;) {  // consume until killed
          auto r = c.peek();
          if (r) {
            RPT_CHECK(c.pop() == Status::ok);
          } else {
            RPT_CHECK(r.status() == Status::would_block);
          }
        }
      },
      120);
  rpt::Stack s(prov, quick_config());
  const auto consumer = s.ep->insert_peer(boot->allgather(s.ep->name(), 20s)[1]);
  RingProducer p(*s.ep, *s.pool, consumer, rpt::allgather_progressing(*boot, *s.ep, {}, 20s)[1], cfg);
  (void)boot->allgather(p.setup(), 20s);
  for (std::uint64_t i = 0; i < 2000; ++i) REQUIRE(p.push(make_record(i, 200), 20s) == Status::ok);
  ::kill(kid.pid, SIGKILL);
  const auto killed = Clock::now();
  CHECK(rpt::reap(kid, 10s) == 128 + SIGKILL);
  // Keep pushing: the ring fills, and the producer must learn the consumer is
  // gone rather than wait for credits for ever.
  Status st = Status::ok;
  std::uint64_t i = 2000;
  while (st == Status::ok && Clock::now() - killed < 30s) {
    st = p.push(make_record(i++, 200), 100ms);
    if (st == Status::timeout) st = Status::ok;  // still waiting for room: go on
  }
  const auto after = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed);
  const auto rs = p.stats();
  const auto es = s.ep->stats();
  INFO("reported " << regpool::to_string(st) << " after " << after.count() << " ms; ring: record_puts "
                   << rs.record_puts << " control_puts " << rs.control_puts << " keepalives " << rs.keepalives
                   << " full " << rs.full << "; endpoint: posted " << es.posted << " completed " << es.completed
                   << " failed " << es.failed << " rejected " << es.rejected << " timeouts " << es.timeouts
                   << " post_retries " << es.post_retries << " in_flight " << es.in_flight);
  CHECK((st == Status::peer_unreachable || st == Status::timeout || st == Status::transport_error));
  CHECK(p.status() == st);  // what push() reported is the channel's failure, not its own deadline
  CHECK(after < kDeathBound);
}
