// bench-sendpath: the CPU cost of one small two-sided message through
// regpool's Endpoint against the same message through libfabric directly,
// and the cost of one round of a spin-wait (Endpoint::progress() against an
// empty fi_cq_read), on one thread, in thread CPU time.
//
//   bench-sendpath [--provider shm|tcp|net] [--iters N] [--reps R] [--sizes LIST] [--tagged] [--contend N] [--json]
//
// --tagged adds the tagged rows: the same message through libfabric's
// native matching (fi_trecv/fi_tsend, tag 1, on an endpoint opened with
// FI_MSG|FI_TAGGED, which then also carries the direct untagged row) and
// through regpool::Messenger (tagged send/recv with regpool's own matching
// over the endpoint's untagged send/post_recv, eager at every size: its
// threshold is set to the largest size). Those four rows answer issue
// "Messaging" item 5: what native matching costs over untagged
// (direct tagged - direct untagged) against what regpool's matching costs
// (Messenger - regpool send).
//
// Both stacks run two RDM endpoints in this one process: post a receive on
// B, send from A, wait for the send's completion on A and the receive's on
// B. With no second process to wait for, the time is the software path
// itself: what each side of a ping-pong spends per message apart from the
// other side. CLOCK_THREAD_CPUTIME_ID counts only this thread's running
// time, so the figures hold on a loaded machine where wall-clock ping-pongs
// (bench/compare-peers) are noise. Median and minimum over --reps
// repetitions; every row runs once per repetition, rows interleaved.
//
// Output per size: regpool ns/message, direct ns/message, the difference
// (what regpool adds per message), the same for one spin-wait round, and
// with --tagged the direct tagged and Messenger rows.
// Then the lock hand-off: median and 99th percentile wall time of one
// stats() call (it takes the endpoint's mutex) while a second thread spins
// in progress() on the same endpoint (--contend N calls, 0 = skip).
// Exit: 0; 1 a failure; 2 bad arguments; 77 the provider cannot be opened.

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
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
#include "regpool/messaging.hpp"
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
  Direct(const std::string& provider, std::size_t size, bool tagged) : buf_(2 * size + 64) {
    fi_info* hints = fi_allocinfo();
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = tagged ? FI_MSG | FI_TAGGED : FI_MSG;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    // Same provider as regpool's FabricConfig: its "tcp" is libfabric's net.
    hints->fabric_attr->prov_name = ::strdup(provider == "tcp" ? "net" : provider.c_str());
    const char* node = provider != "shm" ? "127.0.0.1" : nullptr;
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
      ca.format = tagged ? FI_CQ_FORMAT_TAGGED : FI_CQ_FORMAT_DATA;
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

  // One message of n bytes A -> B: the same calls regpool's backend makes
  // (tagged: the same with libfabric's matching, tag 1, nothing ignored).
  void message(std::size_t n, bool tagged = false) {
    Side& a = side_[0];
    Side& b = side_[1];
    char* rx = buf_.data() + size_;
    while ((tagged ? fi_trecv(b.ep, rx, n, desc_, FI_ADDR_UNSPEC, 1, 0, &b.ctx)
                   : fi_recv(b.ep, rx, n, desc_, FI_ADDR_UNSPEC, &b.ctx)) == -FI_EAGAIN) {
      drain(b);
    }
    while ((tagged ? fi_tsend(a.ep, buf_.data(), n, desc_, a.peer, 1, &a.ctx)
                   : fi_send(a.ep, buf_.data(), n, desc_, a.peer, &a.ctx)) == -FI_EAGAIN) {
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
    fi_cq_tagged_entry e{};
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
    fi_cq_tagged_entry e{};
    (void)fi_cq_read(s.cq, &e, 0);
  }
  static bool reap(Side& s) {
    fi_cq_tagged_entry e{};
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
  Regpool(const std::string& provider, std::size_t size, bool tagged) {
    regpool::FabricConfig fc;
    fc.provider = provider;
    if (provider != "shm") fc.node = "127.0.0.1";
    domain_ = regpool::FabricDomain::open(fc);
    regpool::PoolConfig pc;
    pc.name = "bench-sendpath";
    // Two Messengers keep kBounces receives of 64 + size bytes each.
    pc.arena_size = std::max<std::size_t>(std::size_t{8} << 20, 4 * kBounces * (size + 4096));
    pool_ = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain_}, pc);
    a_ = regpool::FabricEndpoint::open(domain_);
    b_ = regpool::FabricEndpoint::open(domain_);
    peer_ = a_->insert_peer(b_->name());
    (void)b_->insert_peer(a_->name());
    x_ = alloc(size);
    y_ = alloc(size);
    sx_ = *regpool::Slice::data(x_);
    sy_ = *regpool::Slice::data(y_);
    first_message(*a_, *b_, peer_);
    auto t = b_->post_recv(sy_);
    if (!t || b_->wait(*t, 10000ms).status != regpool::Status::ok) fail("regpool: first receive failed");
    if (!tagged) return;
    // A Messenger owns its endpoint's receive side for the endpoint's
    // lifetime, so the tagged row has its own pair of endpoints.
    c_ = regpool::FabricEndpoint::open(domain_);
    d_ = regpool::FabricEndpoint::open(domain_);
    mpeer_ = c_->insert_peer(d_->name());
    (void)d_->insert_peer(c_->name());
    regpool::MessengerConfig mc;
    mc.eager_threshold = std::max<std::uint64_t>(size, 64);  // eager at every size measured
    mc.receive_buffers = kBounces;
    mc.max_operations = 64;
    mc.max_peers = 4;
    mc.max_unexpected = 64;
    mc_ = std::make_unique<regpool::Messenger>(*c_, *pool_, mc);
    md_ = std::make_unique<regpool::Messenger>(*d_, *pool_, mc);
    // The first message (connection set-up) with the target progressing.
    std::atomic<bool> stop{false};
    std::thread helper([&] {
      while (!stop.load()) (void)md_->progress();
    });
    auto s = mc_->send(mpeer_, 1, *sx_.select(0, 1));
    const bool ok = s && mc_->wait(*s, 10000ms).status == regpool::Status::ok;
    stop = true;
    helper.join();
    if (!ok) fail("messenger: first send failed");
    auto r = md_->recv(regpool::kAnyPeer, 1, 0, sy_);
    if (!r || md_->wait(*r, 10000ms).status != regpool::Status::ok) fail("messenger: first receive failed");
  }
  ~Regpool() {
    mc_.reset();
    md_.reset();
    a_.reset();
    b_.reset();
    c_.reset();
    d_.reset();
  }
  Regpool(const Regpool&) = delete;
  Regpool& operator=(const Regpool&) = delete;

  // The message size of message() and tagged_message() (slices cut once,
  // not per message).
  void set_size(std::size_t n) {
    auto out = sx_.select(0, n);
    auto in = sy_.select(0, n);
    if (!out || !in) fail("regpool: slice");
    out_ = std::move(*out);
    in_ = std::move(*in);
  }
  // One message A -> B, both completions by callback, both endpoints
  // polled in turn as in Direct::message (a large message on shm needs the
  // receiver's progress before the send completes; rendezvous on tcp needs
  // the sender's before the receive does).
  void message() {
    int done = 0;
    bool ok = true;
    auto cb = [&done, &ok](const regpool::Completion& c) {
      ok = ok && c.status == regpool::Status::ok;
      ++done;
    };
    auto t = b_->post_recv(in_, cb);
    auto s = a_->send(peer_, out_, cb);
    if (!t || !s) fail("regpool: post refused");
    while (done < 2) {
      (void)a_->progress();
      (void)b_->progress();
    }
    if (!ok) fail("regpool: message failed");
  }
  // The same message through the Messenger: receive posted first (never
  // unexpected), as the untagged row.
  void tagged_message() {
    int done = 0;
    bool ok = true;
    const std::uint64_t want = in_.length();
    auto cb = [&done, &ok, want](regpool::MessageCompletion& c) {
      ok = ok && c.status == regpool::Status::ok && (c.op != regpool::MessageOp::recv || c.received == want);
      ++done;
    };
    auto r = md_->recv(regpool::kAnyPeer, 1, 0, in_, cb);
    auto s = mc_->send(mpeer_, 1, out_, cb);
    if (!r || !s) fail("messenger: post refused");
    while (done < 2) {
      (void)mc_->progress();
      (void)md_->progress();
    }
    if (!ok) fail("messenger: message failed");
  }
  void empty_poll() { (void)b_->progress(); }
  // A receive in flight, as in a spin-wait (the endpoint then also checks
  // deadlines); sent for and completed by finish_pending().
  void start_pending() {
    pending_done_ = 0;
    auto t = b_->post_recv(in_, [this](const regpool::Completion& c) {
      if (c.status != regpool::Status::ok) fail("regpool: receive failed");
      ++pending_done_;
    });
    if (!t) fail("regpool: post_recv refused");
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
    auto s = a_->send(peer_, out_, [this](const regpool::Completion& c) {
      if (c.status != regpool::Status::ok) fail("regpool: send failed");
      ++pending_done_;
    });
    if (!s) fail("regpool: send refused");
    while (pending_done_ < 2) {
      (void)a_->progress();
      (void)b_->progress();
    }
  }

 private:
  static constexpr std::size_t kBounces = 16;
  // The first message to a peer needs the target's progress (connection
  // set-up on tcp;ofi_rxm, the first op on shm): a helper thread gives it.
  void first_message(regpool::FabricEndpoint& from, regpool::FabricEndpoint& to, regpool::PeerId peer) {
    std::atomic<bool> stop{false};
    std::thread helper([&] {
      while (!stop.load()) (void)to.progress();
    });
    // One byte: a large send (shm's CMA protocol) completes only once the
    // target has a receive posted.
    auto s = from.send(peer, *sx_.select(0, 1));
    const bool ok = s && from.wait(*s, 10000ms).status == regpool::Status::ok;
    stop = true;
    helper.join();
    if (!ok) fail("regpool: first send failed");
  }
  regpool::Ldo alloc(std::size_t n) {
    auto r = pool_->allocate(n);
    if (!r) fail("pool allocate");
    return std::move(*r);
  }
  std::shared_ptr<regpool::FabricDomain> domain_;
  std::unique_ptr<regpool::Pool> pool_;
  std::unique_ptr<regpool::FabricEndpoint> a_, b_, c_, d_;
  std::unique_ptr<regpool::Messenger> mc_, md_;
  regpool::PeerId peer_{}, mpeer_{};
  regpool::Ldo x_, y_;
  regpool::Slice sx_, sy_, out_, in_;
  int pending_done_ = 0;
};

