#include "regpool/verbs_endpoint.hpp"

#include "platform/coarse_clock.hpp"
#include "pool/post_registration.hpp"
#include "transport/idle_release.hpp"
#include "transport/verbs_wire.hpp"

#include <fcntl.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <unordered_map>

namespace regpool {
namespace {

using MonoClock = std::chrono::steady_clock;

static_assert(std::endian::native == std::endian::little,
              "names and control messages are host byte order; big-endian hosts need byte swapping here");

// ---- endpoint name (what insert_peer gets): transport/verbs_wire.hpp ----
using verbs_wire::kNameMagic;
using verbs_wire::kNameSize;
using verbs_wire::kNameVersion;
using verbs_wire::WireName;

// ---- control messages over UD: transport/verbs_wire.hpp ----
using verbs_wire::CtrlMsg;
using verbs_wire::kCtrlSize;
using verbs_wire::kRel;
using verbs_wire::kRelAck;
using verbs_wire::kRelNak;
using verbs_wire::kRep;
using verbs_wire::kReq;
constexpr std::size_t kGrh = 40;  // UD receives start with a GRH
constexpr std::size_t kCtrlSlot = 128;
static_assert(kGrh + kCtrlSize <= kCtrlSlot);
constexpr std::size_t kCtrlRecvs = 32;
constexpr std::size_t kCtrlSends = 32;
constexpr std::uint32_t kQkey = 0x11111111;
constexpr auto kRetransmit = std::chrono::milliseconds(50);
// An idle release the peer does not answer (it is not progressing) is given
// up after this long (at most half of post_timeout) and the connection kept:
// posts to the peer answer would_block meanwhile.
constexpr auto kReleaseBound = std::chrono::milliseconds(1000);
// A connection being reset (see begin_reset) normally ends as soon as
// progress reaps the flushed completions of its old WRs; if some never come
// back (a marker could not be posted behind an unsignalled tail), the reset
// is finished anyway after this long and what is left is answered with
// peer_unreachable.
constexpr auto kResetBound = std::chrono::milliseconds(2000);

// ---- wr_id layout: tag (4 bits) | sequence (36 bits) | index (24 bits) ----
enum Tag : std::uint64_t { kTagOp = 1, kTagFence = 2, kTagInternal = 3, kTagUdSend = 4, kTagUdRecv = 5, kTagRecv = 6 };
constexpr std::uint64_t kSeqMask = (std::uint64_t{1} << 36) - 1;
constexpr std::uint64_t make_wr_id(Tag t, std::uint64_t seq, std::uint32_t index) noexcept {
  return (static_cast<std::uint64_t>(t) << 60) | ((seq & kSeqMask) << 24) | (index & 0xffffffu);
}
constexpr Tag tag_of(std::uint64_t id) noexcept { return static_cast<Tag>(id >> 60); }
constexpr std::uint64_t seq_of(std::uint64_t id) noexcept { return (id >> 24) & kSeqMask; }
constexpr std::uint32_t index_of(std::uint64_t id) noexcept { return static_cast<std::uint32_t>(id & 0xffffffu); }

constexpr std::uint32_t kNone = ~std::uint32_t{0};

// A type-2 window's key is its index (24 bits) and an 8-bit tag the binder
// chooses (ibv_inc_rkey). Rebinding with the next tag makes every earlier
// key of the window stale, but only 255 binds can have tags that differ
// from each other and from the one the window was allocated with; after
// that the window is deallocated instead of recycled, so no key of a
// window ever matches twice.
constexpr std::uint32_t kMaxBindsPerWindow = 255;

// What a window grants, by access.
unsigned window_access_flags(RemoteAccess access) noexcept {
  switch (access) {
    case RemoteAccess::read_only: return IBV_ACCESS_REMOTE_READ;
    case RemoteAccess::write_only: return IBV_ACCESS_REMOTE_WRITE;
    case RemoteAccess::read_write: break;
  }
  return IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
}

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

Status status_from_wc(ibv_wc_status s) noexcept {
  switch (s) {
    case IBV_WC_SUCCESS: return Status::ok;
    case IBV_WC_REM_ACCESS_ERR: return Status::bad_key;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_WR_FLUSH_ERR: return Status::peer_unreachable;
    case IBV_WC_LOC_LEN_ERR: return Status::out_of_bounds;
    case IBV_WC_REM_INV_REQ_ERR: return Status::invalid_argument;
    case IBV_WC_MW_BIND_ERR: return Status::access_denied;
    default: return Status::transport_error;
  }
}

std::uint32_t random_psn(std::mt19937_64& rng) noexcept { return static_cast<std::uint32_t>(rng()) & 0xffffffu; }

}  // namespace

// ----------------------------------------------------------------- state

struct VerbsEndpoint::Conn {
  // resetting: the QP is in ERROR and its old WRs are still coming back
  // flushed (begin_reset); nothing new is posted until finish_reset.
  // released: no QP (not used yet, or given back when idle); the first
  // operation to or from the peer makes one. releasing: connected and idle,
  // a release asked of the peer (kRel); nothing new is posted until it
  // answers or kReleaseBound passes.
  enum class State : std::uint8_t { init, connecting, connected, error, resetting, released, releasing };
  // What finish_reset does once the old WRs are back: stay in INIT (or
  // answer a stashed REQ), connect anew (reconnect), or destroy the QP
  // (remove_peer). Ordered: a later request only ever escalates.
  enum class AfterReset : std::uint8_t { nothing, reconnect, close };
  bool used = false;
  bool inserted = false;  // the user inserted this peer (else accepted from a REQ)
  WireName remote{};
  ibv_qp* qp = nullptr;   // null while released
  ibv_ah* ah = nullptr;  // to the peer's UD QP (kept while released)
  State state = State::released;
  // Uses of the connection, for idle release (transport/idle_release.hpp).
  idle::IdleTimer idle;
  // The number of the QP last released (0 = none): kept in conn_of_qpn so a
  // receive that the peer completed just before the release, and that is
  // still queued in the CQ, is credited to the right peer.
  std::uint32_t released_qpn = 0;
  MonoClock::time_point release_deadline{};  // State::releasing
  std::uint32_t local_psn = 0;
  std::uint32_t remote_qpn = 0;
  std::uint32_t remote_psn = 0;
  std::uint32_t epoch = 0;         // ours, bumped by reconnect
  std::uint32_t remote_epoch = 0;  // the peer's last seen
  MonoClock::time_point next_req{};
  // Reset bookkeeping (State::resetting).
  AfterReset after_reset = AfterReset::nothing;
  std::uint64_t reset_seq = 0;  // last WR of the old connection
  MonoClock::time_point reset_deadline{};
  // A peer's REQ that arrived while resetting: answered by finish_reset.
  bool req_stashed = false;
  std::uint32_t stash_qpn = 0;
  std::uint32_t stash_psn = 0;
  std::uint32_t stash_epoch = 0;
  // WRs with a lower sequence belong to an earlier connection of this QP;
  // a late completion of one is stale.
  std::uint64_t first_seq = 1;

  // remove_peer let go of it: the QP is kept only until its old WRs are
  // back, and a peer connecting again gets a new connection.
  bool closing() const noexcept { return state == State::resetting && after_reset == AfterReset::close; }
  // Send queue bookkeeping: every WR gets seq = ++wr_seq; an RC send queue
  // completes in order, so a completion for seq S retires everything <= S.
  std::uint64_t wr_seq = 0;
  std::uint64_t retired_seq = 0;
  std::uint64_t last_signaled_seq = 0;
  std::uint32_t unsignaled_run = 0;
  bool fence_outstanding = false;
  std::uint64_t fence_seq = 0;
  // wr_seq at housekeeping's last timer sweep: a tail of injected sends
  // (complete at post, unsignalled) is fenced once a sweep finds it
  // unchanged, i.e. after a tick without posts.
  std::uint64_t swept_seq = 0;
  // Injected sends complete at their post, so no operation's deadline
  // covers their WRs: the last injected WR's sequence, the bytes posted
  // since the queue was last empty, and when housekeeping last saw
  // retired_seq move (swept_retired) or the queue empty. A queue that
  // holds an injected WR and retires nothing until an op's deadline would
  // have passed (deadline_for: op_timeout + the bytes ahead / min_bandwidth)
  // is a dead peer's (rxe reports no error for WRs
  // to one, docs/provider-facts.md): the connection fails.
  std::uint64_t last_inject_seq = 0;
  std::uint64_t unretired_bytes = 0;
  std::uint64_t swept_retired = 0;
  MonoClock::time_point retire_seen{};
  // Listed in Impl::tail_conns (while it may have an unsignalled tail).
  bool tail_listed = false;
  // Posts a signalled zero-length RDMA WRITE behind everything on the send
  // queue (a no-op at the target, IB spec C9-88: no key is checked for zero
  // bytes): its completion retires every WR before it, unsignalled ones
  // included. `ci` is this connection's index.
  bool post_fence(std::uint32_t ci) noexcept {
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    const std::uint64_t seq = wr_seq + 1;
    wr.wr_id = make_wr_id(kTagFence, seq, ci);
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (ibv_post_send(qp, &wr, &bad) != 0) return false;
    wr_seq = seq;
    fence_seq = seq;
    fence_outstanding = true;
    return true;
  }
  // Ring of unsignalled user ops: (seq, slot index).
  std::vector<std::pair<std::uint64_t, std::uint32_t>> ring;
  std::size_t ring_head = 0;
  std::size_t ring_count = 0;
  // Bumped whenever the QP leaves a connection (finish_reset): a window
  // bound in an earlier incarnation is never recycled.
  std::uint64_t incarnation = 0;
  // Windows of this connection that are unbound (their invalidate came back
  // successfully) and can be rebound at once: window and binds so far.
  // At most VerbsEndpointOptions::window_cache; emptied when the QP is
  // reset or the peer removed (drop_window_cache).
  std::vector<std::pair<ibv_mw*, std::uint32_t>> free_windows;
};

struct VerbsEndpoint::Exposed {
  // A window's bind or invalidate still in flight on its QP (wr_id): the
  // base waits for exposure_settled() without the mutex.
  enum class Pending : std::uint8_t { none, bind, invalidate };
  bool live = false;
  Pending pending = Pending::none;
  std::uint64_t wr_id = 0;
  Registration registration;  // WindowBacking::slice: the MR under the window
  ibv_mw* mw = nullptr;
  std::uint32_t rkey = 0;
  std::uint32_t conn = kNone;
  std::uint32_t binds = 0;         // binds of `mw` so far, this one included
  std::uint64_t incarnation = 0;   // of `conn` when bound
};

struct SlotState {
  std::uint64_t post_seq = 0;  // matches wr_id's sequence while live
  std::uint64_t qp_seq = 0;
  std::uint32_t conn = kNone;
  bool live = false;
  bool unsignaled = false;
};

// QP number -> connection index, with the last answer remembered in front
// of the hash map (QP number 0 is never an RC QP's, so 0 means none):
// completions come in runs from one QP, and a hash lookup per completion is
// a visible part of an op under qemu TCG. Every change goes through here,
// so the remembered answer can never outlive its entry.
class QpIndex {
 public:
  // Throws std::bad_alloc (the caller undoes the QP).
  void insert(std::uint32_t qpn, std::uint32_t conn) {
    map_[qpn] = conn;
    hit_qpn_ = 0;
  }
  // Erases qpn's entry, only when it still maps to `conn` if one is given.
  void erase(std::uint32_t qpn, std::uint32_t conn = kNone) noexcept {
    const auto it = map_.find(qpn);
    if (it != map_.end() && (conn == kNone || it->second == conn)) map_.erase(it);
    hit_qpn_ = 0;
  }
  void clear() noexcept {
    map_.clear();
    hit_qpn_ = 0;
  }
  // The connection of QP number qpn, or kNone.
  std::uint32_t find(std::uint32_t qpn) const noexcept {
    if (qpn == hit_qpn_) return hit_conn_;
    const auto it = map_.find(qpn);
    if (it == map_.end()) return kNone;
    hit_qpn_ = qpn;
    hit_conn_ = it->second;
    return it->second;
  }

