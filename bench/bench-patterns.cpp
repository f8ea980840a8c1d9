// bench-patterns: message rate of small records (8-256 B) over the ring
// channel, the aggregation buffer and plain untagged and tagged send
// (Messenger), in the same run;
// then the one-way latency of paced records at each flush setting of the
// aggregation buffer, beside ring and plain send.
//
//   bench-patterns [--provider shm|tcp|net|tcp;ofi_rxm|verbs[:DEV]] [--records N] [--smoke] [--json]
//
// Forks one receiving process per method (a fresh endpoint each: the
// aggregation receiver owns its endpoint's untagged receives). Latency:
// every record carries the sender's CLOCK_MONOTONIC (steady_clock) time, the
// receiver subtracts it on arrival (both processes on one machine share the
// clock); the sender paces one record every --gap-us (default 20 us).
// Rates are end to end: records received over the time from the first
// record's send stamp to the last record's arrival.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "regpool/aggregator.hpp"
#include "regpool/bootstrap.hpp"
#include "regpool/messaging.hpp"
#include "regpool/pool.hpp"
#include "regpool/ring_channel.hpp"
#include "regpool/slice.hpp"
#include "regpool_config.h"

#if REGPOOL_HAVE_FABRIC
#include "regpool/fabric_domain.hpp"
#include "regpool/fabric_endpoint.hpp"
#endif
#if REGPOOL_HAVE_VERBS && __has_include("regpool/verbs_endpoint.hpp")
#include "regpool/verbs_domain.hpp"
#include "regpool/verbs_endpoint.hpp"
#define BENCH_HAVE_VERBS 1
#else
#define BENCH_HAVE_VERBS 0
#endif

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using regpool::Slice;
using regpool::Status;

[[noreturn]] void die(const std::string& what, Status st = Status::ok) {
  std::fprintf(stderr, "bench-patterns: %s%s%s\n", what.c_str(), st == Status::ok ? "" : ": ",
               st == Status::ok ? "" : regpool::to_string(st));
  std::exit(1);
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

struct Options {
  std::string provider = "shm";
  std::uint64_t records = 200000;
  std::uint64_t paced = 5000;
  std::chrono::microseconds gap{20};
  std::string methods = "send,tagged,ring,ring-batch,aggregate";
  bool json = false;
  bool smoke = false;
};

// One benchmark case: a method and its parameters.
struct Case {
  std::string method;  // ring, ring-batch, aggregate, send
  std::size_t size = 8;
  bool paced = false;
  std::chrono::microseconds deadline{0};
  std::uint32_t flush_bytes = 0;  // aggregate: 0 = full batch
  std::string label;
};

struct Result {
  double rate = 0;       // records per second at the receiver
  double p50_us = 0;     // paced: one-way latency
  double p99_us = 0;
  std::uint64_t records = 0;
};

constexpr std::size_t kSendWindow = 64;
constexpr std::size_t kRecvPosted = 128;
constexpr std::uint32_t kBatch = 8192;

struct Stack {
  std::shared_ptr<regpool::Domain> domain;
  std::unique_ptr<regpool::Pool> pool;
  std::unique_ptr<regpool::Endpoint> ep;
  explicit Stack(const std::string& prov) {
    regpool::EndpointConfig ec;
    ec.max_in_flight = 1024;
    if (prov == "verbs" || prov.rfind("verbs:", 0) == 0) {
#if BENCH_HAVE_VERBS
      regpool::VerbsConfig vc;
      if (prov.size() > 6) vc.device = prov.substr(6);
      auto vd = regpool::VerbsDomain::open(vc);
      domain = vd;
      make_pool();
      ep = regpool::VerbsEndpoint::open(vd, ec);
      return;
#else
      die("this build has no verbs transport");
#endif
    }
#if REGPOOL_HAVE_FABRIC
    ::setenv("FI_TCP_IFACE", "lo", 0);
    regpool::FabricConfig fc;
    fc.provider = prov;
    // Every provider over sockets (tcp = net, tcp;ofi_rxm) stays on loopback.
    if (prov != "shm") fc.node = "127.0.0.1";
    auto fd = regpool::FabricDomain::open(fc);
    domain = fd;
    make_pool();
    ep = regpool::FabricEndpoint::open(fd, ec);
#else
    die("this build has no libfabric transport (provider " + prov + ")");
#endif
  }
  void make_pool() {
    regpool::PoolConfig pc;
    pc.arena_size = std::size_t{32} << 20;
    pool = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain}, pc);
  }
  ~Stack() {
    ep.reset();
    pool.reset();
  }
};

