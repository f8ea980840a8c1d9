// The endpoint's locking and timeouts (hardening): nothing waits while
// holding the endpoint's mutex, references whose last drop runs user code are
// dropped outside it, and per-operation deadlines grow with the transfer.
// Built for libfabric (transport-locking: shm, tcp) and for verbs
// (verbs-locking, inside the Soft-RoCE guest), like the conformance tests.
//
// A deadlock must fail a test, not hang CI: the side that could deadlock runs
// in a forked child under alarm() and is reaped with a bound; the other
// checks measure how long a call from a second thread takes while the first
// one is waiting.

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::Completion;
using regpool::Exposure;
using regpool::RemoteAccess;
using regpool::RemoteRef;
using regpool::Slice;
using regpool::Status;
using Clock = std::chrono::steady_clock;

namespace {

regpool::EndpointConfig target_config() {
  regpool::EndpointConfig c;
  c.progress_thread = true;
  c.progress_idle_sleep = 0us;
  return c;
}

// Backends of this executable that set connections up through the target's
// progress, so that the first operation to a peer that does not progress
// answers would_block (docs/provider-facts.md: tcp;ofi_rxm, net; verbs: its top comment).
std::vector<std::string> connecting_backends() {
  std::vector<std::string> out;
  for (const auto& b : rpt::backends()) {
    if (rpt::connects_through_target_progress(b)) out.push_back(b);
  }
  return out;
}

#ifndef RPT_BACKEND_VERBS  // only the libfabric timeout case stops a peer
// True once /proc says `pid` is stopped (state T), false after `limit`.
bool wait_stopped(pid_t pid, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  while (Clock::now() < until) {
    std::ifstream f(path);
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    // pid (comm) state ...: the state follows the last ')'.
    const auto close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'T') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}
#endif

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Sanitizer builds (CI runs this suite under ASan and TSan) make every call
// several times slower; the bounds below stretch with them but stay well
// under what the waits they catch cost (seconds).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kSlowdown = 5;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr double kSlowdown = 5;
#else
constexpr double kSlowdown = 1;
#endif
#else
constexpr double kSlowdown = 1;
#endif

// A call another thread makes while one thread waits inside the endpoint
// must not wait for it: well under the seconds the waiting thread spends.
constexpr double kPromptMs = 300 * kSlowdown;
// A call that only changes state and posts (reconnect, remove_peer), and
// calls made by others meanwhile: a few ms of syscalls. The bound leaves
// room for preemption: in the 2-vCPU emulated guest on a loaded host a
// thread is descheduled for 10-60 ms now and then.
constexpr double kQuickMs = 100 * kSlowdown;

}  // namespace

