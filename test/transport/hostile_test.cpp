// Hostile peers against FabricEndpoint, on shm and tcp (tcp;ofi_rxm) on
// loopback: names that lie about their lengths or end at an unmapped page,
// garbage sent to an emulating target's control endpoint, and the tcp
// failure modes that used to leave a peer's state untruthful (an oversized
// message, a put with a revoked key). Every byte a peer sends is an input
// here; the assertions are on the status, the message naming the bad field,
// the survival of the target and the correctness of honest peers.

#include <sys/mman.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "transport/fabric_wire.hpp"
#include "support/guard_page.hpp"
#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::Completion;
using regpool::RemoteAccess;
using regpool::RemoteRef;
using regpool::Slice;
using regpool::Status;
namespace fw = regpool::fabric_wire;

namespace {

regpool::EndpointConfig target_config() {
  regpool::EndpointConfig c;
  c.progress_thread = true;
  c.progress_idle_sleep = 0us;
  return c;
}

// The Error insert_peer throws for `name`, or nullopt-like empty status.
struct Refusal {
  bool thrown = false;
  Status status = Status::ok;
  std::string what;
};
Refusal try_insert(regpool::Endpoint& ep, std::span<const std::byte> name) {
  Refusal r;
  try {
    (void)ep.insert_peer(name);
  } catch (const regpool::Error& e) {
    r.thrown = true;
    r.status = e.status();
    r.what = e.what();
  }
  return r;
}

void set_u16(std::vector<std::byte>& b, std::size_t at, std::size_t v) {
  b[at] = static_cast<std::byte>(v & 0xff);
  b[at + 1] = static_cast<std::byte>(v >> 8);
}
std::size_t data_len_of(const std::vector<std::byte>& n) {
  return static_cast<std::size_t>(n[4]) | (static_cast<std::size_t>(n[5]) << 8);
}


struct NameCase {
  std::string label;
  std::vector<std::byte> name;
  std::string field;  // must appear in the message
};

std::vector<NameCase> name_cases(const std::string& prov, const std::vector<std::byte>& good) {
  std::vector<NameCase> c;
  const std::size_t dl = data_len_of(good);
  // Where the addresses start: after the message limit field when there is
  // one (net).
  const std::size_t at = fw::kNameHeader + ((good[3] & std::byte{fw::kNameLimit}) != std::byte{0} ? fw::kNameLimitField : 0);
  c.push_back({"header only, 3 bytes", {good.begin(), good.begin() + 3}, "name length"});
  c.push_back({"truncated by one byte", {good.begin(), good.end() - 1}, "fields do not add up"});
  auto m = good;
  m[0] = std::byte{'X'};
  c.push_back({"wrong magic", m, "name magic"});
  m = good;
  m[2] = std::byte{7};
  c.push_back({"wrong version", m, "name version"});
  m = good;
  m[2] = std::byte{1};  // the format before the control endpoint became optional
  c.push_back({"version 1 (an older regpool)", m, "name version (1"});
  m = good;
  m[3] = std::byte{fw::kNameHasCtrl};  // a control address, but native atomics
  c.push_back({"control flag without emulation", m, "name flags (control address without emulated atomics)"});
  m = good;
  m[3] = std::byte{0x80};
  c.push_back({"unknown flag", m, "name flags"});
  m = good;
  set_u16(m, 4, dl + 1);
  c.push_back({"data length one too long", m, "fields do not add up"});
  m = good;
  set_u16(m, 4, 0xffff);
  c.push_back({"data length 65535", m, "fields do not add up"});
  // Lengths that add up but describe no address of this provider.
  {
    // The same flags, without a message limit field (net's names have one).
    const std::byte no_limit = good[3] & ~std::byte{fw::kNameLimit};
    std::vector<std::byte> b = {std::byte{'R'}, std::byte{'P'}, std::byte{fw::kNameVersion}, no_limit, std::byte{2}, std::byte{0},
                                std::byte{0},   std::byte{0}};
    const bool ctrl = (static_cast<unsigned>(good[3]) & 1) != 0;
    if (ctrl) b[6] = std::byte{1};
    b.push_back(std::byte{2});
    b.push_back(std::byte{0});
    if (ctrl) b.push_back(std::byte{0});
    // tcp: this is the 11-byte reproducer (data length 2, control length 1).
    c.push_back({"2-byte data address", b, "address"});
  }
  if (prov == "shm") {
    // The real name without its final NUL (lengths adjusted to agree).
    m = good;
    m.erase(m.begin() + static_cast<std::ptrdiff_t>(at + dl - 1));
    set_u16(m, 4, dl - 1);
    c.push_back({"shm name without its NUL", m, "not NUL-terminated"});
    m = good;
    m[at + 2] = std::byte{'X'};  // "fi_Xhm://..."
    c.push_back({"foreign scheme", m, "address scheme"});
    m = good;
    m[at + dl - 2] = std::byte{'/'};
    c.push_back({"slash in the shm name", m, "unexpected character"});
    m = good;
    m[at + dl - 3] = std::byte{0};
    c.push_back({"NUL inside the shm name", m, "unexpected character"});
  } else {
    m = good;
    m[at] = std::byte{0x34};
    c.push_back({"address family", m, "address family"});
    m = good;
    m[at + 2] = std::byte{0};
    m[at + 3] = std::byte{0};
    c.push_back({"port 0", m, "address port"});
    m = good;
    m[at + 12] = std::byte{1};
    c.push_back({"sin_zero not zero", m, "address padding"});
    m = good;  // control address 17 bytes, data 15: lengths add up
    set_u16(m, 4, dl - 1);
    set_u16(m, 6, data_len_of(good) == 16 ? 17 : 17);
    c.push_back({"address lengths shifted", m, "address length"});
    m = good;
    m[3] = good[3] & std::byte{fw::kNameLimit};  // native atomics, the limit kept
    set_u16(m, 6, 0);
    m.resize(at + dl);
    c.push_back({"control address missing", m, "unsupported"});
  }
  if (at != fw::kNameHeader) {
    // net: the message limit senders must respect.
    m = good;
    m[fw::kNameHeader] = std::byte{0xff};
    m[fw::kNameHeader + 1] = std::byte{0x0f};
    m[fw::kNameHeader + 2] = std::byte{0};
    m[fw::kNameHeader + 3] = std::byte{0};
    c.push_back({"message limit 4095", m, "message limit (below 4 KiB)"});
    m = good;
    m[3] = good[3] & ~std::byte{fw::kNameLimit};
    c.push_back({"message limit without its flag", m, "fields do not add up"});
  }
  return c;
}

}  // namespace

