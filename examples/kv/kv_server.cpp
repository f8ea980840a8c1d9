// kv-server: a small key-value service on regpool (see examples/README.md).
//
// Clients join over TCP (protocol.hpp: Hello/Welcome swap endpoint names and
// give the client an id and a random session token), then talk to the
// server with regpool messages only:
//  - requests arrive in a ring of posted receives (pool LDOs);
//  - PUT answers with a write lease: a fresh LDO of the value's size,
//    exposed read-write to that client only; the client puts the value
//    straight into it and COMMITs, which makes that LDO the key's value;
//  - GET answers with a read lease: the current value's LDO exposed
//    read-only; the client gets it and says DONE. A value replaced while a
//    client reads it stays alive (the exposure holds its LDO) until DONE.
// The server never copies a value and never registers memory after start.
//
// Membership with today's API: a client must send a request (PING when
// idle) at least once per --lease-ms. One that stays silent longer, or to
// which a reply fails (peer_unreachable, or Status::timeout after
// --op-timeout-ms), is dropped: its leases are revoked, their LDOs freed,
// its peer removed. Everything other clients do goes on meanwhile.
//
//   kv-server [--provider shm|tcp] [--port N] [--lease-ms MS] [--op-timeout-ms MS]
//             [--max-value BYTES] [--expect N] [--max-seconds S]

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <regpool/regpool.hpp>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "net.hpp"
#include "protocol.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using regpool::Status;

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_signal(int) { g_stop = 1; }

struct Options {
  std::string provider = "shm";
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  std::chrono::milliseconds lease{3000};
  std::chrono::milliseconds op_timeout{2000};
  std::uint64_t max_value = std::uint64_t{16} << 20;
  std::size_t max_leases = 16;        // per client
  std::size_t expect = 0;             // exit once this many joined and all left (0: run until signalled)
  unsigned max_seconds = 0;           // hard bound on the run (0: none)
};

constexpr std::size_t kReceives = 64;  // requests the server can hold at once