// Receiver's bookkeeping: count, first/last arrival, latencies when paced.
struct Tally {
  std::uint64_t n = 0;
  std::int64_t first = 0, last = 0;  // the first record's send stamp, the last arrival
  std::vector<double> lat;
  void record(std::span<const std::byte> r, bool paced) {
    const std::int64_t t = now_ns();
    std::int64_t sent = 0;
    std::memcpy(&sent, r.data(), std::min<std::size_t>(8, r.size()));
    if (n == 0) first = sent;
    last = t;
    ++n;
    if (paced) lat.push_back(static_cast<double>(t - sent) / 1000.0);
  }
  Result result() {
    Result r;
    r.records = n;
    if (n > 0 && last > first) r.rate = static_cast<double>(n) * 1e9 / static_cast<double>(last - first);
    if (!lat.empty()) {
      std::sort(lat.begin(), lat.end());
      r.p50_us = lat[lat.size() / 2];
      r.p99_us = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
    }
    return r;
  }
};

void stamp(std::span<std::byte> rec, std::uint64_t i) {
  std::memset(rec.data(), static_cast<int>(i & 0xff), rec.size());
  const std::int64_t t = now_ns();
  std::memcpy(rec.data(), &t, std::min<std::size_t>(8, rec.size()));
}

// Sender pacing: returns when the i-th record is due, calling `idle` (the
// method's progress) while it waits, as an application between records
// would: an aggregation deadline can only fire in someone's progress, and a
// pacing loop that never progressed measured the gap, not the deadline.
template <class Idle>
void pace(const Case& c, const Options& o, Clock::time_point start, std::uint64_t i, Idle&& idle) {
  if (!c.paced) return;
  const auto due = start + o.gap * static_cast<long>(i);
  while (Clock::now() < due) idle();
}

// An allgather during which this process's endpoint keeps progressing. On
// verbs a ring's exposure is bound for its peer on the connection to that
// peer, made on first use: the exposing side waits for the peer to answer
// the connection request, which the peer can only do in its progress, not
// while it blocks in the bootstrap.
std::vector<std::byte> exchange(regpool::TcpBootstrap& b, regpool::Endpoint& ep, std::span<const std::byte> mine,
                                int from) {
  std::atomic<bool> stop{false};
  std::thread progress([&] {
    while (!stop.load(std::memory_order_acquire)) ep.progress_for(2ms);
  });
  std::vector<std::vector<std::byte>> all;
  try {
    all = b.allgather(mine, 30s);
  } catch (...) {
    stop.store(true, std::memory_order_release);
    progress.join();
    throw;
  }
  stop.store(true, std::memory_order_release);
  progress.join();
  return all.at(static_cast<std::size_t>(from));
}

