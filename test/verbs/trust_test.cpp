// What the target itself enforces on verbs (rxe in the Soft-RoCE guest),
// two processes: the initiator forges references that its own checks let
// through (a longer length, other rights, another key tag, a revoked key),
// so every refusal below comes from the target's device, not from regpool.
//  - standard windows (expose(slice, access, peer), bound over the arena's
//    MR): key, rights and revocation are enforced by the target; bounds only
//    up to the MR underneath on rxe (the test records which).
//  - the arena's own rkey (what an exposure without a peer reuses): key and
//    the MR's range only; no rights beyond the MR's, no revocation.
//  - a late put with the key of a revoked window, after the object was freed
//    and a new one allocated at the same address and exposed through the
//    same (recycled) window, fails at the target; the new object keeps its
//    bytes.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <vector>

#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::RemoteAccess;
using regpool::RemoteRef;
using regpool::Slice;
using regpool::Status;

namespace {

regpool::EndpointConfig cfg() {
  regpool::EndpointConfig c;
  c.progress_thread = true;
  c.op_timeout = 20s;
  return c;
}

constexpr std::uint64_t kObj = 8192;
constexpr std::uint64_t kRwOff = 1024, kRoOff = 1280, kWoOff = 1536, kWinLen = 256;
constexpr std::uint64_t kArenaPutOff = 3000;  // in the object, outside every window
constexpr std::size_t kRef = RemoteRef::kEncodedSize;

Status put_status(rpt::Stack& s, regpool::PeerId peer, const RemoteRef& ref, std::uint64_t off, const Slice& src) {
  return rpt::wait_ok(*s.ep, s.ep->put(src, peer, ref, off), 20s).status;
}
Status get_status(rpt::Stack& s, regpool::PeerId peer, const RemoteRef& ref, std::uint64_t off, const Slice& dst) {
  return rpt::wait_ok(*s.ep, s.ep->get(peer, ref, off, dst), 20s).status;
}

// After a remote access error the QPs on both sides are in ERROR: reconnect.
bool recover(rpt::Stack& s, regpool::PeerId peer) {
  for (int i = 0; i < 50 && !s.ep->usable(peer); ++i) {
    (void)s.ep->reconnect(peer);
    s.ep->progress_for(100ms);
  }
  return s.ep->usable(peer);
}

void append(std::vector<std::byte>& out, const RemoteRef& r) {
  const auto e = r.encode();
  out.insert(out.end(), e.begin(), e.end());
}

}  // namespace

