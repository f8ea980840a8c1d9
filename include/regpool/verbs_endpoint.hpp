#pragma once
// Verbs transport: an Endpoint over rdma-core reliable-connected (RC) queue
// pairs, one per peer, on a VerbsDomain's port.
//
// Connection setup (no rdma_cm needed): every endpoint has one UD queue pair
// for control messages. Its name() is {GID, LID, port, UD QPN, random
// endpoint id}. insert_peer(name) only records the peer (and an address
// handle to its UD QP): the RC QP is made on first use. The first operation
// to the peer (or a window exposed to it) creates an RC QP, moves it
// RESET -> INIT and sends a REQ (our RC QPN, a random PSN, an epoch) to the
// peer's UD QP; the peer, inside its progress(), creates (or finds) its own
// RC QP for us, moves it INIT -> RTR (our QPN/PSN/GID) -> RTS and answers
// with a REP carrying its QPN and PSN; our progress then moves ours
// INIT -> RTR -> RTS. So a target
// never has to insert its initiators (as on libfabric RDM), but it must be
// progressing (progress(), wait(), or the progress thread) while a new peer
// connects; the first operation to a peer answers would_block until then, and
// the base class retries it for up to EndpointConfig::post_timeout.
// REQs are retransmitted every kRetransmit until answered (UD is unreliable).
// When both sides insert each other at once, each QP is connected to the
// other's single QP; nothing is duplicated.
//
// Idle release (EndpointConfig::idle_release, 0 = never): a connection
// neither side has used for that long, with nothing in flight and no window
// bound on it, is given back. The side idle for the full time sends REL
// (naming the pair of QPs); the peer grants with REL_ACK when it has nothing
// in flight and has been idle for half the time (both destroy their QP), or
// refuses with REL_NAK. Both asking at once: each grants the other. The
// peer's agreement is needed because its one-sided operations into our
// memory never pass our CPU. While the answer is out (at most 1 s, or half
// post_timeout) posts to the peer answer would_block; an unanswered REL
// keeps the connection. The next use makes a new QP (a new REQ); a REQ from
// a new QP of a peer whose release we asked ends ours too. The control
// messages are parsed by verbs_wire::parse_ctrl (fuzzed).
//
// Errors and recovery: a failed operation puts its RC QP into the ERROR state
// (remote access errors take the target's QP there too). The failed op
// completes with its cause, every later op on that QP with peer_unreachable
// (flushed), and the peer is marked broken. reconnect(peer) moves the QP to
// ERROR and returns; the QP's old work requests then come back flushed
// through progress (each op's slot, and with it its LDO reference, is
// released then; the base has already answered the ops with
// peer_unreachable), and once the last one is back progress RESETs the QP
// and re-runs RESET -> INIT -> RTR -> RTS with a new PSN and a new epoch.
// Until then posts to the peer answer would_block, which the base retries
// while progressing. Nothing of this is waited for under the endpoint's
// mutex; old work requests that never come back (not expected: a QP in
// ERROR flushes everything) are answered after 2 s. The peer must reconnect
// too: it does so by itself when its progress() sees the REQ with the new
// epoch (it resets its own QP the same way, failing what it still had in
// flight to us with peer_unreachable, and answers once that is done). A peer
// that does not progress leaves the reconnecting side's posts answering
// would_block until post_timeout. remove_peer likewise moves the QP to
// ERROR at once and destroys it once its work requests are back.
//
// Soft-RoCE (rxe) runs a QP's send queue inside ibv_post_send, in the
// caller's thread: a post queued behind a large transfer on the same QP can
// itself take 60-800 ms (measured with a 32 MiB write in the qemu guest),
// and it runs with the endpoint's mutex held, since backend calls are
// serialised. Hardware HCAs only ring a doorbell there. Resets post their
// marker after moving the QP to ERROR, so they never send data inside
// ibv_post_send.
//
// Statuses from work completions: IBV_WC_REM_ACCESS_ERR (wrong or revoked
// key, range outside the key, missing right) -> bad_key; RETRY_EXC_ERR and
// RNR_RETRY_EXC_ERR -> peer_unreachable; WR_FLUSH_ERR -> peer_unreachable;
// LOC_LEN_ERR (a message larger than the receive buffer) -> out_of_bounds on
// the receive; REM_INV_REQ_ERR -> invalid_argument; others -> transport_error.
//
// Data path: put/get/send/recv/atomics map to RDMA WRITE/READ, SEND, receives
// on a shared receive queue (so post_recv takes messages from any peer), and
// IBV_WR_ATOMIC_FETCH_AND_ADD / CMP_AND_SWP (native NIC atomics; atomic
// against other verbs atomics on the same device, not against CPU atomics on
// the target). Puts and sends up to the QP's max_inline_data are posted with
// IBV_SEND_INLINE, and of those at most kSignalInterval - 1 in a row go
// unsignalled (selective signalling): an RC send queue completes in order,
// so a signalled completion also completes the unsignalled ones posted
// before it. An op posted while nothing else is in flight on its QP is
// always signalled (a lone op would otherwise wait for the fence below: a
// second round trip), and a run of unsignalled ops stays under half of the
// WRs in flight ahead of it, so a stream that waits for its oldest op gets
// a completion every half window instead of draining the queue. An
// unsignalled tail is closed by a signalled zero-length RDMA WRITE once the
// CQ runs dry, so every op still gets its completion. Inline sends are the
// exception (VerbsEndpointOptions::inject_sends): they complete at their
// post, nobody waits for their WRs, and a tail of them is closed only once
// the connection has been quiet for a clock tick (so an idle queue pair can
// still be released).
//
// Exposures (scoped, revocable exports):
//  - expose(slice, access), made by the base Endpoint: in standard mode (the
//    default) the arena's rkey, nothing registered; in scoped mode a
//    sub-registration (ibv_reg_mr) of exactly the slice with exactly the
//    rights; its rkey grants that slice and nothing else of the arena, to
//    any peer; revoke deregisters it.
//  - expose(slice, access, peer): a type-2 memory window bound with
//    IBV_WR_BIND_MW on that peer's QP. In standard mode it is bound over the
//    object's own MR (arena or user block, registered once with
//    IBV_ACCESS_MW_BIND), so it costs no registration; in scoped mode on rxe
//    over a local-only MR of the slice (see WindowBacking), because rxe checks
//    a window access against the MR underneath, not the window's own range. A
//    type 2 window is tied to the QP it was bound on, so the key grants the
//    slice to exactly that peer, with exactly the rights (read_only: remote
//    read; write_only: remote write; read_write: read, write, atomics).
//    Windows are recycled per connection: one whose invalidate completed
//    goes on the connection's free list (up to window_cache) and is rebound
//    with the next 8-bit key tag (ibv_inc_rkey), so no earlier key of it
//    matches; after 255 binds it is deallocated instead, so its tags never
//    repeat. Windows whose bind or invalidate did not complete successfully
//    (flushed by a reset) are deallocated, and a reset or remove_peer drops
//    the connection's free list. Binding needs the connection up: the call
//    progresses until it is, then posts IBV_WR_BIND_MW and waits for its
//    completion, both bounded by post_timeout and without holding the
//    endpoint's mutex while waiting (the bind is reported to the base with
//    exposure_settled()). Revoking posts IBV_WR_LOCAL_INV; the window is
//    recycled or deallocated (and a backing MR deregistered) when it
//    completes.
//    revoke() waits for that briefly; if it is queued behind slow work
//    requests, the base keeps the slice's LDO reference until progress sees
//    the completion. If the QP is in ERROR (or the invalidate cannot be
//    posted) the window is deallocated at once, which revokes as well.
//    After a reconnect of that peer, expose again: windows bound on the old
//    connection are not carried over.
//  A peer using a revoked or out-of-range key gets bad_key and the target's
//  memory is untouched; its QP (and ours) then need reconnect().
//
// Receive sources: the SRQ receive's wc.qp_num names the RC connection, so
// Completion::peer is the PeerId of the peer whose QP it is (kAnyPeer for a
// peer that connected but was never inserted here).
// Sleeping waits (EndpointConfig::wait_mode sleep/adaptive): the CQ has a
// completion channel; do_arm requests a notification (ibv_req_notify_cq)
// and polls once more before the base sleeps on the channel's fd.
//
// Ownership: the endpoint keeps its VerbsDomain alive. Thread-safety: as
// Endpoint (every backend call is serialised by the base class's mutex).

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "regpool/endpoint.hpp"
#include "regpool/endpoint_backend.hpp"
#include "regpool/verbs_domain.hpp"

