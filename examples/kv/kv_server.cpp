// kv-server: a small key-value service on regpool (see examples/README.md).
//
// Clients join through regpool::Listener (membership.hpp): it admits them
// at any time, inserts each one's endpoint name as a peer and reports peer
// events, joined / left / died. After that the server and a client talk
// with regpool messages only:
//  - requests arrive in a ring of posted receives (pool LDOs); the sender
//    is the one the transport names (Completion::peer), and the request
//    must carry that client's current epoch;
//  - PUT answers with a write lease: a fresh LDO of the value's size,
//    exposed read-write to that client only; the client puts the value
//    straight into it and COMMITs, which makes that LDO the key's value;
//  - GET answers with a read lease: the current value's LDO exposed
//    read-only; the client gets it and says DONE. A value replaced while a
//    client reads it stays alive (the exposure holds its LDO) until DONE.
// The server never copies a value and never registers memory after start.
//
// When a client leaves or dies, the library has already done the work by
// the time the event arrives: operations in flight to it completed with
// peer_unreachable, its peer is on its way out of the endpoint. The server
// only forgets the client, which revokes its leases (their exposures) and
// frees the LDOs of uncommitted write leases. Everything other clients do
// goes on meanwhile: nothing here waits for one client.
//
//   kv-server [--provider shm|tcp] [--port N] [--wait spin|sleep|adaptive]
//             [--op-timeout-ms MS] [--max-value BYTES] [--expect N] [--max-seconds S]

#include <signal.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <regpool/regpool.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "options.hpp"
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
  regpool::WaitMode wait = regpool::WaitMode::spin;
  std::chrono::milliseconds op_timeout{2000};
  std::uint64_t max_value = std::uint64_t{16} << 20;
  std::size_t max_leases = 16;        // per client
  std::size_t expect = 0;             // exit once this many joined and all went (0: run until signalled)
  unsigned max_seconds = 0;           // hard bound on the run (0: none)
};

constexpr std::size_t kReceives = 64;  // requests the server can hold at once
// How often the main loop looks at the membership sockets (joins, leaves,
// deaths), and the longest the endpoint may sleep between two looks when
// --wait is sleep or adaptive.
constexpr auto kMembershipEvery = 1ms;

class Server {
 public:
  explicit Server(const Options& o) : opt_(o) {
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
    // A reply to a client that is alive but stuck must not hold its slot
    // for the default 30 s. (A dead client's replies fail at once: the
    // listener fails its peer.)
    ec.op_timeout = o.op_timeout;
    ec.wait_mode = o.wait;
    ep_ = regpool::FabricEndpoint::open(domain_, ec);
    for (std::size_t i = 0; i < kReceives; ++i) {
      auto buf = pool_->allocate(kv::kMessageSize);
      if (!buf) throw regpool::Error(buf.status(), 0, "kv-server: receive buffer");
      recv_bufs_.push_back(std::move(*buf));
    }
    ready_.reserve(kReceives);
    recv_tokens_.resize(kReceives);
    regpool::ListenerConfig lc;
    lc.host = o.host;
    lc.port = o.port;
    // Joins the listener refused or dropped (garbage, a wrong key, a name
    // the endpoint rejects, a silent connection) and deaths, one line each.
    lc.log = [](const std::string& line) { std::printf("kv-server: membership: %s\n", line.c_str()); };
    listener_ = std::make_unique<regpool::Listener>(*ep_, lc);
  }

