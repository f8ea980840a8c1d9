#pragma once
// libfabric transport: an Endpoint over one FI_EP_RDM endpoint of a
// FabricDomain, with its own address vector (FI_AV_TABLE) and completion
// queue.
//
// Provider behaviour this class is built around (measured, see docs/provider-facts.md):
//  - Manual progress (tcp;ofi_rxm, shm): operations aimed at a process
//    complete only while that process calls progress() (or runs the progress
//    thread). On tcp the first operation to a peer answers -FI_EAGAIN until
//    the peer progresses (connection setup); the base class retries after
//    polling, bounded by EndpointConfig::post_timeout.
//  - Keys: shm checks neither keys nor access rights. The protection users
//    get there is the base class's check before the wire, which every
//    operation goes through. tcp checks keys, the registration's range and
//    its rights, and with FI_DELIVERY_COMPLETE a bad write fails itself
//    instead of poisoning the next operation. Keys are random (FabricDomain).
//  - Exposures (docs/exposures.md): standard mode uses the object's arena
//    (or user block) registration and registers nothing; scoped mode is a
//    registration of exactly the slice with exactly the rights asked and a
//    random key, so on tcp the key grants that slice only and revoking
//    closes it. enforcement() says which of these the target checks.
//  - Atomics: native (fi_fetch_atomic / fi_compare_atomic, FI_UINT64) where
//    the provider's own core has FI_ATOMIC (shm). On layered providers
//    (tcp;ofi_rxm) they are emulated: a request message goes to the target's
//    control endpoint, the target's progress() validates it against its
//    exposures (key, range, rights, alignment) and applies it with
//    std::atomic_ref under the endpoint's mutex, then replies with the old
//    value. Emulated atomics are atomic against each other (all of them on a
//    target are applied by that target, one at a time) and against local
//    std::atomic_ref users, not against native NIC atomics (there are none).
//    The control endpoint is a second FI_EP_RDM endpoint: the domain offers
//    no FI_TAGGED, so control traffic cannot share the user's receive
//    queue without landing in user buffers. It is opened only where
//    wanted (FabricEndpointOptions::emulated_atomics): at construction for
//    an endpoint that serves atomics (its name then carries the control
//    address), else at the first insert_peer of a peer that serves them.
//    Atomics toward a peer that serves none, or from an endpoint opened
//    with EmulatedAtomics::off, return Status::unsupported at once.
//  - Errors map to statuses: FI_ECANCELED/ENOTCONN/EPIPE/ECONNRESET/
//    EHOSTUNREACH/ECONNREFUSED -> peer_unreachable (peer marked broken, use
//    reconnect()), key errors -> bad_key, FI_EACCES/EPERM -> access_denied,
//    FI_ETRUNC -> out_of_bounds, FI_ETIMEDOUT -> timeout. tcp;ofi_rxm: a
//    target that rejects a key closes the connection; the op then completes
//    bad_key (access_denied) and the peer is marked broken (reconnect()).
//  - tcp;ofi_rxm receives carry a shared overflow area behind the slice: a
//    message larger than the slice completes out_of_bounds (bytes = slice
//    length) and the connection keeps working (a provider-truncated eager
//    message would lose every later message of that connection).
//  - reconnect(peer) removes the peer's addresses from the address vectors,
//    progresses briefly so rxm retires the old connection, and inserts them
//    again, which makes rxm open new connections.
//  - Receive sources: with FI_SOURCE (see FabricDomain) receives are read
//    with fi_cq_readfrom and the address mapped to the PeerId insert_peer
//    gave. Our own address is inserted first: shm 1.17 reports a sender it
//    cannot map as fi_addr 0, which would otherwise name the first peer.
//    Unknown senders are kAnyPeer (docs/progress.md).
//  - Sleeping waits (EndpointConfig::wait_mode sleep/adaptive): the CQs are
//    opened with FI_WAIT_FD where the provider has it (tcp;ofi_rxm), their
//    descriptors share one epoll set (do_wait_fd), and fi_trywait arms it
//    (do_arm). shm refuses FI_WAIT_FD: a sleeping shm endpoint makes a
//    doorbell instead, /dev/shm/regpool-bell.<region> (do_wait_bell, see
//    transport/fabric_shm.hpp), which every endpoint that inserted it maps
//    at insert_peer (checked: a regular file of our euid, exact size,
//    magic; anything else means no bell) and rings after each post to it.
//    The file is removed at close; a killed process leaves it (4 KiB), and
//    the next endpoint given the same region name replaces it.
//  - shm and dead peers (libfabric 1.17 spins for ever on a region lock a
//    killed peer held): the endpoint tries each such lock before the
//    provider call that takes it and skips the call while it is held,
//    checks peers' processes by the pid in their shm address (a dead peer's
//    ops complete peer_unreachable, the peer is marked broken), and releases
//    its own region lock only once its holder is proven dead
//    (FabricEndpointOptions::peer_check_interval, stuck_lock_patience;
//    shm_stats()). A peer killed holding our lock between that try and the
//    provider's own spin is rescued by a helper thread the endpoint owns
//    (FabricEndpointOptions::rescue_stuck_calls): the one thread an shm
//    endpoint starts, asleep but for a look a few times a second.
//  - shm needs cross-memory attach (process_vm_readv/writev) between the
//    two processes. Without it libfabric 1.17's shm completes puts before
//    their bytes land, never completes an access the target refuses, and
//    crashes in progress after a peer with large transfers in flight is
//    removed. So construction on shm throws Error(unsupported) when
//    FI_SHM_DISABLE_CMA is true, and insert_peer throws Error(unsupported,
//    EPERM) for a peer whose memory this process may not read (another
//    user, kernel.yama.ptrace_scope >= 1, not dumpable, no
//    CAP_SYS_PTRACE in a sandbox); the message names the cause and the
//    remedy (docs/provider-facts.md, "shm without cross-memory attach").
//    Those copies go to the process the peer's name names: insert_peer
//    throws Error(malformed) for a name whose process does not map the
//    shm region the name names (/proc/<pid>/maps), so a made-up name
//    cannot steer them into a third process (docs/bad-input.md).
//  - net and dead peers (libfabric 1.17 answers -FI_EAGAIN for ever to a
//    post aimed at a peer whose process is gone, as it does for a while to
//    a live peer that has not taken the connection yet): when posts to a
//    peer keep being refused for 100 ms, or an emulated atomic's reply has
//    been owed for as long, the endpoint connects (non-blocking) to the
//    TCP address in the peer's name, where its endpoint listens. A refused
//    connect proves the endpoint gone: the post returns peer_unreachable,
//    the peer's operations in flight complete peer_unreachable and the peer
//    is marked broken (dead_peers_found()). An accepted connect, no answer
//    or an unreachable host proves nothing: the peer is probed again, less
//    often, and post_timeout / op_timeout bound the wait as before. net
//    also cancels an op alike when the target refused it and when the
//    connection closed under it (prov_errno is then a stale errno): such a
//    completion waits for the same probe (one connect round trip) and
//    reports peer_unreachable when the listener is gone, else the refusal
//    (bad_key for an RMA, out_of_bounds for a send).
//  - Hostile peers: insert_peer checks every field of a name against the
//    local provider's address format and length before any provider call
//    (Error(Status::malformed) naming the field). An emulating target checks
//    every field of every control message, drops and counts bad ones
//    (control_stats()), and keeps at most max_reply_peers reply addresses.
//
// Ownership: the endpoint keeps its FabricDomain alive (shared_ptr). Pools
// serving that domain must outlive nothing here: in-flight operations hold
// their LDOs. Thread-safety: as Endpoint.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "regpool/endpoint.hpp"
#include "regpool/endpoint_backend.hpp"
#include "regpool/fabric_domain.hpp"