TEST_CASE("malformed peer names are refused, naming the field, without a crash", "[fabric]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  rpt::Stack a(prov);
  rpt::Stack b(prov);
  const auto good = b.ep->name();
  REQUIRE(good.size() > fw::kNameHeader);
  for (const NameCase& nc : name_cases(prov, good)) {
    INFO("case: " << nc.label);
    // Every case sits right before a PROT_NONE page: a parser or provider
    // reading one byte too far faults here instead of passing by luck.
    rpt::AtGuardPage g(nc.name);
    const Refusal r = try_insert(*a.ep, g.bytes());
    INFO("message: " << r.what);
    REQUIRE(r.thrown);
    if (nc.field == "unsupported") {
      CHECK(r.status == Status::unsupported);
      CHECK(r.what.find("atomics") != std::string::npos);
    } else {
      CHECK(r.status == Status::malformed);
      CHECK(r.what.find(nc.field) != std::string::npos);
      CHECK(r.what.find("remote reference") == std::string::npos);
    }
  }
  CHECK(a.ep->peer_count() == 0);
  // The checks refuse nothing real: the genuine name, also at a page end.
  rpt::AtGuardPage g(good);
  const auto peer = a.ep->insert_peer(g.bytes());
  CHECK(a.ep->usable(peer));
  CHECK(a.ep->peer_count() == 1);
}