// ---- receivers (aggregate, send): run until `count` records arrived (or a
// bound passes). The ring's consumer is in run_method.
Result receive(const Case& c, std::uint64_t count, Stack& s, regpool::TcpBootstrap& b) {
  Tally t;
  if (c.paced) t.lat.reserve(count);
  const auto bound = Clock::now() + 120s;
  if (c.method == "aggregate") {
    regpool::AggregatorConfig ac;
    ac.batch_bytes = kBatch;
    ac.buffers = 16;
    static std::unique_ptr<regpool::AggregateReceiver> recv;  // one per endpoint (owns its receives)
    if (!recv) recv = std::make_unique<regpool::AggregateReceiver>(*s.ep, *s.pool, ac);
    (void)b.allgather({}, 30s);
    while (t.n < count && Clock::now() < bound) {
      auto r = recv->next();
      if (!r) {
        if (r.status() != Status::would_block) die("aggregate next", r.status());
        continue;
      }
      t.record(r->bytes, c.paced);
    }
    return t.result();
  }
  // kRecvPosted receives (tagged: Messenger, any source and tag; plain:
  // untagged), posted once for all cases and each re-posted once read.
  // They complete in posting order: the oldest is where the last case
  // stopped (a case's count need not be a multiple of kRecvPosted).
  struct Posted {
    std::vector<regpool::Ldo> bufs;
    std::vector<std::uint8_t> ready;  // 0 posted, 1 ok, 2 failed
    std::vector<std::uint32_t> got;
    std::size_t head = 0;
  };
  const bool tagged = c.method == "tagged";
  static std::unique_ptr<regpool::Messenger> m;  // one per endpoint (owns its receives)
  static Posted posted[2];
  Posted& r = posted[tagged ? 1 : 0];
  auto post = [&](std::size_t k) {
    r.ready[k] = 0;
    auto sl = *Slice::data(r.bufs[k], 0, 256);
    Status st = Status::ok;
    if (tagged) {
      st = m->recv(regpool::kAnyPeer, 0, ~std::uint64_t{0}, sl, [&r, k](regpool::MessageCompletion& done) {
              r.got[k] = static_cast<std::uint32_t>(done.received);
              r.ready[k] = done.status == Status::ok ? 1 : 2;
            }).status();
    } else {
      st = s.ep->post_recv(sl, [&r, k](const regpool::Completion& done) {
              r.got[k] = static_cast<std::uint32_t>(done.bytes);
              r.ready[k] = done.status == Status::ok ? 1 : 2;
            }).status();
    }
    if (st != Status::ok) die(c.method + " receive post", st);
  };
  if (r.bufs.empty()) {
    if (tagged) m = std::make_unique<regpool::Messenger>(*s.ep, *s.pool);
    for (std::size_t i = 0; i < kRecvPosted; ++i) r.bufs.push_back(*s.pool->allocate(256));
    r.ready.assign(kRecvPosted, 0);
    r.got.assign(kRecvPosted, 0);
    for (std::size_t k = 0; k < kRecvPosted; ++k) post(k);
  }
  (void)b.allgather({}, 30s);
  while (t.n < count && Clock::now() < bound) {
    (void)(tagged ? m->progress() : s.ep->progress());
    while (r.ready[r.head] != 0) {
      if (r.ready[r.head] != 1) die(c.method + " receive failed");
      t.record(std::span<const std::byte>(r.bufs[r.head].data().data(), r.got[r.head]), c.paced);
      post(r.head);
      r.head = (r.head + 1) % kRecvPosted;
    }
  }
  return t.result();
}