struct fid_av;
struct fid_cq;
struct fid_ep;

namespace regpool {
namespace fabric_wire {
struct AddrRules;
struct CtrlMsg;
}  // namespace fabric_wire
namespace fabric_shm {
class Bell;
class DeathWatch;
class LockRescuer;
class RegionLock;
}  // namespace fabric_shm
namespace shm_rings {
class Link;
class Outbox;
struct Knock;
}  // namespace shm_rings
namespace tcp {
class StallProbe;
}  // namespace tcp

struct FabricEndpointOptions {
  enum class Atomics : std::uint8_t {
    automatic,  // native where the core provider has FI_ATOMIC, else emulated
    native,     // fail at construction when unavailable
    emulated,   // always messages (for tests and comparisons)
  };
  Atomics atomics = Atomics::automatic;
  // Emulated atomics (tcp;ofi_rxm, or Atomics::emulated) need a second,
  // control endpoint, and on tcp;ofi_rxm opening one costs as much as the
  // data endpoint itself (measured: 0.27 s and 68 MiB of provider buffers
  // each; docs/provider-facts.md). Whether this endpoint opens it:
  //  - on_demand (default): it serves no atomics (its name carries no
  //    control address, so peers' fetch_add/compare_swap toward it return
  //    Status::unsupported at once). The control endpoint opens inside
  //    insert_peer() of the first peer that serves atomics, so atomics
  //    toward such peers work without asking; an endpoint that only meets
  //    non-serving peers never pays for it. A request carries its own reply
  //    address, which is why the issuing side can open late and the
  //    serving side cannot (its address travels in the name, once).
  //  - serve: open it at construction and put its address into name():
  //    peers may direct atomics at this endpoint's exposures (a server whose
  //    clients use fetch_add/compare_swap on it, SPMD jobs), and it issues
  //    them too.
  //  - off: never; atomics from and to this endpoint return
  //    Status::unsupported at once.
  // Native atomics (shm) use no control endpoint: this option changes
  // nothing there.
  enum class EmulatedAtomics : std::uint8_t { on_demand, serve, off };
  EmulatedAtomics emulated_atomics = EmulatedAtomics::on_demand;
  enum class DeliveryComplete : std::uint8_t {
    automatic,  // on for layered providers (tcp;ofi_rxm), off elsewhere
    on,
    off,
  };
  // FI_DELIVERY_COMPLETE on writes and atomics: the initiator's completion
  // waits for the target to have applied the data. On tcp;ofi_rxm this is
  // what makes a rejected write fail itself. On shm it makes the target
  // check keys, but a rejected op then never completes (it times out), and
  // every write needs target progress: off by default there.
  DeliveryComplete delivery_complete = DeliveryComplete::automatic;
  // shm only: sends up to the provider's inject size (4 KiB in libfabric
  // 1.17) go by fi_inject, which copies the message into the target's
  // queue before the post returns and writes no completion entry. Posted
  // on their own they complete ok inside the post (its gate has just found
  // the target process alive); the last op of a post_batch (the others
  // carry FI_MORE and go by fi_send) completes at the next poll,
  // peer_unreachable if the target process is gone by then. What a send's
  // completion promises does not change (the message is in the target's
  // queue); each small send costs a CQ entry less, and a wait on it no poll
  // (bench/RESULTS.md). Off: every send by fi_send. Other providers always
  // use fi_send: net and tcp;ofi_rxm take an inject to a peer whose
  // connection has failed and drop it without any completion.
  bool inject_sends = true;
  // Requests an emulating target can hold at once (receive buffers of the
  // control endpoint).
  std::size_t control_slots = 64;
  // Completion queue depth (0 = max_in_flight + 2 * control_slots).
  std::size_t cq_size = 0;
  // Emulated atomics, target side: requesters this endpoint never inserted
  // (a server's clients) get an address vector entry so replies can reach
  // them. At most this many (at least control_slots + 1) are kept; the
  // least recently used one goes first, so made-up reply addresses cannot
  // grow the address vector without bound.
  std::size_t max_reply_peers = 256;
  // Scoped exposures (ExposureMode::scoped) register exactly the slice with
  // a random key, and by default revoking closes that registration, so the
  // target refuses the key at once (tcp) and the next scoped exposure of the
  // same bytes registers again (about 2 us on shm/tcp, far more where
  // registration pins pages). With reuse_scoped, a revoked scoped
  // exposure's registration stays open while its bytes sit in the revoke
  // quarantine (EndpointConfig::revoke_quarantine), and a scoped exposure of
  // the same bytes with the same rights in that time reuses it: a service
  // that exposes the same objects again and again registers nothing in
  // steady state. The price: after revoke() the key keeps working at the
  // target on those same bytes (never on another object: the quarantine
  // holds them) until the interval ends, so enforcement(scoped).revocation
  // is false. Keys, bounds and write rights stay enforced (tcp).
  bool reuse_scoped = false;
  // shm only. A killed peer process is noticed by its pid (shm addresses
  // carry it): progress checks the processes behind inserted peers this
  // often, and every post checks its target at most once a millisecond. A
  // dead peer's operations in flight then complete peer_unreachable and the
  // peer is marked broken; nothing more is posted to it (0 = no checks).
  std::chrono::milliseconds peer_check_interval{50};
  // shm only (libfabric 1.17, see docs/provider-facts.md). The provider's
  // calls spin on locks in shared memory that a killed peer may have been
  // holding. The endpoint tries such a lock before every call that takes
  // it and, while it is held, skips the call (progress reaps nothing that
  // round, posts answer would_block), so no call ever spins. When this
  // endpoint's own region lock stays held this long at every poll, its
  // holder is looked for: if no other live process maps the region, or a
  // peer of ours has died and no process that maps the region is stopped
  // or traced, the holder was the dead process and the lock is released
  // (FabricShmStats::lock_recoveries); otherwise the endpoint keeps
  // skipping and says so (FabricShmStats::region_stuck).
  std::chrono::milliseconds stuck_lock_patience{2000};
  // shm only. The try above and the provider's own spin on the lock are two
  // steps: a peer that streams operations into us can take our region lock
  // between them and be killed holding it, and the call then spins inside
  // libfabric for ever, holding the endpoint's mutex. With this on (the
  // default), each shm endpoint owns one helper thread that sleeps and
  // looks every stuck_lock_patience / 8 (at most every 250 ms) whether a
  // provider call of this endpoint has been inside for stuck_lock_patience
  // with its own region lock held at every look; if so, it releases the
  // lock by the rule above (FabricShmStats::lock_rescues) and the call goes
  // on. The same for a post stuck behind a target's lock whose owner
  // process is gone (the target died in its own progress, holding it).
  // Off: no thread, and such a call may never return.
  bool rescue_stuck_calls = true;
  // shm only. Messages (send, send_kept, post_recv and every receive) go
  // through regpool's own rings instead of the provider's queues
  // (docs/architecture.md, "shm message rings"): each endpoint owns a file
  // /dev/shm/regpool-rings.<its region> in which it writes its messages to
  // each peer, and which its peers map read-only. A message up to 65 KiB
  // (shm_ring_copy_max below) is copied in by the sender and out by the
  // receiver; a longer one is read by the receiver straight from the
  // sender's buffer (cross-memory attach), and its send completes when the
  // receiver has read it. Puts
  // and gets: shm_direct_rma below; atomics stay on the provider. What
  // changes for users: the latency (bench/RESULTS.md), and a receive no
  // longer takes a message from a sender this endpoint has not inserted:
  // such messages wait in the sender's ring until insert_peer (or fill it,
  // and the sender's posts answer would_block, then time out). Both ends
  // of a pair must agree (insert_peer refuses a peer that differs, naming
  // the option).
  // Off: the provider's fi_send/fi_recv, as before.
  bool shm_rings = true;
  // shm with shm_rings only. The longest send (bytes) copied through the
  // ring; a longer one is read by the receiver straight from the sender's
  // buffer (one process_vm_readv), and completes once read. At most
  // 66560 (65 KiB, the largest record a ring carries), the default. Which
  // is faster depends on where the host puts the two processes' CPUs
  // (bench/RESULTS.md, "shm sends above 16 KiB as large records"): with
  // the CPUs near each other the two copies win at every size up to
  // 65 KiB (a 24 KiB send's half round trip 0.89 against 2.2 us; 64 KiB
  // bandwidth 44 against 29 GB/s); with them far apart a stream of 64 KiB
  // sends is read faster, new bytes each send or not (1.30 against 0.92 of
  // libfabric's own shm). Hence shm_ring_adaptive below. Each end chooses
  // for its own sends only; a receiver takes both.
  std::uint64_t shm_ring_copy_max = 65 * 1024;
  // shm with shm_rings only. A send longer than 16 KiB and no longer than
  // shm_ring_copy_max goes by whichever of the two paths above this pair
  // of processes measured cheaper, measured as they run: each copy and
  // read of over 16 KiB is timed (a few ns on microseconds), the receiver
  // publishes its figures to the sender in its ring file, and now and
  // then (one send in 64 after the choice changed, down to one in 256 in
  // a stream and one in 1024 in a ping-pong while it holds) a send takes
  // the other path to keep both figures current (docs/architecture.md, "shm message rings"; bench/RESULTS.md,
  // "shm sends that choose their path"). A receiver whose Messenger takes
  // such messages where they lie in the ring, for which copying is always
  // cheaper, has them copied. Off: every send up to shm_ring_copy_max is
  // copied, the same path every time.
  bool shm_ring_adaptive = true;
  // shm only. Puts and gets move their bytes by this process's own
  // process_vm_writev/readv into or out of the target's memory and are
  // complete when the post returns (docs/architecture.md, "shm puts and
  // gets"). libfabric 1.17's shm makes the same system call for them, but
  // around it takes the target's region lock, writes a command into the
  // target's queue and a completion entry into our queue, and the wait
  // reads that entry back: about 0.1 us per operation and several cache
  // lines shared with the target (bench/RESULTS.md). What a completion
  // promises does not change (the bytes are in place: stronger than
  // before for a put), nor do the checks: the initiator's own check of the
  // reference, as before, since shm checks no keys. A put with
  // delivery_complete on (the target then checks keys) and a reference in
  // offset mode still go through the provider. Off: every put and get
  // through fi_write/fi_read.
  bool shm_direct_rma = true;
  // The largest message peers may send to this endpoint, where a longer one
  // would harm the connection instead of failing its own receive (net: a
  // message longer than its receive plus the overflow area behind every
  // receive stalls the connection, docs/provider-facts.md). The overflow
  // area is this large (reserved address space: pages are touched only by
  // the excess of messages longer than their receive), and the limit goes
  // into name(): a peer's send() above it returns
  // Status::message_too_large without sending. A message up to the limit
  // that is longer than its receive fails that receive (out_of_bounds) and
  // nothing else. 4 KiB .. 4 GiB - 1 (construction throws otherwise).
  // shm advertises no limit and ignores it. tcp;ofi_rxm ignores it too and
  // advertises the rxm layer's eager limit instead (16 KiB unless
  // FI_OFI_RXM_BUFFER_SIZE / FI_OFI_RXM_EAGER_LIMIT say otherwise): there a
  // longer message that arrives before its receive and whose sender dies
  // crashes the next receive inside libfabric 1.17
  // (docs/provider-facts.md). Larger payloads go through a Messenger.
  std::uint64_t max_incoming_message = std::uint64_t{16} << 20;
};

// What an shm endpoint saw of dead peers (relaxed snapshot).
struct FabricShmStats {
  bool lock_checks = false;           // the provider's region layout is the measured one (libfabric 1.17)
  std::uint64_t dead_peers = 0;       // inserted peers whose process was found gone
  std::uint64_t lock_skips = 0;       // provider calls skipped because a region lock was held
  std::uint64_t lock_recoveries = 0;  // own region lock released after its holder was proven dead
  bool region_stuck = false;          // own region lock held past stuck_lock_patience, holder not proven dead
  // Region locks released by the helper thread under a provider call stuck
  // behind them: our own, or a dead target's under a post
  // (FabricEndpointOptions::rescue_stuck_calls).
  std::uint64_t lock_rescues = 0;
  // The doorbell (docs/progress.md, "How shm sleeps"): this endpoint sleeps
  // on one (wait_mode sleep or adaptive, and its file could be made); how
  // many inserted peers' bells it has mapped now; and how many of its posts
  // found a peer asleep and woke it.
  bool doorbell = false;
  std::uint64_t bell_peers = 0;
  std::uint64_t bell_rings = 0;
  // Message rings (FabricEndpointOptions::shm_rings): whether this endpoint
  // uses them; messages sent through them, of which read by the receiver
  // from the sender's memory (longer than FabricEndpointOptions::
  // shm_ring_copy_max, or sent so by shm_ring_adaptive); messages received;
  // sends that found the ring full (posted again after progress); and what
  // peers wrote into their rings or directories that could not be believed
  // (records of unknown kind or impossible length, consumed positions
  // outside what was sent): such a peer's ring is read no further, and the
  // peer is marked broken.
  bool rings = false;
  std::uint64_t ring_sends = 0;
  std::uint64_t ring_large_sends = 0;
  std::uint64_t ring_receives = 0;
  std::uint64_t ring_full = 0;
  std::uint64_t ring_corrupt = 0;
  // Puts and gets this endpoint moved itself
  // (FabricEndpointOptions::shm_direct_rma).
  std::uint64_t direct_rma = 0;
};

// Emulated-atomics traffic seen by a target (relaxed snapshot).
struct FabricControlStats {
  std::uint64_t served = 0;           // requests applied and answered
  std::uint64_t rejected = 0;         // messages dropped: malformed, truncated, stale or forged replies
  std::uint64_t reply_peers = 0;      // reply addresses held now (<= max_reply_peers)
  std::uint64_t reply_evictions = 0;  // reply addresses dropped to make room
  std::uint64_t replies_dropped = 0;  // replies given up (requester unreachable, buffers busy)
};

class REGPOOL_API FabricEndpoint final : public Endpoint {
 public:
  // Setup: throws Error with the provider's code.
  FabricEndpoint(std::shared_ptr<FabricDomain> domain, const EndpointConfig& config = {},
                 const FabricEndpointOptions& options = {});
  ~FabricEndpoint() override;