TEST_CASE("Status::malformed no longer claims to be about remote references", "[fabric]") {
  CHECK(std::string(regpool::to_string(Status::malformed)).find("remote reference") == std::string::npos);
}

// ------------------------------------------------------------------ control messages

namespace {

// A bare libfabric RDM endpoint on tcp: what an attacker uses to put any
// bytes it likes into an emulating target's control endpoint.
class RawTcp {
 public:
  RawTcp() {
    ::setenv("FI_TCP_IFACE", "lo", 0);
    fi_info* hints = fi_allocinfo();
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->fabric_attr->prov_name = ::strdup("tcp");
    int rc = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, FI_SOURCE, hints, &info_);
    fi_freeinfo(hints);
    if (rc != 0) throw std::runtime_error("raw: fi_getinfo");
    fi_av_attr aa{};
    aa.type = FI_AV_TABLE;
    fi_cq_attr ca{};
    ca.format = FI_CQ_FORMAT_CONTEXT;
    if (fi_fabric(info_->fabric_attr, &fabric_, nullptr) != 0 || fi_domain(fabric_, info_, &domain_, nullptr) != 0 ||
        fi_av_open(domain_, &aa, &av_, nullptr) != 0 || fi_cq_open(domain_, &ca, &cq_, nullptr) != 0 ||
        fi_endpoint(domain_, info_, &ep_, nullptr) != 0 || fi_ep_bind(ep_, &av_->fid, 0) != 0 ||
        fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV) != 0 || fi_enable(ep_) != 0) {
      throw std::runtime_error("raw: endpoint setup");
    }
  }
  ~RawTcp() {
    if (ep_) fi_close(&ep_->fid);
    if (cq_) fi_close(&cq_->fid);
    if (av_) fi_close(&av_->fid);
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    if (info_) fi_freeinfo(info_);
  }
  RawTcp(const RawTcp&) = delete;
  RawTcp& operator=(const RawTcp&) = delete;

  fi_addr_t insert(std::span<const std::byte> addr) {
    std::vector<std::byte> copy(addr.begin(), addr.end());
    copy.resize(256);
    fi_addr_t a = FI_ADDR_NOTAVAIL;
    if (fi_av_insert(av_, copy.data(), 1, &a, 0, nullptr) != 1) throw std::runtime_error("raw: av insert");
    return a;
  }
  // Sends and waits for the local completion (ok or error); false on
  // timeout.
  bool send(fi_addr_t to, std::span<const std::byte> bytes, std::chrono::milliseconds bound = 10s) {
    buf_.assign(bytes.begin(), bytes.end());
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (;;) {
      const ssize_t rc = fi_send(ep_, buf_.data(), buf_.size(), nullptr, to, &ctx_);
      if (rc == 0) break;
      if (rc != -FI_EAGAIN || std::chrono::steady_clock::now() > deadline) return false;
      fi_cq_entry e[4];
      (void)fi_cq_read(cq_, e, 4);
    }
    while (std::chrono::steady_clock::now() < deadline) {
      fi_cq_entry e[4];
      const ssize_t got = fi_cq_read(cq_, e, 4);
      if (got > 0) return true;
      if (got == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        (void)fi_cq_readerr(cq_, &err, 0);
        return true;
      }
    }
    return false;
  }
  std::vector<std::byte> own_name() {
    std::vector<std::byte> n(256);
    std::size_t len = n.size();
    if (fi_getname(&ep_->fid, n.data(), &len) != 0) throw std::runtime_error("raw: getname");
    n.resize(len);
    return n;
  }

 private:
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  fi_context2 ctx_{};
  std::vector<std::byte> buf_;
};

std::vector<std::byte> msg_bytes(const fw::CtrlMsg& m) {
  const auto* p = reinterpret_cast<const std::byte*>(&m);
  return {p, p + sizeof m};
}

