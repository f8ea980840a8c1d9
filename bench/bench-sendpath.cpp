// bench-sendpath: the CPU cost of one small two-sided message through
// regpool's Endpoint against the same message through libfabric directly,
// and the cost of one round of a spin-wait (Endpoint::progress() against an
// empty fi_cq_read), on one thread, in thread CPU time.
//
//   bench-sendpath [--provider shm|tcp] [--iters N] [--reps R] [--size BYTES] [--contend N] [--json]
//
// Both stacks run two RDM endpoints in this one process: post a receive on
// B, send from A, wait for the send's completion on A and the receive's on
// B. With no second process to wait for, the time is the software path
// itself: what each side of a ping-pong spends per message apart from the
// other side. CLOCK_THREAD_CPUTIME_ID counts only this thread's running
// time, so the figures hold on a loaded machine where wall-clock ping-pongs
// (bench/compare-peers) are noise. Minimum over --reps repetitions; regpool
// and direct alternate within each repetition.
//
// Output: regpool ns/message, direct ns/message, the difference (what
// regpool adds per message), and the same for one spin-wait round. Then
// the lock hand-off: median and 99th percentile wall time of one stats()
// call (it takes the endpoint's mutex) while a second thread spins in
// progress() on the same endpoint (--contend N calls, 0 = skip).
// Exit: 0; 1 a failure; 2 bad arguments; 77 the provider cannot be opened.

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "regpool/endpoint.hpp"
#include "regpool/fabric_domain.hpp"
#include "regpool/fabric_endpoint.hpp"
#include "regpool/pool.hpp"
#include "regpool/slice.hpp"

namespace {

using namespace std::chrono_literals;

double cpu_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "bench-sendpath: %s\n", what.c_str());
  std::exit(1);
}

// ------------------------------------------------------------ direct