template <class F>
double per_op(std::uint64_t n, F f) {
  const double t0 = cpu_ns();
  for (std::uint64_t i = 0; i < n; ++i) f();
  return (cpu_ns() - t0) / static_cast<double>(n);
}

struct Stat {
  std::vector<double> samples;
  void add(double v) { samples.push_back(v); }
  double median() const {
    std::vector<double> v = samples;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
  double min() const { return *std::min_element(samples.begin(), samples.end()); }
};

std::vector<std::size_t> parse_sizes(const std::string& list) {
  std::vector<std::size_t> out;
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const std::size_t comma = std::min(list.find(',', pos), list.size());
    const std::string item = list.substr(pos, comma - pos);
    char* end = nullptr;
    unsigned long long v = std::strtoull(item.c_str(), &end, 10);
    if (end && (*end == 'K' || *end == 'k')) v <<= 10, ++end;
    if (item.empty() || !end || *end != '\0') return {};
    out.push_back(static_cast<std::size_t>(v));
    pos = comma + 1;
  }
  return out;
}

std::string json_row(const char* name, const Stat& s) {
  char b[128];
  std::snprintf(b, sizeof b, "\"%s\":{\"median\":%.1f,\"min\":%.1f}", name, s.median(), s.min());
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::string provider = "shm";
  std::uint64_t iters = 50000;
  int reps = 5;
  std::vector<std::size_t> sizes{8};
  bool json = false, tagged = false;
  std::uint64_t contend = 2000;
  const char* usage =
      "usage: bench-sendpath [--provider shm|tcp|net] [--iters N] [--reps R] [--sizes LIST] [--tagged] [--contend N] [--json]\n";
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
    } else if (a == "--size" || a == "--sizes") {
      sizes = parse_sizes(value());
    } else if (a == "--tagged") {
      tagged = true;
    } else if (a == "--contend") {
      contend = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--json") {
      json = true;
    } else {
      std::fputs(usage, stderr);
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  const std::size_t max_size = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  if ((provider != "shm" && provider != "tcp" && provider != "net") || iters == 0 || reps < 1 || sizes.empty() ||
      *std::min_element(sizes.begin(), sizes.end()) == 0 || max_size > (std::size_t{1} << 20)) {
    std::fprintf(stderr, "bench-sendpath: --provider shm|tcp|net, --iters >= 1, --reps >= 1, --sizes 1..1M (K suffix)\n");
    return 2;
  }
  if (provider != "shm") ::setenv("FI_TCP_IFACE", "lo", 0);
  Direct direct(provider, max_size, tagged);
  Regpool rp(provider, max_size, tagged);
  if (json) {
    std::printf("{\"tool\":\"bench-sendpath\",\"provider\":\"%s\",\"iters\":%llu,\"reps\":%d,\"tagged\":%s,"
                "\"units\":\"ns of thread CPU time per message, median and minimum over reps\",\"sizes\":[",
                provider.c_str(), static_cast<unsigned long long>(iters), reps, tagged ? "true" : "false");
  } else {
    std::printf("bench-sendpath: provider %s, %llu messages per repetition, %d repetitions (thread CPU time, "
                "median / min)\n",
                provider.c_str(), static_cast<unsigned long long>(iters), reps);
  }
  bool first = true;
  for (const std::size_t size : sizes) {
    // Large messages cost microseconds: fewer of them per repetition.
    const std::uint64_t n = std::max<std::uint64_t>(1, size > 4096 ? iters / 8 : iters);
    const std::uint64_t warm = std::min<std::uint64_t>(n, 1000);
    rp.set_size(size);
    for (std::uint64_t i = 0; i < warm; ++i) {
      direct.message(size);
      rp.message();
      if (tagged) {
        direct.message(size, true);
        rp.tagged_message();
      }
    }
    Stat rp_msg, d_msg, rp_poll, d_poll, d_tag, rp_tag;
    for (int r = 0; r < reps; ++r) {
      rp_msg.add(per_op(n, [&] { rp.message(); }));
      d_msg.add(per_op(n, [&] { direct.message(size); }));
      if (tagged) {
        d_tag.add(per_op(n, [&] { direct.message(size, true); }));
        rp_tag.add(per_op(n, [&] { rp.tagged_message(); }));
      }
      rp.start_pending();
      rp_poll.add(per_op(n, [&] { rp.empty_poll(); }));
      rp.finish_pending();
      d_poll.add(per_op(n, [&] { direct.empty_poll(); }));
    }
    for (const Stat* st : {&rp_msg, &d_msg, &rp_poll, &d_poll}) {
      if (!(st->min() > 0)) fail("a figure is not positive");
    }
    if (json) {
      std::string row = std::string(first ? "" : ",") + "{\"size\":" + std::to_string(size) +
                        ",\"messages_per_rep\":" + std::to_string(n) + ",\"message\":{" +
                        json_row("regpool", rp_msg) + "," + json_row("direct", d_msg) + "}";
      if (tagged) {
        row += ",\"tagged\":{" + json_row("messenger", rp_tag) + "," + json_row("direct", d_tag) + "}";
      }
      row += ",\"poll_round\":{" + json_row("regpool", rp_poll) + "," + json_row("direct", d_poll) + "}}";
      std::fputs(row.c_str(), stdout);
    } else {
      std::printf("  %zu B, %llu per repetition\n", size, static_cast<unsigned long long>(n));
      std::printf("    message (post_recv, send, both completions): regpool %.0f / %.0f ns, direct %.0f / %.0f ns, "
                  "added %.0f ns (medians)\n",
                  rp_msg.median(), rp_msg.min(), d_msg.median(), d_msg.min(), rp_msg.median() - d_msg.median());
      if (tagged) {
        std::printf("    tagged message: Messenger %.0f / %.0f ns (own matching, %+.0f ns over regpool send); "
                    "direct fi_tsend/fi_trecv %.0f / %.0f ns (native matching, %+.0f ns over fi_send)\n",
                    rp_tag.median(), rp_tag.min(), rp_tag.median() - rp_msg.median(), d_tag.median(), d_tag.min(),
                    d_tag.median() - d_msg.median());
      }
      std::printf("    spin-wait round (progress / empty fi_cq_read): regpool %.0f ns, direct %.0f ns, added %.0f ns\n",
                  rp_poll.median(), d_poll.median(), rp_poll.median() - d_poll.median());
    }
    first = false;
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
    std::printf("],\"contended_lock_ns\":{\"calls\":%llu,\"median\":%.1f,\"p99\":%.1f}}\n",
                static_cast<unsigned long long>(contend), hand_med, hand_p99);
  } else if (contend > 0) {
    std::printf("  stats() while another thread spins in progress() (wall time, %llu calls): median %.0f ns, p99 %.0f ns\n",
                static_cast<unsigned long long>(contend), hand_med, hand_p99);
  }
  return 0;
}
