#pragma once
// Shared by the pattern tests (ring channel, aggregation buffer): numbered
// records of varying length whose bytes can be checked, and two endpoints
// in one process on one domain and pool, already connected both ways.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "transport/harness.hpp"

namespace rpt {

// Record counts for the two-process cases: the verbs build runs inside the
// Soft-RoCE guest, an emulated (TCG) machine about 20x slower, where a tenth
// still wraps the ring hundreds of times.
inline std::uint64_t scaled(std::uint64_t n) {
#ifdef RPT_BACKEND_VERBS
  return n / 10;
#else
  return n;
#endif
}

inline std::size_t record_len(std::uint64_t i, std::size_t max) { return 1 + (i * 7919) % max; }

// Record i: a pattern seeded by i, its first 8 bytes i itself (when it has 8).
inline std::vector<std::byte> make_record(std::uint64_t i, std::size_t max) {
  std::vector<std::byte> r(record_len(i, max));
  fill(r, i);
  if (r.size() >= 8) std::memcpy(r.data(), &i, 8);
  return r;
}

inline bool is_record(std::span<const std::byte> got, std::uint64_t i, std::size_t max) {
  const auto want = make_record(i, max);
  return got.size() == want.size() && std::memcmp(got.data(), want.data(), want.size()) == 0;
}

// Short bounds, so a test that goes wrong fails in seconds.
inline regpool::EndpointConfig quick_config() {
  using namespace std::chrono_literals;
  regpool::EndpointConfig ec;
  ec.op_timeout = 3s;
  ec.post_timeout = 3s;
  return ec;
}

// Both ends in this process: s.ep and ep2, on one domain and pool.
struct LocalPair {
  Stack s;
  std::unique_ptr<regpool::Endpoint> ep2;
  regpool::PeerId to_ep2 = 0;  // on s.ep
  regpool::PeerId to_ep1 = 0;  // on ep2
  explicit LocalPair(const std::string& b) : s(b, quick_config()) {
    ep2 = open_endpoint(s.domain, b, quick_config());
    to_ep2 = s.ep->insert_peer(ep2->name());
    to_ep1 = ep2->insert_peer(s.ep->name());
    // The first operation between two endpoints completes only while the
    // target progresses (connection setup): make it here, with the target
    // served by a helper thread, so the tests' single thread never waits on
    // itself.
    warm(*ep2, to_ep1, *s.ep);
    warm(*s.ep, to_ep2, *ep2);
  }
  void warm(regpool::Endpoint& from, regpool::PeerId to, regpool::Endpoint& target) {
    using namespace std::chrono_literals;
    auto obj = s.alloc(64);
    const regpool::Slice sl = slice_or_die(regpool::Slice::data(obj, 0, 64));
    auto e = target.expose(sl, regpool::RemoteAccess::read_write);
    REQUIRE(e.ok());
    std::atomic<bool> stop{false};
    std::thread serve([&] {
      while (!stop.load()) (void)target.progress();
    });
    const auto done = wait_ok(from, from.put(sl, to, e->ref(), 0), 10s);
    stop = true;
    serve.join();
    REQUIRE(done.status == regpool::Status::ok);
  }
  ~LocalPair() { ep2.reset(); }
};

}  // namespace rpt