struct ibv_cq;
struct ibv_srq;
struct ibv_qp;
struct ibv_ah;
struct ibv_mw;
struct ibv_wc;

namespace regpool {

struct VerbsEndpointOptions {
  // Puts/sends up to this many bytes are inlined when the QP allows it
  // (0 = never inline). The device may grant less; the QP's value is used.
  std::uint32_t max_inline = 64;
  // Selective signalling of inline puts/sends (off = signal every WR).
  bool selective_signaling = true;
  // Sends up to the inline size complete when the post returns (status ok,
  // all their bytes), as fi_inject does: the payload travels inside the
  // work request, so the buffer is the caller's again at once, and the WR
  // goes unsignalled (every kSignalInterval-th is signalled, only so the
  // send queue's slots come back). A send ping-pong then reaps one
  // completion per message, its receive's, as ib_send_lat does. The cost:
  // a send that fails after its post (the peer died, the connection broke)
  // is not reported on that send; the connection's failure is, on every
  // later operation to the peer (peer_unreachable). Off: every send
  // completes from its own work completion, failures included. Puts never
  // do this: a put's completion means its bytes are at the target.
  bool inject_sends = true;
  // RC transport retries before RETRY_EXC_ERR, and the ACK timeout exponent
  // (4.096 us * 2^timeout; 14 = 67 ms: a dead peer is noticed in ~0.5 s).
  std::uint8_t retry_count = 7;
  std::uint8_t ack_timeout = 14;
  // Outstanding RDMA READs/atomics per QP (clamped to the device's limit).
  std::uint8_t max_rd_atomic = 16;
  // Send queue depth per peer (0 = max_in_flight + room for window binds).
  std::uint32_t send_queue_depth = 0;
  // What a peer-scoped window (expose(slice, access, peer)) is bound over.
  //  - arena: the arena's own MR. Cheapest (no registration per export), and
  //    sufficient where the device checks accesses against the window's own
  //    range, as the IB spec intends (hardware HCAs).
  //  - slice: a local-only MR of exactly the slice (IBV_ACCESS_LOCAL_WRITE |
  //    MW_BIND, no remote rights: only the window grants remote access).
  //    Needed on Soft-RoCE: rxe checks a window access against the range of
  //    the MR underneath it, not against the window's (check_rkey() in
  //    drivers/infiniband/sw/rxe/rxe_resp.c calls mr_check_range(mw->mr, ...)),
  //    so an arena-backed window would let a forged length reach the whole
  //    arena. Measured: a put 256 bytes past an arena-backed window succeeds
  //    on rxe (kernel 6.1).
  //  - automatic: arena for standard exposures (no registration per
  //    exposure: the reference carries the bounds, the initiator checks
  //    them, and on rxe the target enforces key, rights, peer and
  //    revocation but bounds only to the arena's MR); for scoped exposures
  //    (the target must enforce the bounds too) slice on rxe devices, arena
  //    elsewhere. Today's expose(slice, access, peer) is a standard exposure.
  enum class WindowBacking : std::uint8_t { automatic, arena, slice };
  WindowBacking window_backing = WindowBacking::automatic;
  // Type-2 windows kept per peer for reuse once their invalidate completed
  // (rebound with a fresh key tag, so no earlier key of the window matches).
  // 0 = a fresh ibv_alloc_mw per exposure, deallocated after its revoke.
  std::uint32_t window_cache = 16;
};

// Memory-window counters of one endpoint (relaxed snapshot, any thread).
struct VerbsWindowStats {
  std::uint64_t allocated = 0;    // ibv_alloc_mw calls that succeeded
  std::uint64_t deallocated = 0;  // ibv_dealloc_mw calls
  std::uint64_t binds = 0;        // IBV_WR_BIND_MW posted
  std::uint64_t reused = 0;       // of those, on a recycled window
  std::uint64_t cached = 0;       // windows on the per-peer free lists now
};

// RC queue pairs of one endpoint (relaxed snapshot, any thread). A queue
// pair is made on the first operation to or from a peer and released after
// EndpointConfig::idle_release without use on either side.
struct VerbsConnectionStats {
  std::uint64_t queue_pairs = 0;  // RC queue pairs that exist now
  std::uint64_t created = 0;      // made so far (first use, use after a release)
  std::uint64_t released = 0;     // given back when idle
};

class REGPOOL_API VerbsEndpoint final : public Endpoint {
 public:
  static constexpr std::uint32_t kSignalInterval = 16;