TEST_CASE("an LDO cleanup that calls into the endpoint runs outside its mutex", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();

  // The initiator is the child: if the cleanup deadlocks, alarm() ends it.
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov);
        auto parts = regpool::unpack_blobs(b->allgather({}, 20s)[0]);
        const auto peer = s.ep->insert_peer(parts[0]);
        const RemoteRef ref = rpt::decode_or_die(parts[1]);

        auto spare = s.alloc(4096);
        std::optional<Exposure> doomed;  // destroyed by the cleanup
        {
          auto e = s.ep->expose(rpt::slice_or_die(Slice::data(spare, 0, 64)), RemoteAccess::read_only);
          RPT_CHECK(e.ok());
          doomed.emplace(std::move(*e));
        }
        struct Seen {
          std::atomic<int> cleanups{0};
          std::atomic<int> cleanup_failures{0};
          std::atomic<int> completions{0};
          std::atomic<int> nested_ok{0};
        } seen;
        std::vector<Exposure> kept;  // exposures made inside cleanups
        kept.reserve(4);

        // Wrap user memory whose cleanup uses the endpoint: stats, a post
        // (put, with a callback), an expose, and destroying an Exposure.
        std::vector<std::vector<std::byte>> memories(2, std::vector<std::byte>(4096));
        auto make_user = [&](std::size_t i) {
          regpool::UserMemory um;
          um.memory = memories[i];
          um.data_size = 1024;
          um.cleanup = [&, i](std::span<std::byte>) {
            (void)s.ep->stats();
            auto nested = s.ep->put(rpt::slice_or_die(Slice::data(spare, 128, 64)), peer, ref, 2048 + 64 * i,
                                    [&seen](const Completion& c) {
                                      if (c.status == Status::ok) seen.nested_ok.fetch_add(1);
                                    });
            auto x = s.ep->expose(rpt::slice_or_die(Slice::data(spare, 256, 64)), RemoteAccess::read_only);
            if (!nested.ok() || !x.ok()) seen.cleanup_failures.fetch_add(1);
            if (x.ok()) kept.push_back(std::move(*x));
            doomed.reset();
            seen.cleanups.fetch_add(1);
          };
          return regpool::Ldo::wrap(std::move(um));
        };

        // Posts whose completion drops the last reference to the user LDO
        // (the test's own handles are gone before the op completes).
        for (std::size_t i = 0; i < 2; ++i) {
          auto t = [&]() {
            auto user = make_user(i);
            auto sl = rpt::slice_or_die(Slice::data(user));
            rpt::fill(sl.bytes(), 40 + i);
            auto cb = [&seen](const Completion& c) {
              if (c.status == Status::ok) seen.completions.fetch_add(1);
            };
            return i == 0 ? s.ep->put(sl, peer, ref, 0, cb) : s.ep->send(peer, sl, cb);
          }();
          RPT_CHECK(t.ok());
        }
        const auto deadline = Clock::now() + 20s;
        while ((seen.cleanups.load() < 2 || seen.completions.load() < 2 || seen.nested_ok.load() < 2) &&
               Clock::now() < deadline) {
          (void)s.ep->progress();
        }
        std::fprintf(stderr, "cleanups %d completions %d nested %d failures %d\n", seen.cleanups.load(),
                     seen.completions.load(), seen.nested_ok.load(), seen.cleanup_failures.load());
        RPT_CHECK(seen.cleanups.load() == 2);
        RPT_CHECK(seen.completions.load() == 2);
        RPT_CHECK(seen.nested_ok.load() == 2);
        RPT_CHECK(seen.cleanup_failures.load() == 0);
        RPT_CHECK(!doomed.has_value());
        kept.clear();
        (void)b->allgather({}, 30s);  // the target may go
        return 0;
      },
      40);

  rpt::Stack s(prov, target_config());
  auto target = s.alloc(4096);
  auto exposure = s.ep->expose(rpt::slice_or_die(Slice::data(target)), RemoteAccess::read_write);
  REQUIRE(exposure.ok());
  auto inbox = s.alloc(4096);
  REQUIRE(s.ep->post_recv(rpt::slice_or_die(Slice::data(inbox))).ok());
  (void)boot->allgather(regpool::pack_blobs({s.ep->name(), rpt::encoded(*exposure)}), 20s);
  std::vector<std::vector<std::byte>> done;
  try {
    done = boot->allgather({}, 45s);
  } catch (const regpool::Error&) {
    // The child died (alarm: deadlock); its exit code says so below.
  }
  CHECK(rpt::reap(kid, 50s) == 0);
}

TEST_CASE("a post retrying after would_block leaves the endpoint to other threads", "[fabric]") {
  const auto list = connecting_backends();
  if (list.empty()) return;
  const std::string prov = GENERATE_COPY(from_range(list));
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  constexpr auto kSilence = 3s;  // the target does not progress for this long

  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov);  // no progress thread: it progresses when told
        auto obj = s.alloc(4096);
        auto e = s.ep->expose(rpt::slice_or_die(Slice::data(obj)), RemoteAccess::read_write);
        RPT_CHECK(e.ok());
        (void)b->allgather(regpool::pack_blobs({s.ep->name(), rpt::encoded(*e)}), 20s);
        std::this_thread::sleep_for(kSilence);
        s.ep->progress_for(8s);
        (void)b->allgather({}, 30s);
        return 0;
      },
      60);

  regpool::EndpointConfig cfg;
  cfg.post_timeout = 20s;
  rpt::Stack s(prov, cfg);
  auto parts = regpool::unpack_blobs(boot->allgather({}, 20s)[1]);
  const auto peer = s.ep->insert_peer(parts[0]);
  const RemoteRef ref = rpt::decode_or_die(parts[1]);
  auto src = s.alloc(4096);
  auto sl = rpt::slice_or_die(Slice::data(src, 0, 64));

  std::atomic<bool> inside{true};
  Status put_status = Status::in_progress;
  const auto t0 = Clock::now();
  std::thread poster([&] {
    // The first op to a peer that does not progress: would_block until it
    // does (kSilence), retried inside put().
    auto t = s.ep->put(sl, peer, ref, 0);
    put_status = t.ok() ? s.ep->wait(*t, 20s).status : t.status();
    inside.store(false);
  });
  std::this_thread::sleep_for(300ms);

  auto t1 = Clock::now();
  const auto st = s.ep->stats();
  const double stats_ms = ms_since(t1);
  t1 = Clock::now();
  (void)s.ep->progress();
  const double progress_ms = ms_since(t1);
  t1 = Clock::now();
  auto inbox = s.alloc(4096);
  const auto recv = s.ep->post_recv(rpt::slice_or_die(Slice::data(inbox)));
  const double post_ms = ms_since(t1);
  const bool measured_while_inside = inside.load();
  poster.join();
  INFO("stats " << stats_ms << " ms, progress " << progress_ms << " ms, post_recv " << post_ms << " ms; put took "
                << ms_since(t0) << " ms");
  CHECK(recv.ok());
  CHECK(stats_ms < kPromptMs);
  CHECK(progress_ms < kPromptMs);
  CHECK(post_ms < kPromptMs);
  CHECK(measured_while_inside);  // the calls above really overlapped the retry
  CHECK(st.post_retries > 0);
  CHECK(put_status == Status::ok);
  (void)boot->allgather({}, 30s);
  CHECK(rpt::reap(kid, 30s) == 0);
}