  static std::unique_ptr<FabricEndpoint> open(std::shared_ptr<FabricDomain> domain, const EndpointConfig& config = {},
                                              const FabricEndpointOptions& options = {}) {
    return std::make_unique<FabricEndpoint>(std::move(domain), config, options);
  }

  const std::shared_ptr<FabricDomain>& fabric_domain() const noexcept { return domain_; }
  bool emulates_atomics() const noexcept { return emulated_atomics_; }
  // Peers may direct atomics at this endpoint: native atomics, or emulated
  // ones with EmulatedAtomics::serve (its name carries a control address).
  // Fixed at construction; thread-safe.
  bool serves_atomics() const noexcept { return !emulated_atomics_ || serving_; }
  // The emulated-atomics control endpoint is open (serve, or on_demand
  // after inserting a serving peer). Thread-safe.
  bool control_open() const noexcept { return control_open_.load(std::memory_order_acquire); }
  bool uses_delivery_complete() const noexcept { return delivery_complete_; }
  // Thread-safe (atomics); zero when atomics are native.
  FabricControlStats control_stats() const noexcept;
  // Thread-safe; all zero / false on providers other than shm.
  FabricShmStats shm_stats() const noexcept;
  // Peers this endpoint found dead by itself, whose operations it then
  // failed with peer_unreachable: on shm, processes that exited (also in
  // shm_stats()); on net, peers that kept posts waiting (-FI_EAGAIN, which
  // net answers for ever to a dead peer) or owed an emulated atomic's reply
  // while their endpoint's listening socket refused a connect
  // (docs/provider-facts.md, "net"). Thread-safe.
  std::uint64_t dead_peers_found() const noexcept;
  // Native handle: an escape hatch for code that calls libfabric directly
  // (benchmarks and tests comparing with direct libfabric use); not needed
  // for regpool's own API. Owned by the endpoint; do not close it or post
  // on it while the endpoint is in use (its completions would reach the
  // endpoint's queue).
  fid_ep* native_endpoint() const noexcept { return ep_; }