 private:
  std::unordered_map<std::uint32_t, std::uint32_t> map_;
  mutable std::uint32_t hit_qpn_ = 0;
  mutable std::uint32_t hit_conn_ = 0;
};

struct VerbsEndpoint::Impl {
  ibv_cq* cq = nullptr;
  // Sleeping waits (EndpointConfig::wait_mode sleep/adaptive): the CQ's
  // completion channel, non-blocking, and whether a notification is
  // requested and not yet consumed (see do_arm).
  ibv_comp_channel* channel = nullptr;
  bool notify_armed = false;
  ibv_srq* srq = nullptr;
  ibv_qp* ud = nullptr;
  std::uint32_t sq_depth = 0;
  std::uint8_t rd_atomic = 1;
  std::uint64_t endpoint_id = 0;
  std::mt19937_64 rng{std::random_device{}()};
  std::uint64_t post_seq = 0;
  std::vector<SlotState> slots;
  std::vector<Conn> conns;
  // Connections that have posted an unsignalled op since their ring was
  // last empty: the only ones the fence pass of housekeeping() looks at on
  // every dry poll. Each is listed once (Conn::tail_listed); capacity for
  // every connection is reserved when one is added, so listing never
  // allocates on the post path.
  std::vector<std::uint32_t> tail_conns;
  // The coarse clock's reading at housekeeping()'s last timer sweep.
  MonoClock::time_point last_sweep{};
  // Puts `fresh` in conns[ci] and keeps the slot's place in tail_conns: the
  // fence pass unlists it once its ring is empty, as a fresh one's is.
  void replace_conn(std::uint32_t ci, Conn&& fresh) noexcept {
    const bool listed = conns[ci].tail_listed;
    conns[ci] = std::move(fresh);
    conns[ci].tail_listed = listed;
  }
  // Every receive completion names its QP only by number: this maps it to
  // its connection in O(1) (a scan of conns per completion grew with the
  // number of peers). An entry lives exactly as long as the QP.
  QpIndex conn_of_qpn;
  std::vector<Exposed> exposed;
  // VerbsWindowStats (read from any thread).
  std::atomic<std::uint64_t> mw_allocated{0};
  std::atomic<std::uint64_t> mw_deallocated{0};
  std::atomic<std::uint64_t> mw_binds{0};
  std::atomic<std::uint64_t> mw_reused{0};
  std::atomic<std::uint64_t> mw_cached{0};
  std::uint64_t incarnations = 0;  // source of Conn::incarnation
  idle::Policy idle_policy;
  MonoClock::duration release_bound{};
  // VerbsConnectionStats (read from any thread).
  std::atomic<std::uint64_t> rc_qps{0};
  std::atomic<std::uint64_t> qps_created{0};
  std::atomic<std::uint64_t> qps_released{0};

