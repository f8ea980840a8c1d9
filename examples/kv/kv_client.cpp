// kv-client: the client side of the key-value example (see examples/README.md).
//
// KvClient below is the part to copy into a service: join, put, get, leave.
// main() drives it with deterministic values so a test can check every
// byte, and reports request latencies so a benchmark can compare waits:
//
//   kv-client --port N --name NAME [--provider shm|tcp] [--wait spin|sleep|adaptive]
//             [--ops N] [--max-size BYTES] [--wait-go] [--hang]
//             [--verify NAME:COUNT]... [--verify-missing KEY]...
//
//  --ops N        put N keys NAME/0..N-1 (sizes 1..--max-size), get each back, compare
//  --wait-go      then print "NAME: waiting", wait (watching the server) until a
//                 line arrives on stdin, put/get N more keys and re-read the first N
//  --hang         then open a write lease on NAME/pending and sleep for ever
//                 (the test kills this client with SIGKILL)
//  --verify N:C   get keys N/0..N/C-1 and compare them with what client N wrote
//  --verify-missing KEY   expect KEY not to exist
//
// Before it leaves, it prints one line "NAME: stats {json}" with the number
// of requests, the seconds between joining and leaving, and the median and
// 99th percentile of the request round trips in microseconds.
//
// Exit status: 0 all checks passed, 1 a value differed, 2 bad arguments,
// 3 an error (server gone, transport failure).

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <regpool/regpool.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "options.hpp"
#include "protocol.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using regpool::Status;