fw::CtrlMsg request(std::span<const std::byte> reply_name, const RemoteRef& ref, std::uint64_t token) {
  fw::CtrlMsg m{};
  m.magic = fw::kCtrlMagic;
  m.type = fw::kCtrlRequest;
  m.op = fw::kOpFetchAdd;
  m.name_len = static_cast<std::uint8_t>(reply_name.size());
  std::memcpy(m.name, reply_name.data(), reply_name.size());
  m.index = 0;
  m.token = token;
  m.key = ref.key;
  m.address = ref.address;
  m.operand = 1000000;  // would be visible in the honest peers' sums
  return m;
}

constexpr std::size_t kBound = 16;       // target's max_reply_peers
constexpr std::size_t kFlood = 3 * kBound;
constexpr std::uint64_t kHonestOps = 200;

}  // namespace

TEST_CASE("garbage control messages neither kill an emulating target nor disturb honest peers", "[fabric]") {
  // Emulated atomics run on tcp (rxm has no FI_ATOMIC of its own core).
  auto boot = rpt::root_bootstrap(3);
  const auto port = boot->port();

  // Attacker: raw libfabric, never a regpool endpoint.
  auto attacker = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port, 1, 3);
        auto parts = regpool::unpack_blobs(b->allgather({}, 20s)[0]);
        const RemoteRef ref = rpt::decode_or_die(parts[1]);
        const auto& name = parts[0];
        // The control address ends the name (after the header, the message
        // limit field that tcp;ofi_rxm's names carry, and the data address).
        const std::size_t cl = static_cast<std::size_t>(name[6]) | (static_cast<std::size_t>(name[7]) << 8);
        const std::span<const std::byte> ctrl_addr(name.data() + name.size() - cl, cl);
        RawTcp raw;
        const auto target = raw.insert(ctrl_addr);
        const auto mine = raw.own_name();
        std::uint64_t token = 1;
        int sent = 0;
        auto fire = [&](const fw::CtrlMsg& m) {
          RPT_CHECK(raw.send(target, msg_bytes(m)));
          ++sent;
          return 0;
        };
        // A reply address claiming 200 bytes.
        auto m = request(mine, ref, token++);
        m.name_len = 200;
        if (int rc = fire(m)) return rc;
        // Unknown op.
        m = request(mine, ref, token++);
        m.op = 9;
        if (int rc = fire(m)) return rc;
        // Not an address at all.
        const std::byte bogus[16] = {std::byte{0x34}, std::byte{0x12}, std::byte{1}};
        m = request(bogus, ref, token++);
        if (int rc = fire(m)) return rc;
        // Bad magic, unknown type, reply with an index beyond any slot, a
        // forged reply to nothing.
        m = request(mine, ref, token++);
        m.magic = 0;
        if (int rc = fire(m)) return rc;
        m.magic = fw::kCtrlMagic;
        m.type = 7;
        if (int rc = fire(m)) return rc;
        fw::CtrlMsg rep{};
        rep.magic = fw::kCtrlMagic;
        rep.type = fw::kCtrlReply;
        rep.op = fw::kOpFetchAdd;
        rep.index = 0xfffffff0u;
        rep.token = 5;
        if (int rc = fire(rep)) return rc;
        rep.index = 0;
        if (int rc = fire(rep)) return rc;
        // A short message.
        RPT_CHECK(raw.send(target, std::span<const std::byte>(msg_bytes(rep)).first(40)));
        ++sent;
        // A flood of valid-looking requests with made-up reply addresses
        // (loopback ports nobody listens on), well beyond the target's table.
        for (std::size_t i = 0; i < kFlood; ++i) {
          std::vector<std::byte> fake = mine;
          const std::uint16_t p = static_cast<std::uint16_t>(20000 + i);
          fake[2] = static_cast<std::byte>(p >> 8);
          fake[3] = static_cast<std::byte>(p & 0xff);
          auto f = request(fake, ref, token++);
          f.operand = 0;  // applied (the key is real) but changes nothing
          if (int rc = fire(f)) return rc;
        }
        (void)b->allgather(rpt::pod_bytes(static_cast<std::uint64_t>(sent)), 60s);
        (void)b->allgather({}, 120s);
        return 0;
      },
      240);

  // Honest peer: a regpool endpoint doing fetch_add after the attack.
  auto honest = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port, 2, 3);
        rpt::Stack s("tcp;ofi_rxm");
        auto parts = regpool::unpack_blobs(b->allgather({}, 20s)[0]);
        const auto peer = s.ep->insert_peer(parts[0]);
        const RemoteRef ref = rpt::decode_or_die(parts[1]);
        (void)b->allgather({}, 60s);  // attack done
        std::uint64_t last = 0;
        for (std::uint64_t i = 0; i < kHonestOps; ++i) {
          const Completion c = rpt::wait_ok(*s.ep, s.ep->fetch_add(peer, ref, 0, 1));
          if (c.status != Status::ok) std::fprintf(stderr, "honest fetch_add %llu: %s\n", (unsigned long long)i, regpool::to_string(c.status));
          RPT_CHECK(c.status == Status::ok);
          RPT_CHECK(i == 0 || c.value == last + 1);
          last = c.value;
        }
        RPT_CHECK(s.ep->usable(peer));
        (void)b->allgather({}, 120s);
        return 0;
      },
      240);

  regpool::FabricEndpointOptions fo;
  fo.control_slots = 8;
  fo.max_reply_peers = kBound;
  fo.atomics = regpool::FabricEndpointOptions::Atomics::emulated;
  fo.emulated_atomics = regpool::FabricEndpointOptions::EmulatedAtomics::serve;
  auto dom = regpool::FabricDomain::open(rpt::fabric_config("tcp;ofi_rxm"));
  auto ep = regpool::FabricEndpoint::open(dom, target_config(), fo);
  regpool::PoolConfig pc;
  pc.arena_size = 4u << 20;
  regpool::Pool pool({dom}, pc);
  auto obj = pool.allocate(64);
  REQUIRE(obj.ok());
  auto word = rpt::slice_or_die(Slice::data(*obj, 0, 8));
  std::memset(word.address(), 0, 8);
  auto e = ep->expose(word, RemoteAccess::read_write);
  REQUIRE(e.ok());
  (void)boot->allgather(regpool::pack_blobs({ep->name(), rpt::encoded(*e)}), 20s);
  const auto sent = rpt::from_bytes<std::uint64_t>(boot->allgather({}, 60s)[1]);
  // The honest peer runs now, after the whole attack was delivered.
  (void)boot->allgather({}, 120s);
  std::uint64_t value = 0;
  std::memcpy(&value, word.address(), 8);
  const auto st = ep->control_stats();
  INFO("served " << st.served << " rejected " << st.rejected << " reply peers " << st.reply_peers << " evictions "
                 << st.reply_evictions << " sent " << sent);
  CHECK(ep->usable());
  CHECK(value == kHonestOps);  // no garbage request changed the word
  CHECK(st.rejected >= 8);     // every malformed message was counted
  CHECK(st.reply_peers <= kBound);
  CHECK(st.reply_evictions >= kFlood - kBound);
  CHECK(st.served >= kHonestOps);
  CHECK(rpt::reap(attacker, 60s) == 0);
  CHECK(rpt::reap(honest, 60s) == 0);
}