 protected:
  Backend backend_kind() const noexcept override { return Backend::fabric; }
  Domain& domain() const noexcept override { return *domain_; }
  std::uint64_t max_message_size() const noexcept override { return max_msg_; }
  bool needs_target_progress() const noexcept override { return manual_progress_ || emulated_atomics_; }
  bool do_native_atomics() const noexcept override { return !emulated_atomics_; }
  TransferTraits do_transfer_traits() const noexcept override { return transfer_traits_; }
  std::vector<std::byte> do_name() const override;
  std::uint64_t do_insert_peer(std::span<const std::byte> name) override;
  void do_remove_peer(std::uint64_t handle) noexcept override;
  std::chrono::milliseconds reconnect_settle() const noexcept override;
  std::uint64_t do_peer_message_limit(std::uint64_t handle) const noexcept override;
  Status do_post(const BackendOp& op) noexcept override;
  Status do_post_batch(std::span<const BackendOp* const> ops, std::size_t& posted) noexcept override;
  std::size_t do_poll(std::size_t max) noexcept override;
  void do_cancel(const BackendOp& op) noexcept override;
  bool do_abandon(const BackendOp& op) noexcept override;
  Enforcement do_enforcement(ExposureMode mode, bool per_peer) const noexcept override;
  int do_wait_fd() const noexcept override { return wait_fd_; }
  WaitBell do_wait_bell() const noexcept override;
  bool do_messages_in_place() const noexcept override { return outbox_ != nullptr; }
  bool do_gathered_sends() const noexcept override { return gathered_sends_ && outbox_ == nullptr; }
  Status do_send_copy(std::uint64_t handle, std::span<const std::byte> head, std::span<const std::byte> body,
                      bool may_read) noexcept override;
  bool do_arm(std::chrono::microseconds& max_sleep) noexcept override;