TEST_CASE("reconnect and remove_peer with operations in flight leave the endpoint to other threads", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  constexpr std::uint64_t kChunk = 8u << 20;
  constexpr int kChunks = 4;  // 32 MiB in flight: rxe needs ~0.5 s for it
  constexpr std::uint64_t kArena = 64u << 20;

  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        regpool::EndpointConfig tc;
        tc.progress_thread = true;  // idle sleeps: a spinning target would starve the 2-vCPU guest
        rpt::Stack s(prov, tc, kArena);
        auto obj = s.alloc(kChunk * kChunks);
        auto e = s.ep->expose(rpt::slice_or_die(Slice::data(obj)), RemoteAccess::read_write);
        RPT_CHECK(e.ok());
        (void)b->allgather(regpool::pack_blobs({s.ep->name(), rpt::encoded(*e)}), 20s);
        (void)b->allgather({}, 60s);  // the initiator reconnected and used the new connection
        return 0;                     // exit: a dead peer from now on
      },
      120);

  regpool::EndpointConfig cfg;
  cfg.post_timeout = 20s;
  rpt::Stack s(prov, cfg, kArena);
  auto parts = regpool::unpack_blobs(boot->allgather({}, 20s)[1]);
  const auto peer = s.ep->insert_peer(parts[0]);
  const RemoteRef ref = rpt::decode_or_die(parts[1]);
  auto src = s.alloc(kChunk * kChunks);
  rpt::fill(src.data(), 21);
  auto small = rpt::slice_or_die(Slice::data(src, 0, 64));
  REQUIRE(rpt::wait_ok(*s.ep, s.ep->put(small, peer, ref, 0), 20s).status == Status::ok);  // connected

  // Runs `action` while another thread calls stats() in a loop (each call
  // timed). Nobody progresses meanwhile, so what the action left in flight
  // is still visible when it returns. A third thread touches nothing of the
  // endpoint and records the longest it was kept from running (`stall_ms`):
  // when the host stops the guest, every thread sees the same gap (CI,
  // 2026-11-28: reconnect and stats() both 209 ms, against 2-6 ms in other
  // runs), and that time is the machine's, not the endpoint's.
  struct Watch {
    double stats_ms = 0;
    double action_ms = 0;
    double stall_ms = 0;
    std::uint64_t in_flight_after = 0;
  };
  auto watch_during = [&](auto&& action) {
    Watch w;
    std::atomic<bool> stop{false};
    std::atomic<bool> started{false};
    std::thread watcher([&] {
      while (!stop.load()) {
        const auto t = Clock::now();
        (void)s.ep->stats();
        w.stats_ms = std::max(w.stats_ms, ms_since(t));
        started.store(true);
        std::this_thread::sleep_for(200us);
      }
    });
    std::thread bystander([&] {
      auto last = Clock::now();
      while (!stop.load()) {
        std::this_thread::sleep_for(200us);
        const auto now = Clock::now();
        w.stall_ms = std::max(w.stall_ms, std::chrono::duration<double, std::milli>(now - last).count() - 0.2);
        last = now;
      }
    });
    while (!started.load()) std::this_thread::yield();
    const auto t = Clock::now();
    action();
    w.action_ms = ms_since(t);
    w.in_flight_after = s.ep->stats().in_flight;
    std::this_thread::sleep_for(20ms);
    stop.store(true);
    watcher.join();
    bystander.join();
    return w;
  };
  // Progress until nothing is in flight; the slowest progress() call.
  auto settle = [&](std::chrono::milliseconds bound) {
    double worst = 0;
    const auto until = Clock::now() + bound;
    while (s.ep->stats().in_flight > 0 && Clock::now() < until) {
      const auto t = Clock::now();
      (void)s.ep->progress();
      worst = std::max(worst, ms_since(t));
    }
    return worst;
  };

  // 1. reconnect(peer) while large puts are on the wire: it returns at once,
  // the puts end with peer_unreachable (or ok if they got through first),
  // their slots come back through progress, and the new connection works.
  std::vector<regpool::Token> big;
  for (int k = 0; k < kChunks; ++k) {
    const std::uint64_t off = static_cast<std::uint64_t>(k) * kChunk;
    auto t = s.ep->put(rpt::slice_or_die(Slice::data(src, off, kChunk)), peer, ref, off);
    REQUIRE(t.ok());
    big.push_back(*t);
  }
  const auto in_flight = s.ep->stats().in_flight;
  Status reconnect_status = Status::in_progress;
  const Watch r = watch_during([&] { reconnect_status = s.ep->reconnect(peer); });
  std::vector<Status> big_status;
  for (const auto& t : big) big_status.push_back(s.ep->wait(t, 30s).status);
  const double r_progress_ms = settle(10s);
  auto back = s.alloc(64);
  const auto t_after = Clock::now();
  const Completion put_after = rpt::wait_ok(*s.ep, s.ep->put(small, peer, ref, 0), 20s);
  const double put_after_ms = ms_since(t_after);
  const Completion get_after =
      rpt::wait_ok(*s.ep, s.ep->get(peer, ref, 0, rpt::slice_or_die(Slice::data(back))), 20s);
  INFO("reconnect with " << in_flight << " ops in flight: " << regpool::to_string(reconnect_status) << " in "
                         << r.action_ms << " ms, " << r.in_flight_after << " still in flight after it; worst stats "
                         << r.stats_ms << " ms meanwhile, a bystander stalled " << r.stall_ms
                         << " ms, worst progress " << r_progress_ms
                         << " ms after it; put after it " << regpool::to_string(put_after.status) << " in "
                         << put_after_ms << " ms");
  CHECK(reconnect_status == Status::ok);
  for (const Status st : big_status) CHECK((st == Status::ok || st == Status::peer_unreachable));
  CHECK(s.ep->stats().in_flight == 0);  // the slots came back
  CHECK(put_after.status == Status::ok);
  CHECK(get_after.status == Status::ok);
  CHECK(rpt::hash(rpt::slice_or_die(Slice::data(back)).bytes()) == rpt::hash(small.bytes()));
  CHECK(r.stats_ms < kQuickMs + r.stall_ms);
  CHECK(r.action_ms < kQuickMs + r.stall_ms);
  CHECK(r_progress_ms < kQuickMs);
