// Scoped, revocable exports on verbs, between two processes on one rxe
// device (the target's windows bound over slice MRs, WindowBacking::slice):
// a type-2 memory window grants exactly its slice to exactly one
// peer; a sub-registration exposure grants exactly its slice. Out-of-range
// and revoked keys fail remotely (bad_key) and leave the target's memory
// untouched; a re-exposed window has a new key and the old one stays dead.
#include <catch2/catch.hpp>
#include <cstring>
#include <thread>
#include <string>
#include <vector>

#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::Completion;
using regpool::RemoteAccess;
using regpool::RemoteRef;
using regpool::Slice;
using regpool::Status;

namespace {

regpool::EndpointConfig cfg() {
  regpool::EndpointConfig c;
  c.progress_thread = true;  // both sides answer connection setup and resets
  c.op_timeout = 20s;
  return c;
}


constexpr std::uint64_t kObj = 4096;
constexpr std::uint64_t kWinOff = 1024, kWinLen = 256;  // window W over data bytes [1024, 1280)
constexpr std::uint64_t kSubOff = 2048, kSubLen = 256;  // sub-registration S over [2048, 2304)

// The initiator's put and what it must fail to do, as statuses.
Status put_status(rpt::Stack& s, regpool::PeerId peer, const RemoteRef& ref, std::uint64_t off, const Slice& src) {
  return rpt::wait_ok(*s.ep, s.ep->put(src, peer, ref, off), 20s).status;
}

// The target's endpoint for scoped windows: the target must enforce each
// window's bounds, which on rxe takes a window over a local MR of exactly
// the slice (rxe checks a window access against its MR's range).
std::unique_ptr<regpool::Endpoint> scoped_endpoint(rpt::Stack& s) {
  regpool::VerbsEndpointOptions o;
  o.window_backing = regpool::VerbsEndpointOptions::WindowBacking::slice;
  s.ep.reset();
  return regpool::VerbsEndpoint::open(std::dynamic_pointer_cast<regpool::VerbsDomain>(s.domain), cfg(), o);
}

// After a remote access error the QPs on both sides are in ERROR: reconnect.
bool recover(rpt::Stack& s, regpool::PeerId peer) {
  if (s.ep->usable(peer)) return true;
  for (int i = 0; i < 5; ++i) {
    if (s.ep->reconnect(peer) == Status::ok) return true;
    s.ep->progress_for(100ms);
  }
  return false;
}

}  // namespace

