// bench-rma: latency and bandwidth of put, get and send through regpool's
// FabricEndpoint, each beside the same operation written directly against
// libfabric (own fabric, domain, endpoint and CQ; fi_mr_reg of the same
// bytes the regpool side uses, unless --own-buffers), in the same binary and
// run, alternating the two every repetition.
//
//   bench-rma [--provider shm|tcp] [--json] [--reps N] [--smoke] [--shm-direct-rma on|off]
//             [--fresh] [--own-buffers] [--shm-ring-copy-max B]
//   bench-rma --loop put|get|put-kept|get-kept|send|send-kept|kept-both|tagged --impl regpool|direct
//             [--iters N] [--size B]
//
// Forks its own target side. The target polls both stacks from one thread
// (manual progress: shm and tcp;ofi_rxm need the target to progress), echoes
// ping messages for send latency and swallows bulk messages.
//
// Metrics: latency_us = one put/get completing at the initiator with one op
// in flight (send: half a ping-pong round trip); bandwidth_gbps = gigabits
// per second with a window of operations in flight (send: the window is
// closed by a ping-pong so every byte has arrived), 128 MiB or at least
// 32 operations per size and repetition. Medians over --reps,
// and the median over pairs of repetitions of regpool's / the direct
// path's (paired: the runs of a pair are close in time, so a host that
// changes speed between repetitions, as this VM's does every few minutes,
// moves both figures of a pair together, where medians taken apart can
// each come from a different speed; and a pair has one repetition with
// each stack first, which cancels the cache the first leaves the second
// on the bytes both move).
// Writes use FI_DELIVERY_COMPLETE in both stacks when the regpool endpoint
// does (tcp;ofi_rxm by default), so the two do the same work. The text
// output has the regpool initiator's post retries and shm lock skips per
// row and in all (EndpointStats, FabricShmStats): where they are many, a
// ratio measures waiting on the target's region lock, not the software path.
//
// --loop: no timing and no second process. Both sides live in this process
// (each stack's own endpoints, as bench-sendpath does) and one stack runs
// N operations one at a time: a put or get and its wait (or one kept put
// or get reposted each time: put-kept, get-kept), or a send round
// (post a receive on the target, send, wait for both), the send round with
// one kept receive reposted instead (send-kept; its direct loop is send's),
// with a kept send reposted too (kept-both; likewise),
// or the same round through a Messenger on each stack (tagged, regpool
// only). bench/rma-insns
// counts it under callgrind at two N and prints the difference per
// operation: the instructions of one operation on each stack, which hold
// on a loaded machine where wall-clock ratios do not.

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "regpool/bootstrap.hpp"
#include "regpool/fabric_domain.hpp"
#include "regpool/fabric_endpoint.hpp"
#include "regpool/messaging.hpp"
#include "regpool/pool.hpp"
#include "regpool/slice.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using regpool::Slice;
using regpool::Status;

constexpr std::uint64_t kMaxSize = 16u << 20;
constexpr std::size_t kRecvSlots = 4;  // per stack on the target, each kMaxSize
constexpr std::uint64_t kDirectKey = 0xD1EC7;
constexpr std::byte kPing{'P'}, kBulk{'B'}, kEnd{'E'};
// Where the target's receive slot k starts in its shared object (run_target).
constexpr std::uint64_t recv_slot(std::size_t k) { return (k + 1) * kMaxSize; }

[[noreturn]] void die(const std::string& what, long rc = 0) {
  std::fprintf(stderr, "bench-rma: %s (%ld: %s)\n", what.c_str(), rc, rc ? fi_strerror(static_cast<int>(-rc)) : "");
  std::exit(1);
}

struct Options {
  std::string provider = "shm";
  bool json = false;
  // Repetitions: an even number, so every one is in a pair (see the top).
  int reps = 10;
  bool smoke = false;
  // Split mode: the initiator waits on `port` for a target started
  // separately (--target HOST:PORT), e.g. under another user, in another
  // container or pinned to another core, instead of forking one.
  bool no_fork = false;
  std::uint16_t port = 0;
  std::string target_host;  // non-empty: run only the target side
  // --loop (see the top of this file): op and stack, operations, bytes.
  std::string loop_op;
  std::string loop_impl = "regpool";
  std::uint64_t loop_iters = 1000;
  std::uint64_t loop_size = 8;
  // regpool's shm puts and gets by its own cross-memory copy
  // (FabricEndpointOptions::shm_direct_rma; off: through fi_write/fi_read).
  bool direct_rma = true;
  // FabricEndpointOptions::shm_ring_copy_max of both regpool stacks (its
  // default is also its largest value).
  std::uint64_t ring_copy_max = regpool::FabricEndpointOptions{}.shm_ring_copy_max;
  // FabricEndpointOptions::shm_ring_adaptive of both regpool stacks.
  bool ring_adaptive = regpool::FabricEndpointOptions{}.shm_ring_adaptive;
  // --fresh: bandwidth rows write each operation's source bytes before its
  // post, into a slot of their own per window entry, as a sender of new
  // data does. Without it every operation sends the same unchanged bytes,
  // which on shm the receiver's cache may already hold.
  bool fresh = false;
  // --own-buffers: the direct path's buffers are memory of its own
  // (aligned_alloc) instead of the regpool stack's bytes. Shared is the
  // default: which physical pages a run hands each stack moved a 1 MiB
  // ratio by up to 0.14 between runs (bench/RESULTS.md, 2026-12-03), a
  // difference of memory, not of the two software paths being compared.
  bool own_buffers = false;
};

// --------------------------------------------------------------- direct

// The same operations written straight against libfabric.
struct Direct {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  fid_mr* mr = nullptr;
  std::byte* buf = nullptr;
  std::size_t len = 0;
  void* desc = nullptr;
  bool virt = false;
  bool dc = false;
  bool owned = true;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  fi_context2 ctx[64]{};