// ------------------------------------------------------------------ tcp failure modes

namespace {
// All eager on rxm (which refuses longer sends: its advertised limit is its
// eager limit); on net the last two used to stall the connection (longer
// than the receive + a 64 KiB overflow area). Sizes above the receiver's
// advertised limit are left to the "above the receiver's advertised limit"
// case.
constexpr std::uint64_t kOversized[] = {100, 4096, 16384, 70000, std::uint64_t{1} << 20};
constexpr std::uint64_t kSmall = 32;
// The limit the receiver of the "above the limit" case advertises, and
// what its sender tries: one byte more, then exactly the limit.
constexpr std::uint64_t kLimit = std::uint64_t{64} << 10;
constexpr std::uint64_t kRecvLen = 64;
constexpr int kFollowers = 3;
}  // namespace

namespace {
// The sender's side of one oversized message: `big` bytes, then
// kFollowers small ones the receiver checks. 0, or a child exit code.
int send_oversized_then_followers(rpt::Stack& s, regpool::PeerId peer, regpool::Ldo& buf, std::uint64_t big) {
  const Completion c = rpt::wait_ok(*s.ep, s.ep->send(peer, rpt::slice_or_die(Slice::data(buf, 0, big))), 20s);
  RPT_CHECK(c.status == Status::ok);
  for (int i = 0; i < kFollowers; ++i) {
    auto m = rpt::slice_or_die(Slice::data(buf, 0, kSmall));
    rpt::fill(m.bytes(), big + static_cast<std::uint64_t>(i));
    RPT_CHECK(rpt::wait_ok(*s.ep, s.ep->send(peer, m), 20s).status == Status::ok);
  }
  RPT_CHECK(s.ep->usable(peer));
  return 0;
}

// The receiver's side: the oversized message fails its own receive (never
// more than the slice reported), and the followers arrive whole.
void expect_oversized_then_followers(rpt::Stack& s, regpool::TcpBootstrap& boot, regpool::Ldo& slots,
                                     std::uint64_t big) {
  INFO("oversized message of " << big << " bytes into " << kRecvLen);
  std::vector<regpool::Token> toks;
  for (int i = 0; i <= kFollowers; ++i) {
    auto t = s.ep->post_recv(rpt::slice_or_die(Slice::data(slots, kRecvLen * static_cast<std::uint64_t>(i), kRecvLen)));
    REQUIRE(t.ok());
    toks.push_back(*t);
  }
  (void)boot.allgather({}, 20s);
  const Completion first = s.ep->wait(toks[0], 20s);
  CHECK(first.status == Status::out_of_bounds);
  CHECK(first.bytes == kRecvLen);  // never more than the slice
  for (int i = 1; i <= kFollowers; ++i) {
    INFO("follower " << i);
    const Completion c = s.ep->wait(toks[static_cast<std::size_t>(i)], 20s);
    CHECK(c.status == Status::ok);  // the channel survived
    CHECK(c.bytes == kSmall);
    std::vector<std::byte> want(kSmall);
    rpt::fill(want, big + static_cast<std::uint64_t>(i - 1));
    CHECK(std::memcmp(slots.data().data() + kRecvLen * static_cast<std::uint64_t>(i), want.data(), kSmall) == 0);
  }
}

void oversized_case(const std::string& prov) {
  INFO("backend " << prov);
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov);
        const auto peer = s.ep->insert_peer(b->allgather({}, 20s)[0]);
        auto buf = s.alloc(1 << 20);
        for (std::uint64_t big : kOversized) {
          if (big > rpt::incoming_limit(prov)) continue;
          (void)b->allgather({}, 20s);  // receives are posted
          if (const int rc = send_oversized_then_followers(s, peer, buf, big); rc != 0) return rc;
        }
        (void)b->allgather({}, 60s);
        return 0;
      },
      120);
  rpt::Stack s(prov);
  auto slots = s.alloc(kRecvLen * (kFollowers + 1));
  (void)boot->allgather(s.ep->name(), 20s);
  for (std::uint64_t big : kOversized) {
    if (big <= rpt::incoming_limit(prov)) expect_oversized_then_followers(s, *boot, slots, big);
  }
  (void)boot->allgather({}, 60s);
  CHECK(rpt::reap(kid, 30s) == 0);
}

}  // namespace