  // A free (or new) entry of `exposed`, reset. May throw bad_alloc.
  std::size_t claim_exposure_slot() {
    std::size_t slot = 0;
    while (slot < exposed.size() && (exposed[slot].live || exposed[slot].pending != Exposed::Pending::none)) ++slot;
    if (slot == exposed.size()) exposed.emplace_back();
    exposed[slot] = Exposed{};
    return slot;
  }
  // Control buffers: kCtrlRecvs receive slots, then kCtrlSends send slots.
  // (Atomic results go to the base's registered atomic words.)
  std::vector<std::byte> ctrl;
  Registration ctrl_reg;
  std::vector<bool> send_busy;
};

// ----------------------------------------------------------------- setup

VerbsEndpoint::VerbsEndpoint(std::shared_ptr<VerbsDomain> domain, const EndpointConfig& config,
                             const VerbsEndpointOptions& options)
    : Endpoint(config, ExposureSupport{.per_peer = true}),
      domain_(std::move(domain)),
      options_(options),
      impl_(std::make_unique<Impl>()) {
  if (!domain_) throw Error(Status::invalid_argument, 0, "verbs endpoint: null domain");
  try {
    open_resources();
    start();
  } catch (...) {
    shutdown();
    close_resources();
    throw;
  }
}

VerbsEndpoint::~VerbsEndpoint() {
  shutdown();
  close_resources();
}

namespace {

void modify_or_throw(ibv_qp* qp, ibv_qp_attr& a, int mask, const char* what) {
  const int rc = ibv_modify_qp(qp, &a, mask);
  if (rc != 0) throw Error(Status::transport_error, rc, std::string("verbs endpoint: ") + what + ": " + errno_text(rc));
}

ibv_ah_attr ah_attr_for(const VerbsPortInfo& me, const WireName& peer) noexcept {
  ibv_ah_attr ah{};
  ah.dlid = peer.lid;
  ah.sl = 0;
  ah.src_path_bits = 0;
  ah.port_num = me.port;
  if ((peer.flags & 1) != 0 || me.ethernet) {
    ah.is_global = 1;
    std::memcpy(ah.grh.dgid.raw, peer.gid, 16);
    ah.grh.sgid_index = static_cast<std::uint8_t>(me.gid_index < 0 ? 0 : me.gid_index);
    ah.grh.hop_limit = 64;
  }
  return ah;
}

}  // namespace

void VerbsEndpoint::open_resources() {
  Impl& m = *impl_;
  ibv_context* ctx = domain_->native_context();
  ibv_pd* pd = domain_->native_pd();
  const VerbsPortInfo& port = domain_->port_info();
  const std::size_t n = config().max_in_flight;
  if (n > 0xffffffu) throw Error(Status::invalid_argument, 0, "verbs endpoint: max_in_flight above 2^24");
  max_msg_ = port.max_msg_size ? port.max_msg_size : (std::uint64_t{1} << 31);
  m.endpoint_id = m.rng() | 1u;
  m.slots.assign(n, SlotState{});
  m.send_busy.assign(kCtrlSends, false);
  m.rd_atomic = static_cast<std::uint8_t>(
      std::clamp<std::uint32_t>(options_.max_rd_atomic, 1, std::max<std::uint32_t>(domain_->max_qp_rd_atom(), 1)));
  m.sq_depth = options_.send_queue_depth ? options_.send_queue_depth : static_cast<std::uint32_t>(n + 8);
  m.sq_depth = std::min(m.sq_depth, domain_->max_qp_wr());
  m.conns.reserve(16);
  m.idle_policy.after = config().idle_release;
  m.release_bound = std::min<MonoClock::duration>(kReleaseBound, config().post_timeout / 2);

  // One CQ for everything: user ops (one CQE each; a flushed put/get split
  // into chunks gives one per chunk), SRQ receives (counted in
  // max_in_flight), fences and window ops (a few per peer), UD control
  // traffic. Sized for every op flushing as up to three chunks; beyond the
  // device's max_cqe a mass flush of huge transfers could overrun it.
  const std::uint32_t cqe = static_cast<std::uint32_t>(
      std::min<std::size_t>(4 * n + kCtrlRecvs + kCtrlSends + 256, domain_->max_cqe()));
  if (config().wait_mode != WaitMode::spin) {
    m.channel = ibv_create_comp_channel(ctx);
    const int fl = m.channel ? ::fcntl(m.channel->fd, F_GETFL) : -1;
    if (!m.channel || fl < 0 || ::fcntl(m.channel->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
      const int err = errno;
      throw Error(Status::transport_error, err, "verbs endpoint: completion channel for sleeping waits: " + errno_text(err));
    }
  }
  m.cq = ibv_create_cq(ctx, static_cast<int>(cqe), nullptr, m.channel, 0);
  if (!m.cq) {
    const int err = errno;
    throw Error(Status::transport_error, err, "verbs endpoint: ibv_create_cq(" + std::to_string(cqe) + "): " + errno_text(err));
  }
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = static_cast<std::uint32_t>(std::min<std::size_t>(n, domain_->max_srq_wr()));
  sa.attr.max_sge = 1;
  m.srq = ibv_create_srq(pd, &sa);
  if (!m.srq) {
    const int err = errno;
    throw Error(Status::unsupported, err, "verbs endpoint: ibv_create_srq: " + errno_text(err));
  }

  // Control QP (UD) and its buffers.
  m.ctrl.assign((kCtrlRecvs + kCtrlSends) * kCtrlSlot, std::byte{0});
  m.ctrl_reg = domain_->register_memory(m.ctrl.data(), m.ctrl.size(), Access::local);

  ibv_qp_init_attr ua{};
  ua.send_cq = m.cq;
  ua.recv_cq = m.cq;
  ua.cap.max_send_wr = kCtrlSends;
  ua.cap.max_recv_wr = kCtrlRecvs;
  ua.cap.max_send_sge = 1;
  ua.cap.max_recv_sge = 1;
  ua.qp_type = IBV_QPT_UD;
  m.ud = ibv_create_qp(pd, &ua);
  if (!m.ud) {
    const int err = errno;
    throw Error(Status::transport_error, err, "verbs endpoint: ibv_create_qp(UD): " + errno_text(err));
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port.port;
  a.qkey = kQkey;
  modify_or_throw(m.ud, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, "UD QP to INIT");
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  modify_or_throw(m.ud, a, IBV_QP_STATE, "UD QP to RTR");
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = random_psn(m.rng);
  modify_or_throw(m.ud, a, IBV_QP_STATE | IBV_QP_SQ_PSN, "UD QP to RTS");
  for (std::uint32_t k = 0; k < kCtrlRecvs; ++k) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(m.ctrl.data() + k * kCtrlSlot), kCtrlSlot, m.ctrl_reg.local_key()};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = make_wr_id(kTagUdRecv, 0, k);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    const int rc = ibv_post_recv(m.ud, &wr, &bad);
    if (rc != 0) throw Error(Status::transport_error, rc, "verbs endpoint: ibv_post_recv(UD): " + errno_text(rc));
  }
  max_inline_ = options_.max_inline;  // refined by the first RC QP
}

void VerbsEndpoint::close_resources() noexcept {
  if (!impl_) return;
  Impl& m = *impl_;
  for (Exposed& x : m.exposed) {
    if (x.mw) free_window(x.mw);
    x.mw = nullptr;
    x.registration.reset();
    x.live = false;
  }
  for (std::uint32_t ci = 0; ci < m.conns.size(); ++ci) drop_window_cache(ci);
  for (Conn& c : m.conns) {
    if (c.qp) {
      (void)ibv_destroy_qp(c.qp);
      m.rc_qps.fetch_sub(1, std::memory_order_relaxed);
    }
    if (c.ah) (void)ibv_destroy_ah(c.ah);
    c = Conn{};
  }
  m.tail_conns.clear();
  m.conn_of_qpn.clear();
  if (m.ud) (void)ibv_destroy_qp(m.ud);
  if (m.srq) (void)ibv_destroy_srq(m.srq);
  if (m.cq) (void)ibv_destroy_cq(m.cq);  // every event was acknowledged (do_arm)
  if (m.channel) (void)ibv_destroy_comp_channel(m.channel);
  m.channel = nullptr;
  m.ud = nullptr;
  m.srq = nullptr;
  m.cq = nullptr;
  m.ctrl_reg.reset();
}

std::vector<std::byte> VerbsEndpoint::do_name() const {
  const VerbsPortInfo& port = domain_->port_info();
  WireName w{};
  w.magic = kNameMagic;
  w.version = kNameVersion;
  w.flags = port.ethernet ? 1 : 0;
  w.port = port.port;
  w.mtu = static_cast<std::uint8_t>(port.active_mtu);
  w.lid = port.lid;
  w.ud_qpn = impl_->ud->qp_num;
  w.endpoint_id = impl_->endpoint_id;
  std::memcpy(w.gid, port.gid, 16);
  std::vector<std::byte> out(kNameSize);
  std::memcpy(out.data(), &w, kNameSize);
  return out;
}

// ----------------------------------------------------------------- connections

std::uint32_t VerbsEndpoint::new_conn(const void* remote_name) {
  Impl& m = *impl_;
  const auto& r = *static_cast<const WireName*>(remote_name);
  std::uint32_t ci = static_cast<std::uint32_t>(m.conns.size());
  for (std::uint32_t i = 0; i < m.conns.size(); ++i) {
    if (!m.conns[i].used) {
      ci = i;
      break;
    }
  }
  // No queue pair yet (open_qp, on first use): only the address handle to
  // the peer's UD QP, for the connection exchange.
  Conn c;
  c.remote = r;
  ibv_ah_attr aa = ah_attr_for(domain_->port_info(), r);
  c.ah = ibv_create_ah(domain_->native_pd(), &aa);
  if (!c.ah) {
    const int err = errno;
    throw Error(Status::peer_unreachable, err, "verbs endpoint: ibv_create_ah for a peer: " + errno_text(err));
  }
  c.state = Conn::State::released;
  c.used = true;
  try {
    m.tail_conns.reserve(m.conns.size() + 1);
    if (ci == m.conns.size()) {
      m.conns.push_back(std::move(c));
    } else {
      m.replace_conn(ci, std::move(c));
    }
  } catch (...) {
    (void)ibv_destroy_ah(c.ah);
    throw;
  }
  return ci;
}

int VerbsEndpoint::open_qp(std::uint32_t ci) noexcept {
  Impl& m = *impl_;
  Conn& c = m.conns[ci];
  ibv_qp_init_attr qa{};
  qa.send_cq = m.cq;
  qa.recv_cq = m.cq;
  qa.srq = m.srq;
  qa.cap.max_send_wr = m.sq_depth;
  qa.cap.max_recv_wr = 0;  // receives come from the SRQ
  qa.cap.max_send_sge = 2;  // a gathered send's two pieces (do_gathered_sends)
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = options_.max_inline;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;  // selective signalling
  ibv_qp* qp = ibv_create_qp(domain_->native_pd(), &qa);
  if (!qp && options_.max_inline > 0) {
    // Some devices refuse any inline size they cannot do; go without.
    qa.cap.max_inline_data = 0;
    qp = ibv_create_qp(domain_->native_pd(), &qa);
  }
  if (!qp) return errno != 0 ? errno : ENOMEM;
  try {
    if (c.ring.size() != m.sq_depth) c.ring.assign(m.sq_depth, {});
    m.conn_of_qpn.insert(qp->qp_num, ci);
  } catch (...) {
    (void)ibv_destroy_qp(qp);
    return ENOMEM;
  }
  c.qp = qp;
  m.rc_qps.fetch_add(1, std::memory_order_relaxed);
  m.qps_created.fetch_add(1, std::memory_order_relaxed);
  // ibv_create_qp writes back what the device granted.
  max_inline_ = std::min<std::uint32_t>(options_.max_inline, qa.cap.max_inline_data);
  // A fresh send queue: sequence bookkeeping starts over past everything
  // the previous QP (if any) ever posted.
  c.retired_seq = c.wr_seq;
  c.first_seq = c.wr_seq + 1;
  c.last_signaled_seq = c.wr_seq;
  c.ring_head = 0;
  c.ring_count = 0;
  c.unsignaled_run = 0;
  c.fence_outstanding = false;
  c.req_stashed = false;
  c.remote_qpn = 0;
  c.remote_epoch = 0;
  c.local_psn = random_psn(m.rng);
  ++c.epoch;
  c.incarnation = ++m.incarnations;
  c.idle.restart(MonoClock::now());
  const int rc = qp_to_init(c);
  if (rc != 0) {
    release_qp(ci);
    return rc;
  }
  return 0;
}

void VerbsEndpoint::release_qp(std::uint32_t ci) noexcept {
  Impl& m = *impl_;
  Conn& c = m.conns[ci];
  if (!c.qp) return;
  // Callers guarantee nothing is in flight on it (see conn_busy) and no
  // window is bound on it; unbound cached windows go with it.
  drop_window_cache(ci);
  forget_released_qpn(ci);
  c.released_qpn = c.qp->qp_num;
  (void)ibv_destroy_qp(c.qp);
  c.qp = nullptr;
  c.state = Conn::State::released;
  m.rc_qps.fetch_sub(1, std::memory_order_relaxed);
  m.qps_released.fetch_add(1, std::memory_order_relaxed);
}

Status VerbsEndpoint::connect_on_demand(std::uint32_t ci) noexcept {
  const int rc = open_qp(ci);
  if (rc != 0) return rc == ENOMEM ? Status::out_of_memory : Status::transport_error;
  Conn& c = impl_->conns[ci];
  c.state = Conn::State::connecting;
  c.next_req = MonoClock::now() + kRetransmit;
  send_ctrl(c, kReq, c.epoch);
  // The caller retries (the base, progressing) until the REP arrives.
  return Status::would_block;
}

bool VerbsEndpoint::conn_busy(std::uint32_t ci) const noexcept {
  const Impl& m = *impl_;
  const Conn& c = m.conns[ci];
  if (c.wr_seq != c.retired_seq || c.ring_count > 0 || c.fence_outstanding) return true;
  for (const Exposed& x : m.exposed) {
    if (x.conn == ci && (x.live || x.pending != Exposed::Pending::none)) return true;
  }
  return false;
}

void VerbsEndpoint::forget_released_qpn(std::uint32_t ci) noexcept {
  Impl& m = *impl_;
  Conn& c = m.conns[ci];
  if (c.released_qpn == 0) return;
  m.conn_of_qpn.erase(c.released_qpn, ci);
  c.released_qpn = 0;
}

VerbsConnectionStats VerbsEndpoint::connection_stats() const noexcept {
  const Impl& m = *impl_;
  VerbsConnectionStats st;
  st.queue_pairs = m.rc_qps.load(std::memory_order_relaxed);
  st.created = m.qps_created.load(std::memory_order_relaxed);
  st.released = m.qps_released.load(std::memory_order_relaxed);
  return st;
}

int VerbsEndpoint::qp_to_init(Conn& c) noexcept {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = domain_->port_info().port;
  // The QP allows every remote operation; each key (MR or window) restricts
  // what it grants.
  a.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
  c.state = Conn::State::init;
  return ibv_modify_qp(c.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int VerbsEndpoint::qp_to_rts(Conn& c) noexcept {
  const VerbsPortInfo& port = domain_->port_info();
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<int>(port.active_mtu, c.remote.mtu ? c.remote.mtu : port.active_mtu));
  a.dest_qp_num = c.remote_qpn;
  a.rq_psn = c.remote_psn;
  a.max_dest_rd_atomic = impl_->rd_atomic;
  a.min_rnr_timer = 12;
  a.ah_attr = ah_attr_for(port, c.remote);
  int rc = ibv_modify_qp(c.qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) return rc;
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = options_.ack_timeout;
  a.retry_cnt = std::min<std::uint8_t>(options_.retry_count, 7);
  a.rnr_retry = 7;  // "infinite": a receiver that has not posted yet is not an error
  a.sq_psn = c.local_psn;
  a.max_rd_atomic = impl_->rd_atomic;
  rc = ibv_modify_qp(c.qp, &a,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) return rc;
  c.state = Conn::State::connected;
  return 0;
}

void VerbsEndpoint::begin_reset(std::uint32_t ci, int after) noexcept {
  Impl& m = *impl_;
  Conn& c = m.conns[ci];
  const auto then = static_cast<Conn::AfterReset>(after);
  if (c.state == Conn::State::resetting) {
    c.after_reset = std::max(c.after_reset, then);
    return;
  }
  c.state = Conn::State::resetting;
  c.after_reset = then;
  // ERROR first: a QP moved straight to RESET drops its WRs without
  // completions, and their slots would never be given back. In ERROR every
  // WR still queued completes flushed, without touching the wire.
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  (void)ibv_modify_qp(c.qp, &a, IBV_QP_STATE);
  // A signalled marker behind everything posted: its flushed completion
  // retires every WR before it, including unsignalled ones that completed
  // without a CQE. Posted after the move to ERROR, so it is flushed at once
  // instead of queueing behind a large transfer (on rxe, ibv_post_send runs
  // the send queue in the calling thread).
  if (c.wr_seq != c.retired_seq) (void)c.post_fence(ci);
  c.reset_seq = c.wr_seq;
  c.reset_deadline = MonoClock::now() + kResetBound;
  // Nothing is waited for here (the endpoint's mutex is held): handle_wc
  // finishes the reset when the marker comes back, housekeeping after
  // kResetBound at the latest.
  if (c.retired_seq >= c.reset_seq) finish_reset(ci);
}

void VerbsEndpoint::finish_reset(std::uint32_t ci) noexcept {
  Impl& m = *impl_;
  Conn& c = m.conns[ci];
  const bool close = c.after_reset == Conn::AfterReset::close;
  // Window binds/invalidates that did not come back: the QP is in ERROR
  // (about to be reset or destroyed), so the window cannot grant access any
  // more. Closing, every window bound on the QP goes with it.
  for (std::size_t slot = 0; slot < m.exposed.size(); ++slot) {
    Exposed& x = m.exposed[slot];
    if (x.live && x.conn == ci && (close || x.pending != Exposed::Pending::none)) {
      const int pending = static_cast<int>(x.pending);
      finish_window(slot);
      settle_window(slot, pending);
    }
  }
  // Unbound windows go too: the connection's next incarnation allocates
  // afresh (see recycle_window).
  drop_window_cache(ci);
  c.incarnation = ++m.incarnations;
  // Whatever did not come back is answered here; a late CQE for it is
  // recognised as stale by its sequence number (first_seq).
  for (std::uint32_t i = 0; i < m.slots.size(); ++i) {
    SlotState& s = m.slots[i];
    if (s.live && s.conn == ci) {
      s.live = false;
      complete(i, Status::peer_unreachable, 0);
    }
  }
  if (close) {
    forget_released_qpn(ci);
    m.conn_of_qpn.erase(c.qp->qp_num);
    (void)ibv_destroy_qp(c.qp);
    m.rc_qps.fetch_sub(1, std::memory_order_relaxed);
    (void)ibv_destroy_ah(c.ah);
    m.replace_conn(ci, Conn{});
    return;
  }
  c.retired_seq = c.wr_seq;
  c.first_seq = c.wr_seq + 1;
  c.ring_count = 0;
  c.ring_head = 0;
  c.unsignaled_run = 0;
  c.fence_outstanding = false;
  const bool reconnect = c.after_reset == Conn::AfterReset::reconnect;
  c.after_reset = Conn::AfterReset::nothing;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  int rc = ibv_modify_qp(c.qp, &a, IBV_QP_STATE);
  if (rc == 0) rc = qp_to_init(c);
  c.local_psn = random_psn(m.rng);
  if (rc != 0) {
    c.state = Conn::State::error;
    c.req_stashed = false;
    return;
  }
  if (reconnect) ++c.epoch;  // a new epoch tells the peer to reset its side too
  if (c.req_stashed) {
    // The peer reset its side and asked (its REQ came while ours drained):
    // follow it. It is then connected to this QP, so no REQ of ours.
    c.req_stashed = false;
    c.remote_qpn = c.stash_qpn;
    c.remote_psn = c.stash_psn;
    c.remote_epoch = c.stash_epoch;
    if (qp_to_rts(c) != 0) {
      c.state = Conn::State::error;
      return;
    }
    send_ctrl(c, kRep, c.stash_epoch);
    return;
  }
  if (reconnect) {
    c.state = Conn::State::connecting;
    c.next_req = MonoClock::now() + kRetransmit;
    send_ctrl(c, kReq, c.epoch);
  }
}

void VerbsEndpoint::send_ctrl(Conn& c, std::uint8_t type, std::uint32_t epoch) noexcept {
  send_ctrl_to(c, type, epoch, c.qp->qp_num, 0);
}

void VerbsEndpoint::send_ctrl_to(Conn& c, std::uint8_t type, std::uint32_t epoch, std::uint32_t qpn,
                                 std::uint32_t dst_qpn) noexcept {
  Impl& m = *impl_;
  std::uint32_t k = kNone;
  for (std::uint32_t i = 0; i < kCtrlSends; ++i) {
    if (!m.send_busy[i]) {
      k = i;
      break;
    }
  }
  if (k == kNone) return;  // all in flight: REQs are retransmitted, REPs re-sent on the next REQ
  CtrlMsg msg{};
  msg.magic = verbs_wire::kCtrlMagic;
  msg.type = type;
  msg.qpn = qpn;
  const bool connect = type == kReq || type == kRep;
  msg.psn = connect ? c.local_psn : 0;
  msg.epoch = connect ? epoch : 0;
  msg.dst_qpn = dst_qpn;
  msg.dst_id = c.remote.endpoint_id;
  const std::vector<std::byte> me = do_name();
  std::memcpy(&msg.src, me.data(), kNameSize);
  std::byte* buf = m.ctrl.data() + (kCtrlRecvs + k) * kCtrlSlot;
  std::memcpy(buf, &msg, kCtrlSize);
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), static_cast<std::uint32_t>(kCtrlSize), m.ctrl_reg.local_key()};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = make_wr_id(kTagUdSend, 0, k);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.ud.ah = c.ah;
  wr.wr.ud.remote_qpn = c.remote.ud_qpn;
  wr.wr.ud.remote_qkey = kQkey;
  if (ibv_post_send(m.ud, &wr, &bad) == 0) m.send_busy[k] = true;
}