#ifdef RPT_BACKEND_VERBS
  CHECK(in_flight == kChunks);  // rxe cannot move 32 MiB before reconnect()
  CHECK(std::count(big_status.begin(), big_status.end(), Status::peer_unreachable) > 0);
  // reconnect() did not wait for the old QP to give its WRs back: they come
  // back flushed through progress (settle above).
  CHECK(r.in_flight_after == in_flight);
#endif

  // 2. remove_peer of a peer that exited, with a put to it unanswered.
  (void)boot->allgather({}, 30s);
  REQUIRE(rpt::reap(kid, 30s) == 0);
  auto dead = s.ep->put(small, peer, ref, 0);
  const Watch d = watch_during([&] { s.ep->remove_peer(peer); });
  const Completion c = dead.ok() ? s.ep->wait(*dead, 30s) : Completion{};
  const double d_progress_ms = settle(10s);
  INFO("remove_peer of a dead peer: " << d.action_ms << " ms, " << d.in_flight_after
                                      << " still in flight after it; worst stats " << d.stats_ms
                                      << " ms meanwhile, a bystander stalled " << d.stall_ms
                                      << " ms, worst progress " << d_progress_ms
                                      << " ms after it; the put to it "
                                      << regpool::to_string(dead.ok() ? c.status : dead.status()));
  CHECK(d.stats_ms < kQuickMs + d.stall_ms);
  CHECK(d.action_ms < kQuickMs + d.stall_ms);
  CHECK(d_progress_ms < kQuickMs);
  CHECK((!dead.ok() || c.status != Status::ok));