class Direct {
 public:
  Direct(const std::string& provider, std::size_t size) : buf_(2 * size + 64) {
    fi_info* hints = fi_allocinfo();
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = ::strdup(provider == "tcp" ? "tcp;ofi_rxm" : provider.c_str());
    const char* node = provider == "tcp" ? "127.0.0.1" : nullptr;
    const int rc = fi_getinfo(FI_VERSION(1, 17), node, nullptr, node ? FI_SOURCE : 0, hints, &info_);
    fi_freeinfo(hints);
    if (rc != 0) {
      std::fprintf(stderr, "bench-sendpath: fi_getinfo(%s): %s\n", provider.c_str(), fi_strerror(-rc));
      std::exit(77);
    }
    check(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
    check(fi_domain(fabric_, info_, &domain_, nullptr), "fi_domain");
    if (info_->domain_attr->mr_mode & FI_MR_LOCAL) {
      check(fi_mr_reg(domain_, buf_.data(), buf_.size(), FI_SEND | FI_RECV, 0, 0, 0, &mr_, nullptr), "fi_mr_reg");
      desc_ = fi_mr_desc(mr_);
    }
    for (Side& s : side_) {
      fi_cq_attr ca{};
      ca.format = FI_CQ_FORMAT_DATA;
      ca.size = 64;
      fi_av_attr aa{};
      aa.type = FI_AV_TABLE;
      check(fi_cq_open(domain_, &ca, &s.cq, nullptr), "fi_cq_open");
      check(fi_av_open(domain_, &aa, &s.av, nullptr), "fi_av_open");
      check(fi_endpoint(domain_, info_, &s.ep, nullptr), "fi_endpoint");
      check(fi_ep_bind(s.ep, &s.cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind cq");
      check(fi_ep_bind(s.ep, &s.av->fid, 0), "fi_ep_bind av");
      check(fi_enable(s.ep), "fi_enable");
      s.name_len = sizeof s.name;
      check(fi_getname(&s.ep->fid, s.name, &s.name_len), "fi_getname");
    }
    for (int i = 0; i < 2; ++i) {
      if (fi_av_insert(side_[i].av, side_[1 - i].name, 1, &side_[i].peer, 0, nullptr) != 1) fail("fi_av_insert");
    }
    size_ = size;
  }
  ~Direct() {
    for (Side& s : side_) {
      if (s.ep) fi_close(&s.ep->fid);
      if (s.av) fi_close(&s.av->fid);
      if (s.cq) fi_close(&s.cq->fid);
    }
    if (mr_) fi_close(&mr_->fid);
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    if (info_) fi_freeinfo(info_);
  }
  Direct(const Direct&) = delete;
  Direct& operator=(const Direct&) = delete;

  // One message A -> B: the same calls regpool's backend makes.
  void message() {
    Side& a = side_[0];
    Side& b = side_[1];
    while (fi_recv(b.ep, buf_.data() + size_, size_, desc_, FI_ADDR_UNSPEC, &b.ctx) == -FI_EAGAIN) drain(b);
    while (fi_send(a.ep, buf_.data(), size_, desc_, a.peer, &a.ctx) == -FI_EAGAIN) {
      drain(a);
      drain(b);
    }
    // The receiver progresses too (tcp;ofi_rxm moves bytes only then).
    bool sent = false, got = false;
    while (!sent || !got) {
      if (!sent) sent = reap(a);
      if (!got) got = reap(b);
    }
  }
  void empty_poll() {
    fi_cq_data_entry e{};
    (void)fi_cq_read(side_[1].cq, &e, 1);
  }

 private:
  struct Side {
    fid_ep* ep = nullptr;
    fid_cq* cq = nullptr;
    fid_av* av = nullptr;
    fi_addr_t peer = 0;
    fi_context2 ctx{};
    char name[256]{};
    std::size_t name_len = 0;
  };
  static void check(int rc, const char* what) {
    if (rc != 0) fail(std::string(what) + ": " + fi_strerror(-rc));
  }
  static void drain(Side& s) {
    fi_cq_data_entry e{};
    (void)fi_cq_read(s.cq, &e, 0);
  }
  static bool reap(Side& s) {
    fi_cq_data_entry e{};
    const ssize_t r = fi_cq_read(s.cq, &e, 1);
    if (r == 1) return true;
    if (r != -FI_EAGAIN) fail("fi_cq_read: " + std::to_string(r));
    return false;
  }
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_mr* mr_ = nullptr;
  void* desc_ = nullptr;
  std::vector<char> buf_;
  std::size_t size_ = 0;
  Side side_[2];
};

// ------------------------------------------------------------ regpool

class Regpool {
 public:
  Regpool(const std::string& provider, std::size_t size) {
    regpool::FabricConfig fc;
    fc.provider = provider;
    if (provider == "tcp") fc.node = "127.0.0.1";
    domain_ = regpool::FabricDomain::open(fc);
    regpool::PoolConfig pc;
    pc.name = "bench-sendpath";
    pc.arena_size = std::size_t{8} << 20;
    pool_ = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain_}, pc);
    a_ = regpool::FabricEndpoint::open(domain_);
    b_ = regpool::FabricEndpoint::open(domain_);
    peer_ = a_->insert_peer(b_->name());
    (void)b_->insert_peer(a_->name());
    x_ = alloc(size);
    y_ = alloc(size);
    sx_ = *regpool::Slice::data(x_);
    sy_ = *regpool::Slice::data(y_);
    // The first message to a peer needs the target's progress (connection
    // set-up on tcp;ofi_rxm, the first op on shm): a helper thread gives it.
    std::atomic<bool> stop{false};
    std::thread helper([&] {
      while (!stop.load()) (void)b_->progress();
    });
    auto s = a_->send(peer_, sx_);
    const bool ok = s && a_->wait(*s, 10000ms).status == regpool::Status::ok;
    stop = true;
    helper.join();
    if (!ok) fail("regpool: first send failed");
    auto t = b_->post_recv(sy_);
    if (!t || b_->wait(*t, 10000ms).status != regpool::Status::ok) fail("regpool: first receive failed");
  }
  ~Regpool() {
    a_.reset();
    b_.reset();
  }
  Regpool(const Regpool&) = delete;
  Regpool& operator=(const Regpool&) = delete;

  void message() {
    auto t = b_->post_recv(sy_);
    auto s = a_->send(peer_, sx_);
    if (!t || !s) fail("regpool: post refused");
    if (a_->wait(*s, 10000ms).status != regpool::Status::ok) fail("regpool: send failed");
    if (b_->wait(*t, 10000ms).status != regpool::Status::ok) fail("regpool: receive failed");
  }
  void empty_poll() { (void)b_->progress(); }
  // A receive in flight, as in a spin-wait (the endpoint then also checks
  // deadlines); sent for and completed by finish_pending().
  void start_pending() {
    auto t = b_->post_recv(sy_);
    if (!t) fail("regpool: post_recv refused");
    pending_ = *t;
  }
  // Lock hand-off: wall time of one stats() call on B (it takes B's mutex)
  // while another thread spins in B->progress() with a receive in flight,
  // as a progress thread with progress_idle_sleep 0 does. A spinner that
  // retakes the mutex at once shuts the caller out for as long as the
  // scheduler lets it. `lat` receives the n latencies in ns.
  void contended_stats(std::uint64_t n, std::vector<double>& lat) {
    start_pending();
    std::atomic<bool> stop{false};
    std::atomic<bool> spinning{false};
    std::thread spinner([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        (void)b_->progress();
        spinning.store(true, std::memory_order_relaxed);
      }
    });
    while (!spinning.load()) std::this_thread::yield();
    lat.clear();
    for (std::uint64_t i = 0; i < n; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      (void)b_->stats();
      lat.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
      // Let the spinner run alone between calls, as between a user's calls.
      std::this_thread::sleep_for(50us);
    }
    stop = true;
    spinner.join();
    finish_pending();
  }
  void finish_pending() {
    auto s = a_->send(peer_, sx_);
    if (!s || a_->wait(*s, 10000ms).status != regpool::Status::ok) fail("regpool: send failed");
    if (b_->wait(pending_, 10000ms).status != regpool::Status::ok) fail("regpool: receive failed");
  }