std::uint32_t VerbsEndpoint::conn_by_id(std::uint64_t endpoint_id) const noexcept {
  for (std::uint32_t i = 0; i < impl_->conns.size(); ++i) {
    const Conn& c = impl_->conns[i];
    if (c.used && !c.closing() && c.remote.endpoint_id == endpoint_id) return i;
  }
  return kNone;
}

std::uint32_t VerbsEndpoint::conn_by_qpn(std::uint32_t qpn) const noexcept {
  return impl_->conn_of_qpn.find(qpn);
}

std::uint64_t VerbsEndpoint::do_insert_peer(std::span<const std::byte> name) {
  WireName w{};
  if (const char* why = verbs_wire::parse_name(name, domain_->port_info().ethernet, w)) {
    throw Error(Status::malformed, 0,
                std::string("verbs endpoint: peer name rejected: bad ") + why + " (" + std::to_string(name.size()) +
                    "-byte name)");
  }
  if (w.endpoint_id == impl_->endpoint_id) {
    throw Error(Status::invalid_argument, 0, "verbs endpoint: inserting its own name (loopback QPs are not supported)");
  }
  // A peer that connected to us first already has a connection: adopt it.
  // Otherwise the queue pair is made on first use (connect_on_demand).
  std::uint32_t ci = conn_by_id(w.endpoint_id);
  if (ci == kNone) ci = new_conn(&w);
  impl_->conns[ci].inserted = true;
  return ci;
}

void VerbsEndpoint::do_remove_peer(std::uint64_t handle) noexcept {
  Impl& m = *impl_;
  if (handle >= m.conns.size() || !m.conns[handle].used || m.conns[handle].closing()) return;
  const auto ci = static_cast<std::uint32_t>(handle);
  if (m.conns[ci].qp == nullptr) {
    // Released (or never used): nothing on the wire, only the address handle.
    forget_released_qpn(ci);
    (void)ibv_destroy_ah(m.conns[ci].ah);
    m.replace_conn(ci, Conn{});
    return;
  }
  // Windows bound on the QP without a bind or invalidate in flight go now
  // (deallocating revokes); the others end when that WR comes back flushed.
  for (std::size_t slot = 0; slot < m.exposed.size(); ++slot) {
    Exposed& x = m.exposed[slot];
    if (x.live && x.conn == ci && x.pending == Exposed::Pending::none) finish_window(slot);
  }
  drop_window_cache(ci);
  // The QP goes to ERROR; it is destroyed once its old WRs are back
  // (at once when none are out), by progress, not waited for here.
  begin_reset(ci, static_cast<int>(Conn::AfterReset::close));
}

Result<std::uint64_t> VerbsEndpoint::do_reconnect(PeerId /*peer*/, std::uint64_t handle,
                                                  std::span<const std::byte> /*name*/) noexcept {
  Impl& m = *impl_;
  if (handle >= m.conns.size() || !m.conns[handle].used || m.conns[handle].closing()) {
    return Status::invalid_argument;
  }
  const auto ci = static_cast<std::uint32_t>(handle);
  // Released: the next use connects afresh anyway.
  if (m.conns[ci].qp == nullptr) return handle;
  // ERROR now; RESET -> INIT and a REQ with a new epoch once the old WRs
  // are back (finish_reset, from progress). Until then posts answer
  // would_block, which the base retries while progressing.
  begin_reset(ci, static_cast<int>(Conn::AfterReset::reconnect));
  if (m.conns[ci].state == Conn::State::error) return Status::transport_error;
  return handle;
}

void VerbsEndpoint::handle_ctrl(std::uint32_t k, std::uint32_t byte_len) noexcept {
  Impl& m = *impl_;
  std::byte* buf = m.ctrl.data() + k * kCtrlSlot;
  CtrlMsg msg{};
  const char* bad_field = "ctrl length (short)";
  if (byte_len >= kGrh + kCtrlSize) {
    bad_field = verbs_wire::parse_ctrl(std::span<const std::byte>(buf + kGrh, byte_len - kGrh),
                                       domain_->port_info().ethernet, m.endpoint_id, msg);
  }
  // Give the buffer back first: the message is copied out.
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), kCtrlSlot, m.ctrl_reg.local_key()};
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = make_wr_id(kTagUdRecv, 0, k);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  (void)ibv_post_recv(m.ud, &wr, &bad);
  if (bad_field != nullptr) return;  // not for us, or malformed: dropped

  std::uint32_t ci = conn_by_id(msg.src.endpoint_id);
  if (msg.type == kRel || msg.type == kRelAck || msg.type == kRelNak) {
    if (ci != kNone) handle_release(ci, msg.type, msg.qpn, msg.dst_qpn);
    return;
  }
  if (msg.type == kReq) {
    if (ci == kNone) {
      try {
        ci = new_conn(&msg.src);
      } catch (...) {
        return;  // no resources now; the peer retransmits
      }
    }
    Conn& c = m.conns[ci];
    if (c.state == Conn::State::releasing && (c.remote_qpn != msg.qpn || c.remote_epoch != msg.epoch)) {
      // A REQ from another QP of the peer: it gave its side of ours up
      // (our release was granted, the REL_ACK is late or lost) and connects
      // afresh. Ours is idle (nothing in flight while releasing): go too.
      release_qp(ci);
    }
    if (c.state == Conn::State::released) {
      // The peer's first operation (or its first after an idle release):
      // the QP is made now.
      if (open_qp(ci) != 0) return;  // no resources now; the peer retransmits
    }
    const auto stash = [&] {
      c.req_stashed = true;
      c.stash_qpn = msg.qpn;
      c.stash_psn = msg.psn;
      c.stash_epoch = msg.epoch;
    };
    if (c.state == Conn::State::resetting) {
      stash();  // answered when the reset ends (the latest REQ wins)
      return;
    }
    const bool fresh = c.state != Conn::State::connected || c.remote_epoch != msg.epoch || c.remote_qpn != msg.qpn;
    if (fresh && c.state != Conn::State::releasing) {
      // A new epoch from a connected peer means it reset its QP: reset ours
      // (our in-flight ops to it fail with peer_unreachable) and follow once
      // our old WRs are back (finish_reset answers the stashed REQ).
      if (c.state != Conn::State::init && c.state != Conn::State::connecting) {
        stash();
        begin_reset(ci, static_cast<int>(Conn::AfterReset::nothing));
        return;
      }
      c.remote_qpn = msg.qpn;
      c.remote_psn = msg.psn;
      c.remote_epoch = msg.epoch;
      if (qp_to_rts(c) != 0) {
        c.state = Conn::State::error;
        return;
      }
      c.idle.restart(MonoClock::now());
    }
    send_ctrl(c, kRep, msg.epoch);
  } else if (msg.type == kRep) {
    if (ci == kNone) return;
    Conn& c = m.conns[ci];
    if (c.state != Conn::State::connecting || msg.epoch != c.epoch) return;  // late or duplicate
    c.remote_qpn = msg.qpn;
    c.remote_psn = msg.psn;
    if (qp_to_rts(c) != 0) {
      c.state = Conn::State::error;
      return;
    }
    c.idle.restart(MonoClock::now());
  }
}

