#pragma once
// Verbs transport: an Endpoint over rdma-core reliable-connected (RC) queue
// pairs, one per peer, on a VerbsDomain's port.
//
// Connection setup (no rdma_cm needed): every endpoint has one UD queue pair
// for control messages. Its name() is {GID, LID, port, UD QPN, random
// endpoint id}. insert_peer(name) creates an RC QP, moves it RESET -> INIT and
// sends a REQ (our RC QPN, a random PSN, an epoch) to the peer's UD QP; the
// peer, inside its progress(), creates (or finds) its own RC QP for us, moves
// it INIT -> RTR (our QPN/PSN/GID) -> RTS and answers with a REP carrying its
// QPN and PSN; our progress then moves ours INIT -> RTR -> RTS. So a target
// never has to insert its initiators (as on libfabric RDM), but it must be
// progressing (progress(), wait(), or the progress thread) while a new peer
// connects; the first operation to a peer answers would_block until then, and
// the base class retries it for up to EndpointConfig::post_timeout.
// REQs are retransmitted every kRetransmit until answered (UD is unreliable).
// When both sides insert each other at once, each QP is connected to the
// other's single QP; nothing is duplicated.
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
// IBV_SEND_INLINE, and of those only every kSignalInterval-th is signalled
// (selective signalling): an RC send queue completes in order, so a signalled
// completion also completes the unsignalled ones posted before it. An
// unsignalled tail is closed by a signalled zero-length RDMA WRITE once the
// CQ runs dry, so every op still gets its completion.
//
// Exposures (scoped, revocable exports):
//  - expose(slice, access): a sub-registration (ibv_reg_mr) of exactly the
//    slice with exactly the rights; its rkey grants that slice and nothing
//    else of the arena, to any peer; revoke deregisters it.
//  - expose(slice, access, peer): a type-2 memory window (ibv_alloc_mw
//    IBV_MW_TYPE_2, bound with IBV_WR_BIND_MW on that peer's QP over the
//    arena's MR, which the domain registered with IBV_ACCESS_MW_BIND, or over
//    a local-only MR of the slice on rxe: see WindowBacking). A type 2 window
//    is tied to the QP it was bound on, so the key grants exactly the slice,
//    to exactly that peer. Binding needs the connection up: the call
//    progresses until it is, then posts IBV_WR_BIND_MW and waits for its
//    completion, both bounded by post_timeout and without holding the
//    endpoint's mutex while waiting (the bind is reported to the base with
//    exposure_settled()). Revoking posts IBV_WR_LOCAL_INV; the window is
//    deallocated (and a backing MR deregistered) when it completes.
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
  //  - automatic: slice on rxe devices, arena elsewhere.
  enum class WindowBacking : std::uint8_t { automatic, arena, slice };
  WindowBacking window_backing = WindowBacking::automatic;
};

class VerbsEndpoint final : public Endpoint {
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

 protected:
  Backend backend_kind() const noexcept override { return Backend::verbs; }
  Domain& domain() const noexcept override { return *domain_; }
  std::uint64_t max_message_size() const noexcept override { return max_msg_; }
  // RDMA needs no target CPU once connected; only connection setup does
  // (see the top comment).
  bool needs_target_progress() const noexcept override { return false; }
  bool do_native_atomics() const noexcept override { return true; }
  std::vector<std::byte> do_name() const override;
  std::uint64_t do_insert_peer(std::span<const std::byte> name) override;
  void do_remove_peer(std::uint64_t handle) noexcept override;
  Result<std::uint64_t> do_reconnect(PeerId peer, std::uint64_t handle,
                                     std::span<const std::byte> name) noexcept override;
  Status do_put(const OpDesc& op) noexcept override;
  Status do_get(const OpDesc& op) noexcept override;
  Status do_send(const OpDesc& op) noexcept override;
  Status do_recv(const OpDesc& op) noexcept override;
  Status do_atomic(const OpDesc& op) noexcept override;
  std::size_t do_poll(std::size_t max) noexcept override;
  void do_cancel(const OpDesc& op) noexcept override;
  Result<ExposureInfo> do_expose(const Slice& slice, RemoteAccess access) noexcept override;
  Result<ExposureInfo> do_expose_to(const Slice& slice, RemoteAccess access, PeerId peer,
                                    std::uint64_t peer_handle) noexcept override;
  void do_revoke(std::uint64_t handle) noexcept override;
  int do_wait_fd() const noexcept override;
  bool do_arm(std::chrono::microseconds& max_sleep) noexcept override;

 private:
  struct Conn;
  struct Exposed;
  struct Impl;

  void open_resources();
  void close_resources() noexcept;
  // Connections: index into Impl::conns. new_conn throws (setup).
  std::uint32_t new_conn(const void* remote_name);
  int qp_to_init(Conn& c) noexcept;
  int qp_to_rts(Conn& c) noexcept;
  // A reset never waits (the endpoint's mutex is held): begin_reset moves
  // the QP to ERROR and posts a marker; finish_reset runs from progress once
  // the old WRs came back flushed (or at once when none are out). `after` is
  // a Conn::AfterReset.
  void begin_reset(std::uint32_t ci, int after) noexcept;
  void finish_reset(std::uint32_t ci) noexcept;
  void send_ctrl(Conn& c, std::uint8_t type, std::uint32_t epoch) noexcept;
  std::uint32_t conn_by_id(std::uint64_t endpoint_id) const noexcept;
  std::uint32_t conn_by_qpn(std::uint32_t qpn) const noexcept;
  // Data path.
  Status post_rc(const OpDesc& op) noexcept;
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

  std::shared_ptr<VerbsDomain> domain_;
  VerbsEndpointOptions options_;
  std::unique_ptr<Impl> impl_;
  std::uint64_t max_msg_ = 0;
  std::uint32_t max_inline_ = 0;
};

}  // namespace regpool