  ~Server() {
    // The listener (it says bye to the members) and the leases (exposures)
    // before the endpoint, the endpoint before the pool.
    listener_.reset();
    clients_.clear();
    ep_.reset();
    store_.clear();
    recv_bufs_.clear();
    pool_.reset();
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int run() {
    for (std::size_t i = 0; i < kReceives; ++i) post_receive(i, false);
    std::printf("kv-server: listening on %s:%u (provider %s, wait %s)\n", opt_.host.c_str(), listener_->port(),
                opt_.provider.c_str(), regpool::to_string(opt_.wait));
    std::fflush(stdout);
    const auto start = Clock::now();
    auto next_look = start;
    while (!g_stop) {
      const auto now = Clock::now();
      if (now >= next_look) {
        listener_->poll();
        handle_events();
        next_look = now + kMembershipEvery;
        if (opt_.expect && joined_ >= opt_.expect && clients_.empty()) break;
        if (opt_.max_seconds && now - start > std::chrono::seconds(opt_.max_seconds)) {
          std::fprintf(stderr, "kv-server: --max-seconds reached\n");
          report();
          return 1;
        }
      }
      // spin: one progress round; sleep/adaptive: when there was nothing
      // to do, sleep on the provider until there is (or until it is time
      // to look at the membership sockets again).
      ep_->progress_or_idle(kMembershipEvery);
      serve_ready();
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
    std::uint64_t epoch = 0;
    std::unordered_map<std::uint64_t, Lease> leases;
    // The client's replies go from one 96-byte buffer through one kept send
    // (Endpoint::send_kept), reposted for each reply: nothing allocated,
    // claimed or referenced per reply. `reply_busy` while a reply is
    // posted (the buffer must not be rewritten then); a reply asked
    // meanwhile goes from a buffer of its own.
    regpool::Ldo reply_buf;
    regpool::Token reply_token{};
    bool reply_busy = false;
  };
  struct Ready {
    std::uint32_t slot;
    Status status;
    std::uint64_t bytes;
    regpool::PeerId from;
  };

  void handle_events() {
    while (auto ev = listener_->next_event()) {
      if (ev->kind == regpool::PeerEventKind::joined) {
        clients_[ev->peer].epoch = ev->epoch;
        ++joined_;
        std::printf("kv-server: client %u (epoch %llu, %s) joined\n", ev->peer,
                    static_cast<unsigned long long>(ev->epoch), ev->address.c_str());
      } else {
        // left or died: the library already failed every operation in flight
        // to the client and will remove its peer. Forgetting the client
        // revokes its leases; an uncommitted write lease frees its LDO.
        auto it = clients_.find(ev->peer);
        const std::size_t held = it == clients_.end() ? 0 : it->second.leases.size();
        if (it != clients_.end()) {
          // Its kept reply ends: parked, at once; posted, with its completion
          // (the callback then finds no such client).
          if (it->second.reply_token) (void)ep_->end_kept(it->second.reply_token);
          clients_.erase(it);
        }
        ++(ev->kind == regpool::PeerEventKind::left ? left_ : died_);
        std::printf("kv-server: client %u (epoch %llu) %s: %s (released %zu leases)\n", ev->peer,
                    static_cast<unsigned long long>(ev->epoch), regpool::to_string(ev->kind), ev->reason.c_str(),
                    held);
      }
      std::fflush(stdout);
    }
  }

  // Each request buffer has one kept receive (Endpoint::post_recv_kept):
  // after a request it is parked with its slot, buffer and callback, and
  // repost() puts it back, with nothing claimed or copied per request. A
  // receive that ended (a provider error) is posted anew.
  void post_receive(std::size_t i, bool parked) {
    if (parked) {
      const Status st = ep_->repost(recv_tokens_[i]);
      if (st == Status::ok || st == Status::closed) return;
      std::fprintf(stderr, "kv-server: repost: %s; posting a new receive\n", regpool::to_string(st));
      (void)ep_->end_kept(recv_tokens_[i]);
    }
    auto slice = regpool::Slice::data(recv_bufs_[i]);
    // The callback only records the completion: requests are served in the
    // main loop, where a handler may take its time.
    auto t = ep_->post_recv_kept(*slice, [this, i](const regpool::Completion& c) {
      ready_.push_back({static_cast<std::uint32_t>(i), c.status, c.bytes, c.peer});
    });
    if (!t) {
      std::fprintf(stderr, "kv-server: post_recv_kept: %s\n", regpool::to_string(t.status()));
      return;
    }
    recv_tokens_[i] = *t;
  }

  void serve_ready() {
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
      // ok and out_of_bounds leave the kept receive parked; anything else
      // ended it.
      if (r.status != Status::closed) {
        post_receive(r.slot, r.status == Status::ok || r.status == Status::out_of_bounds);
      }
    }
    ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(n));
  }

  void handle(const Ready& r, std::span<const std::byte> bytes) {
    auto req = kv::decode_request(bytes);
    // The sender is who the transport says (never a field of the message):
    // it must be a current member, and the request must carry its epoch,
    // so one sent by an earlier incarnation that had the same PeerId is
    // dropped. Anything else is dropped unanswered.
    auto it = clients_.find(r.from);
    if (!req || it == clients_.end() || req->epoch != it->second.epoch ||
        !listener_->current(r.from, req->epoch)) {
      ++bad_requests_;
      return;
    }
    ++requests_;
    Client& c = it->second;
    kv::Reply reply;
    switch (req->op) {
      case kv::Op::put: reply = start_put(c, r.from, *req); break;
      case kv::Op::commit: reply.result = commit(c, *req); break;
      case kv::Op::get: reply = start_get(c, r.from, *req); break;
      case kv::Op::done: reply.result = c.leases.erase(req->argument) ? kv::Result::ok : kv::Result::bad_request; break;
    }
    reply.request_id = req->request_id;
    send_reply(r.from, reply);
  }