void VerbsEndpoint::handle_release(std::uint32_t ci, std::uint8_t type, std::uint32_t qpn,
                                   std::uint32_t dst_qpn) noexcept {
  Impl& m = *impl_;
  Conn& c = m.conns[ci];
  // The pair the message is about: the sender's QP `qpn` and our `dst_qpn`.
  const bool ours = c.qp != nullptr && c.qp->qp_num == dst_qpn && c.remote_qpn == qpn;
  if (type == kRel) {
    if (!ours) {
      // No QP of ours is paired with the sender's `qpn` any more (released,
      // replaced, or reset and connected anew): the peer's side is useless,
      // grant. Answered with the pair as the peer named it.
      send_ctrl_to(c, kRelAck, 0, dst_qpn, qpn);
      return;
    }
    const auto now = MonoClock::now();
    c.idle.observe(now);
    // Both asking at once: each grants the other (both are idle).
    const bool grant = c.state == Conn::State::releasing ||
                       (c.state == Conn::State::connected && m.idle_policy.grant(c.idle, conn_busy(ci), now));
    send_ctrl_to(c, grant ? kRelAck : kRelNak, 0, dst_qpn, qpn);
    if (grant) release_qp(ci);
    return;
  }
  if (!ours || c.state != Conn::State::releasing) return;  // late or duplicate
  if (type == kRelAck) {
    release_qp(ci);
  } else {
    // Refused: the peer still uses it. Ask again after another full period.
    c.state = Conn::State::connected;
    c.idle.restart(MonoClock::now());
  }
}

// ----------------------------------------------------------------- data path

Status VerbsEndpoint::rc_conn(const BackendOp& op, std::uint32_t& ci) noexcept {
  Impl& m = *impl_;
  if (op.peer_handle >= m.conns.size() || !m.conns[op.peer_handle].used) return Status::invalid_argument;
  ci = static_cast<std::uint32_t>(op.peer_handle);
  Conn& c = m.conns[ci];
  if (c.state == Conn::State::error) {
    mark_peer_broken(op.peer);
    return Status::peer_unreachable;
  }
  // First use, or first since an idle release: make the QP and ask.
  if (c.state == Conn::State::released) return connect_on_demand(ci);
  // Handshake, reset or release still running.
  if (c.state != Conn::State::connected) return Status::would_block;
  if (op.remote && op.remote->key > 0xffffffffu) return Status::invalid_argument;
  return Status::ok;
}

bool VerbsEndpoint::may_skip_signal(bool small_inline, std::uint32_t unsignaled_run,
                                    std::uint64_t in_flight) const noexcept {
  // An op alone on the QP (everything before it retired) is signalled even
  // when it could go unsignalled: nothing behind it would close the tail,
  // so it would wait for a fence WR (a second round trip) once the CQ runs
  // dry. Behind others in flight, a run of unsignalled ops stays under half
  // of what is in flight: an application that keeps W ops in flight and
  // waits for the oldest (a stream) then gets a signalled completion every
  // W/2 ops or so, and posts the next ones while the other half is still
  // on the wire. With runs up to kSignalInterval - 1 regardless, a stream
  // with a window of 16 retired a whole window at once, when its last
  // (signalled) op completed, and the queue ran empty before the next
  // window was posted.
  return small_inline && options_.selective_signaling && unsignaled_run + 1 < kSignalInterval &&
         2 * (std::uint64_t{unsignaled_run} + 1) < in_flight;
}

void VerbsEndpoint::note_rc_posted(std::uint32_t ci, std::uint32_t index, std::uint64_t first, std::uint64_t last,
                                   bool signaled) noexcept {
  Impl& m = *impl_;
  Conn& c = m.conns[ci];
  c.wr_seq = last;
  c.idle.touch();
  SlotState& s = m.slots[index];
  s.post_seq = first;  // first WR of the op (its range is [post_seq, qp_seq])
  s.qp_seq = last;
  s.conn = ci;
  s.live = true;
  s.unsignaled = !signaled;
  if (signaled) {
    c.unsignaled_run = 0;
    c.last_signaled_seq = last;
  } else {
    c.ring[(c.ring_head + c.ring_count) % c.ring.size()] = {last, index};
    ++c.ring_count;
    ++c.unsignaled_run;
    if (!c.tail_listed) {
      c.tail_listed = true;
      m.tail_conns.push_back(ci);  // capacity reserved in new_conn
    }
  }
}

void VerbsEndpoint::note_injected(std::uint32_t ci, std::uint32_t index, std::uint64_t seq, bool signaled) noexcept {
  Impl& m = *impl_;
  Conn& c = m.conns[ci];
  c.wr_seq = seq;
  c.last_inject_seq = seq;
  c.idle.touch();
  // Not live: the op completes at its post, so its WR's completion (when
  // signalled, or a failure's) only retires the send queue and, failed,
  // breaks the connection (handle_send_wc); it never completes the slot,
  // which may hold another op by then. Not in the ring either: nobody
  // waits for it, so no fence is posted behind it while traffic flows.
  m.slots[index].live = false;
  if (signaled) {
    c.unsignaled_run = 0;
    c.last_signaled_seq = seq;
  } else {
    ++c.unsignaled_run;
  }
}

namespace {
// The WR of a put, get or send of one chunk at offset 0 (sg_list, opcode,
// rkey, remote address); flags and wr_id are the caller's.
Status fill_data_wr(const BackendOp& op, Domain& domain, ibv_send_wr& wr, ibv_sge& sge) noexcept {
  auto reg = detail::post_registration(op.local->ldo(), domain);
  if (!reg) return reg.status();
  sge.addr = reinterpret_cast<std::uintptr_t>(op.local->address());
  sge.length = static_cast<std::uint32_t>(op.length);
  sge.lkey = (*reg)->local_key();
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op.kind == OpKind::put ? IBV_WR_RDMA_WRITE : op.kind == OpKind::get ? IBV_WR_RDMA_READ : IBV_WR_SEND;
  if (op.remote) {
    wr.wr.rdma.rkey = static_cast<std::uint32_t>(op.remote->key);
    wr.wr.rdma.remote_addr = op.remote_address;
  }
  return Status::ok;
}

// The WR of a gathered send (BackendOp::body): two scatter-gather entries,
// the head's and the body's, each with its own registration's key.
Status fill_gathered_wr(const BackendOp& op, Domain& domain, ibv_send_wr& wr, ibv_sge (&sge)[2]) noexcept {
  auto head = detail::post_registration(op.local->ldo(), domain);
  if (!head) return head.status();
  auto body = detail::post_registration(op.body->ldo(), domain);
  if (!body) return body.status();
  const std::uint64_t body_length = op.body->length();
  sge[0] = ibv_sge{reinterpret_cast<std::uintptr_t>(op.local->address()),
                   static_cast<std::uint32_t>(op.length - body_length), (*head)->local_key()};
  sge[1] = ibv_sge{reinterpret_cast<std::uintptr_t>(op.body->address()), static_cast<std::uint32_t>(body_length),
                   (*body)->local_key()};
  wr.sg_list = sge;
  wr.num_sge = 2;
  wr.opcode = IBV_WR_SEND;
  return Status::ok;
}
}  // namespace