TEST_CASE("tcp, net: an oversized message fails its own receive and nothing else", "[fabric]") {
  for (const std::string& prov : rpt::backends()) {
    if (rpt::over_sockets(prov)) oversized_case(prov);
  }
}

namespace {
// A receiver asking for kLimit: where a limit is advertised (net: kLimit;
// tcp;ofi_rxm: its eager limit) a send of limit + 1 is refused by the
// sender (message_too_large, nothing sent) and the connection carries on;
// one of exactly the limit fails only its receive. Elsewhere no limit is
// advertised and kLimit + 1 fails only its receive too.
void above_limit_case(const std::string& prov) {
  INFO("backend " << prov);
  const bool limited = rpt::advertises_message_limit(prov);
  const std::uint64_t limit = limited ? rpt::incoming_limit(prov, kLimit) : kLimit;
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov);
        const auto peer = s.ep->insert_peer(b->allgather({}, 20s)[0]);
        auto buf = s.alloc(limit + 1);
        (void)b->allgather({}, 20s);  // receives are posted
        if (limited) {
          const auto r = s.ep->send(peer, rpt::slice_or_die(Slice::data(buf, 0, limit + 1)));
          RPT_CHECK(!r.ok() && r.status() == Status::message_too_large);
          RPT_CHECK(s.ep->usable(peer));
          if (const int rc = send_oversized_then_followers(s, peer, buf, limit); rc != 0) return rc;
        } else if (const int rc = send_oversized_then_followers(s, peer, buf, limit + 1); rc != 0) {
          return rc;
        }
        (void)b->allgather({}, 60s);
        return 0;
      },
      120);
  rpt::Stack s(prov, {}, std::size_t{16} << 20, kLimit);
  auto slots = s.alloc(kRecvLen * (kFollowers + 1));
  (void)boot->allgather(s.ep->name(), 20s);
  expect_oversized_then_followers(s, *boot, slots, limited ? limit : limit + 1);
  (void)boot->allgather({}, 60s);
  CHECK(rpt::reap(kid, 30s) == 0);
}
}  // namespace