  // Setup: throws Error (errno as the provider code).
  VerbsEndpoint(std::shared_ptr<VerbsDomain> domain, const EndpointConfig& config = {},
                const VerbsEndpointOptions& options = {});
  ~VerbsEndpoint() override;

  static std::unique_ptr<VerbsEndpoint> open(std::shared_ptr<VerbsDomain> domain, const EndpointConfig& config = {},
                                             const VerbsEndpointOptions& options = {}) {
    return std::make_unique<VerbsEndpoint>(std::move(domain), config, options);
  }

  const std::shared_ptr<VerbsDomain>& verbs_domain() const noexcept { return domain_; }
  // What the device granted on RC QPs (0 = no inline sends).
  std::uint32_t max_inline_data() const noexcept { return max_inline_; }
  // Window allocation, binding and recycling counters.
  VerbsWindowStats window_stats() const noexcept;
  // RC queue pairs: made on first use, released when idle.
  VerbsConnectionStats connection_stats() const noexcept;

 protected:
  Backend backend_kind() const noexcept override { return Backend::verbs; }
  Domain& domain() const noexcept override { return *domain_; }
  std::uint64_t max_message_size() const noexcept override { return max_msg_; }
  // RDMA needs no target CPU once connected; only connection setup does
  // (see the top comment).
  bool needs_target_progress() const noexcept override { return false; }
  bool do_native_atomics() const noexcept override { return true; }
  bool do_gathered_sends() const noexcept override { return true; }
  // RDMA READ proceeds on the NIC (gets overlap); the crossover was not
  // measured (Soft-RoCE under emulation says little about a NIC): 16 KiB,
  // the usual hardware figure.
  TransferTraits do_transfer_traits() const noexcept override { return {false, 16 << 10}; }
  std::vector<std::byte> do_name() const override;
  std::uint64_t do_insert_peer(std::span<const std::byte> name) override;
  void do_remove_peer(std::uint64_t handle) noexcept override;
  Result<std::uint64_t> do_reconnect(PeerId peer, std::uint64_t handle,
                                     std::span<const std::byte> name) noexcept override;
  Status do_post(const BackendOp& op) noexcept override;
  Status do_post_batch(std::span<const BackendOp* const> ops, std::size_t& posted) noexcept override;
  std::size_t do_poll(std::size_t max) noexcept override;
  void do_cancel(const BackendOp& op) noexcept override;
  Result<ExposureInfo> do_expose(const Slice& slice, RemoteAccess access, ExposureMode mode,
                                 std::uint64_t peer_handle) noexcept override;
  void do_revoke(std::uint64_t handle) noexcept override;
  Enforcement do_enforcement(ExposureMode mode, bool per_peer) const noexcept override;
  int do_wait_fd() const noexcept override;
  bool do_arm(std::chrono::microseconds& max_sleep) noexcept override;