 private:
  regpool::Ldo alloc(std::size_t n) {
    auto r = pool_->allocate(n);
    if (!r) fail("pool allocate");
    return std::move(*r);
  }
  std::shared_ptr<regpool::FabricDomain> domain_;
  std::unique_ptr<regpool::Pool> pool_;
  std::unique_ptr<regpool::FabricEndpoint> a_, b_;
  regpool::PeerId peer_{};
  regpool::Ldo x_, y_;
  regpool::Slice sx_, sy_;
  regpool::Token pending_{};
};

template <class F>
double per_op(std::uint64_t n, F f) {
  const double t0 = cpu_ns();
  for (std::uint64_t i = 0; i < n; ++i) f();
  return (cpu_ns() - t0) / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  std::string provider = "shm";
  std::uint64_t iters = 50000;
  int reps = 5;
  std::size_t size = 8;
  bool json = false;
  std::uint64_t contend = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench-sendpath: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--provider") {
      provider = value();
    } else if (a == "--iters") {
      iters = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--reps") {
      reps = std::atoi(value().c_str());
    } else if (a == "--size") {
      size = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--contend") {
      contend = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench-sendpath [--provider shm|tcp] [--iters N] [--reps R] [--size BYTES] [--contend N] "
                   "[--json]\n");
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  if ((provider != "shm" && provider != "tcp") || iters == 0 || reps < 1 || size == 0 || size > 4096) {
    std::fprintf(stderr, "bench-sendpath: --provider shm|tcp, --iters >= 1, --reps >= 1, --size 1..4096\n");
    return 2;
  }
  if (provider == "tcp") ::setenv("FI_TCP_IFACE", "lo", 0);
  Direct direct(provider, size);
  Regpool rp(provider, size);
  const std::uint64_t warm = std::min<std::uint64_t>(iters, 1000);
  for (std::uint64_t i = 0; i < warm; ++i) {
    direct.message();
    rp.message();
  }
  double rp_msg = 1e300, d_msg = 1e300, rp_poll = 1e300, d_poll = 1e300;
  for (int r = 0; r < reps; ++r) {
    rp_msg = std::min(rp_msg, per_op(iters, [&] { rp.message(); }));
    d_msg = std::min(d_msg, per_op(iters, [&] { direct.message(); }));
    rp.start_pending();
    rp_poll = std::min(rp_poll, per_op(iters, [&] { rp.empty_poll(); }));
    rp.finish_pending();
    d_poll = std::min(d_poll, per_op(iters, [&] { direct.empty_poll(); }));
  }
  double hand_med = 0, hand_p99 = 0;
  if (contend > 0) {
    std::vector<double> lat;
    rp.contended_stats(contend, lat);
    std::sort(lat.begin(), lat.end());
    hand_med = lat[lat.size() / 2];
    hand_p99 = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
  }
  if (json) {
    std::printf(
        "{\"tool\":\"bench-sendpath\",\"provider\":\"%s\",\"size\":%zu,\"iters\":%llu,\"reps\":%d,"
        "\"units\":\"ns of thread CPU time, minimum over reps\","
        "\"message\":{\"regpool\":%.1f,\"direct\":%.1f,\"added\":%.1f},"
        "\"poll_round\":{\"regpool\":%.1f,\"direct\":%.1f,\"added\":%.1f},"
        "\"contended_lock_ns\":{\"calls\":%llu,\"median\":%.1f,\"p99\":%.1f}}\n",
        provider.c_str(), size, static_cast<unsigned long long>(iters), reps, rp_msg, d_msg, rp_msg - d_msg, rp_poll,
        d_poll, rp_poll - d_poll, static_cast<unsigned long long>(contend), hand_med, hand_p99);
  } else {
    std::printf("bench-sendpath: provider %s, %zu-byte messages, %llu per repetition, minimum of %d (thread CPU time)\n",
                provider.c_str(), size, static_cast<unsigned long long>(iters), reps);
    std::printf("  message (post_recv, send, both completions): regpool %.0f ns, direct %.0f ns, added %.0f ns\n",
                rp_msg, d_msg, rp_msg - d_msg);
    std::printf("  spin-wait round (progress / empty fi_cq_read): regpool %.0f ns, direct %.0f ns, added %.0f ns\n",
                rp_poll, d_poll, rp_poll - d_poll);
    if (contend > 0) {
      std::printf("  stats() while another thread spins in progress() (wall time, %llu calls): median %.0f ns, p99 %.0f ns\n",
                  static_cast<unsigned long long>(contend), hand_med, hand_p99);
    }
  }
  if (!(rp_msg > 0 && d_msg > 0 && rp_poll > 0 && d_poll > 0)) fail("a figure is not positive");
  return 0;
}