TEST_CASE("tcp, net: a send above the receiver's advertised limit never reaches the connection", "[fabric]") {
  for (const std::string& prov : rpt::backends()) {
    if (rpt::over_sockets(prov)) above_limit_case(prov);
  }
}

namespace {
// tcp;ofi_rxm closes the connection on a refused key (the peer is broken
// until reconnect); net fails the put alone and the peer stays usable.
void revoked_key_case(const std::string& prov) {
  INFO("backend " << prov);
  const bool breaks = rpt::key_refusal_breaks_connection(prov);
  constexpr int kRounds = 3;
  constexpr int kAfter = 2;
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        rpt::Stack s(prov, target_config());
        auto obj = s.alloc(8192);
        auto keep = s.ep->expose(rpt::slice_or_die(Slice::data(obj, 4096, 1024)), RemoteAccess::read_write);
        RPT_CHECK(keep.ok());
        auto rbuf = s.alloc(64);
        std::vector<regpool::Token> toks;
        for (int i = 0; i < kRounds * kAfter; ++i) toks.push_back(*s.ep->post_recv(rpt::slice_or_die(Slice::data(rbuf))));
        (void)b->allgather(regpool::pack_blobs({s.ep->name(), rpt::encoded(*keep)}), 20s);
        for (int r = 0; r < kRounds; ++r) {
          auto gone = s.ep->expose(rpt::slice_or_die(Slice::data(obj, 0, 1024)), RemoteAccess::read_write,
                                  regpool::ExposureMode::scoped);
          RPT_CHECK(gone.ok());
          const auto ref = rpt::encoded(*gone);
          gone->revoke();
          (void)b->allgather(ref, 20s);
          (void)b->allgather({}, 60s);  // round done
        }
        int got = 0;
        for (auto t : toks) got += s.ep->wait(t, 5s).status == Status::ok ? 1 : 0;
        (void)b->allgather(rpt::pod_bytes(got), 20s);
        return 0;
      },
      120);
  regpool::EndpointConfig ec;
  ec.op_timeout = 10s;
  rpt::Stack s(prov, ec);
  auto parts = regpool::unpack_blobs(boot->allgather({}, 20s)[1]);
  const auto peer = s.ep->insert_peer(parts[0]);
  const RemoteRef keep = rpt::decode_or_die(parts[1]);
  auto src = s.alloc(64);
  auto sl = rpt::slice_or_die(Slice::data(src));
  REQUIRE(rpt::wait_ok(*s.ep, s.ep->put(sl, peer, keep, 0)).status == Status::ok);
  for (int r = 0; r < kRounds; ++r) {
    INFO("round " << r);
    const RemoteRef gone = rpt::decode_or_die(boot->allgather({}, 20s)[1]);
    const Completion bad = rpt::wait_ok(*s.ep, s.ep->put(sl, peer, gone, 0), 20s);
    CHECK(bad.status == Status::bad_key);  // the documented cause, not peer_unreachable
    if (breaks) {
      CHECK_FALSE(s.ep->usable(peer));  // rxm closed the connection: say so
      CHECK(s.ep->put(sl, peer, keep, 0).status() == Status::peer_unreachable);
      CHECK(s.ep->reconnect(peer) == Status::ok);
    }
    CHECK(s.ep->usable(peer));
    for (int i = 0; i < kAfter; ++i) {
      CHECK(rpt::wait_ok(*s.ep, s.ep->send(peer, sl), 20s).status == Status::ok);
      CHECK(rpt::wait_ok(*s.ep, s.ep->put(sl, peer, keep, 0), 20s).status == Status::ok);
    }
    (void)boot->allgather({}, 60s);
  }
  CHECK(rpt::from_bytes<int>(boot->allgather({}, 30s)[1]) == kRounds * kAfter);
  CHECK(rpt::reap(kid, 30s) == 0);
}

}  // namespace