 private:
  struct PeerAddr {
    bool used = false;
    std::uint64_t data = 0;  // fi_addr_t in av_
    std::uint64_t ctrl = 0;  // fi_addr_t in ctrl_av_ (emulated atomics)
    std::vector<std::byte> ctrl_name;
    // Unique per insert (never reused): which AV entry an op went through,
    // so do_abandon can tell that entry was removed even after the handle
    // was reused.
    std::uint64_t incarnation = 0;
    // The largest message the peer accepts (its name's limit; ~0 for none).
    std::uint64_t message_limit = ~std::uint64_t{0};
    // shm: the peer's process, its regions' locks (when their layout is
    // known), and what the last check found.
    std::int64_t pid = 0;
    bool cma = false;  // we may read its memory with process_vm_readv (probed at insert)
    bool dead = false;
    bool reported = false;  // found dead (shm: pid; net: stall probe), its ops failed and counted
    std::chrono::steady_clock::time_point checked{};
    std::unique_ptr<fabric_shm::RegionLock> lock;
    std::unique_ptr<fabric_shm::RegionLock> ctrl_lock;
    // Its doorbell, when it sleeps on one and the file passed the checks:
    // rung after every post to it.
    std::unique_ptr<fabric_shm::Bell> bell;
    // Its message rings' file, mapped read-only, and our slot for it
    // (FabricEndpointOptions::shm_rings).
    std::unique_ptr<shm_rings::Link> link;
    bool ring_broken = false;  // it corrupted its ring: read no further
    // A copy (do_send_copy) declined because the pair's costs chose a large
    // record: the posted send that follows takes that choice (ring_send)
    // instead of choosing, and probing, a second time.
    bool large_next = false;
    // net: where its endpoint listens, probed while it keeps us waiting
    // (posts refused for now, an emulated atomic's reply owed); null where
    // the provider reports dead peers itself or the address cannot be
    // probed.
    std::unique_ptr<tcp::StallProbe> stall;
    // tcp;ofi_rxm: the same check of where its endpoint listens, made when
    // a probe read to it is refused for now (see probe_connection), and
    // whether do_abandon wanted a probe for this incarnation (its entry then
    // outlives the removal until the probe has answered: retired_).
    std::unique_ptr<tcp::StallProbe> listener;
    bool probe_wanted = false;
    // First -FI_EAGAIN answer to a probe read after its listener refused.
    std::chrono::steady_clock::time_point refused_since{};
  };
  // One of this endpoint's own shm regions (data, control) and how long its
  // lock has been seen held.
  struct OwnRegion {
    std::unique_ptr<fabric_shm::RegionLock> lock;
    // Provider calls that may take the lock: odd while one runs (written
    // under the endpoint's mutex, read by the rescuer_).
    std::atomic<std::uint64_t> calls{0};
    bool held = false;
    bool stuck = false;  // held past stuck_lock_patience, holder not proven dead
    std::chrono::steady_clock::time_point held_since{};
    std::chrono::steady_clock::time_point next_look{};
  };
  // Emulated atomics, per operation slot.
  struct EmuOp {
    std::uint64_t token = 0;  // 0 = none outstanding
    bool send_done = false;
    bool reply_done = false;
    Status status = Status::ok;
    std::uint64_t value = 0;
    std::uint64_t peer_handle = 0;
    std::chrono::steady_clock::time_point sent{};  // when the request was posted
  };
  struct ReplyAddr {
    bool used = false;
    std::vector<std::byte> name;
    std::uint64_t addr = 0;
    std::uint64_t last_use = 0;
  };