Status VerbsEndpoint::post_rc(const BackendOp& op) noexcept {
  Impl& m = *impl_;
  std::uint32_t ci = 0;
  if (const Status st = rc_conn(op, ci); st != Status::ok) return st;
  Conn& c = m.conns[ci];

  ibv_sge sges[2]{};
  ibv_sge& sge = sges[0];
  ibv_send_wr wr{};
  std::uint64_t chunks = 1;
  const bool atomic = op.kind == OpKind::fetch_add || op.kind == OpKind::compare_swap;
  if (atomic) {
    const AtomicWords* w = atomic_words(op.index);
    sge.addr = reinterpret_cast<std::uintptr_t>(&w->result);
    sge.length = 8;
    sge.lkey = atomic_registration().local_key();
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op.kind == OpKind::fetch_add ? IBV_WR_ATOMIC_FETCH_AND_ADD : IBV_WR_ATOMIC_CMP_AND_SWP;
    wr.wr.atomic.remote_addr = op.remote_address;
    wr.wr.atomic.rkey = static_cast<std::uint32_t>(op.remote->key);
    wr.wr.atomic.compare_add = op.kind == OpKind::fetch_add ? w->operand : w->compare;
    wr.wr.atomic.swap = w->operand;
  } else if (op.body) [[unlikely]] {
    // One message of at most max_msg_ bytes (the base checked the total).
    if (const Status st = fill_gathered_wr(op, *domain_, wr, sges); st != Status::ok) return st;
  } else {
    if (const Status st = fill_data_wr(op, *domain_, wr, sge); st != Status::ok) return st;
    // The port's max_msg_sz (8 MiB on rxe) bounds one WR: larger RDMA
    // transfers go as several WRs, only the last one signalled.
    // (A division only when needed: it is a helper call under qemu TCG.)
    chunks = op.length <= max_msg_ ? 1 : (op.length + max_msg_ - 1) / max_msg_;
    if (op.kind == OpKind::send && chunks > 1) return Status::invalid_argument;
  }
  // Keep two WRs of room for a fence or a window bind/invalidate.
  if (c.wr_seq - c.retired_seq + chunks + 2 > m.sq_depth) return Status::would_block;

  const bool small_inline = !atomic && op.kind != OpKind::get && op.length <= max_inline_;
  // An inline send's payload is inside its WR once ibv_post_send returns:
  // it completes then (VerbsEndpointOptions::inject_sends), and its WR is
  // signalled only every kSignalInterval-th time, so that a completion
  // retires the run before it and the send queue's slots come back.
  const bool inject = small_inline && op.kind == OpKind::send && options_.inject_sends;
  const bool signaled = inject ? !options_.selective_signaling || c.unsignaled_run + 1 >= kSignalInterval
                               : !may_skip_signal(small_inline, c.unsignaled_run, c.wr_seq - c.retired_seq);
  SlotState& s = m.slots[op.index];
  const std::uint64_t first = c.wr_seq + 1;
  std::uint64_t seq = c.wr_seq;
  for (std::uint64_t k = 0; k < chunks; ++k) {
    const std::uint64_t off = k * max_msg_;
    const bool last = k + 1 == chunks;
    ++seq;
    if (!atomic && !op.body) {
      sge.addr = reinterpret_cast<std::uintptr_t>(op.local->address()) + off;
      sge.length = static_cast<std::uint32_t>(std::min<std::uint64_t>(max_msg_, op.length - off));
      if (op.remote) wr.wr.rdma.remote_addr = op.remote_address + off;
    }
    wr.send_flags = (last && signaled ? static_cast<unsigned>(IBV_SEND_SIGNALED) : 0u) |
                    (small_inline ? static_cast<unsigned>(IBV_SEND_INLINE) : 0u);
    wr.wr_id = make_wr_id(kTagOp, seq, op.index);
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(c.qp, &wr, &bad);
    if (rc != 0) {
      if (k == 0) return rc == ENOMEM ? Status::would_block : Status::transport_error;
      // Part of the op is on the wire: it can no longer be refused. Fail it
      // through the QP (its posted chunks flush) so the slot comes back.
      c.wr_seq = seq - 1;
      s = SlotState{0, c.wr_seq, ci, true, false};
      s.post_seq = first;
      conn_failed(ci);
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      (void)ibv_modify_qp(c.qp, &a, IBV_QP_STATE);
      return Status::ok;
    }
  }
  // Bytes posted since the queue was last empty (it was if these WRs are
  // all that is unretired): the slack a stuck queue gets (housekeeping).
  c.unretired_bytes = (c.retired_seq + chunks == seq ? 0 : c.unretired_bytes) + op.length;
  if (inject) {
    note_injected(ci, op.index, seq, signaled);
    complete_at_post();
    return Status::ok;
  }
  note_rc_posted(ci, op.index, first, seq, signaled);
  return Status::ok;
}

Status VerbsEndpoint::do_post_batch(std::span<const BackendOp* const> ops, std::size_t& posted) noexcept {
  Impl& m = *impl_;
  posted = 0;
  std::size_t i = 0;
  while (i < ops.size()) {
    const BackendOp& head = *ops[i];
    // An op of several WRs (beyond the port's max_msg_sz) goes alone, as
    // do_post would post it.
    if (head.kind == OpKind::recv || head.length > max_msg_) {
      if (const Status st = do_post(head); st != Status::ok) return st;
      ++posted;
      ++i;
      continue;
    }
    std::uint32_t ci = 0;
    if (const Status st = rc_conn(head, ci); st != Status::ok) return st;
    Conn& c = m.conns[ci];
    // The run of consecutive single-WR ops to this QP, chained through
    // wr.next and handed to the device with one ibv_post_send (one
    // doorbell). Signalling and inline follow the single-op rules, the ops
    // of the chain before an op counting as in flight ahead of it (the
    // chain posts in order).
    std::array<ibv_send_wr, kBatchChain> wrs{};
    std::array<ibv_sge, kBatchChain> sges{};
    std::array<bool, kBatchChain> signaled{};
    std::size_t n = 0;
    Status stop = Status::ok;
    std::uint64_t seq = c.wr_seq;
    std::uint32_t run = c.unsignaled_run;
    while (i + n < ops.size() && n < kBatchChain) {
      const BackendOp& op = *ops[i + n];
      if (n > 0 && (op.peer_handle != head.peer_handle || op.kind == OpKind::recv || op.length > max_msg_)) break;
      if (op.remote && op.remote->key > 0xffffffffu) {
        stop = Status::invalid_argument;
        break;
      }
      // Keep two WRs of room for a fence or a window bind/invalidate.
      if (seq - c.retired_seq + 1 + 2 > m.sq_depth) {
        stop = Status::would_block;
        break;
      }
      ibv_send_wr& wr = wrs[n];
      if (const Status st = fill_data_wr(op, *domain_, wr, sges[n]); st != Status::ok) {
        stop = st;
        break;
      }
      const bool small_inline = op.kind != OpKind::get && op.length <= max_inline_;
      signaled[n] = !may_skip_signal(small_inline, run, seq - c.retired_seq);
      run = signaled[n] ? 0 : run + 1;
      ++seq;
      wr.send_flags = (signaled[n] ? static_cast<unsigned>(IBV_SEND_SIGNALED) : 0u) |
                      (small_inline ? static_cast<unsigned>(IBV_SEND_INLINE) : 0u);
      wr.wr_id = make_wr_id(kTagOp, seq, op.index);
      if (n > 0) wrs[n - 1].next = &wr;
      ++n;
    }
    if (n == 0) return stop;
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(c.qp, wrs.data(), &bad);
    // On failure, the WRs before bad_wr were posted and the rest were not.
    std::size_t accepted = n;
    if (rc != 0) {
      accepted = 0;
      for (std::size_t k = 0; k < n; ++k) {
        if (&wrs[k] == bad) {
          accepted = k;
          break;
        }
      }
    }
    for (std::size_t k = 0; k < accepted; ++k) {
      note_rc_posted(ci, ops[i + k]->index, c.wr_seq + 1, c.wr_seq + 1, signaled[k]);
    }
    posted += accepted;
    i += accepted;
    if (rc != 0) return rc == ENOMEM ? Status::would_block : Status::transport_error;
    if (stop != Status::ok) return stop;
  }
  return Status::ok;
}

Status VerbsEndpoint::do_post(const BackendOp& op) noexcept {
  return op.kind == OpKind::recv ? post_srq(op) : post_rc(op);
}

Status VerbsEndpoint::post_srq(const BackendOp& op) noexcept {
  Impl& m = *impl_;
  if (op.length > 0xffffffffu) return Status::invalid_argument;
  auto reg = detail::post_registration(op.local->ldo(), *domain_);
  if (!reg) return reg.status();
  SlotState& s = m.slots[op.index];
  const std::uint64_t tag = ++m.post_seq;
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(op.local->address()), static_cast<std::uint32_t>(op.length),
              (*reg)->local_key()};
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = make_wr_id(kTagRecv, tag, op.index);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  const int rc = ibv_post_srq_recv(m.srq, &wr, &bad);
  if (rc != 0) return rc == ENOMEM ? Status::would_block : Status::transport_error;
  s = SlotState{};
  s.post_seq = tag & kSeqMask;
  s.conn = kNone;
  s.live = true;
  return Status::ok;
}

void VerbsEndpoint::conn_failed(std::uint32_t ci) noexcept {
  Impl& m = *impl_;
  Conn& c = m.conns[ci];
  if (c.state == Conn::State::connected) c.state = Conn::State::error;
  // During a reset the flushes are expected: the reset decides.
  if (c.state != Conn::State::resetting) mark_peer_broken(peer_for_handle(ci));
}

void VerbsEndpoint::retire(std::uint32_t ci, std::uint64_t seq) noexcept {
  Impl& m = *impl_;
  Conn& c = m.conns[ci];
  // In-order completion: unsignalled ops posted before `seq` are done, and
  // done well (a failed one reports itself with its own CQE first).
  while (c.ring_count > 0) {
    const auto [rs, idx] = c.ring[c.ring_head];
    if (rs > seq) break;
    c.ring_head = (c.ring_head + 1) % c.ring.size();
    --c.ring_count;
    if (rs == seq) continue;  // the CQE's own op: its caller completes it
    SlotState& s = m.slots[idx];
    if (s.live && s.conn == ci && s.qp_seq == rs) {
      s.live = false;
      complete(idx, Status::ok, op_at(idx).length);
    }
  }
  if (seq > c.retired_seq) c.retired_seq = seq;
}

void VerbsEndpoint::handle_wc(const ibv_wc& wc) noexcept {
  Impl& m = *impl_;
  const Tag tag = tag_of(wc.wr_id);
  const std::uint32_t index = index_of(wc.wr_id);
  switch (tag) {
    case kTagUdRecv:
      if (index >= kCtrlRecvs) return;
      if (wc.status == IBV_WC_SUCCESS) {
        handle_ctrl(index, wc.byte_len);
      } else if (wc.status != IBV_WC_WR_FLUSH_ERR) {
        handle_ctrl(index, 0);  // re-posts the buffer
      }
      return;
    case kTagUdSend:
      if (index < kCtrlSends) m.send_busy[index] = false;
      return;
    case kTagRecv: {
      if (index >= m.slots.size()) return;
      SlotState& s = m.slots[index];
      if (!s.live || s.conn != kNone || s.post_seq != seq_of(wc.wr_id)) return;  // stale
      s.live = false;
      const Status st = status_from_wc(wc.status);
      const std::uint32_t ci = conn_by_qpn(wc.qp_num);
      if (ci != kNone) m.conns[ci].idle.touch();
      const PeerId from = ci == kNone ? kAnyPeer : peer_for_handle(ci);
      complete(index, st, st == Status::ok ? wc.byte_len : 0, from);
      return;
    }
    default: break;
  }
  // Send-queue completions of an RC QP.
  const std::uint32_t ci = conn_by_qpn(wc.qp_num);
  if (ci == kNone) return;
  Conn& c = m.conns[ci];
  if (c.qp == nullptr || c.qp->qp_num != wc.qp_num) return;  // of a released QP: nothing was in flight
  // Expand the 36-bit sequence of the wr_id against the QP's counter.
  std::uint64_t seq = (c.wr_seq & ~kSeqMask) | seq_of(wc.wr_id);
  if (seq > c.wr_seq) {
    if (c.wr_seq <= kSeqMask) return;  // never posted on this QP: stale
    seq -= kSeqMask + 1;
  }
  // A late completion from before a reset that was finished by its bound.
  if (seq < c.first_seq) return;
  handle_send_wc(ci, seq, wc);
  // The old connection's last WR is back: the reset can end.
  if (c.state == Conn::State::resetting && c.retired_seq >= c.reset_seq) finish_reset(ci);
}