TEST_CASE("tcp, net: a put with a revoked key reports bad_key; tcp breaks the peer until reconnect, net keeps it", "[fabric]") {
  for (const std::string& prov : rpt::backends()) {
    if (rpt::over_sockets(prov)) revoked_key_case(prov);
  }
}

TEST_CASE("tcp, net: a message limit no name can advertise refuses the endpoint, naming where it came from", "[fabric]") {
  for (const std::string& prov : rpt::backends()) {
    if (!rpt::advertises_message_limit(prov)) continue;
    INFO("backend " << prov);
    if (rpt::is_net(prov)) {
      // The caller's option: invalid_argument, at both ends of the range.
      for (const std::uint64_t bad : {std::uint64_t{1024}, std::uint64_t{4} << 30}) {
        INFO("max_incoming_message " << bad);
        try {
          rpt::Stack s(prov, {}, std::size_t{16} << 20, bad);
          FAIL("the endpoint opened");
        } catch (const regpool::Error& e) {
          CHECK(e.status() == Status::invalid_argument);
          CHECK(std::string(e.what()).find("max_incoming_message") != std::string::npos);
        }
      }
      continue;
    }
    // rxm: the limit comes from the environment, so each try runs in a
    // child (the variable must not leak into other cases) and reports 0 on
    // the expected outcome. 8 KiB is advertised; 1 KiB is refused as the
    // site's setting (unsupported), naming the variables.
    for (const char* value : {"8192", "1024"}) {
      INFO("FI_OFI_RXM_EAGER_LIMIT=" << value);
      auto kid = rpt::spawn(
          [&]() -> int {
            ::setenv("FI_OFI_RXM_EAGER_LIMIT", value, 1);
            try {
              rpt::Stack s(prov);
              RPT_CHECK(std::string(value) == "8192");
              RPT_CHECK(s.ep->transfer_traits().incoming_message_limit == 8192);
            } catch (const regpool::Error& e) {
              RPT_CHECK(std::string(value) == "1024");
              RPT_CHECK(e.status() == Status::unsupported);
              RPT_CHECK(std::string(e.what()).find("FI_OFI_RXM_EAGER_LIMIT") != std::string::npos);
            }
            return 0;
          },
          60);
      CHECK(rpt::reap(kid, 60s) == 0);
    }
  }
}