 private:
  struct Conn;
  struct Exposed;
  struct Impl;

  void open_resources();
  void close_resources() noexcept;
  // Connections: index into Impl::conns. new_conn throws (setup); it makes
  // no QP: open_qp does, on first use (connect_on_demand, or a peer's REQ),
  // and release_qp gives it back once idle (see connection_stats).
  std::uint32_t new_conn(const void* remote_name);
  int open_qp(std::uint32_t ci) noexcept;
  void release_qp(std::uint32_t ci) noexcept;
  void forget_released_qpn(std::uint32_t ci) noexcept;
  Status connect_on_demand(std::uint32_t ci) noexcept;
  // Operations, fences or window work in flight, or a window bound on it.
  bool conn_busy(std::uint32_t ci) const noexcept;
  void handle_release(std::uint32_t ci, std::uint8_t type, std::uint32_t qpn, std::uint32_t dst_qpn) noexcept;
  int qp_to_init(Conn& c) noexcept;
  int qp_to_rts(Conn& c) noexcept;
  // A reset never waits (the endpoint's mutex is held): begin_reset moves
  // the QP to ERROR and posts a marker; finish_reset runs from progress once
  // the old WRs came back flushed (or at once when none are out). `after` is
  // a Conn::AfterReset.
  void begin_reset(std::uint32_t ci, int after) noexcept;
  void finish_reset(std::uint32_t ci) noexcept;
  void send_ctrl(Conn& c, std::uint8_t type, std::uint32_t epoch) noexcept;
  void send_ctrl_to(Conn& c, std::uint8_t type, std::uint32_t epoch, std::uint32_t qpn,
                    std::uint32_t dst_qpn) noexcept;
  std::uint32_t conn_by_id(std::uint64_t endpoint_id) const noexcept;
  std::uint32_t conn_by_qpn(std::uint32_t qpn) const noexcept;
  // Data path.
  // put, get, send and atomics on the peer's RC QP; receives on the SRQ.
  Status post_rc(const BackendOp& op) noexcept;
  // The connection of op's peer (`ci`) when it can take a WR now; else
  // why not (would_block while connecting, peer_unreachable, ...).
  Status rc_conn(const BackendOp& op, std::uint32_t& ci) noexcept;
  // Whether an op may go unsignalled (selective signalling, see above),
  // after `unsignaled_run` unsignalled ops, with `in_flight` WRs of its QP
  // posted and not yet retired.
  bool may_skip_signal(bool small_inline, std::uint32_t unsignaled_run, std::uint64_t in_flight) const noexcept;
  // Bookkeeping of an op posted on `ci` as WRs [first, last].
  void note_rc_posted(std::uint32_t ci, std::uint32_t index, std::uint64_t first, std::uint64_t last,
                      bool signaled) noexcept;
  // Bookkeeping of an injected send (inject_sends) posted on `ci` as WR `seq`.
  void note_injected(std::uint32_t ci, std::uint32_t index, std::uint64_t seq, bool signaled) noexcept;
  // Most WRs chained into one ibv_post_send by do_post_batch.
  static constexpr std::size_t kBatchChain = 32;
  Status post_srq(const BackendOp& op) noexcept;
  std::size_t poll_cq(std::size_t max) noexcept;
  void handle_wc(const ibv_wc& wc) noexcept;
  void handle_send_wc(std::uint32_t ci, std::uint64_t seq, const ibv_wc& wc) noexcept;
  void handle_ctrl(std::uint32_t k, std::uint32_t byte_len) noexcept;
  void retire(std::uint32_t ci, std::uint64_t seq) noexcept;
  void conn_failed(std::uint32_t ci) noexcept;
  void housekeeping() noexcept;
  // Window binds and invalidates are posted, never waited for under the
  // endpoint's mutex: their completions end them here (see Exposed).
  void window_op_done(std::uint64_t wr_id, int wc_status) noexcept;
  void finish_window(std::size_t slot) noexcept;
  void settle_window(std::size_t slot, int pending) noexcept;
  // Window recycling (per connection, see Conn::free_windows). A window goes
  // back to its connection's free list only when its bind and its
  // invalidate both completed successfully on the connection's current
  // incarnation; anything else is deallocated.
  Result<ExposureInfo> expose_window(const Slice& slice, RemoteAccess access, std::uint32_t ci,
                                     bool scoped) noexcept;
  bool window_over_slice(bool scoped) const noexcept;
  ibv_mw* take_window(std::uint32_t ci, std::uint32_t& binds) noexcept;
  void recycle_window(std::size_t slot) noexcept;
  void free_window(ibv_mw* mw) noexcept;
  void drop_window_cache(std::uint32_t ci) noexcept;

  std::shared_ptr<VerbsDomain> domain_;
  VerbsEndpointOptions options_;
  std::unique_ptr<Impl> impl_;
  std::uint64_t max_msg_ = 0;
  std::uint32_t max_inline_ = 0;
};

}  // namespace regpool