// Thrown for anything that ends the session (the server is gone or broke
// the protocol); main() turns it into exit status 3.
struct SessionError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One client session. Every buffer is a pool LDO: the request and reply
// messages (allocated once) and the values. Not thread-safe.
class KvClient {
 public:
  KvClient(const std::string& provider, const std::string& host, std::uint16_t port, regpool::WaitMode wait) {
    regpool::FabricConfig fc;
    fc.provider = provider;
    if (provider == "tcp") fc.node = host;
    domain_ = regpool::FabricDomain::open(fc);
    regpool::PoolConfig pc;
    pc.name = "kv-client";
    pc.arena_size = std::size_t{64} << 20;
    pool_ = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain_}, pc);
    regpool::EndpointConfig ec;
    ec.wait_mode = wait;
    ep_ = regpool::FabricEndpoint::open(domain_, ec);
    request_ = allocate(kv::kMessageSize);
    reply_ = allocate(kv::kMessageSize);

    // Join: the library swaps endpoint names with the server (and checks
    // the job key, when REGPOOL_BOOTSTRAP_KEY is set on both sides) and
    // gives us our epoch; throws regpool::Error when it cannot.
    regpool::ConnectConfig cc;
    cc.host = host;
    cc.port = port;
    conn_ = regpool::connect(*ep_, cc);
    started_ = Clock::now();
  }

  ~KvClient() {
    conn_.reset();  // leaves, if leave() was not called
    ep_.reset();
    pool_.reset();
  }
  KvClient(const KvClient&) = delete;
  KvClient& operator=(const KvClient&) = delete;

  regpool::Ldo allocate(std::uint64_t size) {
    auto r = pool_->allocate(size);
    if (!r) throw SessionError(std::string("allocate: ") + regpool::to_string(r.status()));
    return std::move(*r);
  }

  // Stores `value`'s data section under `key`: one request for a write
  // lease, one RMA put straight into the server's LDO, one commit.
  kv::Result put(const std::string& key, const regpool::Ldo& value) {
    const kv::Reply lease = call(kv::Op::put, key, value.data_size());
    if (lease.result != kv::Result::ok) return lease.result;
    const regpool::RemoteRef ref = decode_ref(lease, value.data_size());
    check(ep_->put(*regpool::Slice::data(value), conn_->server(), ref, 0), "put");
    return call(kv::Op::commit, {}, lease.lease).result;
  }

  // The value of `key` in a fresh LDO of exactly its size, or the reason.
  kv::Result get(const std::string& key, regpool::Ldo* out) {
    const kv::Reply lease = call(kv::Op::get, key, 0);
    if (lease.result != kv::Result::ok) return lease.result;
    if (lease.value_size == 0 || lease.value_size > kMaxValue) throw SessionError("server offered a bad value size");
    const regpool::RemoteRef ref = decode_ref(lease, lease.value_size);
    regpool::Ldo value = allocate(lease.value_size);
    check(ep_->get(conn_->server(), ref, 0, *regpool::Slice::data(value)), "get");
    const kv::Result done = call(kv::Op::done, {}, lease.lease).result;
    *out = std::move(value);
    return done;
  }

  // A write lease that is never committed (what a client dying mid-put
  // leaves behind on the server).
  void open_write_lease(const std::string& key, std::uint64_t size) {
    if (call(kv::Op::put, key, size).result != kv::Result::ok) throw SessionError("no write lease");
  }

  // Waits up to `wait` for news of the server; throws when it left or died.
  void watch(std::chrono::milliseconds wait) {
    conn_->poll(wait);
    while (auto ev = conn_->next_event()) {
      if (ev->kind != regpool::PeerEventKind::joined)
        throw SessionError(std::string("the server ") + regpool::to_string(ev->kind) + ": " + ev->reason);
    }
  }

  // Leaving: the server hears our bye at once and releases our leases.
  void leave() {
    finished_ = Clock::now();
    conn_->leave();
  }

  // Request round trips so far, and the time from joining to leaving.
  const std::vector<double>& latencies_us() const { return latencies_us_; }
  double seconds() const { return std::chrono::duration<double>(finished_ - started_).count(); }
  regpool::EndpointStats endpoint_stats() const { return ep_->stats(); }

 private:
  static constexpr std::uint64_t kMaxValue = std::uint64_t{1} << 30;  // trust, but bound
  static constexpr std::chrono::milliseconds kTimeout{10000};
  // How long a wait for the server goes before looking at the membership
  // connection: a server that died is noticed within this much.
  static constexpr std::chrono::milliseconds kWatchEvery{100};

  void encode(kv::Op op, const std::string& key, std::uint64_t argument) {
    kv::Request r;
    r.op = op;
    r.request_id = ++request_id_;
    r.epoch = conn_->epoch();
    r.argument = argument;
    r.key = key;
    kv::encode(r, std::span<std::byte, kv::kMessageSize>(request_.data().data(), kv::kMessageSize));
  }

  // Waits for `t`, watching the membership connection meanwhile: if the
  // server dies, the library fails our operations to it and watch() says so.
  regpool::Completion await(regpool::Token t, const char* what) {
    const auto deadline = Clock::now() + kTimeout;
    for (;;) {
      const auto c = ep_->wait(t, kWatchEvery);
      if (c.status != Status::in_progress) return c;
      watch(0ms);
      if (Clock::now() >= deadline) throw SessionError(std::string(what) + ": no answer from the server");
    }
  }

  void check(regpool::Result<regpool::Token> t, const char* what) {
    if (!t) throw SessionError(std::string(what) + ": " + regpool::to_string(t.status()));
    const auto c = await(*t, what);
    if (c.status != Status::ok) {
      watch(0ms);  // a failure because the server died says so
      throw SessionError(std::string(what) + ": " + regpool::to_string(c.status));
    }
  }

  // One request, one reply. The receive is posted before the request goes
  // out, so the reply always has a buffer waiting.
  kv::Reply call(kv::Op op, const std::string& key, std::uint64_t argument) {
    encode(op, key, argument);
    const auto start = Clock::now();
    auto rt = ep_->post_recv(*regpool::Slice::data(reply_));
    if (!rt) throw SessionError(std::string("post_recv: ") + regpool::to_string(rt.status()));
    check(ep_->send(conn_->server(), *regpool::Slice::data(request_)), "send");
    const auto c = await(*rt, "reply");
    if (c.status != Status::ok) throw SessionError(std::string("reply: ") + regpool::to_string(c.status));
    latencies_us_.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    // The sender must be the server, as the transport names it.
    if (c.peer != conn_->server()) throw SessionError("a reply from someone else");
    auto reply = kv::decode_reply(std::span<const std::byte>(reply_.data().data(), c.bytes));
    if (!reply || reply->request_id != request_id_) throw SessionError("malformed reply");
    return *reply;
  }

  regpool::RemoteRef decode_ref(const kv::Reply& lease, std::uint64_t size) {
    auto ref = regpool::RemoteRef::decode(lease.ref);
    if (!ref) throw SessionError(std::string("lease reference: ") + regpool::to_string(ref.status()));
    if (ref->length != size) throw SessionError("lease reference has the wrong length");
    return *ref;
  }

  std::shared_ptr<regpool::FabricDomain> domain_;
  std::unique_ptr<regpool::Pool> pool_;
  std::unique_ptr<regpool::FabricEndpoint> ep_;
  std::unique_ptr<regpool::Connection> conn_;
  regpool::Ldo request_, reply_;
  std::uint32_t request_id_ = 0;
  std::vector<double> latencies_us_;
  Clock::time_point started_{}, finished_{};
};