class Server {
 public:
  explicit Server(const Options& o) : opt_(o), rng_(std::random_device{}()) {
    regpool::FabricConfig fc;
    fc.provider = o.provider;
    if (o.provider == "tcp") fc.node = o.host;
    domain_ = regpool::FabricDomain::open(fc);
    regpool::PoolConfig pc;
    pc.name = "kv-server";
    pc.arena_size = std::size_t{64} << 20;
    pc.max_bytes = std::size_t{1} << 30;
    pool_ = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain_}, pc);
    regpool::EndpointConfig ec;
    // A reply to a dead client must not sit in a slot for the default 30 s.
    ec.op_timeout = o.op_timeout;
    ep_ = regpool::FabricEndpoint::open(domain_, ec);
    name_ = ep_->name();
    for (std::size_t i = 0; i < kReceives; ++i) {
      auto buf = pool_->allocate(kv::kMessageSize);
      if (!buf) throw regpool::Error(buf.status(), 0, "kv-server: receive buffer");
      recv_bufs_.push_back(std::move(*buf));
    }
    ready_.reserve(kReceives);
    listen_fd_.fd = kv::net::listen_on(o.host, o.port, &port_);
    if (listen_fd_.fd < 0) throw regpool::Error(Status::unsupported, errno, "kv-server: cannot listen");
  }

  ~Server() {
    // Leases (exposures) before the endpoint, the endpoint before the pool.
    for (auto& c : clients_) c.leases.clear();
    ep_.reset();
    store_.clear();
    recv_bufs_.clear();
    pool_.reset();
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int run() {
    for (std::size_t i = 0; i < kReceives; ++i) post_receive(i);
    std::printf("kv-server: listening on %s:%u (provider %s)\n", opt_.host.c_str(), port_, opt_.provider.c_str());
    std::fflush(stdout);
    const auto start = Clock::now();
    while (!g_stop) {
      std::size_t work = ep_->progress();
      work += serve_ready();
      work += accept_joins();
      drop_failed_and_silent();
      if (opt_.expect && joined_ >= opt_.expect && live_ == 0) break;
      if (opt_.max_seconds && Clock::now() - start > std::chrono::seconds(opt_.max_seconds)) {
        std::fprintf(stderr, "kv-server: --max-seconds reached\n");
        report();
        return 1;
      }
      if (!work) std::this_thread::sleep_for(50us);
    }
    report();
    return 0;
  }

 private:
  struct Lease {
    regpool::Exposure exposure;  // revoked when the lease goes
    regpool::Ldo value;          // write leases: the value being written
    std::string key;
    bool write = false;
  };
  struct Client {
    bool live = false;
    bool reply_failed = false;  // set from a send completion
    regpool::PeerId peer = 0;
    std::uint64_t token = 0;
    Clock::time_point last_seen{};
    std::unordered_map<std::uint64_t, Lease> leases;
  };
  struct Ready {
    std::uint32_t slot;
    Status status;
    std::uint64_t bytes;
    regpool::PeerId from;
  };

  void post_receive(std::size_t i) {
    auto slice = regpool::Slice::data(recv_bufs_[i]);
    // The callback only records the completion: requests are served in the
    // main loop, where a handler may take its time.
    auto t = ep_->post_recv(*slice, [this, i](const regpool::Completion& c) {
      ready_.push_back({static_cast<std::uint32_t>(i), c.status, c.bytes, c.peer});
    });
    if (!t) std::fprintf(stderr, "kv-server: post_recv: %s\n", regpool::to_string(t.status()));
  }

  std::size_t serve_ready() {
    const std::size_t n = ready_.size();
    for (std::size_t k = 0; k < n; ++k) {
      const Ready r = ready_[k];
      if (r.status == Status::ok) {
        handle(r, std::span<const std::byte>(recv_bufs_[r.slot].data().data(), r.bytes));
      } else if (r.status != Status::closed) {
        // A message larger than the buffer, or the provider's error: the
        // sender is unknown, so there is nobody to answer.
        ++bad_requests_;
      }
      if (r.status != Status::closed) post_receive(r.slot);
    }
    ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(n));
    return n;
  }

  void handle(const Ready& r, std::span<const std::byte> bytes) {
    auto req = kv::decode_request(bytes);
    // Anything that does not name a live client with its session token is
    // dropped unanswered; so is a request whose sender the provider
    // identified as another client.
    if (!req || req->client_id >= clients_.size() || !clients_[req->client_id].live ||
        clients_[req->client_id].token != req->token ||
        (r.from != regpool::kAnyPeer && r.from != clients_[req->client_id].peer)) {
      ++bad_requests_;
      return;
    }
    ++requests_;
    Client& c = clients_[req->client_id];
    c.last_seen = Clock::now();
    kv::Reply reply;
    reply.request_id = req->request_id;
    switch (req->op) {
      case kv::Op::put: reply = start_put(c, *req); break;
      case kv::Op::commit: reply.result = commit(c, *req); break;
      case kv::Op::get: reply = start_get(c, *req); break;
      case kv::Op::done: reply.result = c.leases.erase(req->argument) ? kv::Result::ok : kv::Result::bad_request; break;
      case kv::Op::ping: break;
      case kv::Op::bye:
        drop(req->client_id, "left");
        return;  // no reply: the client does not wait for one
    }
    reply.request_id = req->request_id;
    send_reply(req->client_id, reply);
  }

  kv::Reply start_put(Client& c, const kv::Request& req) {
    kv::Reply rep;
    if (req.key.empty() || req.argument == 0) {
      rep.result = kv::Result::bad_request;
      return rep;
    }
    if (req.argument > opt_.max_value) {
      rep.result = kv::Result::too_large;
      return rep;
    }
    if (c.leases.size() >= opt_.max_leases) {
      rep.result = kv::Result::busy;
      return rep;
    }
    auto value = pool_->allocate(req.argument);  // no registration: the arena's covers it
    if (!value) {
      rep.result = kv::Result::busy;
      return rep;
    }
    return grant(c, std::move(*value), req.key, true);
  }

  kv::Result commit(Client& c, const kv::Request& req) {
    auto it = c.leases.find(req.argument);
    if (it == c.leases.end() || !it->second.write) return kv::Result::bad_request;
    // The client's put completed before it sent COMMIT, so the bytes are in
    // place. Replacing the map entry drops the old value, unless a reader's
    // lease still holds it.
    store_[it->second.key] = std::move(it->second.value);
    c.leases.erase(it);
    return kv::Result::ok;
  }

  kv::Reply start_get(Client& c, const kv::Request& req) {
    kv::Reply rep;
    auto it = store_.find(req.key);
    if (it == store_.end()) {
      rep.result = kv::Result::not_found;
      return rep;
    }
    if (c.leases.size() >= opt_.max_leases) {
      rep.result = kv::Result::busy;
      return rep;
    }
    return grant(c, it->second, req.key, false);
  }

  kv::Reply grant(Client& c, regpool::Ldo value, const std::string& key, bool write) {
    kv::Reply rep;
    auto slice = regpool::Slice::data(value);
    auto exp = slice ? ep_->expose(*slice, write ? regpool::RemoteAccess::read_write : regpool::RemoteAccess::read_only,
                                   c.peer)
                     : regpool::Result<regpool::Exposure>(slice.status());
    if (!exp) {
      rep.result = kv::Result::busy;
      return rep;
    }
    const std::uint64_t id = next_lease_++;
    rep.value_size = value.data_size();
    rep.lease = id;
    rep.ref = exp->encode();
    Lease l;
    l.exposure = std::move(*exp);
    if (write) l.value = std::move(value);
    l.key = key;
    l.write = write;
    c.leases.emplace(id, std::move(l));
    return rep;
  }

  void send_reply(std::uint32_t id, const kv::Reply& reply) {
    auto buf = pool_->allocate(kv::kMessageSize);
    if (!buf) {
      clients_[id].reply_failed = true;
      return;
    }
    kv::encode(reply, std::span<std::byte, kv::kMessageSize>(buf->data().data(), kv::kMessageSize));
    // The send holds the LDO until it completes; dropping our handle is fine.
    auto t = ep_->send(clients_[id].peer, *regpool::Slice::data(*buf), [this, id](const regpool::Completion& c) {
      if (c.status != Status::ok && id < clients_.size()) clients_[id].reply_failed = true;
    });
    if (!t) clients_[id].reply_failed = true;
  }

  std::size_t accept_joins() {
    std::size_t n = 0;
    for (;;) {
      kv::net::Fd conn(::accept4(listen_fd_.fd, nullptr, nullptr, SOCK_CLOEXEC));
      if (conn.fd < 0) return n;
      ++n;
      // Bounded: a client that connects and says nothing costs 2 s at most.
      const auto deadline = Clock::now() + 2s;
      auto hello = kv::net::recv_framed(conn.fd, 8, 4, kv::kMaxName, deadline);
      auto name = hello ? kv::decode_hello(*hello) : std::nullopt;
      if (!name) {
        ++bad_requests_;
        continue;
      }
      Client c;
      try {
        c.peer = ep_->insert_peer(*name);
      } catch (const regpool::Error& e) {
        std::fprintf(stderr, "kv-server: refusing a client: %s\n", e.what());
        ++bad_requests_;
        continue;
      }
      // insert_peer returns the existing PeerId for a name it knows: a
      // second join with a live client's name would share (and on leaving,
      // remove) that client's peer. Refuse it.
      if (peer_in_use(c.peer)) {
        ++bad_requests_;
        continue;
      }
      c.live = true;
      c.token = rng_();
      c.last_seen = Clock::now();
      const auto id = static_cast<std::uint32_t>(clients_.size());
      kv::Welcome w{id, c.token, name_};
      if (!kv::net::send_all(conn.fd, kv::encode_welcome(w), deadline)) {
        ep_->remove_peer(c.peer);
        continue;
      }
      clients_.push_back(std::move(c));
      ++joined_;
      ++live_;
      std::printf("kv-server: client %u joined\n", id);
      std::fflush(stdout);
    }
  }

  bool peer_in_use(regpool::PeerId peer) const {
    for (const Client& c : clients_)
      if (c.live && c.peer == peer) return true;
    return false;
  }

  void drop_failed_and_silent() {
    const auto now = Clock::now();
    for (std::uint32_t id = 0; id < clients_.size(); ++id) {
      Client& c = clients_[id];
      if (!c.live) continue;
      if (c.reply_failed) {
        drop(id, "reply failed");
        ++dropped_;
      } else if (now - c.last_seen > opt_.lease) {
        drop(id, "lease expired");
        ++dropped_;
      }
    }
  }

  void drop(std::uint32_t id, const char* why) {
    Client& c = clients_[id];
    const std::size_t held = c.leases.size();
    c.leases.clear();  // revokes the exposures; write leases free their LDOs
    ep_->remove_peer(c.peer);
    c.live = false;
    --live_;
    std::printf("kv-server: client %u %s (released %zu leases)\n", id, why, held);
    std::fflush(stdout);
  }

  void report() {
    std::printf("kv-server: %zu joined, %zu dropped, %llu requests, %llu rejected, %zu keys\n", joined_, dropped_,
                static_cast<unsigned long long>(requests_), static_cast<unsigned long long>(bad_requests_),
                store_.size());
    regpool::print(std::cout, pool_->stats());
    regpool::print(std::cout, ep_->stats());
    regpool::print(std::cout, ep_->exposure_stats());
    std::cout.flush();
  }

  Options opt_;
  std::mt19937_64 rng_;
  std::shared_ptr<regpool::FabricDomain> domain_;
  std::unique_ptr<regpool::Pool> pool_;
  std::unique_ptr<regpool::FabricEndpoint> ep_;
  std::vector<std::byte> name_;
  std::vector<regpool::Ldo> recv_bufs_;
  std::vector<Ready> ready_;
  std::vector<Client> clients_;
  std::unordered_map<std::string, regpool::Ldo> store_;
  kv::net::Fd listen_fd_;
  std::uint16_t port_ = 0;
  std::uint64_t next_lease_ = 1;
  std::size_t joined_ = 0, live_ = 0, dropped_ = 0;
  std::uint64_t requests_ = 0, bad_requests_ = 0;

};

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: kv-server [--provider shm|tcp] [--port N] [--lease-ms MS] [--op-timeout-ms MS]\n"
               "                 [--max-value BYTES] [--expect N] [--max-seconds S]\n");
}