#ifdef RPT_BACKEND_VERBS
  REQUIRE(dead.ok());
  CHECK(c.status == Status::peer_unreachable);
  CHECK(d.in_flight_after == 1);        // not drained under the mutex...
  CHECK(s.ep->stats().in_flight == 0);  // ...but by progress: the slot came back
#endif
}

#ifndef RPT_BACKEND_VERBS
TEST_CASE("op_timeout scales with the transfer; a dead peer still times out", "[fabric]") {
  // rxm: a 64 MiB send waits for the receiver (rendezvous); net would
  // queue it on the socket, and refuses it above the peer's 16 MiB limit.
  const std::string prov = "tcp;ofi_rxm";
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  constexpr std::uint64_t kBig = 64u << 20;

  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov, target_config());
        auto obj = s.alloc(kBig);
        auto e = s.ep->expose(rpt::slice_or_die(Slice::data(obj)), RemoteAccess::read_write);
        RPT_CHECK(e.ok());
        (void)b->allgather(regpool::pack_blobs({s.ep->name(), rpt::encoded(*e)}), 20s);
        (void)b->allgather({}, 60s);  // the parent stops us (SIGSTOP) after this
        std::this_thread::sleep_for(60s);
        return 0;
      },
      120);

  // 5 ms is far less than 64 MiB needs over loopback tcp (several GB/s at
  // best); the size term (64 MiB / 20 MB/s = 3.4 s) is what keeps it alive.
  regpool::EndpointConfig cfg;
  cfg.op_timeout = 5ms;
  cfg.min_bandwidth = 20'000'000;
  rpt::Stack s(prov, cfg);
  auto parts = regpool::unpack_blobs(boot->allgather({}, 20s)[1]);
  const auto peer = s.ep->insert_peer(parts[0]);
  const RemoteRef ref = rpt::decode_or_die(parts[1]);
  auto src = s.alloc(kBig);
  auto big = rpt::slice_or_die(Slice::data(src));
  rpt::fill(big.bytes(), 9);

  const auto t0 = Clock::now();
  const Completion c = rpt::wait_ok(*s.ep, s.ep->put(big, peer, ref, 0), 30s);
  INFO("64 MiB put: " << regpool::to_string(c.status) << " after " << ms_since(t0) << " ms");
  CHECK(c.status == Status::ok);
  CHECK(s.ep->usable(peer));
  CHECK(s.ep->stats().timeouts == 0);
  (void)boot->allgather({}, 30s);

  // A peer that stops answering: a small op gets about op_timeout.
  std::this_thread::sleep_for(100ms);
  REQUIRE(::kill(kid.pid, SIGSTOP) == 0);
  // kill() returns before the stop takes effect on every thread of the
  // target; a put posted in that gap is answered (seen under TSan, which
  // slows the stop down). Wait until the kernel reports the process stopped.
  REQUIRE(wait_stopped(kid.pid, 5s));
  auto small = rpt::slice_or_die(Slice::data(src, 0, 8));
  const auto t1 = Clock::now();
  const Completion d = rpt::wait_ok(*s.ep, s.ep->put(small, peer, ref, 0), 10s);
  const double dead_ms = ms_since(t1);
  INFO("put to a stopped peer: " << regpool::to_string(d.status) << " after " << dead_ms << " ms");
  CHECK(d.status == Status::timeout);
  CHECK(dead_ms < 2000);
  CHECK_FALSE(s.ep->usable(peer));
  CHECK(s.ep->stats().timeouts == 1);
  ::kill(kid.pid, SIGKILL);
  (void)rpt::reap(kid, 10s);
}
#endif