  // `shared`: the bytes to use (registered here too, never freed here;
  // they must outlive this object), else nullptr for memory of its own.
  Direct(const fi_info* tmpl, std::size_t bytes, bool delivery_complete, std::byte* shared = nullptr)
      : len(bytes), dc(delivery_complete), owned(shared == nullptr) {
    info = fi_dupinfo(tmpl);
    long rc = fi_fabric(info->fabric_attr, &fabric, nullptr);
    if (rc) die("fi_fabric", rc);
    rc = fi_domain(fabric, info, &domain, nullptr);
    if (rc) die("fi_domain", rc);
    fi_av_attr aa{};
    aa.type = FI_AV_TABLE;
    rc = fi_av_open(domain, &aa, &av, nullptr);
    if (rc) die("fi_av_open", rc);
    fi_cq_attr ca{};
    ca.format = FI_CQ_FORMAT_DATA;
    ca.size = 256;
    rc = fi_cq_open(domain, &ca, &cq, nullptr);
    if (rc) die("fi_cq_open", rc);
    rc = fi_endpoint(domain, info, &ep, nullptr);
    if (rc) die("fi_endpoint", rc);
    if ((rc = fi_ep_bind(ep, &av->fid, 0)) || (rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) ||
        (rc = fi_enable(ep))) {
      die("fi_ep_bind/enable", rc);
    }
    if (shared != nullptr) {
      buf = shared;
    } else {
      // Same kind of memory as a regpool arena (2 MiB aligned, THP
      // advised), so the comparison measures the transport, not the page
      // size.
      len = (len + (2u << 20) - 1) & ~std::size_t{(2u << 20) - 1};
      buf = static_cast<std::byte*>(std::aligned_alloc(2u << 20, len));
      (void)::madvise(buf, len, MADV_HUGEPAGE);
      std::memset(buf, 0, len);
    }
    rc = fi_mr_reg(domain, buf, len, FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, 0,
                   kDirectKey, 0, &mr, nullptr);
    if (rc) die("fi_mr_reg", rc);
    desc = fi_mr_desc(mr);
    virt = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  }
  ~Direct() {
    fi_close(&ep->fid);
    fi_close(&mr->fid);
    fi_close(&cq->fid);
    fi_close(&av->fid);
    fi_close(&domain->fid);
    fi_close(&fabric->fid);
    fi_freeinfo(info);
    if (owned) std::free(buf);
  }
  std::vector<std::byte> name() const {
    std::size_t n = 256;
    std::vector<std::byte> v(n);
    if (fi_getname(&ep->fid, v.data(), &n)) die("fi_getname");
    v.resize(n);
    return v;
  }
  void insert(const std::vector<std::byte>& name) {
    if (fi_av_insert(av, name.data(), 1, &peer, 0, nullptr) != 1) die("fi_av_insert");
  }
  std::uint64_t remote_base() const { return virt ? reinterpret_cast<std::uintptr_t>(buf) : 0; }
  // Reap one completion; returns its context.
  void* reap() {
    fi_cq_data_entry e{};
    for (;;) {
      const ssize_t n = fi_cq_read(cq, &e, 1);
      if (n == 1) return e.op_context;
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        fi_cq_readerr(cq, &err, 0);
        die("direct completion error", -static_cast<long>(err.err));
      }
      if (n != -FI_EAGAIN) die("fi_cq_read", n);
    }
  }
  // Post with the retry-after-progress every manual-progress provider needs.
  template <class F>
  void post(F&& f) {
    for (;;) {
      const ssize_t rc = f();
      if (rc == 0) return;
      if (rc != -FI_EAGAIN) die("direct post", rc);
      fi_cq_data_entry e{};
      (void)fi_cq_read(cq, &e, 0);
    }
  }
  void write(std::size_t n, std::uint64_t raddr, std::uint64_t key, void* c, std::uint64_t at = 0) {
    if (!dc) {
      post([&] { return fi_write(ep, buf + at, n, desc, peer, raddr, key, c); });
      return;
    }
    iovec iov{buf + at, n};
    fi_rma_iov rma{raddr, n, key};
    fi_msg_rma m{};
    m.msg_iov = &iov;
    m.desc = &desc;
    m.iov_count = 1;
    m.addr = peer;
    m.rma_iov = &rma;
    m.rma_iov_count = 1;
    m.context = c;
    post([&] { return fi_writemsg(ep, &m, FI_COMPLETION | FI_DELIVERY_COMPLETE); });
  }
};

// --------------------------------------------------------------- regpool

struct Stack {
  std::shared_ptr<regpool::FabricDomain> domain;
  std::unique_ptr<regpool::Pool> pool;
  std::unique_ptr<regpool::FabricEndpoint> ep;
  Stack(const std::string& provider, bool direct_rma, std::uint64_t ring_copy_max, bool ring_adaptive,
        const regpool::EndpointConfig& ec = {}) {
    regpool::FabricConfig fc;
    fc.provider = provider;
    if (provider == "tcp") fc.node = "127.0.0.1";
    domain = regpool::FabricDomain::open(fc);
    regpool::PoolConfig pc;
    pc.arena_size = 32u << 20;
    pool = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain}, pc);
    regpool::FabricEndpointOptions fo;
    fo.shm_direct_rma = direct_rma;
    fo.shm_ring_copy_max = ring_copy_max;
    fo.shm_ring_adaptive = ring_adaptive;
    ep = regpool::FabricEndpoint::open(domain, ec, fo);
  }
  ~Stack() {
    ep.reset();
    pool.reset();
  }
  regpool::Ldo alloc(std::uint64_t n) {
    auto r = pool->allocate(n);
    if (!r) die("allocate");
    return std::move(*r);
  }
};

Slice must(regpool::Result<Slice> r) {
  if (!r) die("slice");
  return std::move(*r);
}