// ---- senders
void send_all(const Case& c, std::uint64_t count, const Options& o, Stack& s, regpool::TcpBootstrap& b,
              regpool::PeerId peer) {
  std::vector<std::byte> rec(c.size);
  if (c.method == "ring" || c.method == "ring-batch") {
    regpool::RingConfig rc;
    rc.post_batch = c.method == "ring-batch" ? 4096 : 0;
    regpool::RingProducer prod(*s.ep, *s.pool, peer, exchange(b, *s.ep, {}, 1), rc);
    (void)exchange(b, *s.ep, prod.setup(), 1);  // the consumer connects
    const auto start = Clock::now();
    for (std::uint64_t i = 0; i < count; ++i) {
      pace(c, o, start, i, [&] { (void)prod.progress(); });
      stamp(rec, i);
      Status st;
      while ((st = prod.try_push(rec)) == Status::would_block) {
        if (const Status p = prod.progress(); p != Status::ok) die("ring progress", p);
      }
      if (st != Status::ok) die("ring push", st);
      if (c.paced) (void)prod.progress();
    }
    if (const Status d = prod.drain(60s); d != Status::ok) die("ring drain", d);
    b.barrier(60s);
    return;
  }
  if (c.method == "aggregate") {
    regpool::AggregatorConfig ac;
    ac.batch_bytes = kBatch;
    ac.buffers = 16;
    ac.deadline = c.deadline;
    ac.flush_bytes = c.flush_bytes;
    regpool::Aggregator agg(*s.ep, *s.pool, peer, ac);
    (void)b.allgather({}, 30s);
    const auto start = Clock::now();
    for (std::uint64_t i = 0; i < count; ++i) {
      pace(c, o, start, i, [&] { (void)agg.progress(); });
      stamp(rec, i);
      Status st;
      while ((st = agg.append(rec)) == Status::would_block) {
        if (const Status p = agg.progress(); p != Status::ok) die("aggregate progress", p);
      }
      if (st != Status::ok) die("aggregate append", st);
      if (c.paced) (void)agg.progress();  // notices the deadline between records
    }
    if (const Status d = agg.drain(60s); d != Status::ok) die("aggregate drain", d);
    b.barrier(60s);
    return;
  }
  if (c.method == "tagged") {
    // Tagged send: the same window, through the Messenger (eager: copied
    // into a bounce LDO, so a send completes once handed over).
    static std::unique_ptr<regpool::Messenger> m;
    if (!m) m = std::make_unique<regpool::Messenger>(*s.ep, *s.pool);
    std::vector<regpool::MessageToken> tokens(kSendWindow);
    auto buf = *s.pool->allocate(256);
    (void)b.allgather({}, 30s);
    const auto start = Clock::now();
    for (std::uint64_t i = 0; i < count; ++i) {
      pace(c, o, start, i, [&] { (void)m->progress(); });
      const std::size_t w = i % kSendWindow;
      if (tokens[w]) {
        const auto done = m->wait(tokens[w], 60s);
        if (done.status != Status::ok) die("tagged send", done.status);
      }
      auto sl = *Slice::data(buf, 0, c.size);
      stamp(sl.bytes(), i);
      auto t = m->send(peer, i, sl);
      if (!t) die("tagged send post", t.status());
      tokens[w] = *t;
      if (c.paced) (void)m->progress();
    }
    for (auto& t : tokens) {
      if (t) (void)m->wait(t, 60s);
    }
    b.barrier(60s);
    return;
  }
  // Plain send: a window of kSendWindow buffers, each reused once its send completed.
  std::vector<regpool::Ldo> bufs;
  for (std::size_t i = 0; i < kSendWindow; ++i) bufs.push_back(*s.pool->allocate(256));
  std::vector<regpool::Token> tokens(kSendWindow);
  (void)b.allgather({}, 30s);
  const auto start = Clock::now();
  for (std::uint64_t i = 0; i < count; ++i) {
    pace(c, o, start, i, [&] { (void)s.ep->progress(); });
    const std::size_t w = i % kSendWindow;
    if (tokens[w]) {
      const auto done = s.ep->wait(tokens[w], 60s);
      if (done.status != Status::ok) die("send", done.status);
    }
    auto sl = *Slice::data(bufs[w], 0, c.size);
    stamp(sl.bytes(), i);
    auto t = s.ep->send(peer, sl);
    if (!t) die("send post", t.status());
    tokens[w] = *t;
    if (c.paced) (void)s.ep->progress();
  }
  for (auto& t : tokens) {
    if (t) (void)s.ep->wait(t, 60s);
  }
  b.barrier(60s);
}

std::uint64_t count_for(const Case& c, const Options& o) { return c.paced ? o.paced : o.records; }