#ifndef RPT_BACKEND_VERBS
TEST_CASE("receives keep recv_timeout and other ops op_timeout when they alternate", "[fabric]") {
  // The endpoint caches the deadline span of the last length posted of
  // each bound (a send ping-pong alternates receives and sends): a receive
  // posted right after a send of the same length must still get
  // recv_timeout, and the send op_timeout. Both ends in this process; the
  // other end neither posts a receive nor progresses until the end, so the
  // 1 MiB send stays in flight.
  constexpr std::uint64_t kLen = 1u << 20;
  regpool::EndpointConfig cfg;
  cfg.recv_timeout = 150ms;
  cfg.op_timeout = 30s;
  cfg.min_bandwidth = 0;  // the bounds exactly, whatever the length
  rpt::Stack s("shm", cfg);
  auto other = rpt::open_endpoint(s.domain, "shm", cfg);
  const auto peer = s.ep->insert_peer(other->name());
  (void)other->insert_peer(s.ep->name());
  auto obj = s.alloc(4 * kLen);
  const Slice source = rpt::slice_or_die(Slice::data(obj, 0, kLen));
  const Slice rx1 = rpt::slice_or_die(Slice::data(obj, kLen, kLen));
  const Slice rx2 = rpt::slice_or_die(Slice::data(obj, 2 * kLen, kLen));
  const Slice theirs = rpt::slice_or_die(Slice::data(obj, 3 * kLen, kLen));
  rpt::fill(source.bytes(), 5);
  // Runs `body` while a thread progresses the other end.
  const auto with_other_progressing = [&](auto&& body) {
    std::atomic<bool> stop{false};
    std::thread serve([&] {
      while (!stop.load()) (void)other->progress();
    });
    body();
    stop = true;
    serve.join();
  };
  {
    // The first message between two endpoints completes only while the
    // target progresses (connection setup).
    const Slice hello = rpt::slice_or_die(Slice::data(obj, 0, 8));
    auto in = other->post_recv(rpt::slice_or_die(Slice::data(obj, 3 * kLen, 8)));
    REQUIRE(in.ok());
    Completion c, r;
    with_other_progressing([&] {
      c = rpt::wait_ok(*s.ep, s.ep->send(peer, hello), 10s);
      r = other->wait(*in, 10s);
    });
    REQUIRE(c.status == Status::ok);
    REQUIRE(r.status == Status::ok);
  }

  const auto t0 = Clock::now();
  auto r1 = s.ep->post_recv(rx1);  // nothing is ever sent here: times out
  REQUIRE(r1.ok());
  auto sent = s.ep->send(peer, source);
  REQUIRE(sent.ok());
  auto r2 = s.ep->post_recv(rx2);  // same length as the send just posted
  REQUIRE(r2.ok());

  const Completion c1 = s.ep->wait(*r1, 10s);
  const Completion c2 = s.ep->wait(*r2, 10s);
  const double recv_ms = ms_since(t0);
  INFO("receives: " << regpool::to_string(c1.status) << ", " << regpool::to_string(c2.status) << " after "
                    << recv_ms << " ms");
  CHECK(c1.status == Status::timeout);
  CHECK(c2.status == Status::timeout);
  // 150 ms plus up to four coarse ticks; far from op_timeout's 30 s.
  CHECK(recv_ms >= 150);
  CHECK(recv_ms < 2000);
  // The send kept op_timeout: still in flight well past recv_timeout.
  const Completion pending = s.ep->wait(*sent, 400ms);
  INFO("send after " << ms_since(t0) << " ms: " << regpool::to_string(pending.status));
  CHECK(pending.status == Status::in_progress);
  CHECK(s.ep->stats().timeouts == 2);

  // Now the other end receives it.
  auto got = other->post_recv(theirs);
  REQUIRE(got.ok());
  Completion done, in;
  with_other_progressing([&] {
    done = s.ep->wait(*sent, 10s);
    in = other->wait(*got, 10s);
  });
  CHECK(done.status == Status::ok);
  CHECK(in.status == Status::ok);
  CHECK(in.bytes == kLen);
  CHECK(rpt::hash(theirs.bytes()) == rpt::hash(source.bytes()));
  CHECK(s.ep->stats().timeouts == 2);
}
#endif