  void open_resources(const FabricEndpointOptions& options);
  // Opens the control endpoint of emulated atomics and its buffers (setup;
  // throws Error). Under the base mutex when called from insert_peer.
  void open_control();
  void close_control() noexcept;
  void open_triplet(fid_av** av, fid_cq** cq, fid_ep** ep, const char* what);
  void close_resources() noexcept;
  Status post_emulated(const BackendOp& op) noexcept;
  void count_reply_peers() noexcept;
  std::size_t poll_data(std::size_t max) noexcept;
  bool poll_error() noexcept;
  std::size_t poll_ctrl() noexcept;
  // shm, before a peer's address is removed: the provider processes what
  // the peer left in our queue while its region is still mapped
  // (do_remove_peer). At most kDrainMax data completions.
  void drain_before_unmap(std::uint64_t addr) noexcept;
  static constexpr std::size_t kDrainMax = 2048;
  // shm, in the same place: the peer's messages that the provider keeps
  // unexpected (no receive took them) still refer to its region, written
  // when a receive matches them. Directed receives into drain_buf_ take and
  // drop them while it is mapped. How many it took.
  std::size_t drain_unexpected(std::uint64_t addr) noexcept;
  // A completion (or error, `canceled` for FI_ECANCELED) of the drain's
  // receive, recognised by its context (kDrainContext, a tag no slot has).
  [[gnu::cold]] void drain_completed(bool canceled) noexcept;
  static constexpr std::uintptr_t kDrainContext = 0xffffffffU;
  enum class DrainState : std::uint8_t { idle, posted, matched, canceled };
  DrainState drain_state_ = DrainState::idle;
  // FI_DIRECTED_RECV granted (asked of shm only) and tags as contexts.
  bool drain_unexpected_ok_ = false;
  std::array<std::byte, 64> drain_buf_{};
  std::size_t poll_ctrl_paced() noexcept;
  REGPOOL_LOCAL void serve_request(const fabric_wire::CtrlMsg& req) noexcept;
  REGPOOL_LOCAL void handle_reply(const fabric_wire::CtrlMsg& rep) noexcept;
  void drop_reply(std::size_t r) noexcept;
  REGPOOL_LOCAL fabric_wire::AddrRules addr_rules() const noexcept;
  Status post_ctrl_recv(std::size_t k) noexcept;
  void flush_pending_replies() noexcept;
  void finish_emulated(std::uint32_t index) noexcept;
  Result<std::uint64_t> reply_address(std::span<const std::byte> name, std::size_t r) noexcept;
  // The PeerId of a receive's source address (FI_SOURCE), or kAnyPeer.
  PeerId peer_of_addr(std::uint64_t addr) const noexcept;
  // shm dead-peer handling (fabric_endpoint.cpp, "shm and dead peers").
  void open_shm_watch(const std::vector<std::byte>& data_name);
  void shm_peer_check(PeerAddr& p, std::span<const std::byte> data);
  void shm_peer_insert(PeerAddr& p, std::span<const std::byte> data, std::span<const std::byte> ctrl);
  void shm_check_peers(std::chrono::steady_clock::time_point now) noexcept;
  bool shm_peer_gone(std::uint64_t handle) noexcept;
  // The same for peers_[handle] (handle in range), inlined into the post
  // gate.
  inline bool shm_peer_gone(PeerAddr& p, std::uint64_t handle) noexcept;
  void shm_sweep_deaths(std::chrono::steady_clock::time_point now) noexcept;
  // The context the data endpoint is given for `op` (its tag or its context
  // memory, see tagged_contexts_), and the slot a completion's context names.
  void* data_context(const BackendOp& op) const noexcept;
  std::uint32_t data_index(void* context) noexcept;
  inline Status shm_peer_gate(std::uint64_t handle, bool ctrl) noexcept;
  inline bool shm_peer_dead(PeerAddr& p, std::uint64_t handle) noexcept;
  bool shm_region_blocked(OwnRegion& r) noexcept;
  void shm_try_recover(OwnRegion& r, std::chrono::steady_clock::time_point now) noexcept;
  void* local_desc(const BackendOp& op) noexcept;
  // do_post by kind; `more` is FI_MORE for every op of a batch but the
  // last, else 0. Inline (defined in fabric_endpoint.cpp, the only user):
  // do_post and do_post_batch reach the provider's call without a chain
  // of calls.
  inline Status post_data(const BackendOp& op, std::uint64_t more) noexcept;
  inline Status do_put(const BackendOp& op, std::uint64_t more) noexcept;
  inline Status do_get(const BackendOp& op, std::uint64_t more) noexcept;
  // shm_direct_rma: whether `op` (a put or get) is moved by our own
  // cross-memory copy, and that copy.
  inline bool direct_rma(const BackendOp& op) const noexcept;
  Status post_direct_rma(const BackendOp& op) noexcept;
  bool direct_puts_ = false;
  bool direct_gets_ = false;
  std::atomic<std::uint64_t> direct_rma_{0};
  inline Status do_send(const BackendOp& op, std::uint64_t more) noexcept;
  // Flags of a put through fi_writemsg.
  Status rma_msg(bool write, const BackendOp& op, void* buf, void* desc, std::uint64_t dest,
                 std::uint64_t flags) noexcept;
  std::uint64_t msg_flags(std::uint64_t more) const noexcept;
  inline bool provider_entry(const BackendOp& op, bool injected) const noexcept;
  // Whether the target's shm bell rings after `op` is posted.
  inline bool rings_target(const BackendOp& op) const noexcept;
  Status do_recv(const BackendOp& op) noexcept;
  Status do_atomic(const BackendOp& op) noexcept;
  // Message rings (shm_rings): open our file (setup), a peer's (insert),
  // a send, receives matched to what peers' rings hold, large sends the
  // receivers have read, a receive taken back.
  void open_rings(const std::vector<std::byte>& data_name);
  void ring_peer_insert(PeerAddr& p, std::span<const std::byte> data, bool peer_rings);
  void ring_peer_remove(PeerAddr& p) noexcept;
  Status ring_send(const BackendOp& op) noexcept;
  inline Status ring_copy(PeerAddr& p, const void* head, std::uint64_t head_length, const void* body,
                   std::uint64_t body_length) noexcept;
  std::size_t poll_rings(std::size_t max) noexcept;
  std::size_t ring_acks() noexcept;
  bool ring_cancel(const BackendOp& op) noexcept;
  void ring_corrupt(std::uint64_t handle) noexcept;
  void accept_knocks() noexcept;
  // Messages from one peer's ring into waiting receives (peer: its id, or
  // kAnyPeer for a knocking sender). Returns how many; `corrupt` when the
  // ring cannot be read on.
  std::size_t drain_ring(shm_rings::Link& link, PeerId peer, std::size_t max, bool& corrupt) noexcept;