void VerbsEndpoint::handle_send_wc(std::uint32_t ci, std::uint64_t seq, const ibv_wc& wc) noexcept {
  Impl& m = *impl_;
  Conn& c = m.conns[ci];
  const Tag tag = tag_of(wc.wr_id);
  const std::uint32_t index = index_of(wc.wr_id);
  retire(ci, seq);
  const Status st = status_from_wc(wc.status);
  if (st != Status::ok) conn_failed(ci);
  if (tag == kTagFence) {
    if (c.fence_outstanding && seq == c.fence_seq) c.fence_outstanding = false;
    return;
  }
  if (tag == kTagInternal) {
    window_op_done(wc.wr_id, wc.status);
    return;
  }
  if (tag != kTagOp || index >= m.slots.size()) return;
  SlotState& s = m.slots[index];
  if (!s.live || s.conn != ci || seq < s.post_seq || seq > s.qp_seq) return;  // stale
  if (st == Status::ok && seq != s.qp_seq) return;  // an early chunk (not normally signalled)
  s.live = false;
  // An atomic's old value is in its result word, where the base reads it.
  complete(index, st, st == Status::ok ? op_at(index).length : 0);
}

std::size_t VerbsEndpoint::poll_cq(std::size_t max) noexcept {
  Impl& m = *impl_;
  std::size_t events = 0;
  while (events < max) {
    ibv_wc wcs[16];
    const int want = static_cast<int>(std::min<std::size_t>(16, max - events));
    const int got = ibv_poll_cq(m.cq, want, wcs);
    if (got < 0) {
      mark_unusable();  // the CQ itself failed
      break;
    }
    for (int i = 0; i < got; ++i) handle_wc(wcs[i]);
    events += static_cast<std::size_t>(got);
    if (got < want) break;
  }
  return events;
}

void VerbsEndpoint::housekeeping() noexcept {
  Impl& m = *impl_;
  // Runs after every poll that found the CQ dry, i.e. on every round of a
  // spin-wait, so it must cost next to nothing there and not grow with the
  // number of connections.
  //
  // The timers (retransmits, the reset bound, idle release) read the coarse
  // clock (vDSO, no clocksource read; the precise clock cost a system call
  // and an emulated HPET read per round in the Soft-RoCE guest): 50 ms
  // retransmits and a 2 s reset bound fire up to three ticks late, never
  // early. Every timer is set to a future time and compared with that
  // reading, so a sweep that sees the same reading as the last one decides
  // the same: the sweep over all connections runs once per clock tick. (A
  // use that IdleTimer::touch counts after a sweep is dated by the next
  // tick's sweep, which only delays a release by that tick.)
  const auto now = platform::CoarseClock::now();
  if (now != m.last_sweep) {
    m.last_sweep = now;
    for (std::uint32_t ci = 0; ci < m.conns.size(); ++ci) {
      Conn& c = m.conns[ci];
      if (!c.used) continue;
      if (c.state == Conn::State::resetting && now >= c.reset_deadline) {
        finish_reset(ci);  // some old WRs never came back: answer them now
        continue;
      }
      if (c.state == Conn::State::connecting && now >= c.next_req) {
        c.next_req = now + kRetransmit;
        send_ctrl(c, kReq, c.epoch);
      }
      if (c.state == Conn::State::releasing) {
        if (now >= c.release_deadline) {
          // The peer did not answer (not progressing): keep the connection,
          // ask again after another full period.
          c.state = Conn::State::connected;
          c.idle.restart(now);
        } else if (now >= c.next_req) {
          c.next_req = now + kRetransmit;  // UD is unreliable: ask again
          send_ctrl_to(c, kRel, 0, c.qp->qp_num, c.remote_qpn);
        }
        continue;
      }
      if (c.state == Conn::State::connected) {
        if (c.retired_seq >= c.last_inject_seq || c.retired_seq != c.swept_retired ||
            c.retire_seen == MonoClock::time_point{}) {
          c.swept_retired = c.retired_seq;
          c.retire_seen = now;
        } else if (now > deadline_for(OpKind::send, c.unretired_bytes, c.retire_seen)) {
          conn_failed(ci);  // the peer is marked broken: later posts answer peer_unreachable
          continue;
        }
      }
      // A tail of injected sends nobody waits for (note_injected): fenced
      // once a whole tick passed without a post, so its WRs retire and an
      // idle queue pair can be released (conn_busy), without a fence per
      // message while traffic flows.
      if (c.state == Conn::State::connected && c.ring_count == 0 && !c.fence_outstanding &&
          c.wr_seq > c.last_signaled_seq && c.wr_seq == c.swept_seq &&
          c.wr_seq - c.retired_seq + 1 <= m.sq_depth && c.post_fence(ci)) {
        c.last_signaled_seq = c.wr_seq;
        c.unsignaled_run = 0;
      }
      c.swept_seq = c.wr_seq;
      if (c.state == Conn::State::connected && m.idle_policy.enabled()) {
        c.idle.observe(now);
        // The exposure scan in conn_busy runs only once the time is up.
        if (m.idle_policy.propose(c.idle, false, now) && !conn_busy(ci)) {
          c.state = Conn::State::releasing;
          c.release_deadline = now + m.release_bound;
          c.next_req = now + kRetransmit;
          send_ctrl_to(c, kRel, 0, c.qp->qp_num, c.remote_qpn);
        }
      }
    }
  }
  // An unsignalled tail with nothing signalled behind it would never
  // complete: close it with a fence (Conn::post_fence). Not waiting for the
  // clock: an application may be waiting for that tail now.
  // Only the listed connections are looked at; one whose ring is empty is
  // unlisted (its next unsignalled post lists it again).
  for (std::size_t k = 0; k < m.tail_conns.size();) {
    const std::uint32_t ci = m.tail_conns[k];
    Conn& c = m.conns[ci];
    if (c.ring_count == 0) {
      c.tail_listed = false;
      m.tail_conns[k] = m.tail_conns.back();
      m.tail_conns.pop_back();
      continue;
    }
    ++k;
    if (c.state != Conn::State::connected || c.fence_outstanding) continue;
    const auto tail = c.ring[(c.ring_head + c.ring_count - 1) % c.ring.size()].first;
    if (tail > c.last_signaled_seq && c.wr_seq - c.retired_seq + 1 <= m.sq_depth && c.post_fence(ci)) {
      c.last_signaled_seq = c.wr_seq;
      c.unsignaled_run = 0;
    }
  }
}

std::size_t VerbsEndpoint::do_poll(std::size_t max) noexcept {
  const std::size_t events = poll_cq(max);
  // Fences and retransmissions only once the CQ ran dry: a signalled
  // completion that is already queued closes the tail for free.
  if (events < max) housekeeping();
  return events;
}

int VerbsEndpoint::do_wait_fd() const noexcept { return impl_->channel ? impl_->channel->fd : -1; }

bool VerbsEndpoint::do_arm(std::chrono::microseconds& max_sleep) noexcept {
  Impl& m = *impl_;
  if (!m.channel) return true;  // spin endpoints have none (the base naps)
  // A notification that fired is consumed (and acknowledged at once, so
  // destroying the CQ never waits for us) and must be requested again.
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  while (ibv_get_cq_event(m.channel, &ev_cq, &ev_ctx) == 0) {
    ibv_ack_cq_events(ev_cq, 1);
    m.notify_armed = false;
  }
  if (m.notify_armed) return true;  // requested, and a poll since found nothing
  if (ibv_req_notify_cq(m.cq, 0) != 0) {
    max_sleep = std::min(max_sleep, std::chrono::microseconds(1000));
    return true;
  }
  m.notify_armed = true;
  // A completion queued before the request raises no event: poll once more
  // before sleeping.
  return false;
}

void VerbsEndpoint::do_cancel(const BackendOp& /*op*/) noexcept {
  // Verbs cannot withdraw one posted WR. The op stays with the QP until it
  // completes or is flushed (reconnect, remove_peer, endpoint close); a
  // receive stays on the SRQ until a message fills it or the endpoint closes.
}

// ----------------------------------------------------------------- exposures

Result<ExposureInfo> VerbsEndpoint::do_expose(const Slice& slice, RemoteAccess access, ExposureMode /*mode*/,
                                              std::uint64_t peer_handle) noexcept {
  // The base makes exposures for any peer (the arena's rkey, or a
  // registration of exactly the slice); what reaches here is a window for
  // one peer, in either mode.
  Impl& m = *impl_;
  if (!domain_->memory_windows()) return Status::unsupported;
  if (peer_handle >= m.conns.size() || !m.conns[peer_handle].used) return Status::invalid_argument;
  // A standard exposure: no registration per exposure (see WindowBacking).
  return expose_window(slice, access, static_cast<std::uint32_t>(peer_handle), false);
}

Enforcement VerbsEndpoint::do_enforcement(ExposureMode mode, bool per_peer) const noexcept {
  // The device checks rkeys, and the rights and state of the MR or window
  // behind them: an invalidated window or a deregistered MR no longer
  // answers. Measured on rxe by verbs-trust (forged references past the
  // initiator's checks):
  //  - the arena's rkey (standard mode, any peer) grants the whole arena
  //    with the arena's rights and is never revoked: keys only;
  //  - a window (with a peer, either mode) refuses a wrong key tag, a put
  //    into a read-only window, a get from a write-only one and any use after
  //    its invalidate; its range is checked against the MR underneath, not
  //    the window's own (rxe), so the bounds hold only when that MR is the
  //    slice's (scoped on rxe, or WindowBacking::slice). Devices other than
  //    rxe check a window's own range (InfiniBand spec); not measured here;
  //  - a sub-registration of the slice (scoped, any peer): key, range and
  //    write rights; a get through a write-only one is not measured.
  Enforcement e;
  e.keys = true;
  if (per_peer) {
    e.rights = true;
    e.read_rights = true;
    e.revocation = true;
    e.bounds = window_over_slice(mode == ExposureMode::scoped) || domain_->device_name().rfind("rxe", 0) != 0;
  } else if (mode == ExposureMode::scoped) {
    e.bounds = true;
    e.rights = true;
    e.revocation = true;
  }
  return e;
}

void VerbsEndpoint::finish_window(std::size_t slot) noexcept {
  Exposed& x = impl_->exposed[slot];
  if (x.mw) free_window(x.mw);
  x.mw = nullptr;
  // Only now, with no window bound over it, can a backing MR go.
  x.registration.reset();
  x.live = false;
  x.pending = Exposed::Pending::none;
  x.wr_id = 0;
}