TEST_CASE("memory windows and sub-registrations: scoped, revocable, memory untouched", "[verbs]") {
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();

  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s("verbs", cfg());
        auto names = b->allgather(s.ep->name(), 20s);
        const auto peer = s.ep->insert_peer(names[0]);
        auto refs = b->allgather({}, 30s)[0];
        const RemoteRef w = rpt::decode_or_die({refs.begin(), refs.begin() + 64});
        const RemoteRef sub = rpt::decode_or_die({refs.begin() + 64, refs.end()});
        RPT_CHECK(w.length == kWinLen && sub.length == kSubLen);
        auto src = s.alloc(kObj);
        auto sixteen = rpt::slice_or_die(Slice::data(src, 0, 16));
        rpt::fill(sixteen.bytes(), 55);

        // Inside the window: put, get, fetch_add work.
        RPT_CHECK(put_status(s, peer, w, 0, sixteen) == Status::ok);
        auto into = rpt::slice_or_die(Slice::data(src, 64, kWinLen));
        RPT_CHECK(rpt::wait_ok(*s.ep, s.ep->get(peer, w, 0, into)).status == Status::ok);
        RPT_CHECK(std::memcmp(into.address(), sixteen.address(), 16) == 0);
        auto fa = rpt::wait_ok(*s.ep, s.ep->fetch_add(peer, w, 16, 1));
        RPT_CHECK(fa.status == Status::ok);
        // Inside the sub-registration too.
        RPT_CHECK(put_status(s, peer, sub, 0, sixteen) == Status::ok);

        // Forged references that reach past the window / sub-registration:
        // our checks pass them (the length is a lie), the target's NIC does not.
        RemoteRef wide_w = w;
        wide_w.length += 256;
        const Status a = put_status(s, peer, wide_w, kWinLen, sixteen);
        std::fprintf(stderr, "put past the window: %s\n", regpool::to_string(a));
        RPT_CHECK(a == Status::bad_key);
        RPT_CHECK(recover(s, peer));
        RemoteRef wide_s = sub;
        wide_s.length += 256;
        const Status c = put_status(s, peer, wide_s, kSubLen, sixteen);
        std::fprintf(stderr, "put past the sub-registration: %s\n", regpool::to_string(c));
        RPT_CHECK(c == Status::bad_key);
        RPT_CHECK(recover(s, peer));
        (void)b->allgather({}, 30s);  // phase 1 done

        (void)b->allgather({}, 30s);  // the target has revoked both
        const Status r1 = put_status(s, peer, w, 0, sixteen);
        std::fprintf(stderr, "put through a revoked window: %s\n", regpool::to_string(r1));
        RPT_CHECK(r1 == Status::bad_key);
        RPT_CHECK(recover(s, peer));
        const Status r2 = put_status(s, peer, sub, 0, sixteen);
        std::fprintf(stderr, "put through a revoked sub-registration: %s\n", regpool::to_string(r2));
        RPT_CHECK(r2 == Status::bad_key);
        RPT_CHECK(recover(s, peer));
        RPT_CHECK(rpt::wait_ok(*s.ep, s.ep->get(peer, w, 0, into), 20s).status == Status::bad_key);
        RPT_CHECK(recover(s, peer));
        (void)b->allgather({}, 30s);  // phase 2 done

        // A new window over the same bytes: new key; the old key stays dead.
        auto w2b = b->allgather({}, 30s)[0];
        const RemoteRef w2 = rpt::decode_or_die(w2b);
        RPT_CHECK(w2.key != w.key);
        auto other = rpt::slice_or_die(Slice::data(src, 128, 16));
        rpt::fill(other.bytes(), 66);
        RPT_CHECK(put_status(s, peer, w2, 32, other) == Status::ok);
        RPT_CHECK(put_status(s, peer, w, 48, other) == Status::bad_key);
        RPT_CHECK(recover(s, peer));
        (void)b->allgather({}, 30s);  // phase 3 done
        return 0;
      },
      240);

  rpt::Stack s("verbs", cfg());
  s.ep = scoped_endpoint(s);
  auto names = boot->allgather(s.ep->name(), 20s);
  const auto peer = s.ep->insert_peer(names[1]);
  auto obj = s.alloc(kObj);
  rpt::fill(obj.data(), 9);
  std::vector<std::byte> expect(obj.data().begin(), obj.data().end());

  auto w = s.ep->expose(rpt::slice_or_die(Slice::data(obj, kWinOff, kWinLen)), RemoteAccess::read_write, peer);
  REQUIRE(w.ok());
  auto sub = s.ep->expose(rpt::slice_or_die(Slice::data(obj, kSubOff, kSubLen)), RemoteAccess::read_write,
                          regpool::ExposureMode::scoped);
  REQUIRE(sub.ok());
  CHECK(w->ref().key != sub->ref().key);
  auto wb = rpt::encoded(*w), sb = rpt::encoded(*sub);
  wb.insert(wb.end(), sb.begin(), sb.end());
  (void)boot->allgather(wb, 30s);

  (void)boot->allgather({}, 60s);  // phase 1 done
  {
    // What the legal operations did, and nothing else.
    std::vector<std::byte> put16(16);
    rpt::fill(put16, 55);
    std::memcpy(expect.data() + kWinOff, put16.data(), 16);
    std::memcpy(expect.data() + kSubOff, put16.data(), 16);
    std::uint64_t word = 0;
    std::memcpy(&word, expect.data() + kWinOff + 16, 8);
    ++word;
    std::memcpy(expect.data() + kWinOff + 16, &word, 8);
    CHECK(std::memcmp(obj.data().data(), expect.data(), kObj) == 0);
    // In particular the 16 bytes right after each range (the forged puts' targets).
    CHECK(rpt::hash(obj.data().subspan(kWinOff + kWinLen, 16)) ==
          rpt::hash(std::span<const std::byte>(expect).subspan(kWinOff + kWinLen, 16)));
  }
  w->revoke();
  sub->revoke();
  (void)boot->allgather({}, 30s);  // revoked
  (void)boot->allgather({}, 60s);  // phase 2 done
  CHECK(std::memcmp(obj.data().data(), expect.data(), kObj) == 0);  // revoked keys wrote nothing

  // The initiator's recover() re-establishes the connection from its side;
  // ours comes back through progress, so a bind may briefly find the
  // connection not yet usable. That is a retryable status, not a failure.
  auto expose_w2 = [&] {
    return s.ep->expose(rpt::slice_or_die(Slice::data(obj, kWinOff, kWinLen)), RemoteAccess::read_write, peer);
  };
  auto w2 = expose_w2();
  for (auto until = std::chrono::steady_clock::now() + 20s;
       !w2.ok() && (w2.status() == Status::would_block || w2.status() == Status::peer_unreachable) &&
       std::chrono::steady_clock::now() < until;) {
    // If our side saw the connection break, re-establishing it is ours to
    // do (reconnect is idempotent with the peer's own recovery).
    if (w2.status() == Status::peer_unreachable) (void)s.ep->reconnect(peer);
    s.ep->progress();
    std::this_thread::sleep_for(10ms);
    w2 = expose_w2();
  }
  INFO("re-expose status: " << regpool::to_string(w2.status()));
  REQUIRE(w2.ok());
  (void)boot->allgather(rpt::encoded(*w2), 30s);
  (void)boot->allgather({}, 60s);  // phase 3 done
  std::vector<std::byte> put16(16);
  rpt::fill(put16, 66);
  std::memcpy(expect.data() + kWinOff + 32, put16.data(), 16);
  CHECK(std::memcmp(obj.data().data(), expect.data(), kObj) == 0);
  CHECK(rpt::reap(kid, 30s) == 0);
}

TEST_CASE("a window for an unknown or broken peer is refused", "[verbs]") {
  rpt::Stack s("verbs");
  auto obj = s.alloc(kObj);
  auto sl = rpt::slice_or_die(Slice::data(obj));
  CHECK(s.ep->expose(sl, RemoteAccess::read_only, 3).status() == Status::invalid_argument);
  CHECK(s.ep->expose(sl, RemoteAccess::read_only, regpool::kAnyPeer).status() == Status::invalid_argument);
}