void out_append(std::vector<std::byte>& out, const Result& r) {
  const auto* p = reinterpret_cast<const std::byte*>(&r);
  out.insert(out.end(), p, p + sizeof r);
}

// The receiver keeps its endpoint progressing until the sender has drained
// (on tcp the sender's last operations complete only with our progress).
void serve_barrier(Stack& s, regpool::TcpBootstrap& b) {
  std::atomic<bool> done{false};
  std::thread serve([&] {
    while (!done.load(std::memory_order_acquire)) (void)s.ep->progress();
  });
  b.barrier(60s);
  done.store(true, std::memory_order_release);
  serve.join();
}

// One method's cases in a fresh pair of processes: the child receives.
std::vector<Result> run_method(const std::vector<Case>& cases, const Options& o) {
  regpool::TcpBootstrapConfig bc;
  bc.rank = 0;
  bc.size = 2;
  bc.connect_timeout = 30s;
  auto root = std::make_unique<regpool::TcpBootstrap>(bc);
  const auto port = root->port();
  std::fflush(nullptr);
  const pid_t kid = ::fork();
  if (kid < 0) die("fork");
  if (kid == 0) {
    root.reset();
    ::alarm(600);
    regpool::TcpBootstrapConfig cc;
    cc.rank = 1;
    cc.size = 2;
    cc.port = port;
    cc.connect_timeout = 30s;
    regpool::TcpBootstrap b(cc);
    Stack s(o.provider);
    const auto peer = s.ep->insert_peer(b.allgather(s.ep->name(), 30s)[0]);
    std::vector<std::byte> out;
    for (const auto& c : cases) {
      if (c.method == "ring" || c.method == "ring-batch") {
        // The consumer's blob goes first, then the producer's comes back.
        regpool::RingConfig rc;
        rc.capacity = 256 << 10;
        regpool::RingConsumer cons(*s.ep, *s.pool, peer, rc);
        (void)exchange(b, *s.ep, cons.setup(), 0);
        cons.connect(exchange(b, *s.ep, {}, 0));
        Tally t;
        if (c.paced) t.lat.reserve(count_for(c, o));
        const auto bound = Clock::now() + 120s;
        auto last_seen = Clock::now();
        while (t.n < count_for(c, o) && Clock::now() < bound) {
          auto r = cons.peek();
          if (Clock::now() - last_seen > 5s) {
            const auto cs = cons.stats();
            std::fprintf(stderr,
                         "bench-patterns: ring consumer waited 5 s for a record: n=%llu records=%llu "
                         "control=%llu keepalives=%llu pads=%llu\n",
                         (unsigned long long)t.n, (unsigned long long)cs.records, (unsigned long long)cs.control_puts,
                         (unsigned long long)cs.keepalives, (unsigned long long)cs.pads);
            last_seen = Clock::now();
          }
          if (r) last_seen = Clock::now();
          if (!r) {
            if (r.status() != Status::would_block) die(c.label + " " + std::to_string(c.size) + " B: ring peek", r.status());
            continue;
          }
          t.record(*r, c.paced);
          (void)cons.pop();
        }
        out_append(out, t.result());
        serve_barrier(s, b);
        continue;
      }
      out_append(out, receive(c, count_for(c, o), s, b));
      serve_barrier(s, b);
    }
    (void)b.allgather(out, 30s);
    std::fflush(nullptr);
    ::_exit(0);
  }
  std::vector<Result> results;
  {
    Stack s(o.provider);
    const auto peer = s.ep->insert_peer(root->allgather(s.ep->name(), 30s)[1]);
    for (const auto& c : cases) send_all(c, count_for(c, o), o, s, *root, peer);
    const auto all = root->allgather({}, 60s)[1];
    if (all.size() != cases.size() * sizeof(Result)) die("receiver's results have the wrong size");
    for (std::size_t i = 0; i < cases.size(); ++i) {
      Result r;
      std::memcpy(&r, all.data() + i * sizeof r, sizeof r);
      results.push_back(r);
    }
  }
  int st = 0;
  ::waitpid(kid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("receiver process failed");
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--provider") o.provider = next();
    else if (a == "--records") o.records = std::stoull(next());
    else if (a == "--paced") o.paced = std::stoull(next());
    else if (a == "--gap-us") o.gap = std::chrono::microseconds(std::stoll(next()));
    else if (a == "--methods") o.methods = next();
    else if (a == "--json") o.json = true;
    else if (a == "--smoke") o.smoke = true;
    else die("unknown argument " + a + " (--provider shm|tcp|net|tcp;ofi_rxm|verbs --records N --paced N --gap-us U --methods LIST --json --smoke)");
  }
  if (o.smoke) {
    o.records = 2000;
    o.paced = 200;
  }
  const std::vector<std::size_t> sizes = o.smoke ? std::vector<std::size_t>{8, 256}
                                                 : std::vector<std::size_t>{8, 16, 32, 64, 128, 256};
  const std::vector<std::string> methods = {"send", "tagged", "ring", "ring-batch", "aggregate"};
  std::vector<std::pair<Case, Result>> all;
  for (const auto& m : methods) {
    if (("," + o.methods + ",").find("," + m + ",") == std::string::npos) continue;
    std::vector<Case> cases;
    for (auto sz : sizes) cases.push_back(Case{m, sz, false, {}, 0, m});
    // Latency of paced 64-byte records.
    if (m == "aggregate") {
      cases.push_back(Case{m, 64, true, {}, 64 + 20, "aggregate flush=each record"});
      for (auto d : {20us, 100us, 1000us}) {
        cases.push_back(Case{m, 64, true, d, 0, "aggregate deadline=" + std::to_string(d.count()) + "us"});
      }
    } else {
      cases.push_back(Case{m, 64, true, {}, 0, m});
    }
    auto res = run_method(cases, o);
    for (std::size_t i = 0; i < cases.size(); ++i) all.emplace_back(cases[i], res[i]);
  }
  bool ok = true;
  std::printf("bench-patterns (%s): message rate, records of each size, receiver side\n", o.provider.c_str());
  std::printf("%-12s %6s %14s\n", "method", "bytes", "Mrecords/s");
  for (const auto& [c, r] : all) {
    if (c.paced) continue;
    std::printf("%-12s %6zu %14.3f\n", c.method.c_str(), c.size, r.rate / 1e6);
    if (r.records != o.records) ok = false;
  }
  std::printf("one-way latency of 64 B records, one every %lld us (us)\n", static_cast<long long>(o.gap.count()));
  std::printf("%-32s %10s %10s\n", "method", "p50", "p99");
  for (const auto& [c, r] : all) {
    if (!c.paced) continue;
    std::printf("%-32s %10.1f %10.1f\n", c.label.c_str(), r.p50_us, r.p99_us);
    ok = ok && r.records == o.paced;
  }
  if (o.json) {
    std::printf("{\"provider\":\"%s\",\"results\":[", o.provider.c_str());
    bool first = true;
    for (const auto& [c, r] : all) {
      std::printf("%s{\"method\":\"%s\",\"label\":\"%s\",\"bytes\":%zu,\"paced\":%s,\"records\":%llu,"
                  "\"rate\":%.1f,\"p50_us\":%.2f,\"p99_us\":%.2f}",
                  first ? "" : ",", c.method.c_str(), c.label.c_str(), c.size, c.paced ? "true" : "false",
                  static_cast<unsigned long long>(r.records), r.rate, r.p50_us, r.p99_us);
      first = false;
    }
    std::printf("]}\n");
  }
  if (!ok) std::fprintf(stderr, "bench-patterns: a receiver did not get every record\n");
  return ok ? 0 : 1;
}