void VerbsEndpoint::settle_window(std::size_t slot, int pending) noexcept {
  // A window whose bind or invalidate was still in flight when its QP went
  // away: a bind failed (retryable after reconnect), an invalidate is done.
  if (pending == static_cast<int>(Exposed::Pending::bind)) exposure_settled(slot, Status::peer_unreachable);
  if (pending == static_cast<int>(Exposed::Pending::invalidate)) exposure_settled(slot, Status::ok);
}

void VerbsEndpoint::window_op_done(std::uint64_t wr_id, int wc_status) noexcept {
  Impl& m = *impl_;
  for (std::size_t slot = 0; slot < m.exposed.size(); ++slot) {
    Exposed& x = m.exposed[slot];
    if (x.pending == Exposed::Pending::none || x.wr_id != wr_id) continue;
    if (x.pending == Exposed::Pending::bind) {
      if (wc_status == IBV_WC_SUCCESS) {
        x.pending = Exposed::Pending::none;
        x.wr_id = 0;
        exposure_settled(slot, Status::ok);
        return;
      }
      // A bind lost because the connection broke under it (flushed: a
      // peer's reconnect resets the QP) is retryable after reconnecting;
      // only a bind the device refused is an access error.
      finish_window(slot);
      exposure_settled(slot, wc_status == IBV_WC_WR_FLUSH_ERR ? Status::peer_unreachable : Status::access_denied);
      return;
    }
    // Invalidate: done (or flushed with its QP, which kills the window's
    // key as well). Reusing or deallocating now cannot race a remote
    // access. Only a window the device confirmed unbound is reused: a
    // flushed invalidate left it bound (and a flushed bind left the
    // device's key tag behind ours), so it is deallocated.
    if (wc_status == IBV_WC_SUCCESS) {
      recycle_window(slot);
    } else {
      finish_window(slot);
    }
    exposure_settled(slot, Status::ok);
    return;
  }
}

bool VerbsEndpoint::window_over_slice(bool scoped) const noexcept {
  switch (options_.window_backing) {
    case VerbsEndpointOptions::WindowBacking::arena: return false;
    case VerbsEndpointOptions::WindowBacking::slice: return true;
    case VerbsEndpointOptions::WindowBacking::automatic: break;
  }
  // rxe checks a window access against the range of the MR underneath, not
  // the window's (see WindowBacking): a window that must enforce its bounds
  // at the target needs an MR of exactly the slice there.
  return scoped && domain_->device_name().rfind("rxe", 0) == 0;
}

ibv_mw* VerbsEndpoint::take_window(std::uint32_t ci, std::uint32_t& binds) noexcept {
  Impl& m = *impl_;
  Conn& c = m.conns[ci];
  if (!c.free_windows.empty()) {
    const auto [mw, n] = c.free_windows.back();
    c.free_windows.pop_back();
    m.mw_cached.fetch_sub(1, std::memory_order_relaxed);
    m.mw_reused.fetch_add(1, std::memory_order_relaxed);
    binds = n;
    return mw;
  }
  ibv_mw* mw = ibv_alloc_mw(domain_->native_pd(), IBV_MW_TYPE_2);
  if (mw) m.mw_allocated.fetch_add(1, std::memory_order_relaxed);
  binds = 0;
  return mw;
}

void VerbsEndpoint::free_window(ibv_mw* mw) noexcept {
  (void)ibv_dealloc_mw(mw);
  impl_->mw_deallocated.fetch_add(1, std::memory_order_relaxed);
}

void VerbsEndpoint::recycle_window(std::size_t slot) noexcept {
  Impl& m = *impl_;
  Exposed& x = m.exposed[slot];
  // Reusable: unbound by a successful invalidate (the caller's word), bound
  // in the connection's current incarnation (a window bound before a QP
  // reset is not rebound on the reconnected QP), tags left, and room in
  // the connection's cache.
  if (x.mw && x.conn < m.conns.size()) {
    Conn& c = m.conns[x.conn];
    if (c.used && !c.closing() && c.incarnation == x.incarnation && x.binds < kMaxBindsPerWindow &&
        c.free_windows.size() < options_.window_cache) {
      try {
        c.free_windows.emplace_back(x.mw, x.binds);
        m.mw_cached.fetch_add(1, std::memory_order_relaxed);
        x.mw = nullptr;
      } catch (...) {
        // No room to remember it: finish_window deallocates it.
      }
    }
  }
  finish_window(slot);
}

void VerbsEndpoint::drop_window_cache(std::uint32_t ci) noexcept {
  Impl& m = *impl_;
  if (ci >= m.conns.size()) return;
  Conn& c = m.conns[ci];
  for (auto& w : c.free_windows) free_window(w.first);
  m.mw_cached.fetch_sub(c.free_windows.size(), std::memory_order_relaxed);
  c.free_windows.clear();
}

VerbsWindowStats VerbsEndpoint::window_stats() const noexcept {
  const Impl& m = *impl_;
  VerbsWindowStats st;
  st.allocated = m.mw_allocated.load(std::memory_order_relaxed);
  st.deallocated = m.mw_deallocated.load(std::memory_order_relaxed);
  st.binds = m.mw_binds.load(std::memory_order_relaxed);
  st.reused = m.mw_reused.load(std::memory_order_relaxed);
  st.cached = m.mw_cached.load(std::memory_order_relaxed);
  return st;
}

Result<ExposureInfo> VerbsEndpoint::expose_window(const Slice& slice, RemoteAccess access, std::uint32_t ci,
                                                  bool scoped) noexcept {
  Impl& m = *impl_;
  // Binding needs the connection up; the base retries (progressing, without
  // the mutex) until post_timeout.
  if (m.conns[ci].state == Conn::State::released) return connect_on_demand(ci);
  if (m.conns[ci].state == Conn::State::connecting || m.conns[ci].state == Conn::State::resetting ||
      m.conns[ci].state == Conn::State::releasing) {
    return Status::would_block;
  }
  Conn& c = m.conns[ci];
  if (c.state != Conn::State::connected) return Status::peer_unreachable;
  if (c.wr_seq - c.retired_seq + 1 > m.sq_depth) return Status::would_block;
  Registration backing;
  ibv_mr* mr = nullptr;
  if (window_over_slice(scoped)) {
    // Local rights only: remote access to these bytes exists only through
    // the window bound over them.
    auto reg = domain_->try_register(slice.address(), static_cast<std::size_t>(slice.length()), Access::local);
    if (!reg) return reg.status();
    backing = std::move(*reg);
    mr = static_cast<ibv_mr*>(backing.native());
  } else {
    // The object's own MR (arena or user block), registered once with
    // IBV_ACCESS_MW_BIND: binding a window over it is not a registration.
    auto region = slice.ldo().region(*domain_);
    if (!region) return region.status();
    if (!region->registration || !region->registration->native()) return Status::unsupported;
    mr = static_cast<ibv_mr*>(region->registration->native());
  }
  std::size_t slot = 0;
  try {
    slot = m.claim_exposure_slot();
  } catch (...) {
    return Status::out_of_memory;
  }

  std::uint32_t binds = 0;
  ibv_mw* mw = take_window(ci, binds);
  if (!mw) return errno == ENOMEM ? Status::out_of_memory : Status::unsupported;
  // The next key tag: no earlier key of this window matches any more.
  const std::uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  const std::uint64_t seq = c.wr_seq + 1;
  wr.wr_id = make_wr_id(kTagInternal, seq, ci);
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = rkey;
  wr.bind_mw.bind_info.mr = mr;
  wr.bind_mw.bind_info.addr = reinterpret_cast<std::uintptr_t>(slice.address());
  wr.bind_mw.bind_info.length = slice.length();
  wr.bind_mw.bind_info.mw_access_flags = window_access_flags(access);
  if (ibv_post_send(c.qp, &wr, &bad) != 0) {
    // Nothing reached the device: the window is as it was (unbound, same
    // tag) and can wait for the next exposure.
    if (c.free_windows.size() < options_.window_cache) {
      try {
        c.free_windows.emplace_back(mw, binds);
        m.mw_cached.fetch_add(1, std::memory_order_relaxed);
        mw = nullptr;
      } catch (...) {
      }
    }
    if (mw) free_window(mw);
    return Status::would_block;
  }
  m.mw_binds.fetch_add(1, std::memory_order_relaxed);
  c.wr_seq = seq;
  c.idle.touch();
  c.last_signaled_seq = seq;
  c.unsignaled_run = 0;
  // libibverbs does not update mw->rkey for WR binds; keep it for the next
  // ibv_inc_rkey.
  mw->rkey = rkey;
  // Not waited for here (the endpoint's mutex is held): the base waits for
  // exposure_settled() from window_op_done(), progressing without the mutex.
  Exposed& x = m.exposed[slot];
  x.live = true;
  x.registration = std::move(backing);
  x.mw = mw;
  x.rkey = rkey;
  x.conn = ci;
  x.binds = binds + 1;
  x.incarnation = c.incarnation;
  x.pending = Exposed::Pending::bind;
  x.wr_id = wr.wr_id;
  ExposureInfo info;
  info.key = rkey;
  info.address = reinterpret_cast<std::uintptr_t>(slice.address());
  info.mode = AddressMode::virtual_address;
  info.handle = slot;
  info.pending = true;
  return info;
}

void VerbsEndpoint::do_revoke(std::uint64_t handle) noexcept {
  Impl& m = *impl_;
  if (handle >= m.exposed.size() || !m.exposed[handle].live) return;
  Exposed& x = m.exposed[handle];
  if (x.pending == Exposed::Pending::invalidate) {
    revoke_deferred(handle);  // already on its way
    return;
  }
  // An invalidate queued behind everything posted on the window's QP (a
  // still pending bind included): once it completes, deallocating cannot
  // race a remote access. It is not waited for here: the base parks the
  // slice until window_op_done() confirms. When it cannot be posted (QP in
  // ERROR, not connected, send queue full), deallocation revokes
  // synchronously. A window whose invalidate completed successfully goes
  // back to its connection's free list (recycle_window); one whose
  // invalidate was flushed is still bound on the device and is deallocated.
  if (x.conn < m.conns.size() && m.conns[x.conn].used && m.conns[x.conn].state == Conn::State::connected) {
    Conn& c = m.conns[x.conn];
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    const std::uint64_t seq = c.wr_seq + 1;
    wr.wr_id = make_wr_id(kTagInternal, seq, x.conn);
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = x.rkey;
    if (c.wr_seq - c.retired_seq + 1 <= m.sq_depth && ibv_post_send(c.qp, &wr, &bad) == 0) {
      c.wr_seq = seq;
      c.last_signaled_seq = seq;
      c.unsignaled_run = 0;
      x.pending = Exposed::Pending::invalidate;
      x.wr_id = wr.wr_id;
      revoke_deferred(handle);
      return;
    }
  }
  finish_window(handle);
}

}  // namespace regpool