TEST_CASE("verbs targets enforce keys, rights and revocation of windows; bounds to the MR", "[verbs]") {
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();

  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s("verbs", cfg());
        auto names = b->allgather(s.ep->name(), 20s);
        const auto peer = s.ep->insert_peer(names[0]);
        auto blob = b->allgather({}, 30s)[0];
        RPT_CHECK(blob.size() == 4 * kRef || blob.size() == 5 * kRef);
        auto ref_at = [&](std::size_t i) { return rpt::decode_or_die({blob.begin() + i * kRef, kRef}); };
        const RemoteRef rw = ref_at(0), ro = ref_at(1), arena_obj = ref_at(2), arena_past = ref_at(3);
        const bool have_wo = blob.size() == 5 * kRef;
        auto src = s.alloc(4096);
        auto p55 = rpt::slice_or_die(Slice::data(src, 0, 16));
        auto p77 = rpt::slice_or_die(Slice::data(src, 16, 16));
        auto into = rpt::slice_or_die(Slice::data(src, 1024, 16));
        rpt::fill(p55.bytes(), 55);
        rpt::fill(p77.bytes(), 77);

        // Legal: put into the read-write window, get from the read-only one.
        RPT_CHECK(put_status(s, peer, rw, 0, p55) == Status::ok);
        RPT_CHECK(get_status(s, peer, ro, 0, into) == Status::ok);

        // Key: another tag of the same window.
        RemoteRef forged = rw;
        forged.key ^= 0x01;
        const Status key_st = put_status(s, peer, forged, 32, p77);
        std::fprintf(stderr, "window, other key tag: %s\n", regpool::to_string(key_st));
        RPT_CHECK(key_st == Status::bad_key);
        RPT_CHECK(recover(s, peer));

        // Rights: a put into the read-only window (the reference claims rw).
        forged = ro;
        forged.access = RemoteAccess::read_write;
        const Status ro_st = put_status(s, peer, forged, 32, p77);
        std::fprintf(stderr, "window, put into read-only: %s\n", regpool::to_string(ro_st));
        RPT_CHECK(ro_st == Status::bad_key);
        RPT_CHECK(recover(s, peer));

        // Rights: a get from the write-only window.
        if (have_wo) {
          const RemoteRef wo = ref_at(4);
          RPT_CHECK(put_status(s, peer, wo, 0, p55) == Status::ok);
          forged = wo;
          forged.access = RemoteAccess::read_write;
          const Status wo_st = get_status(s, peer, forged, 0, into);
          std::fprintf(stderr, "window, get from write-only: %s\n", regpool::to_string(wo_st));
          RPT_CHECK(wo_st == Status::bad_key);
          RPT_CHECK(recover(s, peer));
        }

        // Bounds: 16 bytes right past the window (inside the object; the
        // reference's length is a lie).
        forged = rw;
        forged.length += kWinLen;
        const Status past_win = put_status(s, peer, forged, kWinLen, p55);
        std::fprintf(stderr, "window (over the arena MR), put past its end: %s\n", regpool::to_string(past_win));
        RPT_CHECK(past_win == Status::ok || past_win == Status::bad_key);
        RPT_CHECK(recover(s, peer));
        // ... and past the end of the arena's MR through the same window.
        forged = rw;
        forged.length = arena_past.address + arena_past.length - rw.address;
        const std::uint64_t mr_end = arena_past.address + arena_past.length - 4096 - rw.address;
        const Status past_mr = put_status(s, peer, forged, mr_end, p77);
        std::fprintf(stderr, "window, put past the end of the MR: %s\n", regpool::to_string(past_mr));
        RPT_CHECK(past_mr == Status::bad_key);
        RPT_CHECK(recover(s, peer));

        // The arena's rkey: any byte of the MR, nothing outside it, any key
        // tag other than the MR's refused.
        const Status arena_in = put_status(s, peer, arena_obj, kArenaPutOff, p55);
        std::fprintf(stderr, "arena rkey, put outside every window: %s\n", regpool::to_string(arena_in));
        RPT_CHECK(arena_in == Status::ok);
        forged = arena_obj;
        forged.key ^= 0x01;
        const Status arena_key = put_status(s, peer, forged, 48, p77);
        std::fprintf(stderr, "arena rkey, other key tag: %s\n", regpool::to_string(arena_key));
        RPT_CHECK(arena_key == Status::bad_key);
        RPT_CHECK(recover(s, peer));
        const Status arena_past_st = put_status(s, peer, arena_past, arena_past.length - 4096, p77);
        std::fprintf(stderr, "arena rkey, put past the MR: %s\n", regpool::to_string(arena_past_st));
        RPT_CHECK(arena_past_st == Status::bad_key);
        RPT_CHECK(recover(s, peer));
        const std::vector<std::byte> landed{static_cast<std::byte>(past_win == Status::ok)};
        (void)b->allgather(landed, 30s);  // phase 1 done

        // Revocation.
        (void)b->allgather({}, 30s);  // the target has revoked rw
        const Status revoked = put_status(s, peer, rw, 64, p77);
        std::fprintf(stderr, "window, put after revoke: %s\n", regpool::to_string(revoked));
        RPT_CHECK(revoked == Status::bad_key);
        RPT_CHECK(recover(s, peer));
        (void)b->allgather({}, 30s);  // phase 2 done

        // Late put after free and reuse of the address.
        const RemoteRef x = rpt::decode_or_die(b->allgather({}, 30s)[0]);
        RPT_CHECK(put_status(s, peer, x, 0, p55) == Status::ok);
        (void)b->allgather({}, 30s);  // put to X done
        const RemoteRef y = rpt::decode_or_die(b->allgather({}, 30s)[0]);  // X revoked, freed; Y exposed
        RPT_CHECK(put_status(s, peer, y, 8, p77) == Status::ok);
        const Status late = put_status(s, peer, x, 0, p55);
        std::fprintf(stderr, "late put with the freed object's key: %s\n", regpool::to_string(late));
        RPT_CHECK(late == Status::bad_key);
        RPT_CHECK(recover(s, peer));
        (void)b->allgather({}, 30s);  // phase 3 done
        return 0;
      },
      240);

  rpt::Stack s("verbs", cfg());  // default options: standard windows over the arena's MR
  auto names = boot->allgather(s.ep->name(), 20s);
  const auto peer = s.ep->insert_peer(names[1]);
  auto obj = s.alloc(kObj);
  rpt::fill(obj.data(), 9);
  std::vector<std::byte> expect(obj.data().begin(), obj.data().end());
  auto window = [&](std::uint64_t off, RemoteAccess a) {
    return s.ep->expose(rpt::slice_or_die(Slice::data(obj, off, kWinLen)), a, peer);
  };
  auto rw = window(kRwOff, RemoteAccess::read_write);
  REQUIRE(rw.ok());
  auto ro = window(kRoOff, RemoteAccess::read_only);
  REQUIRE(ro.ok());
  auto wo = window(kWoOff, RemoteAccess::write_only);
  if (!wo.ok()) {
    // The base endpoint of this build does not take write_only yet.
    WARN("write_only exposure refused by the endpoint (" << regpool::to_string(wo.status())
                                                         << "): the write-only check is skipped");
    REQUIRE(wo.status() == Status::invalid_argument);
  }
  auto region = obj.region(*s.domain);
  REQUIRE(region.ok());
  REQUIRE(region->registration != nullptr);
  const regpool::Registration& mr = *region->registration;
  RemoteRef arena_obj;  // what a standard exposure without a peer reuses: the arena's key
  arena_obj.backend = regpool::Backend::verbs;
  arena_obj.access = RemoteAccess::read_write;
  arena_obj.key = mr.remote_key();
  arena_obj.address = reinterpret_cast<std::uintptr_t>(obj.data().data());
  arena_obj.length = kObj;
  arena_obj.exposure_id = 1;
  RemoteRef arena_past = arena_obj;  // 4 KiB past the MR's end
  arena_past.address = reinterpret_cast<std::uintptr_t>(mr.base());
  arena_past.length = mr.length() + 4096;
  std::vector<std::byte> blob;
  append(blob, rw->ref());
  append(blob, ro->ref());
  append(blob, arena_obj);
  append(blob, arena_past);
  if (wo.ok()) append(blob, wo->ref());
  (void)boot->allgather(blob, 30s);

  auto phase1 = boot->allgather({}, 120s);  // phase 1 done
  REQUIRE(phase1.size() == 2);
  REQUIRE(phase1[1].size() == 1);
  const bool past_window_landed = phase1[1][0] != std::byte{0};
  std::printf("rxe window over the arena MR enforces its own bounds: %s\n", past_window_landed ? "no" : "yes");
  {
    std::vector<std::byte> p55(16), p77(16);
    rpt::fill(p55, 55);
    rpt::fill(p77, 77);
    std::memcpy(expect.data() + kRwOff, p55.data(), 16);                      // legal put
    if (wo.ok()) std::memcpy(expect.data() + kWoOff, p55.data(), 16);         // legal put
    if (past_window_landed) std::memcpy(expect.data() + kRwOff + kWinLen, p55.data(), 16);
    std::memcpy(expect.data() + kArenaPutOff, p55.data(), 16);                // arena key, no bounds
    // Nothing of the refused puts (pattern 77) landed anywhere.
    CHECK(std::memcmp(obj.data().data(), expect.data(), kObj) == 0);
  }
  rw->revoke();
  (void)boot->allgather({}, 30s);   // revoked
  (void)boot->allgather({}, 60s);   // phase 2 done
  CHECK(std::memcmp(obj.data().data(), expect.data(), kObj) == 0);

  // Expose X (a fresh window after the resets above), revoke it, free X,
  // allocate Y at the same address and expose it: the recycled window
  // comes back with the next key tag.
  auto expose_all = [&](const regpool::Ldo& l) {
    auto e = s.ep->expose(rpt::slice_or_die(Slice::data(l)), RemoteAccess::read_write, peer);
    for (auto until = std::chrono::steady_clock::now() + 20s;
         !e.ok() && (e.status() == Status::would_block || e.status() == Status::peer_unreachable) &&
         std::chrono::steady_clock::now() < until;) {
      if (e.status() == Status::peer_unreachable) (void)s.ep->reconnect(peer);
      s.ep->progress_for(10ms);
      e = s.ep->expose(rpt::slice_or_die(Slice::data(l)), RemoteAccess::read_write, peer);
    }
    return e;
  };
  auto x = s.alloc(4096);
  const auto* x_addr = x.data().data();
  auto wx = expose_all(x);
  REQUIRE(wx.ok());
  const RemoteRef xref = wx->ref();
  (void)boot->allgather(rpt::encoded(*wx), 30s);
  (void)boot->allgather({}, 30s);  // the child's legal put to X is done
  wx->revoke();
  x = regpool::Ldo{};
  auto y = s.alloc(4096);
  std::printf("new object at the freed object's address: %s\n", y.data().data() == x_addr ? "yes" : "no");
  CHECK(y.data().data() == x_addr);
  rpt::fill(y.data(), 5);
  std::vector<std::byte> expect_y(y.data().begin(), y.data().end());
  auto wy = expose_all(y);
  REQUIRE(wy.ok());
  // The same window (index), rebound with the next tag.
  CHECK((wy->ref().key >> 8) == (xref.key >> 8));
  CHECK(wy->ref().key != xref.key);
  auto* v = dynamic_cast<regpool::VerbsEndpoint*>(s.ep.get());
  REQUIRE(v);
  CHECK(v->window_stats().reused >= 1);
  (void)boot->allgather(rpt::encoded(*wy), 30s);
  (void)boot->allgather({}, 60s);  // phase 3 done
  std::vector<std::byte> p77(16);
  rpt::fill(p77, 77);
  std::memcpy(expect_y.data() + 8, p77.data(), 16);
  CHECK(std::memcmp(y.data().data(), expect_y.data(), 4096) == 0);
  CHECK(rpt::reap(kid, 30s) == 0);
}