// Deterministic values: key NAME/i always has the same size and bytes, so
// any process can check what another wrote.
std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t seed_of(const std::string& key) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char ch : key) h = (h ^ ch) * 1099511628211ULL;
  return h;
}

std::uint64_t size_of(const std::string& key, std::uint64_t max_size) {
  std::uint64_t s = seed_of(key);
  return 1 + splitmix(s) % max_size;
}

void fill(const std::string& key, std::span<std::byte> out) {
  std::uint64_t s = seed_of(key) ^ 0x5bd1e995ULL;
  for (std::size_t i = 0; i < out.size(); i += 8) {
    const std::uint64_t w = splitmix(s);
    for (std::size_t b = 0; b < 8 && i + b < out.size(); ++b) out[i + b] = static_cast<std::byte>(w >> (8 * b));
  }
}

struct Run {
  KvClient& kv;
  std::string name;
  std::uint64_t max_size = 0;
  int mismatches = 0;

  std::string key(std::uint64_t i) const { return name + "/" + std::to_string(i); }

  void put(const std::string& k) {
    regpool::Ldo v = kv.allocate(size_of(k, max_size));
    fill(k, v.data());
    const kv::Result r = kv.put(k, v);
    if (r != kv::Result::ok) throw SessionError("put " + k + ": " + kv::to_string(r));
  }

  // Byte for byte against the generator.
  void verify(const std::string& k, std::uint64_t max) {
    regpool::Ldo v;
    const kv::Result r = kv.get(k, &v);
    if (r != kv::Result::ok) {
      std::fprintf(stderr, "get %s: %s\n", k.c_str(), kv::to_string(r));
      ++mismatches;
      return;
    }
    std::vector<std::byte> want(size_of(k, max));
    fill(k, want);
    if (v.data_size() != want.size() || std::memcmp(v.data().data(), want.data(), want.size()) != 0) {
      std::fprintf(stderr, "get %s: %llu bytes differ from the %zu written\n", k.c_str(),
                   static_cast<unsigned long long>(v.data_size()), want.size());
      ++mismatches;
    }
  }

  void phase(std::uint64_t from, std::uint64_t to) {
    for (std::uint64_t i = from; i < to; ++i) {
      put(key(i));
      verify(key(i), max_size);
    }
  }
};

// Until stdin has a line, watching the server (throws when it goes).
void wait_for_go(KvClient& kv) {
  for (;;) {
    pollfd p{0, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) {
      char buf[256];
      (void)!::read(0, buf, sizeof buf);
      return;
    }
    kv.watch(100ms);
  }
}