// Waits for a posted regpool operation; dies on any failure.
void wait_ok(regpool::Endpoint& ep, regpool::Result<regpool::Token> t) {
  if (!t) die(std::string("regpool post: ") + regpool::to_string(t.status()));
  auto c = ep.wait(*t, 30s);
  if (c.status != Status::ok) die(std::string("regpool op: ") + regpool::to_string(c.status));
}

template <class T>
std::vector<std::byte> pod(const T& v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  return {p, p + sizeof v};
}
template <class T>
T unpod(const std::vector<std::byte>& b) {
  T v{};
  std::memcpy(&v, b.data(), std::min(sizeof v, b.size()));
  return v;
}

// --------------------------------------------------------------- target

int run_target(const Options& o, const std::string& host, std::uint16_t port) {
  regpool::TcpBootstrapConfig bc;
  bc.rank = 1;
  bc.size = 2;
  bc.host = host;
  bc.port = port;
  regpool::TcpBootstrap boot(bc);
  Stack s(o.provider, o.direct_rma, o.ring_copy_max, o.ring_adaptive);
  // One object for both stacks' bytes (unless --own-buffers): the target
  // of puts and gets at 0, receive slot k at (k + 1) * kMaxSize. Both
  // stacks' receives are posted over the same slots; only one stack
  // carries traffic at a time.
  auto area = s.alloc(kMaxSize * (kRecvSlots + 1));
  Direct d(s.domain->native_info(), kMaxSize * (kRecvSlots + 1), s.ep->uses_delivery_complete(),
           o.own_buffers ? nullptr : area.data().data());
  auto exposure = s.ep->expose(must(Slice::data(area, 0, kMaxSize)), regpool::RemoteAccess::read_write);
  if (!exposure) die("expose");
  auto ref = exposure->encode();
  auto all = boot.allgather(regpool::pack_blobs({s.ep->name(), {ref.begin(), ref.end()}, d.name(), pod(d.remote_base())}), 30s);
  auto theirs = regpool::unpack_blobs(all[0]);
  const auto peer = s.ep->insert_peer(theirs[0]);
  d.insert(theirs[2]);

  // regpool receives: echo pings, swallow bulk, stop at END.
  bool rp_done = false, d_done = false;
  std::function<void(std::size_t)> post_rp = [&](std::size_t k) {
    auto t = s.ep->post_recv(must(Slice::data(area, recv_slot(k), kMaxSize)), [&, k](const regpool::Completion& c) {
      if (c.status != Status::ok) die("target recv");
      const std::byte tag = area.data()[recv_slot(k)];
      if (tag == kEnd) {
        rp_done = true;
        return;
      }
      if (tag == kPing) {
        // Echo from the same buffer; re-post the receive once it has left.
        auto e = s.ep->send(peer, must(Slice::data(area, recv_slot(k), c.bytes)),
                            [&, k](const regpool::Completion&) { post_rp(k); });
        if (!e) die("target echo");
        return;
      }
      post_rp(k);
    });
    if (!t) die("target post_recv");
  };
  for (std::size_t k = 0; k < kRecvSlots; ++k) post_rp(k);

  // Direct receives: contexts 0..kRecvSlots-1 are receives, 32+k echoes.
  auto post_d = [&](std::size_t k) {
    d.post([&] { return fi_recv(d.ep, d.buf + (k + 1) * kMaxSize, kMaxSize, d.desc, FI_ADDR_UNSPEC, &d.ctx[k]); });
  };
  for (std::size_t k = 0; k < kRecvSlots; ++k) post_d(k);
  while (!(rp_done && d_done)) {
    s.ep->progress();
    fi_cq_data_entry e{};
    const ssize_t n = fi_cq_read(d.cq, &e, 1);
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(d.cq, &err, 0);
      die("target direct completion", -static_cast<long>(err.err));
    }
    if (n != 1) continue;
    const auto idx = static_cast<std::size_t>(static_cast<fi_context2*>(e.op_context) - d.ctx);
    if (idx >= 32) {
      post_d(idx - 32);
      continue;
    }
    std::byte* b = d.buf + (idx + 1) * kMaxSize;
    if (b[0] == kEnd) {
      d_done = true;
    } else if (b[0] == kPing) {
      d.post([&] { return fi_send(d.ep, b, e.len, d.desc, d.peer, &d.ctx[32 + idx]); });
    } else {
      post_d(idx);
    }
  }
  boot.barrier(30s);
  return 0;
}

// --------------------------------------------------------------- initiator