#ifdef RPT_BACKEND_VERBS
TEST_CASE("verbs: expose to a peer and destroying its Exposure never wait under the mutex", "[verbs]") {
  const std::string prov = "verbs";
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  constexpr auto kSilence = 3s;

  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov);
        auto obj = s.alloc(4096);
        auto e = s.ep->expose(rpt::slice_or_die(Slice::data(obj)), RemoteAccess::read_write);
        RPT_CHECK(e.ok());
        (void)b->allgather(regpool::pack_blobs({s.ep->name(), rpt::encoded(*e)}), 20s);
        std::this_thread::sleep_for(kSilence);  // connection setup waits for this
        s.ep->progress_for(8s);
        (void)b->allgather({}, 30s);
        return 0;  // exit: its QP goes, so ours gets no more answers
      },
      90);

  regpool::EndpointConfig cfg;
  cfg.post_timeout = 20s;
  cfg.op_timeout = 3s;  // rxe may not report a gone peer by itself
  rpt::Stack s(prov, cfg);
  auto parts = regpool::unpack_blobs(boot->allgather({}, 20s)[1]);
  const auto peer = s.ep->insert_peer(parts[0]);
  const RemoteRef ref = rpt::decode_or_die(parts[1]);
  auto obj = s.alloc(4096);

  // 1. expose(…, peer) waits for the connection: others go on meanwhile.
  std::atomic<bool> inside{true};
  std::optional<Exposure> window;
  Status expose_status = Status::in_progress;
  std::thread exposer([&] {
    auto w = s.ep->expose(rpt::slice_or_die(Slice::data(obj, 0, 256)), RemoteAccess::read_write, peer);
    expose_status = w.status();
    if (w.ok()) window.emplace(std::move(*w));
    inside.store(false);
  });
  std::this_thread::sleep_for(300ms);
  auto t1 = Clock::now();
  (void)s.ep->stats();
  const double stats_ms = ms_since(t1);
  t1 = Clock::now();
  (void)s.ep->progress();
  const double progress_ms = ms_since(t1);
  const bool overlapped = inside.load();
  exposer.join();
  INFO("during expose: stats " << stats_ms << " ms, progress " << progress_ms << " ms");
  CHECK(overlapped);
  CHECK(stats_ms < kPromptMs);
  CHECK(progress_ms < kPromptMs);
  REQUIRE(expose_status == Status::ok);
  REQUIRE(window.has_value());
  CHECK(obj.use_count() == 2);  // ours and the Exposure's

  // 2. The peer goes away; a put to it sits on our QP unanswered (rxe in
  // the guest does not even give up on it by itself). The window's
  // invalidate queues behind it, so it cannot be confirmed quickly:
  // destroying the Exposure must return anyway, leave the mutex to others,
  // and keep the bytes referenced until the invalidate is done - here when
  // remove_peer resets the QP, which flushes both.
  (void)boot->allgather({}, 30s);
  REQUIRE(rpt::reap(kid, 30s) == 0);
  auto src = s.alloc(4096);
  auto tok = s.ep->put(rpt::slice_or_die(Slice::data(src, 0, 64)), peer, ref, 0);
  REQUIRE(tok.ok());
  std::atomic<bool> destroying{true};
  double destroy_ms = 0;
  std::thread destroyer([&] {
    const auto t = Clock::now();
    window.reset();
    destroy_ms = ms_since(t);
    destroying.store(false);
  });
  double worst_stats_ms = 0;
  while (destroying.load()) {
    const auto t = Clock::now();
    (void)s.ep->stats();
    worst_stats_ms = std::max(worst_stats_ms, ms_since(t));
    std::this_thread::sleep_for(1ms);
  }
  destroyer.join();
  const bool put_still_running = s.ep->stats().in_flight > 0;
  const auto parked_refs = obj.use_count();
  const Completion c = s.ep->wait(*tok, 30s);
  INFO("~Exposure " << destroy_ms << " ms, worst stats " << worst_stats_ms << " ms, put to the gone peer "
                    << regpool::to_string(c.status) << ", still running after ~Exposure " << put_still_running);
  CHECK(destroy_ms < kPromptMs);
  CHECK(worst_stats_ms < kPromptMs);
  CHECK(put_still_running);
  CHECK(parked_refs == 2);  // parked: the key may still work
  CHECK((c.status == Status::peer_unreachable || c.status == Status::timeout));
  CHECK(obj.use_count() == 2);  // still parked: the QP still holds the window
  s.ep->remove_peer(peer);
  const auto until = Clock::now() + 5s;
  while (obj.use_count() != 1 && Clock::now() < until) (void)s.ep->progress();
  CHECK(obj.use_count() == 1);  // released once the invalidate completed (flushed)
}
#endif