  std::shared_ptr<FabricDomain> domain_;
  FabricEndpointOptions options_;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  std::vector<std::byte> name_;
  // The local provider's address format (fabric_wire::AddrKind), length and
  // scheme: what peers' addresses are checked against.
  std::uint8_t addr_kind_ = 0;
  std::size_t addr_len_ = 0;
  std::string addr_scheme_;
  std::uint64_t max_msg_ = 0;
  bool manual_progress_ = true;
  bool delivery_complete_ = false;
  bool emulated_atomics_ = false;
  // FI_SOURCE granted: receives are read with fi_cq_readfrom. Our own
  // address is inserted first (self_addr_), so a provider that reports a
  // sender it cannot map as address 0 (shm 1.17 does) names no real peer.
  bool source_ = false;
  std::uint64_t self_addr_ = ~std::uint64_t{0};
  std::vector<std::uint32_t> handle_by_addr_;  // fi_addr_t (FI_AV_TABLE index) -> peers_ index
  // Sleeping waits: an epoll set of the CQs' FI_WAIT_FD descriptors (-1
  // when the provider has none: shm).
  int wait_fd_ = -1;

  std::vector<PeerAddr> peers_;
  std::uint64_t next_incarnation_ = 1;
  // Contexts handed to the data endpoint are BackendOp::tag values (the
  // provider needs no context memory: neither FI_CONTEXT nor FI_CONTEXT2 in
  // its mode), so a completion for an op the base abandoned is recognised.
  bool tagged_contexts_ = false;
  // tcp;ofi_rxm: whether a failed op's connection is gone is learnt from a
  // probe read sent on it (see do_abandon). One probe per peer incarnation,
  // at most kMaxProbes remembered (the oldest finished one is reused).
  bool probe_connections_ = false;
  static constexpr std::size_t kMaxProbes = 64;
  enum class ProbeState : std::uint8_t { free, posted, closed, answered };
  struct Probe {
    std::uint64_t incarnation = 0;
    std::uint64_t order = 0;  // when it was posted (reuse: oldest finished)
    ProbeState state = ProbeState::free;
  };
  std::array<Probe, kMaxProbes> probes_{};
  std::uint64_t probe_order_ = 0;
  // A probe's context is the address of its entry: never a tag (tags of
  // entries in probes_ would need an index below max_in_flight and the
  // right generation at once).
  bool probe_done(void* context, bool failed) noexcept;
  bool probe_connection(std::uint64_t incarnation) noexcept;
  bool probe_closed(std::uint64_t incarnation) const noexcept;
  // A removed peer whose failed ops still wait for their probe's answer:
  // its AV entry (and listener check) is kept until then, since a probe
  // can only be posted through it. Bounded by the peers removed with such
  // ops; dropped once its probe has answered or its address is inserted
  // again.
  struct RetiredPeer {
    std::uint64_t incarnation = 0;
    std::uint64_t data = 0;  // fi_addr_t in av_
    std::unique_ptr<tcp::StallProbe> listener;
    std::chrono::steady_clock::time_point refused_since{};
  };
  std::vector<RetiredPeer> retired_;
  void sweep_retired() noexcept;
  // Per operation slot: the peer as it was when the op was posted.
  struct OpPeer {
    std::uint64_t incarnation = 0;
    std::int64_t pid = 0;  // shm
    bool cma = false;      // shm
  };
  std::vector<OpPeer> op_peer_;
  // The target checks keys, registration ranges and rights (measured:
  // tcp;ofi_rxm and net; see do_enforcement).
  bool target_checks_keys_ = false;
  // By provider, set in open_resources (do_transfer_traits).
  TransferTraits transfer_traits_;
  bool target_checks_read_rights_ = false;  // net; see do_enforcement
  // A refused RMA key cancels the op with the target's verdict and closes
  // the connection (tcp;ofi_rxm; see the CQ error path).
  bool key_refusal_closes_ = false;
  // A refused op fails alone and the connection survives (net).
  bool refusal_keeps_connection_ = false;
  bool shm_ = false;
  OwnRegion own_data_;
  OwnRegion own_ctrl_;
  std::chrono::steady_clock::time_point next_peer_check_{};
  // The last poll found completions and did not ask the clock whether the
  // peer check was due (do_poll): the next poll asks.
  bool peer_check_skipped_ = false;
  std::atomic<std::uint64_t> dead_peers_{0};
  // When a peer was last found dead, or removed while its process was gone
  // (membership removes a dead client at once, often before the pid check
  // has seen it): a stuck own lock may then be recovered (shm_try_recover).
  std::chrono::steady_clock::time_point last_peer_death_{};
  std::atomic<std::uint64_t> lock_skips_{0};
  std::atomic<std::uint64_t> lock_recoveries_{0};
  std::atomic<bool> region_stuck_{false};
  // shm: the thread that releases our own region lock under a provider
  // call stuck behind a dead holder (null when off or the layout is
  // unknown). Declared after the regions it watches; reset first at close.
  std::unique_ptr<fabric_shm::LockRescuer> rescuer_;
  // shm, sleeping wait modes: this endpoint's doorbell (null when none).
  std::unique_ptr<fabric_shm::Bell> bell_;
  // shm: peers' processes watched for exit (pidfds in one epoll set), and
  // the coarse tick of the last look (the post path looks once per tick).
  std::unique_ptr<fabric_shm::DeathWatch> deaths_;
  std::chrono::steady_clock::time_point deaths_swept_{};
  std::atomic<std::uint64_t> bell_peers_{0};
  std::atomic<std::uint64_t> bell_rings_{0};
  // Message rings (shm_rings): our file; receives waiting for a message, in
  // posting order (a circular queue of slot indices, max_in_flight long);
  // large sends waiting for their receiver to have read them; links of
  // removed peers that such sends still wait on; where the next poll
  // starts looking among peers.
  std::unique_ptr<shm_rings::Outbox> outbox_;
  std::vector<std::uint32_t> ring_recvs_;
  std::size_t ring_recv_head_ = 0;
  std::size_t ring_recv_count_ = 0;
  struct LargeSend {
    shm_rings::Link* link = nullptr;
    std::uint64_t end = 0;  // the receiver's consumed position that completes it
    std::uint64_t tag = 0;
  };
  std::vector<LargeSend> large_sends_;
  std::vector<std::unique_ptr<shm_rings::Link>> retired_links_;
  // Senders we have not inserted that knocked (shm_rings.hpp, "Knocks"):
  // their rings are read too, their messages completing with kAnyPeer,
  // until they die or are inserted (the link then becomes the peer's).
  std::vector<std::unique_ptr<shm_rings::Link>> anon_links_;
  std::vector<shm_rings::Knock> knocks_;  // reserved: taken without allocating
  std::size_t ring_next_peer_ = 0;
  // Entries the data CQ owes us (posted puts, gets, atomics, provider
  // sends and receives), and polls since fi_cq_read last ran (do_poll).
  std::uint64_t provider_entries_ = 0;
  std::uint32_t provider_skips_ = 0;
  static constexpr std::uint32_t kProviderPollEvery = 64;
  std::atomic<std::uint64_t> ring_sends_{0};
  std::atomic<std::uint64_t> ring_large_sends_{0};
  std::atomic<std::uint64_t> ring_receives_{0};
  std::atomic<std::uint64_t> ring_full_{0};
  std::atomic<std::uint64_t> ring_corrupt_{0};
  // After a post to the peer behind `handle`: ring its bell (shm).
  void ring_peer(std::uint64_t handle) noexcept;