  kv::Reply start_put(Client& c, regpool::PeerId peer, const kv::Request& req) {
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
    return grant(c, peer, std::move(*value), req.key, true);
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

  kv::Reply start_get(Client& c, regpool::PeerId peer, const kv::Request& req) {
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
    return grant(c, peer, it->second, req.key, false);
  }

  // A lease is one exposure, revoked on COMMIT/DONE or when the client
  // goes. (Listener::attach would tie an exposure to the client's
  // membership too, but only for the client's whole membership: a lease
  // ends earlier, and a committed value must stop being writable then.)
  kv::Reply grant(Client& c, regpool::PeerId peer, regpool::Ldo value, const std::string& key, bool write) {
    kv::Reply rep;
    auto slice = regpool::Slice::data(value);
    auto exp = slice ? ep_->expose(*slice, write ? regpool::RemoteAccess::read_write : regpool::RemoteAccess::read_only,
                                   peer)
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

  void send_reply(regpool::PeerId peer, const kv::Reply& reply) {
    auto it = clients_.find(peer);
    if (it != clients_.end() && !it->second.reply_busy && send_kept_reply(peer, it->second, reply)) return;
    auto buf = pool_->allocate(kv::kMessageSize);
    if (!buf) {
      ++failed_replies_;
      return;
    }
    kv::encode(reply, std::span<std::byte, kv::kMessageSize>(buf->data().data(), kv::kMessageSize));
    // The send holds the LDO until it completes; dropping our handle is fine.
    // A reply that fails (the client died: peer_unreachable; it is stuck:
    // timeout) is only counted: membership events decide who is a client.
    auto t = ep_->send(peer, *regpool::Slice::data(*buf), [this](const regpool::Completion& c) {
      if (c.status != Status::ok) ++failed_replies_;
    });
    if (!t) ++failed_replies_;
  }

  // The reply through the client's kept send; false when it could not go
  // that way (no buffer, or a post that failed: the caller then sends it
  // from a buffer of its own).
  bool send_kept_reply(regpool::PeerId peer, Client& c, const kv::Reply& reply) {
    if (!c.reply_buf) {
      auto buf = pool_->allocate(kv::kMessageSize);
      if (!buf) return false;
      c.reply_buf = std::move(*buf);
    }
    kv::encode(reply, std::span<std::byte, kv::kMessageSize>(c.reply_buf.data().data(), kv::kMessageSize));
    if (c.reply_token) {
      if (ep_->repost(c.reply_token) != Status::ok) return false;  // still parked: tried again next reply
    } else {
      const std::uint64_t epoch = c.epoch;
      auto t = ep_->send_kept(peer, *regpool::Slice::data(c.reply_buf),
                              [this, peer, epoch](const regpool::Completion& done) { on_reply_sent(peer, epoch, done); });
      if (!t) return false;
      c.reply_token = *t;
    }
    c.reply_busy = true;
    return true;
  }

  // A kept reply's completion: ok parks it for the next reply; anything
  // else ended it (a new one is made for the next reply).
  void on_reply_sent(regpool::PeerId peer, std::uint64_t epoch, const regpool::Completion& done) {
    if (done.status != Status::ok) ++failed_replies_;
    auto it = clients_.find(peer);
    if (it == clients_.end() || it->second.epoch != epoch || it->second.reply_token != done.token) return;
    it->second.reply_busy = false;
    if (done.status != Status::ok) it->second.reply_token = regpool::Token{};
  }

  void report() {
    std::printf("kv-server: %zu joined, %zu left, %zu died, %llu requests, %llu rejected, %llu replies failed, %zu keys\n",
                joined_, left_, died_, static_cast<unsigned long long>(requests_),
                static_cast<unsigned long long>(bad_requests_), static_cast<unsigned long long>(failed_replies_),
                store_.size());
    regpool::print(std::cout, pool_->stats());
    regpool::print(std::cout, ep_->stats());
    regpool::print(std::cout, ep_->exposure_stats());
    std::cout.flush();
  }

  Options opt_;
  std::shared_ptr<regpool::FabricDomain> domain_;
  std::unique_ptr<regpool::Pool> pool_;
  std::unique_ptr<regpool::FabricEndpoint> ep_;
  std::unique_ptr<regpool::Listener> listener_;
  std::vector<regpool::Ldo> recv_bufs_;
  std::vector<regpool::Token> recv_tokens_;  // their kept receives
  std::vector<Ready> ready_;
  std::unordered_map<regpool::PeerId, Client> clients_;  // current members
  std::unordered_map<std::string, regpool::Ldo> store_;
  std::uint64_t next_lease_ = 1;
  std::size_t joined_ = 0, left_ = 0, died_ = 0;
  std::uint64_t requests_ = 0, bad_requests_ = 0, failed_replies_ = 0;
};

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: kv-server [--provider shm|tcp] [--port N] [--wait spin|sleep|adaptive]\n"
               "                 [--op-timeout-ms MS] [--max-value BYTES] [--expect N] [--max-seconds S]\n");
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
    } else if (a == "--port" && has && kv::number(argv[++i], &v) && v < 65536) {
      o.port = static_cast<std::uint16_t>(v);
    } else if (a == "--wait" && has && kv::wait_mode(argv[i + 1])) {
      o.wait = *kv::wait_mode(argv[++i]);
    } else if (a == "--op-timeout-ms" && has && kv::number(argv[++i], &v) && v > 0) {
      o.op_timeout = std::chrono::milliseconds(v);
    } else if (a == "--max-value" && has && kv::number(argv[++i], &v) && v > 0) {
      o.max_value = v;
    } else if (a == "--expect" && has && kv::number(argv[++i], &v)) {
      o.expect = static_cast<std::size_t>(v);
    } else if (a == "--max-seconds" && has && kv::number(argv[++i], &v)) {
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