// One machine-readable line (bench/wait-modes reads it).
void print_stats(const std::string& name, const KvClient& kv) {
  std::vector<double> l = kv.latencies_us();
  std::sort(l.begin(), l.end());
  const auto at = [&](double q) { return l.empty() ? 0.0 : l[static_cast<std::size_t>(q * double(l.size() - 1))]; };
  std::printf("%s: stats {\"requests\": %zu, \"seconds\": %.6f, \"median_us\": %.1f, \"p99_us\": %.1f}\n",
              name.c_str(), l.size(), kv.seconds(), at(0.5), at(0.99));
}

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: kv-client --port N --name NAME [--provider shm|tcp] [--wait spin|sleep|adaptive]\n"
               "                 [--ops N] [--max-size BYTES] [--wait-go] [--hang]\n"
               "                 [--verify NAME:COUNT]... [--verify-missing KEY]...\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string provider = "shm", name, host = "127.0.0.1";
  unsigned long long port = 0, ops = 0, max_size = 200000;
  regpool::WaitMode wait = regpool::WaitMode::spin;
  bool wait_go = false, hang = false;
  std::vector<std::pair<std::string, unsigned long long>> verify;
  std::vector<std::string> missing;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (a == "--provider" && has) {
      provider = argv[++i];
    } else if (a == "--port" && has && kv::number(argv[++i], &port)) {
    } else if (a == "--wait" && has && kv::wait_mode(argv[i + 1])) {
      wait = *kv::wait_mode(argv[++i]);
    } else if (a == "--name" && has) {
      name = argv[++i];
    } else if (a == "--ops" && has && kv::number(argv[++i], &ops)) {
    } else if (a == "--max-size" && has && kv::number(argv[++i], &max_size)) {
    } else if (a == "--wait-go") {
      wait_go = true;
    } else if (a == "--hang") {
      hang = true;
    } else if (a == "--verify" && has) {
      const std::string v = argv[++i];
      const auto colon = v.rfind(':');
      unsigned long long count = 0;
      if (colon == std::string::npos || !kv::number(v.c_str() + colon + 1, &count)) {
        usage(stderr);
        return 2;
      }
      verify.emplace_back(v.substr(0, colon), count);
    } else if (a == "--verify-missing" && has) {
      missing.emplace_back(argv[++i]);
    } else {
      std::fprintf(stderr, "kv-client: bad argument '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (port == 0 || port > 65535 || max_size == 0 || (name.empty() && (ops || hang || wait_go))) {
    usage(stderr);
    return 2;
  }
  if (provider == "tcp") ::setenv("FI_TCP_IFACE", "lo", 0);
  try {
    KvClient kv(provider, host, static_cast<std::uint16_t>(port), wait);
    Run run{kv, name, max_size};
    run.phase(0, ops);
    if (ops) std::printf("%s: %llu puts and gets verified\n", name.c_str(), ops);
    if (hang) {
      kv.open_write_lease(name + "/pending", 4096);
      std::printf("%s: holding a write lease\n", name.c_str());
      std::fflush(stdout);
      for (;;) ::pause();
    }
    if (wait_go) {
      std::printf("%s: waiting\n", name.c_str());
      std::fflush(stdout);
      wait_for_go(kv);
      run.phase(ops, 2 * ops);
      for (std::uint64_t i = 0; i < ops; ++i) run.verify(run.key(i), max_size);
      std::printf("%s: %llu more puts and gets, and the first %llu re-read\n", name.c_str(), ops, ops);
    }
    for (const auto& [who, count] : verify) {
      Run other{kv, who, max_size};
      for (std::uint64_t i = 0; i < count; ++i) other.verify(other.key(i), max_size);
      run.mismatches += other.mismatches;
      std::printf("%s: verified %llu keys of %s\n", name.c_str(), count, who.c_str());
    }
    for (const auto& k : missing) {
      regpool::Ldo v;
      const kv::Result r = kv.get(k, &v);
      if (r != kv::Result::not_found) {
        std::fprintf(stderr, "%s: expected not found, got %s\n", k.c_str(), kv::to_string(r));
        ++run.mismatches;
      }
    }
    kv.leave();
    print_stats(name, kv);
    std::printf("%s: ", name.c_str());
    regpool::print(std::cout, kv.endpoint_stats());
    std::cout.flush();
    if (run.mismatches) {
      std::fprintf(stderr, "%s: %d values differ\n", name.c_str(), run.mismatches);
      return 1;
    }
    std::printf("%s: OK\n", name.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv-client %s: %s\n", name.c_str(), e.what());
    return 3;
  }
}