  // Dead peers on providers that answer -FI_EAGAIN for ever to them (net;
  // fabric_provider::Facts::dead_peer_answers_eagain): a post's status, seen
  // by the peer's stall probe. A refused post (would_block) that has lasted
  // long enough and whose peer's listener is gone becomes peer_unreachable,
  // and the peer's other operations fail with it.
  bool probe_stalls_ = false;
  Status watch_stall(std::uint64_t handle, Status st) noexcept;
  // Emulated atomics whose reply is owed by a peer: probed the same way,
  // looked at every kStallScan (do_poll).
  void scan_owed_replies() noexcept;
  void fail_gone_peer(std::uint64_t handle) noexcept;
  void fail_peer_once(std::uint64_t handle, bool PeerAddr::*flag, std::atomic<std::uint64_t>& count,
                      Status st) noexcept;
  // net cancels an op (FI_ECANCELED) alike when the target refused it and
  // when the connection closed under it (its prov_errno is then whatever
  // errno the provider last saw): such a completion waits here until the
  // peer's listener answers a probe (gone: peer_unreachable; else
  // `otherwise`, the refusal). At most one per slot; settled in do_poll.
  struct HeldCompletion {
    std::uint32_t index = 0;
    std::uint64_t handle = 0;
    Status otherwise = Status::ok;
  };
  std::vector<HeldCompletion> held_;
  bool hold_for_probe(std::uint32_t index, Status otherwise) noexcept;
  void settle_held() noexcept;
  std::chrono::steady_clock::time_point next_owed_scan_{};
  std::atomic<std::uint64_t> gone_peers_{0};

  // Sends of at most inject_limit_ bytes go by fi_inject: the provider
  // copies the message before the call returns and writes no completion,
  // so the op is complete when the post returns (do_post: complete_at_post)
  // or, posted in a batch, at our next poll (injected_: their tags, in
  // posting order), without a CQ entry to write and read. 0 = never (not
  // shm, or FabricEndpointOptions::inject_sends is off; open_shm_watch).
  std::uint64_t inject_limit_ = 0;
  bool injected_now_ = false;  // do_send's inject, for its caller
  bool gathered_sends_ = false;  // the provider takes two pieces per message
  Status send_gathered(const BackendOp& op, void* head_desc, std::uint64_t more) noexcept;
  std::vector<std::uint64_t> injected_;
  std::size_t complete_injected(std::size_t max) noexcept;
  void complete_send(std::uint32_t index, const BackendOp& op) noexcept;

  // tcp;ofi_rxm: where the excess of an oversized eager message goes, so
  // the provider never truncates one (which loses the connection's later
  // messages). Shared by all receives; its contents are never read.
  // Receives' overflow area (do_recv): an anonymous mapping, untouched
  // until a message overflows into it; null where receives need none.
  std::byte* overflow_ = nullptr;
  std::size_t overflow_size_ = 0;
  Registration overflow_reg_;
  // The largest message this endpoint accepts, advertised in name_ (0: no
  // limit; FabricEndpointOptions::max_incoming_message).
  std::uint64_t message_limit_ = 0;

  // Emulated atomics: the control endpoint and its buffers.
  fid_av* ctrl_av_ = nullptr;
  fid_cq* ctrl_cq_ = nullptr;
  fid_ep* ctrl_ep_ = nullptr;
  std::vector<std::byte> ctrl_name_;
  bool serving_ = false;              // EmulatedAtomics::serve: ctrl_name_ is in name_
  std::atomic<bool> control_open_{false};
  std::vector<std::byte> ctrl_buffers_;  // requests out (per slot), then rx, then replies
  Registration ctrl_reg_;
  std::vector<EmuOp> emu_;
  // Pacing of the control CQ's polls (poll_ctrl_paced): polls left at
  // every poll since the last control activity, and polls skipped since the
  // last one while idle.
  std::uint32_t ctrl_busy_ = 0;
  std::uint32_t ctrl_skipped_ = 0;
  std::unique_ptr<std::byte[]> ctrl_contexts_;  // fi_context2 per request send, rx and reply
  // Reply buffers (control_slots of them), apart from the receive buffers
  // so a reply the provider cannot take never holds a receive buffer.
  std::vector<std::size_t> pending_replies_;    // reply indices the provider refused with EAGAIN, oldest first
  std::vector<std::uint64_t> reply_dest_;       // per reply: where it goes
  std::vector<std::uint32_t> reply_entry_;      // per reply: reply_addrs_ entry it uses (or none)
  std::vector<std::uint8_t> reply_state_;       // per reply: free, pending, posted
  std::vector<std::chrono::steady_clock::time_point> reply_since_;
  std::vector<ReplyAddr> reply_addrs_;          // at most max_reply_addrs_
  std::size_t max_reply_addrs_ = 0;
  std::uint64_t reply_clock_ = 0;
  std::uint64_t next_token_ = 1;
  std::atomic<std::uint64_t> ctrl_served_{0};
  std::atomic<std::uint64_t> ctrl_rejected_{0};
  std::atomic<std::uint64_t> reply_evictions_{0};
  std::atomic<std::uint64_t> reply_peers_{0};
  std::atomic<std::uint64_t> replies_dropped_{0};
};

}  // namespace regpool