bool number(const char* s, unsigned long long* v) {
  char* end = nullptr;
  errno = 0;
  *v = std::strtoull(s, &end, 10);
  return errno == 0 && end && *end == '\0' && end != s;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    unsigned long long v = 0;
    const bool has = i + 1 < argc;
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (a == "--provider" && has) {
      o.provider = argv[++i];
    } else if (a == "--port" && has && number(argv[++i], &v) && v < 65536) {
      o.port = static_cast<std::uint16_t>(v);
    } else if (a == "--lease-ms" && has && number(argv[++i], &v) && v > 0) {
      o.lease = std::chrono::milliseconds(v);
    } else if (a == "--op-timeout-ms" && has && number(argv[++i], &v) && v > 0) {
      o.op_timeout = std::chrono::milliseconds(v);
    } else if (a == "--max-value" && has && number(argv[++i], &v) && v > 0) {
      o.max_value = v;
    } else if (a == "--expect" && has && number(argv[++i], &v)) {
      o.expect = static_cast<std::size_t>(v);
    } else if (a == "--max-seconds" && has && number(argv[++i], &v)) {
      o.max_seconds = static_cast<unsigned>(v);
    } else {
      std::fprintf(stderr, "kv-server: bad argument '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (o.provider == "tcp") ::setenv("FI_TCP_IFACE", "lo", 0);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  try {
    Server s(o);
    return s.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv-server: %s\n", e.what());
    return 1;
  }
}