struct Result {
  const char* op;
  std::uint64_t size;
  bool latency;
  std::vector<double> rp, direct;
  // Per repetition: regpool / direct (as the medians' ratio in the table).
  std::vector<double> paired;
  // The regpool initiator's post retries and shm lock skips in this row,
  // all repetitions: where they are many, the row waited on a region lock.
  std::uint64_t retries = 0, skips = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

int run_initiator(const Options& o, regpool::TcpBootstrap& boot) {
  Stack s(o.provider, o.direct_rma, o.ring_copy_max, o.ring_adaptive);
  // Both stacks' bytes in one object (unless --own-buffers): the source of
  // puts and sends (and a get's destination) at 0, the ping's echo at
  // kMaxSize.
  auto src = s.alloc(kMaxSize * 2);
  Direct d(s.domain->native_info(), kMaxSize * 2, s.ep->uses_delivery_complete(),
           o.own_buffers ? nullptr : src.data().data());
  auto all = boot.allgather(regpool::pack_blobs({s.ep->name(), {}, d.name(), {}}), 30s);
  auto theirs = regpool::unpack_blobs(all[1]);
  const auto peer = s.ep->insert_peer(theirs[0]);
  auto ref = regpool::RemoteRef::decode(theirs[1]);
  if (!ref) die("decode");
  d.insert(theirs[2]);
  const std::uint64_t d_raddr = unpod<std::uint64_t>(theirs[3]);

  std::memset(src.data().data(), 0x11, kMaxSize);
  if (o.own_buffers) std::memset(d.buf, 0x11, kMaxSize);  // else the same bytes

  // regpool building blocks
  auto rp_wait = [&](regpool::Result<regpool::Token> t) { wait_ok(*s.ep, std::move(t)); };
  auto rp_op = [&](const char* op, const Slice& sl) -> regpool::Result<regpool::Token> {
    if (op[0] == 'p') return s.ep->put(sl, peer, *ref, 0);
    if (op[0] == 'g') return s.ep->get(peer, *ref, 0, sl);
    return s.ep->send(peer, sl);
  };
  // put-kept, get-kept: the first post of a kept put or get; later ones
  // are reposts of its token (rp_again).
  auto rp_kept = [&](const char* op, const Slice& sl) -> regpool::Result<regpool::Token> {
    return op[0] == 'p' ? s.ep->put_kept(sl, peer, *ref, 0) : s.ep->get_kept(peer, *ref, 0, sl);
  };
  auto rp_again = [&](regpool::Token t) {
    if (const Status st = s.ep->repost(t); st != Status::ok) die(std::string("repost: ") + regpool::to_string(st));
  };
  auto rp_ping = [&](std::uint64_t size) {
    auto in = s.ep->post_recv(must(Slice::data(src, kMaxSize, std::max<std::uint64_t>(size, 8))));
    src.data()[0] = kPing;
    rp_wait(s.ep->send(peer, must(Slice::data(src, 0, size))));
    rp_wait(std::move(in));
  };
  // direct building blocks
  // `at`: where in the source the bytes of a put or send start.
  auto d_op = [&](const char* op, std::uint64_t size, void* c, std::uint64_t at = 0) {
    if (op[0] == 'p') {
      d.write(size, d_raddr, kDirectKey, c, at);
    } else if (op[0] == 'g') {
      d.post([&] { return fi_read(d.ep, d.buf, size, d.desc, d.peer, d_raddr, kDirectKey, c); });
    } else {
      d.post([&] { return fi_send(d.ep, d.buf + at, size, d.desc, d.peer, c); });
    }
  };
  auto d_ping = [&](std::uint64_t size) {
    d.post([&] { return fi_recv(d.ep, d.buf + kMaxSize, std::max<std::uint64_t>(size, 8), d.desc, FI_ADDR_UNSPEC, &d.ctx[1]); });
    d.buf[0] = kPing;
    d.post([&] { return fi_send(d.ep, d.buf, size, d.desc, d.peer, &d.ctx[0]); });
    (void)d.reap();
    (void)d.reap();
  };

  const int lat_iters = o.smoke ? 20 : 1000;
  const std::uint64_t bw_bytes = o.smoke ? (4u << 20) : (128u << 20);
  std::vector<Result> results;
  // put-kept and get-kept: regpool's kept puts and gets (one per window
  // slot, reposted), against the same direct puts and gets.
  for (const char* op : {"put", "get", "send", "put-kept", "get-kept"}) {
    for (std::uint64_t size : {8ull, 4096ull}) results.push_back({op, size, true, {}, {}, {}});
    for (std::uint64_t size : {65536ull, 1ull << 20, 16ull << 20}) results.push_back({op, size, false, {}, {}, {}});
  }
  // Warm both stacks (connections, first-touch).
  for (const char* op : {"put", "get"}) {
    rp_wait(rp_op(op, must(Slice::data(src, 0, 8))));
    d_op(op, 8, &d.ctx[0]);
    (void)d.reap();
  }
  rp_ping(8);
  d_ping(8);

  for (int rep = 0; rep < o.reps; ++rep) {
    for (Result& r : results) {
      const bool send = r.op[0] == 's';
      const bool kept = std::strchr(r.op, '-') != nullptr;
      for (int impl = 0; impl < 2; ++impl) {
        const bool rp = (impl + rep) % 2 == 0;  // alternate who goes first
        double value = 0;
        const std::uint64_t retries0 = s.ep->stats().post_retries, skips0 = s.ep->shm_stats().lock_skips;
        if (r.latency) {
          // Made once, as the direct path's buffer and descriptor are: the
          // loop times the operation, not the making of a Slice.
          const Slice slice = must(Slice::data(src, 0, r.size));
          regpool::Token kept_op{};
          const auto t0 = Clock::now();
          for (int i = 0; i < lat_iters; ++i) {
            if (send) {
              rp ? rp_ping(r.size) : d_ping(r.size);
            } else if (rp && kept) {
              if (i == 0) {
                auto t = rp_kept(r.op, slice);
                if (!t) die(std::string(r.op) + " post");
                kept_op = *t;
              } else {
                rp_again(kept_op);
              }
              if (s.ep->wait(kept_op, 30s).status != Status::ok) die(std::string(r.op));
            } else if (rp) {
              rp_wait(rp_op(r.op, slice));
            } else {
              d_op(r.op, r.size, &d.ctx[0]);
              (void)d.reap();
            }
          }
          const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / lat_iters;
          if (kept_op) (void)s.ep->end_kept(kept_op);
          value = send ? us / 2 : us;
        } else {
          // At least 32 operations (16 MiB: 512 MiB moved): with 128 MiB,
          // a 16 MiB row was 8 operations at a window of 2, and one
          // repetition's ratio scattered by +-7 % (bench/RESULTS.md).
          const std::uint64_t n = std::max<std::uint64_t>(bw_bytes / r.size, o.smoke ? 4 : 32);
          const std::size_t window = std::min<std::uint64_t>(r.size >= (16u << 20) ? 2 : 16, n);
          if (send) src.data()[0] = kBulk, d.buf[0] = kBulk;
          // --fresh: the slot of window entry w, written before each post
          // (the first byte stays kBulk: the target tells bulk from a ping).
          const bool fresh = o.fresh && r.op[0] != 'g' && r.size * window <= kMaxSize;
          const auto slot_at = [&](std::uint64_t w) { return fresh ? w * r.size : 0; };
          const auto refresh = [&](std::byte* base, std::uint64_t w, std::uint64_t i) {
            if (!fresh) return;
            std::memset(base + slot_at(w) + 1, static_cast<int>(i & 0x7f), r.size - 1);
            base[slot_at(w)] = send ? kBulk : std::byte{0x11};
          };
          // regpool's slices and tokens are made before the clock starts,
          // as the direct path's buffer and descriptors are.
          std::vector<Slice> slices;
          std::vector<regpool::Token> ring;
          if (rp) {
            for (std::size_t w = 0; w < window; ++w) slices.push_back(must(Slice::data(src, slot_at(w), r.size)));
            ring.resize(window);
          }
          const auto t0 = Clock::now();
          if (rp) {
            for (std::uint64_t i = 0; i < n; ++i) {
              auto& t = ring[i % window];
              if (t && s.ep->wait(t, 30s).status != Status::ok) die("regpool bw op");
              refresh(src.data().data(), i % window, i);
              if (kept && t) {
                rp_again(t);
                continue;
              }
              const Slice& slice = slices[i % window];
              auto nt = kept ? rp_kept(r.op, slice) : rp_op(r.op, slice);
              if (!nt) die("regpool bw post");
              t = *nt;
            }
            for (auto& t : ring) {
              if (t && s.ep->wait(t, 30s).status != Status::ok) die("regpool bw op");
              if (kept && t) (void)s.ep->end_kept(t);
            }
            if (send) rp_ping(8);
          } else {
            std::uint64_t posted = 0, done = 0;
            while (done < n) {
              while (posted < n && posted - done < window) {
                refresh(d.buf, posted % window, posted);
                d_op(r.op, r.size, &d.ctx[2 + posted % window], slot_at(posted % window));
                ++posted;
              }
              (void)d.reap();
              ++done;
            }
            if (send) d_ping(8);
          }
          const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
          value = static_cast<double>(n * r.size) * 8 / secs / 1e9;
        }
        (rp ? r.rp : r.direct).push_back(value);
        r.retries += s.ep->stats().post_retries - retries0;
        r.skips += s.ep->shm_stats().lock_skips - skips0;
      }
      // A pair of repetitions, one with each stack first: the stack that
      // runs second finds the shared bytes in cache, so a single
      // repetition's ratio is 0.9 or 1.1 by its order alone (measured
      // 2026-12-03); over the pair the order cancels. A lone repetition
      // (--smoke, the last of an odd --reps) makes no pair, unless it is
      // the only one.
      if (rep % 2 == 1 || o.reps == 1) {
        const std::size_t from = o.reps == 1 ? r.rp.size() - 1 : r.rp.size() - 2;
        double a = 0, b = 0;
        for (std::size_t k = from; k < r.rp.size(); ++k) a += r.rp[k], b += r.direct[k];
        if (a > 0 && b > 0) r.paired.push_back(a / b);
      }
    }
  }
  // Tell both target stacks to stop.
  src.data()[0] = kEnd;
  rp_wait(s.ep->send(peer, must(Slice::data(src, 0, 8))));
  d.buf[0] = kEnd;
  d_op("send", 8, &d.ctx[0]);
  (void)d.reap();
  boot.barrier(30s);

  if (o.json) {
    std::printf("{\"provider\": \"%s\", \"shm_direct_rma\": %s, \"shm_ring_copy_max\": %llu, "
                "\"shm_ring_adaptive\": %s, \"results\": [",
                s.domain->provider_name().c_str(), o.direct_rma ? "true" : "false",
                static_cast<unsigned long long>(o.ring_copy_max), o.ring_adaptive ? "true" : "false");
    for (std::size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::printf("%s{\"op\": \"%s\", \"size\": %llu, \"metric\": \"%s\", \"regpool\": %.4f, \"direct\": %.4f, "
                  "\"paired_ratio\": %.4f}",
                  i ? ", " : "", r.op, static_cast<unsigned long long>(r.size),
                  r.latency ? "latency_us" : "bandwidth_gbps", median(r.rp), median(r.direct), median(r.paired));
    }
    std::printf("]}\n");
  } else {
    std::printf(
        "provider %s, %d repetitions (medians), delivery complete %s, shm direct rma %s, shm ring copy max %llu, "
        "adaptive %s\n",
        s.domain->provider_name().c_str(), o.reps, s.ep->uses_delivery_complete() ? "on" : "off",
        o.direct_rma ? "on" : "off", static_cast<unsigned long long>(o.ring_copy_max), o.ring_adaptive ? "on" : "off");
    // ratio: regpool / direct of the two medians; paired: the median over
    // pairs of repetitions of regpool / direct (latency: > 1 is slower;
    // bandwidth: < 1 is slower).
    std::printf("%-5s %10s %-15s %12s %12s %10s %8s %8s %8s\n", "op", "size", "metric", "regpool", "direct", "ratio",
                "paired", "retries", "skips");
    for (const Result& r : results) {
      const double a = median(r.rp), b = median(r.direct);
      const double ratio = b > 0 ? a / b : 0.0;
      std::printf("%-5s %10llu %-15s %12.3f %12.3f %10.3f %8.3f %8llu %8llu\n", r.op,
                  static_cast<unsigned long long>(r.size), r.latency ? "latency_us" : "bandwidth_gbps", a, b, ratio,
                  median(r.paired), static_cast<unsigned long long>(r.retries), static_cast<unsigned long long>(r.skips));
    }
    // Why a ratio may be off: posts the regpool endpoint refused for now and
    // retried (a peer's shm region lock seen held), and polls it skipped.
    const regpool::EndpointStats es = s.ep->stats();
    const regpool::FabricShmStats fs = s.ep->shm_stats();
    std::printf("regpool initiator: %llu ops posted, %llu post retries, %llu shm lock skips, "
                "%llu puts and gets by its own copy\n",
                static_cast<unsigned long long>(es.posted), static_cast<unsigned long long>(es.post_retries),
                static_cast<unsigned long long>(fs.lock_skips), static_cast<unsigned long long>(fs.direct_rma));
  }
  return 0;
}


// --------------------------------------------------------------- loop

// shm's fast put and get leave a command in the target's queue (libfabric
// 1.17 smr_rma_fast), which fills unless the target progresses: the loop
// polls the target once per this many operations, the same in both stacks.
constexpr std::uint64_t kLoopTargetEvery = 64;

// --loop: one stack's operations, both sides in this process (see the top
// of this file). Setup is the same at any --iters, so the difference of two
// runs' instruction counts is the operations' own.
int run_loop(const Options& o) {
  const std::uint64_t size = o.loop_size;
  // kept-both: a send round (its direct loop is the send loop).
  const char op = o.loop_op == "kept-both" ? 's' : o.loop_op[0];
  // A short post_timeout, so the warm-up below can progress the target
  // between attempts (the rest of the path is the default one).
  regpool::EndpointConfig ec;
  ec.post_timeout = std::chrono::milliseconds(1);
  Stack a(o.provider, o.direct_rma, o.ring_copy_max, o.ring_adaptive, ec),
      b(o.provider, o.direct_rma, o.ring_copy_max, o.ring_adaptive, ec);
  if (o.loop_impl == "direct") {
    Direct da(a.domain->native_info(), size, a.ep->uses_delivery_complete());
    Direct db(b.domain->native_info(), size, b.ep->uses_delivery_complete());
    da.insert(db.name());
    db.insert(da.name());
    // shm's first operation to a peer waits for the peer's progress (its
    // answer to our name): one 8-byte send with both sides progressing.
    db.post([&] { return fi_recv(db.ep, db.buf, 8, db.desc, FI_ADDR_UNSPEC, &db.ctx[1]); });
    for (;;) {
      const ssize_t rc = fi_send(da.ep, da.buf, 8, da.desc, da.peer, &da.ctx[0]);
      if (rc == 0) break;
      if (rc != -FI_EAGAIN) die("direct warm-up send", rc);
      fi_cq_data_entry e{};
      (void)fi_cq_read(da.cq, &e, 0);
      (void)fi_cq_read(db.cq, &e, 0);
    }
    (void)da.reap();
    (void)db.reap();
    for (std::uint64_t i = 0; i < o.loop_iters; ++i) {
      if (op == 'p') {
        da.write(size, db.remote_base(), kDirectKey, &da.ctx[0]);
      } else if (op == 'g') {
        da.post([&] { return fi_read(da.ep, da.buf, size, da.desc, da.peer, db.remote_base(), kDirectKey, &da.ctx[0]); });
      } else {
        db.post([&] { return fi_recv(db.ep, db.buf, size, db.desc, FI_ADDR_UNSPEC, &db.ctx[1]); });
        da.post([&] { return fi_send(da.ep, da.buf, size, da.desc, da.peer, &da.ctx[0]); });
      }
      (void)da.reap();
      if (op == 's') (void)db.reap();
      if (i % kLoopTargetEvery == 0) {
        fi_cq_data_entry e{};
        (void)fi_cq_read(db.cq, &e, 0);
      }
    }
    return 0;
  }
  auto target = b.alloc(size);
  auto exposure = b.ep->expose(must(Slice::data(target)), regpool::RemoteAccess::read_write);
  if (!exposure) die("expose");
  const regpool::RemoteRef ref = exposure->ref();
  const auto peer = a.ep->insert_peer(b.ep->name());
  const auto back = b.ep->insert_peer(a.ep->name());
  {
    // As above, the target progressing between attempts (not from a
    // thread: its spinning would be counted, as much as the scheduler
    // lets it run, and differ between runs).
    auto warm_in = b.alloc(8), warm_out = a.alloc(8);
    // A put first: with regpool's shm message rings no send goes through
    // the provider, and shm's first operation toward a peer (the address
    // exchange) needs the target's progress.
    for (;;) {
      auto t = a.ep->put(must(Slice::data(warm_out)), peer, ref, 0);
      if (t) {
        for (;;) {
          const auto c = a.ep->wait(*t, 1ms);
          if (c.status == Status::ok) break;
          if (c.status != Status::in_progress) die(std::string("warm-up put: ") + regpool::to_string(c.status));
          (void)b.ep->progress();
        }
        break;
      }
      if (t.status() != Status::would_block) die(std::string("warm-up put: ") + regpool::to_string(t.status()));
      (void)b.ep->progress();
    }
    auto in = b.ep->post_recv(must(Slice::data(warm_in)));
    for (;;) {
      auto t = a.ep->send(peer, must(Slice::data(warm_out)));
      if (t) {
        wait_ok(*a.ep, std::move(t));
        break;
      }
      if (t.status() != Status::would_block) die(std::string("warm-up send: ") + regpool::to_string(t.status()));
      (void)b.ep->progress();
    }
    wait_ok(*b.ep, std::move(in));
  }
  auto src = a.alloc(size);
  // Made once, as in the latency loop of the two-process run.
  const Slice local = must(Slice::data(src, 0, size));
  const Slice inbox = must(Slice::data(target, 0, size));
  if (op == 't') {
    // The Messenger's tagged round, the same shape as the send round:
    // receive posted on the target, send, wait for both. Against the
    // send round it is what matching, credits and the header cost.
    regpool::Messenger ma(*a.ep, *a.pool), mb(*b.ep, *b.pool);
    auto tagged_ok = [](regpool::Messenger& m, regpool::Result<regpool::MessageToken> t) {
      if (!t) die(std::string("messenger post: ") + regpool::to_string(t.status()));
      auto c = m.wait(*t, 30s);
      if (c.status != Status::ok) die(std::string("messenger op: ") + regpool::to_string(c.status));
    };
    {
      // A first message from the target teaches the sender its limits
      // (eager threshold, credits; docs/messaging.md): until then a send
      // above 64 bytes goes by rendezvous, whose get needs the target's
      // progress while this thread waits on the sender (it timed out).
      const std::uint64_t n = std::min<std::uint64_t>(size, 8);
      auto hello = ma.recv(peer, 8, 0, must(Slice::data(src, 0, n)));
      tagged_ok(mb, mb.send(back, 8, must(Slice::data(target, 0, n))));
      tagged_ok(ma, std::move(hello));
    }
    for (std::uint64_t i = 0; i < o.loop_iters; ++i) {
      auto in = mb.recv(back, 7, 0, inbox);
      tagged_ok(ma, ma.send(peer, 7, local));
      tagged_ok(mb, std::move(in));
    }
    return 0;
  }
  if (o.loop_op == "send-kept" || o.loop_op == "kept-both") {
    // The send round with one kept receive (post_recv_kept), reposted after
    // each message instead of a new receive posted: what the endpoint's
    // slot, reference and callback handling of a receive costs. kept-both
    // also sends through one kept send (send_kept), reposted each round:
    // the same for the send.
    const bool kept_send = o.loop_op == "kept-both";
    auto kept = b.ep->post_recv_kept(inbox);
    if (!kept) die(std::string("post_recv_kept: ") + regpool::to_string(kept.status()));
    regpool::Token sent{};
    for (std::uint64_t i = 0; i < o.loop_iters; ++i) {
      if (!kept_send) {
        wait_ok(*a.ep, a.ep->send(peer, local));
      } else if (!sent) {
        auto t = a.ep->send_kept(peer, local);
        if (!t) die(std::string("send_kept: ") + regpool::to_string(t.status()));
        sent = *t;
        wait_ok(*a.ep, sent);
      } else if (const Status st = a.ep->repost(sent); st != Status::ok) {
        die(std::string("repost: ") + regpool::to_string(st));
      } else {
        wait_ok(*a.ep, sent);
      }
      wait_ok(*b.ep, *kept);
      if (const Status st = b.ep->repost(*kept); st != Status::ok) die(std::string("repost: ") + regpool::to_string(st));
      if (i % kLoopTargetEvery == 0) (void)b.ep->progress();
    }
    return 0;
  }
  if (o.loop_op == "put-kept" || o.loop_op == "get-kept") {
    // One kept put or get (put_kept, get_kept) reposted for each operation
    // instead of a new one: what put()'s and get()'s checks, slot claim and
    // buffer reference cost (their direct reference is the put or get row).
    const bool is_put = op == 'p';
    auto t = is_put ? a.ep->put_kept(local, peer, ref, 0) : a.ep->get_kept(peer, ref, 0, local);
    if (!t) die(std::string(o.loop_op) + ": " + regpool::to_string(t.status()));
    const regpool::Token kept = *t;
    for (std::uint64_t i = 0; i < o.loop_iters; ++i) {
      if (i > 0) {
        if (const Status st = a.ep->repost(kept); st != Status::ok) die(std::string("repost: ") + regpool::to_string(st));
      }
      wait_ok(*a.ep, kept);
      if (i % kLoopTargetEvery == 0) (void)b.ep->progress();
    }
    (void)a.ep->end_kept(kept);
    return 0;
  }
  for (std::uint64_t i = 0; i < o.loop_iters; ++i) {
    if (op == 'p') {
      wait_ok(*a.ep, a.ep->put(local, peer, ref, 0));
    } else if (op == 'g') {
      wait_ok(*a.ep, a.ep->get(peer, ref, 0, local));
    } else {
      auto in = b.ep->post_recv(inbox);
      wait_ok(*a.ep, a.ep->send(peer, local));
      wait_ok(*b.ep, std::move(in));
    }
    if (i % kLoopTargetEvery == 0) (void)b.ep->progress();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench-rma [--provider shm|tcp] [--json] [--reps N] [--smoke] [--shm-direct-rma on|off]\n"
          "                 [--fresh] [--own-buffers] [--shm-ring-copy-max B] [--shm-ring-adaptive on|off]\n"
          "                 [--no-fork [--port P] | --target HOST:PORT]\n"
          "       bench-rma [--provider shm|tcp] --loop put|get|put-kept|get-kept|send|send-kept|kept-both|tagged\n"
          "                 [--impl regpool|direct]\n"
          "                 [--iters N] [--size B]\n"
          "  --fresh: bandwidth rows write each put's or send's bytes before its post,\n"
          "  one slot per operation in flight, as a sender of new data does (default:\n"
          "  the same unchanged bytes every time, which a shm receiver may hold in\n"
          "  its cache already).\n"
          "  --reps N: repetitions (default 10); the paired ratio is the median over\n"
          "  pairs of them, one with each stack first (an odd last one is left out).\n"
          "  --own-buffers: the direct path moves bytes of its own (default: the\n"
          "  regpool side's, registered with both, so a ratio compares the two\n"
          "  software paths on the same memory).\n"
          "  --shm-ring-copy-max B: the longest shm send regpool copies through its\n"
          "  ring (default and at most 66560); longer ones the receiver reads from\n"
          "  the sender's buffer (FabricEndpointOptions::shm_ring_copy_max).\n"
          "  --shm-ring-adaptive on|off: shm sends over 16 KiB up to that limit take\n"
          "  the path each pair measured cheaper (on, the default) or are always\n"
          "  copied (FabricEndpointOptions::shm_ring_adaptive).\n"
          "  --shm-direct-rma on|off: regpool's shm puts and gets by its own\n"
          "  cross-memory copy (on, the default) or through fi_write/fi_read.\n"
          "  By default the target side is forked. --no-fork waits on port P (0: any,\n"
          "  printed on stderr) for a target started as 'bench-rma --target HOST:PORT'\n"
          "  with the same --provider/--reps/--smoke/--own-buffers.\n"
          "  --loop runs N operations of one stack, both sides in this process, untimed\n"
          "  (for instruction counts: bench/rma-insns).\n");
      return 0;
    }
    if (a == "--provider" && i + 1 < argc) {
      o.provider = argv[++i];
    } else if (a == "--fresh") {
      o.fresh = true;
    } else if (a == "--own-buffers") {
      o.own_buffers = true;
    } else if (a == "--shm-ring-copy-max" && i + 1 < argc) {
      char* end = nullptr;
      o.ring_copy_max = std::strtoull(argv[++i], &end, 0);
      if (*end != '\0' || o.ring_copy_max > regpool::FabricEndpointOptions{}.shm_ring_copy_max) {
        std::fprintf(stderr, "bench-rma: --shm-ring-copy-max takes a byte count up to 66560, not '%s'\n", argv[i]);
        return 2;
      }
    } else if ((a == "--shm-ring-adaptive" || a == "--shm-direct-rma") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v != "on" && v != "off") {
        std::fprintf(stderr, "bench-rma: %s takes on or off, not '%s'\n", a.c_str(), v.c_str());
        return 2;
      }
      (a == "--shm-direct-rma" ? o.direct_rma : o.ring_adaptive) = v == "on";
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--smoke") {
      o.smoke = true;
      o.reps = 1;
    } else if (a == "--no-fork") {
      o.no_fork = true;
    } else if (a == "--port" && i + 1 < argc) {
      const long p = std::strtol(argv[++i], nullptr, 10);
      if (p < 0 || p > 65535) {
        std::fprintf(stderr, "bench-rma: --port needs 0..65535\n");
        return 2;
      }
      o.port = static_cast<std::uint16_t>(p);
    } else if (a == "--target" && i + 1 < argc) {
      const std::string t = argv[++i];
      const auto colon = t.rfind(':');
      const long p = colon == std::string::npos ? 0 : std::strtol(t.c_str() + colon + 1, nullptr, 10);
      if (colon == std::string::npos || colon == 0 || p <= 0 || p > 65535) {
        std::fprintf(stderr, "bench-rma: --target needs HOST:PORT, got '%s'\n", t.c_str());
        return 2;
      }
      o.target_host = t.substr(0, colon);
      o.port = static_cast<std::uint16_t>(p);
    } else if (a == "--loop" && i + 1 < argc) {
      o.loop_op = argv[++i];
      if (o.loop_op != "put" && o.loop_op != "get" && o.loop_op != "put-kept" && o.loop_op != "get-kept" &&
          o.loop_op != "send" && o.loop_op != "send-kept" && o.loop_op != "kept-both" &&
          o.loop_op != "tagged") {
        std::fprintf(stderr, "bench-rma: --loop needs put, get, put-kept, get-kept, send, send-kept, kept-both or tagged\n");
        return 2;
      }
    } else if (a == "--impl" && i + 1 < argc) {
      o.loop_impl = argv[++i];
      if (o.loop_impl != "regpool" && o.loop_impl != "direct") {
        std::fprintf(stderr, "bench-rma: --impl needs regpool or direct\n");
        return 2;
      }
    } else if ((a == "--iters" || a == "--size") && i + 1 < argc) {
      const std::uint64_t v = std::strtoull(argv[++i], nullptr, 0);
      if (v == 0 || (a == "--size" && v > kMaxSize)) {
        std::fprintf(stderr, "bench-rma: %s needs 1..%llu\n", a.c_str(),
                     static_cast<unsigned long long>(a == "--size" ? kMaxSize : ~0ull));
        return 2;
      }
      (a == "--iters" ? o.loop_iters : o.loop_size) = v;
    } else if (a == "--reps" && i + 1 < argc) {
      o.reps = std::atoi(argv[++i]);
      if (o.reps < 1) {
        std::fprintf(stderr, "bench-rma: --reps needs a positive integer\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "bench-rma: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (o.no_fork && !o.target_host.empty()) {
    std::fprintf(stderr, "bench-rma: --no-fork (initiator) and --target (target) exclude each other\n");
    return 2;
  }
  if (o.loop_op == "tagged" && o.loop_impl == "direct") {
    std::fprintf(stderr, "bench-rma: --loop tagged is the Messenger's round (regpool only); compare it with --loop send\n");
    return 2;
  }
  ::setenv("FI_TCP_IFACE", "lo", 0);
  if (!o.loop_op.empty()) {
    try {
      return run_loop(o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench-rma loop: %s\n", e.what());
      return 1;
    }
  }
  if (!o.target_host.empty()) {
    try {
      return run_target(o, o.target_host, o.port);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench-rma target: %s\n", e.what());
      return 1;
    }
  }
  try {
    regpool::TcpBootstrapConfig bc;
    bc.rank = 0;
    bc.size = 2;
    bc.port = o.port;
    if (o.no_fork) bc.connect_timeout = std::chrono::milliseconds(120000);
    regpool::TcpBootstrap boot(bc);
    const auto port = boot.port();
    if (o.no_fork) {
      std::fprintf(stderr, "bench-rma: waiting for a target on port %u (bench-rma --target 127.0.0.1:%u)\n",
                   static_cast<unsigned>(port), static_cast<unsigned>(port));
      std::fflush(nullptr);
      return run_initiator(o, boot);
    }
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(o.smoke ? 90 : 300);  // a hung initiator must not leave the target behind
      int rc = 1;
      try {
        rc = run_target(o, "127.0.0.1", port);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench-rma target: %s\n", e.what());
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    int rc = run_initiator(o, boot);
    int st = 0;
    ::waitpid(pid, &st, 0);
    return rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench-rma: %s\n", e.what());
    return 1;
  }
}
