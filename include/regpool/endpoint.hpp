#pragma once
// Layer 7: the transport. An Endpoint moves bytes between LDO slices of this
// process and remote references exposed by peers (put, get, send, post_recv,
// fetch_add, compare_swap) and exposes slices of this process to peers
// (expose()). Endpoint is backend-neutral: construct a FabricEndpoint
// (libfabric FI_EP_RDM, fabric_endpoint.hpp) or a VerbsEndpoint (verbs RC
// queue pairs, verbs_endpoint.hpp) and use it through this interface.
//
// Thread-safety: every public member may be called from any thread; the
// endpoint serialises calls itself and never holds its lock while waiting
// or while running callbacks (details on class Endpoint below).
//
// Ownership: an operation in flight holds a Slice, i.e. a reference to its
// LDO, from post until the backend is done with it, so dropping the user's
// handle early cannot free bytes under a transfer; an Exposure holds its
// Slice until revoked. The endpoint itself is not movable (hold it by
// unique_ptr) and keeps its domain alive.
//
// What every endpoint does, whatever the backend (so every backend gives the
// same statuses):
//  - checks before anything reaches the wire: local slice inside its object,
//    remote reference well formed (RemoteRef::well_formed(): malformed),
//    remote range inside the remote reference, remote reference from this
//    backend, access rights (put/atomics need a read-write export), 8-byte
//    alignment of atomic words, message size, peer known and not broken.
//    A violation returns the Status immediately and posts nothing;
//  - a preallocated in-flight table (EndpointConfig::max_in_flight slots):
//    posting never allocates;
//  - tokens, wait(token, timeout), progress() running callbacks, quiesce(),
//    the optional background progress thread, per-operation timeouts scaled
//    by transfer size (Status::timeout), retrying posts the provider refuses
//    for now (bounded by EndpointConfig::post_timeout, without holding the
//    lock while backing off), per-peer broken state, usable() and
//    reconnect().
//
// Writing a backend: the protected interface and its rules are documented
// in regpool/endpoint_backend.hpp.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "regpool/domain.hpp"
#include "regpool/error.hpp"
#include "regpool/inline_callback.hpp"
#include "regpool/ldo.hpp"
#include "regpool/remote_ref.hpp"
#include "regpool/slice.hpp"

namespace regpool {

class Endpoint;
// Backend-side types, defined in regpool/endpoint_backend.hpp.
struct BackendOp;
struct ExposureInfo;
struct WaitBell;
namespace detail {
// Shared between an endpoint and its exposures (defined in the library).
struct ExposureLink;
// The Messenger's receiver of messages in place, and the Messenger's core
// (both the library's, lib/transport/message_sink.hpp).
class MessageSink;
struct MessengerCore;
}  // namespace detail

// Index of an inserted peer, dense from 0. kAnyPeer in a receive completion
// means the backend could not tell who sent it.
using PeerId = std::uint32_t;
inline constexpr PeerId kAnyPeer = ~PeerId{0};

// Names one posted operation: slot index (low 32 bits) and the slot's
// generation (high 32 bits), so a stale token never matches a reused slot.
// Value 0 is never issued.
struct Token {
  std::uint64_t value = 0;
  explicit operator bool() const noexcept { return value != 0; }
  friend bool operator==(Token a, Token b) noexcept { return a.value == b.value; }
};

enum class OpKind : std::uint8_t { put, get, send, recv, fetch_add, compare_swap };
REGPOOL_API const char* to_string(OpKind k) noexcept;

struct Completion {
  Token token;
  OpKind op = OpKind::put;
  // ok, or the cause: bad_key, access_denied, peer_unreachable, timeout,
  // out_of_bounds (a received message larger than its buffer), canceled,
  // closed, transport_error. wait() also uses in_progress (its own bound
  // expired, the op goes on) and invalid_argument (unknown token).
  Status status = Status::ok;
  // Target; for recv the sender as the provider identifies it (libfabric:
  // FI_SOURCE, the address the transport itself saw; verbs: the RC
  // connection the message came in on), never taken from message bytes.
  // kAnyPeer when the sender is not an inserted peer (counted in
  // EndpointStats::unknown_source) or the provider cannot tell.
  PeerId peer = kAnyPeer;
  std::uint64_t bytes = 0;   // moved (recv: received)
  std::uint64_t value = 0;   // atomics: the remote word before the op
};

// What an operation calls when it completes (inline storage: storing one in
// an operation slot never allocates; regpool/inline_callback.hpp).
using Callback = InlineCallback<const Completion&>;

// One operation of a batch (Endpoint::post_batch): a put, get or send as the
// single calls take it, plus what post_batch reports back. Build them with
// BatchOp::put/get/send. Ownership: `local` and `remote` are only read
// during post_batch (the endpoint keeps its own reference to the LDO of
// each posted op, as put() does); `cb` is moved out of a posted op into the
// endpoint and stays in an op that was not posted. An array of BatchOps
// can be reused from batch to batch, so batching never allocates.
struct BatchOp {
  OpKind kind = OpKind::put;  // put, get or send; anything else: invalid_argument
  PeerId peer = 0;
  const Slice* local = nullptr;
  const RemoteRef* remote = nullptr;  // put/get
  std::uint64_t remote_offset = 0;    // put/get
  Callback cb;                        // as for put(); empty: wait(token)
  // Set by post_batch: the op's token (posted ops only) and ok (posted),
  // the cause (the first op not posted), or canceled (not attempted).
  Token token;
  Status status = Status::in_progress;

  static BatchOp put(const Slice& local, PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset,
                     Callback cb = {}) noexcept {
    return make(OpKind::put, peer, &local, &remote, remote_offset, std::move(cb));
  }
  static BatchOp get(PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset, const Slice& local,
                     Callback cb = {}) noexcept {
    return make(OpKind::get, peer, &local, &remote, remote_offset, std::move(cb));
  }
  static BatchOp send(PeerId peer, const Slice& local, Callback cb = {}) noexcept {
    return make(OpKind::send, peer, &local, nullptr, 0, std::move(cb));
  }

 private:
  static BatchOp make(OpKind kind, PeerId peer, const Slice* local, const RemoteRef* remote,
                      std::uint64_t remote_offset, Callback&& cb) noexcept {
    BatchOp op;
    op.kind = kind;
    op.peer = peer;
    op.local = local;
    op.remote = remote;
    op.remote_offset = remote_offset;
    op.cb = std::move(cb);
    return op;
  }
};

// How an exposure grants access (docs/exposures.md).
//  - standard: no registration. The exposure reuses the registration its
//    object already has (the arena's, or the user block's) and carries the
//    object's bounds and rights in the RemoteRef; every initiator checks
//    them before the wire. The key is the arena's, so the target enforces at
//    most "knows the arena key" (Endpoint::enforcement). Expose and revoke
//    are O(1), allocation-free in steady state. Verbs with a peer: a type-2
//    window bound over the arena registration, scoped to that peer.
//  - scoped: the strongest per-exposure enforcement the provider has:
//    libfabric, a registration of exactly the slice with exactly the rights
//    and a random key (one registration per exposure); verbs, a memory
//    window (with a peer) or a registration of the slice.
enum class ExposureMode : std::uint8_t { standard = 0, scoped = 1 };
REGPOOL_API const char* to_string(ExposureMode mode) noexcept;

// What the target (the exposing process's provider or device) enforces on
// its own for an exposure, whatever an initiator does. Anything false here is
// guarded only by honest initiators' checks (and, for revocation, by the
// quarantine of revoked bytes).
//  keys:       an operation with a key the target never issued fails;
//  bounds:     an operation outside the exposed slice fails (not merely
//              outside the arena);
//  rights:     a write (put, atomics) through a read-only exposure fails;
//  read_rights: a get through a write-only exposure fails (separate: net
//              refuses it, tcp;ofi_rxm enforces write rights but was
//              measured to serve such a get);
//  revocation: an operation with a revoked exposure's key fails.
struct Enforcement {
  bool keys = false;
  bool bounds = false;
  bool rights = false;
  bool revocation = false;
  bool read_rights = false;
};

// How a backend moves bytes (Endpoint::transfer_traits()), for protocols
// built on an endpoint; fixed for the endpoint's life.
//  initiator_copies: a get or put is a copy the initiator's CPU makes inside
//    the post (libfabric shm: process_vm_readv/writev), not a transfer that
//    proceeds while the initiator does other things. Gets issued together
//    then run one after another anyway, and each completion is seen only
//    after all of them.
//  copy_crossover: the payload size (bytes) where sending a copy through
//    the receiver's bounce buffers and a rendezvous (notice, get, fin) were
//    measured to cost the same (docs/messaging.md): the default eager
//    threshold of a Messenger on this endpoint.
//  incoming_message_limit: the longest message peers may send to this
//    endpoint (its name tells them; a longer send() of theirs returns
//    Status::message_too_large). libfabric net: FabricEndpointOptions::
//    max_incoming_message; tcp;ofi_rxm: the rxm layer's eager limit;
//    elsewhere no limit. A Messenger keeps its eager payloads within it.
//  fast_message_limit: the longest message (bytes) the backend sends by its
//    fastest path; longer ones take a slower one. libfabric shm with
//    regpool's message rings (FabricEndpointOptions::shm_rings, the
//    default): FabricEndpointOptions::shm_ring_copy_max (65 KiB by
//    default), the longest send copied through a ring; a longer one the
//    receiver reads from the sender's buffer (a system call), as it does
//    a send over 16 KiB that shm_ring_adaptive found cheaper so. Without
//    the rings: the provider's inject size (4096 in 1.17), above which
//    every message goes by CMA (0.38 against 2.18 us for 4160 bytes,
//    measured; docs/messaging.md). 0 = no such step.
//  split_crossover: messages up to this many bytes were measured faster
//    sent as several messages within fast_message_limit than as one: the
//    default of MessengerConfig::eager_split. 0 = never.
//  gather_limit: the longest message (bytes, a Messenger's 64-byte header
//    included) that was measured at least as fast sent gathered (two
//    pieces, the second uncopied from the caller's buffer) as copied into
//    one: the default of MessengerConfig::eager_gather_max. libfabric tcp
//    (net): 65408, 64 KiB less 128 bytes: a gathered message that needs a
//    second segment of the loopback's 64 KiB MTU cost 20-30% more than
//    the copied one with the two processes on cores apart, while below it
//    the gathered one is 1-5% ahead (docs/messaging.md, "Gathered eager").
//    Elsewhere no limit (UINT64_MAX).
//  read_choice_from: messages longer than this (and within
//    fast_message_limit) can be copied through the transport or read by
//    the receiver from the sender's memory, and each pair of endpoints
//    measures which costs less (libfabric shm with regpool's rings and
//    FabricEndpointOptions::shm_ring_adaptive: 16 KiB; the copies' cost
//    depends on where the host places the two processes' CPUs). A
//    Messenger asks per message whether to send a rendezvous instead of
//    a copied eager message (MessengerConfig::rendezvous_choice).
//    UINT64_MAX = no such choice.
struct TransferTraits {
  bool initiator_copies = false;
  std::uint64_t copy_crossover = 16 << 10;
  std::uint64_t incoming_message_limit = ~std::uint64_t{0};
  std::uint64_t fast_message_limit = 0;
  std::uint64_t split_crossover = 0;
  std::uint64_t gather_limit = ~std::uint64_t{0};
  std::uint64_t read_choice_from = ~std::uint64_t{0};
};

// Exposure counters of one endpoint (exposure_stats(); a consistent snapshot).
struct ExposureStats {
  std::uint64_t created = 0;            // exposures made (both modes)
  std::uint64_t scoped = 0;             // of which in scoped mode
  std::uint64_t live = 0;               // exposed now
  std::uint64_t revoked = 0;            // revokes (explicit, destruction, close)
  std::uint64_t quarantined = 0;        // revoked exposures whose bytes are held now
  std::uint64_t quarantined_bytes = 0;  // their slice bytes
  std::uint64_t quarantine_total = 0;   // exposures ever quarantined
  std::uint64_t quarantine_released = 0;  // released after their interval
  std::uint64_t registrations = 0;      // domain registrations made for exposures
};

// What a waiting call does when a poll finds nothing to do.
//  - spin: poll again at once (lowest latency on a free core; with more
//    busy processes than cores it steals the CPU its peers need: measured,
//    a put phase of 3 clients on 2 cores took 5-10 times longer);
//  - sleep: block in poll(2) on the provider's wait object (libfabric
//    FI_WAIT_FD + fi_trywait; verbs: a completion channel) and on an eventfd
//    of the endpoint (another thread posted, completed the awaited op, or
//    shutdown began) until there is work. Providers without a wait object
//    (libfabric shm 1.17 refuses FI_WAIT_FD) nap instead: short timed sleeps
//    growing from 16 us to the provider's cap (1 ms), still woken at once
//    by the eventfd. On shm the nap is a futex wait on a doorbell that
//    peers ring after posting to this endpoint, so a message ends it at
//    once (docs/progress.md, "How shm sleeps"). Every sleep is bounded
//    (10 ms at most) so operation deadlines are noticed within that much;
//  - adaptive: spin for a window after the last activity, then sleep:
//    spinning latency for traffic that keeps coming, a sleeping process
//    when it pauses. The window is EndpointConfig::wait_spin, or longer
//    when the waiting loop has seen short gaps: it remembers the last 8
//    idle gaps (last work to next work) and spins 2x the longest of them,
//    at most 1 ms, when that longest gap is at most 1 ms and no more
//    processes are runnable than this process has CPUs (/proc/loadavg,
//    read every 10 ms at most); otherwise wait_spin. So a request/response
//    peer that thinks for 100 us between requests finds the server
//    awake on a free core, and 8 clients on 2 cores do not burn them.
// The endpoint's mutex is never held while sleeping or napping.
enum class WaitMode : std::uint8_t { spin, sleep, adaptive };
REGPOOL_API const char* to_string(WaitMode m) noexcept;

struct EndpointConfig {
  // Operation slots (put/get/send/recv/atomics in flight at once, receives
  // included). Posting beyond it returns Status::would_block.
  std::size_t max_in_flight = 1024;
  // Per-operation bound: an op not completed by then completes with
  // Status::timeout and its peer is marked broken (0 = no bound). Keeps
  // operations to dead peers from hanging forever on providers that never
  // report them. The bound grows with the transfer, so a large transfer on a
  // slow link is not mistaken for a dead peer:
  //   deadline = (time the post was accepted) + op_timeout
  //              + length / min_bandwidth
  // (length in bytes; atomics count 8; the post's own would_block retries,
  // bounded by post_timeout, come before and do not count). The post time
  // is read from the kernel's coarse clock plus the most it lags (12 ms
  // with HZ=250), and deadlines are checked once per tick while something
  // polls: an op never times out before its deadline, and about four ticks
  // after it at most (docs/progress.md, "Deadlines and the clock").
  std::chrono::milliseconds op_timeout{30000};
  // Receives usually wait for a peer to decide to send: unbounded by default.
  // When set, it scales with the receive buffer's length like op_timeout.
  std::chrono::milliseconds recv_timeout{0};
  // The slowest transfer rate (bytes per second) still considered alive, for
  // the deadline above (0 = do not scale: every op gets op_timeout only).
  // The default is below the slowest transport measured (Soft-RoCE under
  // emulation, about 55 MB/s): a 64 MiB put gets op_timeout + 2.7 s.
  std::uint64_t min_bandwidth = 25'000'000;
  // How long one post call may spend progressing and retrying while the
  // backend answers would_block (connection setup on manual-progress
  // providers); then the post returns Status::would_block. The endpoint's
  // mutex is not held while the call backs off between attempts. Also
  // bounds expose(slice, access, peer) waiting for the connection and for
  // a window bind.
  std::chrono::milliseconds post_timeout{10000};
  // Start a thread that calls progress() for users who do not want to poll.
  // Callbacks then run on that thread.
  bool progress_thread = false;
  // Sleep of the progress thread after an idle poll (0 = spin, burns a core).
  // WaitMode::spin only; the other modes sleep on the provider instead.
  std::chrono::microseconds progress_idle_sleep{20};
  // How wait(), quiesce(), progress_for() and the progress thread pass the
  // time when a poll finds nothing (see WaitMode and docs/progress.md).
  WaitMode wait_mode = WaitMode::spin;
  // WaitMode::adaptive: keep polling at least this long after the last
  // activity before sleeping, so a ping-pong keeps spinning latency on a
  // free core (longer when recent gaps were short: see WaitMode).
  std::chrono::microseconds wait_spin{50};
  // Completions reaped per backend poll.
  std::size_t poll_batch = 32;
  // What expose() gives when no mode is named (see ExposureMode).
  ExposureMode exposure_mode = ExposureMode::standard;
  // Where the target cannot revoke a key (enforcement(mode).revocation is
  // false: shm always, tcp in standard mode), a revoked exposure's bytes are
  // quarantined: the endpoint keeps the slice's LDO reference this long
  // after revoke, so a late put from a peer that still holds the reference
  // lands in bytes nobody else owns yet, never in a new object allocated at
  // the same address. Released by progress() or the next expose/revoke once
  // due, and at endpoint close without waiting. 0 = no quarantine.
  std::chrono::milliseconds revoke_quarantine{1000};
  // Backends with a connection per peer (verbs: an RC queue pair) make it
  // on the first operation to or from the peer and give it back once both
  // sides have left it unused this long, with nothing in flight and no
  // window bound on it; the next operation makes a new one (docs/scale.md,
  // "Connections on demand"). 0 = keep connections until remove_peer.
  // libfabric endpoints ignore it (the provider owns its connections).
  std::chrono::milliseconds idle_release{60000};
};

// A slice made reachable by peers. Holds the Slice (so the LDO stays alive
// while peers may write to it) and the RemoteRef to send them. Revoked on
// destruction or revoke(); afterwards peers' operations fail only where the
// target enforces revocation (Endpoint::enforcement: tcp scoped, verbs
// windows); elsewhere the endpoint quarantines the bytes for
// EndpointConfig::revoke_quarantine, so a late write cannot reach an object
// allocated there later. Where revoking takes a network round (verbs
// windows: an invalidate queued behind earlier work requests), revoke()
// waits for it only briefly (about 20 ms, polling without holding the
// endpoint's mutex); if it is not confirmed by then, the endpoint keeps the
// slice's LDO reference until its progress confirms the key is dead, so the
// bytes are never reused while the key may still work. Move-only.
// Thread-safety: revoke()/destruction may race with endpoint calls from other
// threads; one Exposure object must not be used from two threads at once.
class REGPOOL_API Exposure {
 public:
  Exposure() noexcept = default;
  Exposure(Exposure&& o) noexcept { *this = std::move(o); }
  Exposure& operator=(Exposure&& o) noexcept;
  Exposure(const Exposure&) = delete;
  Exposure& operator=(const Exposure&) = delete;
  ~Exposure() { revoke(); }

  explicit operator bool() const noexcept { return active_; }
  const RemoteRef& ref() const noexcept { return ref_; }
  std::array<std::byte, RemoteRef::kEncodedSize> encode() const noexcept { return ref_.encode(); }
  const Slice& slice() const noexcept { return slice_; }
  // Idempotent; noexcept; bounded (see above). May run an LDO's cleanup
  // (the last reference of something the endpoint released meanwhile).
  void revoke() noexcept;

 private:
  friend class Endpoint;
  std::shared_ptr<detail::ExposureLink> link_;
  Slice slice_;
  RemoteRef ref_;
  std::uint32_t index_ = 0;  // the endpoint's exposure table entry
  bool active_ = false;
};

// Counters for tests and telemetry (read with stats(); relaxed snapshot).
struct EndpointStats {
  std::uint64_t posted = 0;
  std::uint64_t completed = 0;
  std::uint64_t failed = 0;          // completed with a status other than ok
  std::uint64_t rejected = 0;        // refused before the wire
  std::uint64_t timeouts = 0;
  std::uint64_t post_retries = 0;    // would_block answers from the backend
  std::uint64_t in_flight = 0;
  std::uint64_t reconnects = 0;
  // Receives completed ok whose sender the backend could not name
  // (Completion::peer == kAnyPeer): a sender never inserted with
  // insert_peer, or a provider without source addressing.
  std::uint64_t unknown_source = 0;
  // Times a waiting call slept (WaitMode sleep/adaptive) instead of polling.
  std::uint64_t sleeps = 0;
  // Of those, sleeps on the backend's doorbell (shm) that its ring ended
  // (a peer's post, or another thread of this process) rather than their
  // time bound.
  std::uint64_t bell_wakes = 0;
  // Operations whose slot (and LDO reference) was taken back from the
  // backend without a completion from the provider: failed (peer gone,
  // timeout) and proven inert (Endpoint::do_abandon).
  std::uint64_t abandoned = 0;
  // Completions the provider reported for such an operation after its slot
  // was taken back (recognised by the slot's generation and dropped).
  std::uint64_t stale_completions = 0;
  // Messages a peer had sent that no receive had taken when remove_peer
  // removed it, and that the backend had to drop there: libfabric shm keeps
  // such a message pointing into the sender's memory, which the removal
  // unmaps, so a receive matching it later would crash the process.
  std::uint64_t dropped_at_removal = 0;
};

// Thread-safety: every public member may be called from any thread; calls
// are serialised by an internal mutex (backends need not be thread-safe),
// handed over fairly: a thread spinning in wait() or progress() lets a
// thread blocked on the mutex have it before taking it again.
// The mutex is never held while waiting: a post retrying after would_block,
// expose(…, peer) waiting for a connection or a bind, and revoke() waiting
// for an invalidate all release it between attempts. Callbacks run on the
// thread calling progress()/wait()/quiesce() (or the progress thread), never
// under the endpoint's mutex, so they may post new operations. Likewise the
// references the endpoint drops (an op's LDO once the backend is done with
// it) are dropped after the mutex is released, so an LDO cleanup (pool free,
// user memory cleanup) may call into the endpoint or destroy an Exposure. Not movable (backends hand the address of slot storage to the
// provider); hold it by unique_ptr.
//
// Manual progress: on providers where needs_target_progress() is true, an
// operation aimed at a peer completes only while that peer calls progress()
// (or runs the progress thread). A pure target must keep progressing.
class REGPOOL_API Endpoint {
 public:
  static constexpr std::size_t kBackendContextSize = 64;

  virtual ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // --- setup (may throw Error) ---
  // Address blob of this endpoint, to hand to peers (e.g. via Bootstrap).
  std::vector<std::byte> name() const { return do_name(); }
  // Make a peer addressable from its name(). Inserting the same name twice
  // returns the same PeerId.
  PeerId insert_peer(std::span<const std::byte> name);
  // Forget a peer. Its messages that no receive has taken yet may be
  // dropped (shm must: EndpointStats::dropped_at_removal).
  void remove_peer(PeerId peer) noexcept;
  std::size_t peer_count() const noexcept;

  // Expose a slice to peers with the given rights, in config().exposure_mode
  // (or the mode named). Data path: no throw. invalid_argument for an empty
  // slice or unknown access, access_denied when the object's registration
  // lacks the rights (standard mode), unsupported when the backend has no
  // such mode.
  Result<Exposure> expose(const Slice& slice, RemoteAccess access) noexcept;
  Result<Exposure> expose(const Slice& slice, RemoteAccess access, ExposureMode mode) noexcept;
  // Expose a slice to one peer only, where the backend can scope a key to a
  // connection (verbs: a type-2 memory window bound on that peer's queue
  // pair, so the key grants exactly this slice to exactly this peer).
  // Backends without per-peer keys give the same key expose(slice, access)
  // would. invalid_argument for an unknown peer, peer_unreachable for a
  // broken one.
  Result<Exposure> expose(const Slice& slice, RemoteAccess access, PeerId peer) noexcept;
  Result<Exposure> expose(const Slice& slice, RemoteAccess access, PeerId peer, ExposureMode mode) noexcept;
  // What this endpoint's target side enforces for exposures made in `mode`
  // (per_peer: with a PeerId). Measured facts per provider, never more.
  Enforcement enforcement(ExposureMode mode, bool per_peer = false) const noexcept {
    return do_enforcement(mode, per_peer);
  }
  ExposureStats exposure_stats() const noexcept;

  // --- operations (never throw; a failed check posts nothing) ---
  // Completion goes to `cb` when given (then the token is only informative:
  // wait() on it answers invalid_argument), else it is kept for wait(token).
  // An op posted without a callback keeps its slot until wait() returns it.
  Result<Token> put(const Slice& local, PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset,
                    Callback cb = {}) noexcept;
  Result<Token> get(PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset, const Slice& local,
                    Callback cb = {}) noexcept;
  // A send longer than the peer accepts returns Status::message_too_large
  // and sends nothing (the peer's name says how much it takes: on net, its
  // FabricEndpointOptions::max_incoming_message; on tcp;ofi_rxm, rxm's
  // eager limit, 16 KiB by default; elsewhere no limit).
  Result<Token> send(PeerId peer, const Slice& local, Callback cb = {}) noexcept;
  // Receive one message from any peer into `local` (messages from one peer
  // are matched to posted receives in posting order).
  Result<Token> post_recv(const Slice& local, Callback cb = {}) noexcept;
  // A receive that is kept when it completes, to be posted again with
  // repost(): the same slot, buffer reference, callback and token, so a loop
  // that receives into the same buffers over and over (a server's request
  // buffers, a ping-pong) does not claim a slot, take a reference to its
  // buffer and move a callback in for every message (docs/architecture.md,
  // "Kept operations").
  //  - Its completions come as post_recv()'s do: to `cb`, or to wait(token).
  //  - After a completion with status ok or out_of_bounds (a message longer
  //    than the buffer) the receive is parked: it holds its slot (one of
  //    max_in_flight) and its buffer until repost() or end_kept(). Any other
  //    status (closed, timeout, ...) ends it, as it ends a post_recv().
  //  - Its callback runs in place. repost() or end_kept() asked while it
  //    runs (from it, or from another thread) take effect once it returns,
  //    so a kept operation's callback never runs twice at once.
  Result<Token> post_recv_kept(const Slice& local, Callback cb = {}) noexcept;
  // A send that is kept when it completes, to be sent again with repost():
  // the same peer, slot, buffer reference, callback and token, for a buffer
  // sent over and over (a ping-pong, a reply or credit message rewritten in
  // place). Checked and posted as send() is; completions and the callback
  // as for post_recv_kept(). Parked after a completion with status ok; any
  // other status ends it. The buffer may be rewritten while the send is
  // parked, never while it is posted. A PeerId removed (remove_peer) while
  // the send is kept is not its peer any more, even when a later
  // insert_peer hands the same id out again: its reposts answer
  // peer_unreachable. Messages to one peer go out in the order asked, kept
  // or not: a repost the provider cannot take yet holds later send()s,
  // batches and reposts to that peer back until it goes. A repost asked
  // while the send's callback runs is asked when the callback returns, so
  // a send() the callback makes after it goes out first.
  Result<Token> send_kept(PeerId peer, const Slice& local, Callback cb = {}) noexcept;
  // The same, sending only the first `length` bytes of `local` now; reposts
  // may send up to all of it (repost(token, length)). For a buffer whose
  // messages vary in length: `local` is the whole buffer. invalid_argument
  // when `length` is 0 or above local's length. (A literal `{}` as third
  // argument selects this overload with length 0: leave the callback out
  // instead.)
  Result<Token> send_kept(PeerId peer, const Slice& local, std::uint64_t length, Callback cb = {}) noexcept;
  // A put or a get that is kept when it completes, to be posted again with
  // repost(): the same peer, remote range, slot, buffer reference, callback
  // and token, for a transfer repeated as it is (a remote status word read
  // over and over, a record rewritten in place and put to the same remote
  // place), as perftest reuses one work request. Checked and posted as
  // put() and get() are: the remote reference and range are checked here,
  // once, for local's length. Parked after a completion with status ok;
  // any other status ends it (an access the target refused, a failed
  // peer). A removed peer's id answers peer_unreachable, as for
  // send_kept(). Each repost is an operation of its own, unordered against
  // other puts and gets, as put() and get() are.
  Result<Token> put_kept(const Slice& local, PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset,
                         Callback cb = {}) noexcept;
  Result<Token> get_kept(PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset, const Slice& local,
                         Callback cb = {}) noexcept;
  // Post a parked kept operation again: a receive into its buffer, a send
  // of its buffer to its peer, a put or get between its buffer and the
  // same remote offset; or with `local` as the new buffer (the old one's
  // reference is then dropped; a send's, put's or get's length is local's;
  // a put's or get's new buffer may not be longer than its first, whose
  // length the remote range was checked for: out_of_bounds).
  // invalid_argument when `token` is not a parked kept operation of this
  // endpoint (still posted, its completion not yet taken, ended, or already
  // asked to repost); closed once the endpoint shuts down. A send's, put's
  // or get's peer checks answer as send()'s do (peer_unreachable; a send's
  // message_too_large). Any
  // such failure, or a provider error, leaves the operation parked, with
  // `local`. A repost the provider cannot take yet (would_block: its queue
  // is full, shm's region is busy, a reconnected peer still settles) is
  // accepted and retried by every poll, for up to post_timeout; past that
  // the operation ends with a completion of status would_block. A receive
  // waiting so takes its place among posted receives when it posts (ones
  // posted meanwhile match messages before it); a send keeps its place
  // (send_kept). Asked while
  // the operation's callback runs, it returns ok and posts when the
  // callback returns (the callback may still read the old buffer); should
  // that post fail, the operation ends with a completion carrying the
  // failure.
  Status repost(Token token) noexcept;
  Status repost(Token token, const Slice& local) noexcept;
  // Post a parked kept operation again over the first `length` bytes of its
  // buffer: a send sends them, a receive takes at most that many, a put or
  // get moves that many to or from the same remote offset. For a
  // buffer rewritten in place with a new length (a reply, a ping-pong of
  // varying sizes), with no new reference taken. invalid_argument also when
  // `length` is 0 or above the buffer's length. The other forms use the
  // whole buffer again.
  Status repost(Token token, std::uint64_t length) noexcept;
  // End a kept operation. Parked (or its repost still waiting for the
  // provider): its slot and buffer reference go now. Posted: its next
  // completion is its last (it is then a post_recv() or a send()).
  // invalid_argument when `token` is not a live kept operation.
  Status end_kept(Token token) noexcept;
  // 64-bit atomics on an 8-byte aligned word at remote_offset of a
  // read-write export; Completion::value is the word before the op.
  Result<Token> fetch_add(PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset, std::uint64_t addend,
                          Callback cb = {}) noexcept;
  Result<Token> compare_swap(PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset,
                             std::uint64_t expected, std::uint64_t desired, Callback cb = {}) noexcept;

  // Post several puts, gets and sends at once, in order, so the backend can
  // hand them to the provider together (verbs: one chain of work requests
  // and one doorbell per run of consecutive ops to the same peer; libfabric:
  // FI_MORE on all but the last, docs/architecture.md, "Batches"). Each op is
  // checked exactly as by put()/get()/send() and gets its own slot, token,
  // completion and callback; the ops complete independently.
  //
  // Returns n, the number of leading ops posted: ops[0..n) have status ok
  // and a token; when n < ops.size(), ops[n].status is why it was not
  // posted (the statuses of put(): would_block when no operation slot is
  // free or the provider's queue stayed full for post_timeout,
  // peer_unreachable, invalid_argument, out_of_bounds, ...) and every later
  // op has status canceled and was not attempted. A failed op never leaves a
  // later one posted, so "posted" is always a prefix: resubmit ops[n..).
  // An empty span posts nothing and returns 0.
  // Thread-safety: as every member; the batch is posted under one hold of
  // the endpoint's mutex (released only to back off while the provider
  // answers would_block, as put() does), so ops of a batch are not
  // interleaved with another thread's posts. `ops` must not be touched by
  // another thread during the call.
  std::size_t post_batch(std::span<BatchOp> ops) noexcept;

  // --- completion ---
  // Poll the backend, time out overdue ops, run ready callbacks. Returns the
  // number of user completions delivered (a Messenger's messages taken in
  // place on shm count as its completions).
  std::size_t progress() noexcept;
  // Block (progressing, or sleeping when the progress thread runs) until the
  // op completes or `timeout` passes (then status in_progress; the op goes
  // on and may be waited for again). Never returns before `timeout`; a
  // timeout of 1 s or more may run up to one clock tick (4 ms) longer, as
  // may quiesce()'s and progress_for()'s.
  Completion wait(Token token, std::chrono::milliseconds timeout) noexcept;
  // Progress until no user-visible operation is in flight other than posted
  // receives (ok) or `timeout` passes (Status::timeout).
  Status quiesce(std::chrono::milliseconds timeout) noexcept;
  // Progress for `duration` (serving a target role on manual-progress
  // providers).
  void progress_for(std::chrono::milliseconds duration) noexcept;
  // One progress round; when it found nothing to do, wait up to `max` for
  // work as config().wait_mode says (spin: return at once; sleep: sleep on
  // the provider; adaptive: return at once inside the spin window after
  // the last round that found work, sleep after it). Its idle state (the
  // window's gaps, the naps) carries over from call to call, for loops
  // layered above the endpoint (a server's loop, Messenger::wait).
  std::size_t progress_or_idle(std::chrono::milliseconds max) noexcept;

  // --- health ---
  bool usable() const noexcept { return usable_.load(std::memory_order_acquire); }
  bool usable(PeerId peer) const noexcept;
  // Re-establish a broken peer (after peer_unreachable). Fails ops still in
  // flight to it with peer_unreachable. Returns ok or the cause.
  Status reconnect(PeerId peer) noexcept;
  // The peer is gone (membership: it left or died). Marks it broken, so
  // posts to it answer peer_unreachable, and completes every operation in
  // flight to it with `status` now instead of at its timeout. The slots'
  // LDO references go when the backend lets go of the operations (cancel)
  // or when the backend proves the provider has let go of them (see
  // docs/membership.md), or when the endpoint closes. Unknown peers are
  // ignored.
  void fail_peer(PeerId peer, Status status = Status::peer_unreachable) noexcept;

  // --- properties ---
  Backend backend() const noexcept { return backend_kind(); }
  bool native_atomics() const noexcept { return do_native_atomics(); }
  bool target_progress_required() const noexcept { return needs_target_progress(); }
  const EndpointConfig& config() const noexcept { return config_; }
  EndpointStats stats() const noexcept;
  // Largest send/receive (and the chunk size layered protocols use for get).
  std::uint64_t message_size_limit() const noexcept { return max_message_size(); }
  // How this backend moves bytes, for protocols built on the endpoint (the
  // Messenger picks its eager threshold and rendezvous pacing from it).
  TransferTraits transfer_traits() const noexcept { return do_transfer_traits(); }

  // --- receive-side ownership (regpool/messaging.hpp) ---
  // A Messenger owns the endpoint's receives (it posts and consumes them
  // all, and they stay posted until the endpoint closes). The first claim
  // returns true, every later one false, for the endpoint's lifetime.
  bool claim_receive_side() noexcept { return !receive_side_claimed_.exchange(true, std::memory_order_acq_rel); }

 protected:
  // For backends: the contract below is documented in regpool/endpoint_backend.hpp.

  // What the base does with exposures for a backend (fixed at construction).
  //  - per_peer: the backend scopes keys to one peer (verbs windows):
  //    expose(slice, access, peer) reaches do_expose. Otherwise a peer
  //    changes nothing and the base makes the exposure as for any peer.
  //  - reuse_scoped: a scoped registration stays open while a revoked
  //    exposure's bytes are quarantined (where the target does not revoke)
  //    and a scoped exposure of the same bytes with the same rights reuses it
  //    meanwhile (FabricEndpointOptions::reuse_scoped).
  struct ExposureSupport {
    bool per_peer = false;
    bool reuse_scoped = false;
  };
  Endpoint(const EndpointConfig& config, const ExposureSupport& support);

  // Register the atomic words (native atomics) and start the progress
  // thread if configured: call at the end of the derived constructor, once
  // do_poll can run, inside its cleanup (may throw Error).
  void start();
  // Stop the progress thread and revoke every exposure. Derived destructors
  // call it first. Idempotent, noexcept, bounded (joins the thread, which
  // exits after its current poll).
  void shutdown() noexcept;

  // For backends, from inside do_* only (the mutex is held).
  // A pending bind (ExposureInfo::pending) or a deferred revoke of `handle`
  // has finished; for a bind, status != ok means it failed and the backend
  // has already released the handle.
  void exposure_settled(std::uint64_t handle, Status status) noexcept;
  // From inside do_revoke(handle): the key may still work until the backend
  // calls exposure_settled(handle, ...).
  void revoke_deferred(std::uint64_t handle) noexcept;
  // The backend is done with the op in slot `index`. An atomic's old value
  // is read from its result word (atomic_words(index)->result), where the
  // provider (or, for emulated atomics, the backend) put it.
  void complete(std::uint32_t index, Status status, std::uint64_t bytes, PeerId peer = kAnyPeer) noexcept;
  void mark_peer_broken(PeerId peer) noexcept;
  // The peer is gone (e.g. its process died): every operation in flight to
  // it completes with `st` now, and the peer is marked broken. As after a
  // timeout, the backend keeps the slots until it reports them itself or
  // do_abandon agrees to give them back.
  void fail_peer_ops(PeerId peer, Status st) noexcept;
  void mark_unusable() noexcept { usable_.store(false, std::memory_order_release); }
  // PeerId whose handle is `handle`, or kAnyPeer.
  PeerId peer_for_handle(std::uint64_t handle) const noexcept;
  // The op in slot `index` (valid while the backend owns it).
  const BackendOp& op_at(std::uint32_t index) const noexcept;
  // Slot index of a BackendOp::context pointer handed back by a provider, or
  // kNoIndex when it is not one (providers may overwrite the context bytes
  // themselves, FI_CONTEXT2, so the index cannot be stored inside them).
  static constexpr std::uint32_t kNoIndex = ~std::uint32_t{0};
  std::uint32_t index_of_context(const void* context) const noexcept;
  // Slot index of a BackendOp::tag handed back by a provider, or kNoIndex
  // when no op the backend owns now has that tag (a stale completion of an
  // abandoned op whose slot was reused, or not a tag at all: counted in
  // EndpointStats::stale_completions when it names a slot).
  std::uint32_t index_of_tag(std::uint64_t tag) noexcept;
  // The words of an atomic in slot `index`: the base fills operand and
  // compare and zeroes result before posting, and reads result when the
  // op completes ok. Stable, 8-byte aligned, in one array registered with
  // domain() for local access (atomic_registration(): descriptor, lkey) when
  // do_native_atomics() was true at start().
  struct AtomicWords {
    std::uint64_t operand = 0;  // fetch_add addend; compare_swap desired
    std::uint64_t compare = 0;  // compare_swap expected
    std::uint64_t result = 0;   // the remote word before the op
  };
  AtomicWords* atomic_words(std::uint32_t index) noexcept { return &atomic_words_[index]; }
  // From do_post only (never do_post_batch), for the op being posted: it is
  // complete already (status ok, all its bytes; e.g. a message the provider
  // copied inside the post). The base completes it once it has taken the op
  // in, and the backend reports nothing more for it.
  void complete_at_post() noexcept { completed_at_post_ = true; }
  // When an op of `kind` and `length` bytes accepted at `now` is overdue:
  // now + op_timeout (recv_timeout for receives) + length / min_bandwidth,
  // saturating; time_point::max() when there is no bound. For a backend
  // bounding work no op's deadline covers (verbs: injected sends' WRs).
  std::chrono::steady_clock::time_point deadline_for(OpKind kind, std::uint64_t length,
                                                     std::chrono::steady_clock::time_point now) const noexcept;
  // A backend dropped `n` messages of a peer it was removing
  // (EndpointStats::dropped_at_removal).
  void count_dropped_at_removal(std::uint64_t n) noexcept {
    dropped_at_removal_.fetch_add(n, std::memory_order_relaxed);
  }
  const Registration& atomic_registration() const noexcept { return atomic_reg_; }

  // --- the backend interface (endpoint_backend.hpp) ---
  virtual Backend backend_kind() const noexcept = 0;
  virtual Domain& domain() const noexcept = 0;
  virtual std::uint64_t max_message_size() const noexcept = 0;
  virtual bool needs_target_progress() const noexcept = 0;
  virtual bool do_native_atomics() const noexcept = 0;
  virtual TransferTraits do_transfer_traits() const noexcept = 0;
  virtual std::vector<std::byte> do_name() const = 0;
  virtual std::uint64_t do_insert_peer(std::span<const std::byte> name) = 0;
  virtual void do_remove_peer(std::uint64_t handle) noexcept = 0;
  // The largest message the peer behind `handle` accepts (what its name
  // advertised); the default: any the transport carries.
  virtual std::uint64_t do_peer_message_limit(std::uint64_t /*handle*/) const noexcept { return ~std::uint64_t{0}; }
  virtual std::chrono::milliseconds reconnect_settle() const noexcept { return std::chrono::milliseconds{0}; }
  virtual Result<std::uint64_t> do_reconnect(PeerId peer, std::uint64_t handle,
                                             std::span<const std::byte> name) noexcept;
  // Post one operation of any kind (op.kind).
  virtual Status do_post(const BackendOp& op) noexcept = 0;
  // Post ops in order as one batch where the provider can (see
  // endpoint_backend.hpp). `posted` receives how many leading ops were
  // accepted. The default posts them one by one with do_post.
  virtual Status do_post_batch(std::span<const BackendOp* const> ops, std::size_t& posted) noexcept;
  virtual std::size_t do_poll(std::size_t max) noexcept = 0;
  virtual void do_cancel(const BackendOp& op) noexcept = 0;
  // See endpoint_backend.hpp: the provider will never touch op again.
  virtual bool do_abandon(const BackendOp& /*op*/) noexcept { return false; }
  // Only with ExposureSupport::per_peer, for an exposure to one peer (either
  // mode); everything else is made by the base (the object's registration,
  // or a registration of the slice). The default: unsupported.
  virtual Result<ExposureInfo> do_expose(const Slice& slice, RemoteAccess access, ExposureMode mode,
                                         std::uint64_t peer_handle) noexcept;
  // Undo what do_expose made.
  virtual void do_revoke(std::uint64_t /*handle*/) noexcept {}
  // What the target enforces (see Enforcement); the default claims nothing.
  virtual Enforcement do_enforcement(ExposureMode /*mode*/, bool /*per_peer*/) const noexcept { return {}; }

  // For backends that emulate atomics for peers, from inside do_* only:
  // apply `op` (fetch_add: operand added; compare_swap: operand stored if
  // the word equals compare) to the 8-byte word at `address` (the
  // RemoteRef's addressing) of the live exposure whose key is `key`, with
  // std::atomic_ref (atomic against the target's own atomic_ref users), and
  // return the word before. Checked as a target would: bad_key when no live
  // exposure has the key, out_of_bounds when none with it holds the word,
  // access_denied unless it is read-write, invalid_argument for a word not
  // 8-byte aligned or another op. Linear in the live exposures.
  Result<std::uint64_t> apply_remote_atomic(OpKind op, std::uint64_t key, std::uint64_t address,
                                            std::uint64_t operand, std::uint64_t compare) noexcept;
  // Sleeping waits (WaitMode sleep/adaptive); see endpoint_backend.hpp.
  virtual int do_wait_fd() const noexcept { return -1; }
  virtual bool do_arm(std::chrono::microseconds& /*max_sleep*/) noexcept { return true; }
  virtual WaitBell do_wait_bell() const noexcept;
  // Messages in place (endpoint_backend.hpp): whether the backend copies a
  // message into the transport within a call and shows incoming ones where
  // they lie; the copy itself (ok, or would_block when it cannot now); and,
  // from do_poll only, an incoming message offered to the receive side's
  // sink before a posted receive takes it (true: taken, consumed).
  virtual bool do_messages_in_place() const noexcept { return false; }
  // Gathered sends (endpoint_backend.hpp): whether the backend sends an op
  // with a `body` as one message of its two pieces.
  virtual bool do_gathered_sends() const noexcept { return false; }
  virtual Status do_send_copy(std::uint64_t /*handle*/, std::span<const std::byte> /*head*/,
                              std::span<const std::byte> /*body*/, bool /*may_read*/) noexcept {
    return Status::would_block;
  }
  bool has_message_sink() const noexcept { return sink_ != nullptr; }
  bool offer_in_place(PeerId peer, std::span<const std::byte> bytes) noexcept;

 private:
  friend class Exposure;
  // The Messenger's path past the operation table, where the backend has
  // one (lib/transport/message_sink.hpp); not part of the public API.
  friend struct detail::MessengerCore;
  // Installs (or, null, removes) the receive side's sink, on any backend;
  // returns whether the backend shows messages where they lie and copies
  // them in place (do_messages_in_place). Where it does not, completed
  // kept receives are offered to the sink instead. After a removal
  // returns, no take() runs.
  REGPOOL_LOCAL bool set_message_sink(std::shared_ptr<detail::MessageSink> sink) noexcept;
  // A message of `head` then `body` to `peer`, copied into the transport
  // now: ok (nothing follows: no operation, no completion), would_block
  // (the backend cannot now, or has no such path: post it instead), or why
  // the peer cannot be sent to. With `may_read` (the caller can send it by
  // rendezvous instead), also in_progress: not copied, because the pair
  // measured the receiver's read cheaper (TransferTraits::
  // read_choice_from).
  Status send_copy(PeerId peer, std::span<const std::byte> head, const Slice& body, bool may_read = false) noexcept;
  // One message of `head` then `body` to `peer`, each sent from where it
  // lies, as send() sends one slice (both references held until the
  // completion). Only on a backend whose do_gathered_sends() is true:
  // Status::unsupported elsewhere.
  REGPOOL_LOCAL Result<Token> send_gathered(PeerId peer, const Slice& head, const Slice& body, Callback cb) noexcept;

  using Clock = std::chrono::steady_clock;
  class Lock;
  // After a poll whose sink's takes left posts: its settle(), without the
  // mutex (released and taken back).
  void settle_sink(Lock& g) noexcept;
  // A completed kept receive offered to that sink before its callback;
  // true when taken (the receive is posted again, or failed).
  bool take_kept_locked(std::uint32_t index) noexcept;
  // A kept send completed ok, offered to that sink before its callback;
  // true when taken (the send is parked for its owner's next repost).
  bool take_sent_locked(std::uint32_t index) noexcept;

  // One operation slot (defined in endpoint.cpp; slots_ owns them).
  struct Slot;
  struct Peer {
    bool used = false;
    bool broken = false;
    // Removed by reconnect() and waiting out reconnect_settle() before it is
    // inserted again: `handle` is stale meanwhile.
    bool settling = false;
    Clock::time_point settle_until{};
    std::uint64_t handle = 0;
    // Sends longer than this are refused (Status::message_too_large): the
    // peer said it cannot take them without harm to the connection. Its
    // name fixed it, so a reconnect keeps it.
    std::uint64_t message_limit = ~std::uint64_t{0};
    std::vector<std::byte> name;
    // Bumped by remove_peer and carried over when insert_peer reuses the
    // id: a kept send remembers it, so it never goes to a peer inserted
    // after its own was removed.
    std::uint32_t epoch = 0;
  };

  // The checks of an op that need no lock (local slice, remote reference,
  // rights, alignment, message size): ok or the status to reject it with.
  // This and the other `inline` members below are defined in endpoint.cpp,
  // their only user, and inlined into the per-operation path there.
  inline Status check_op(OpKind kind, const Slice* local, const RemoteRef* remote, std::uint64_t remote_offset,
                  std::uint64_t length) const noexcept;
  // Under the mutex: peer checks and a free slot (polling once if none),
  // filled for the op; the slot is reserved (user_pending) until
  // accept_locked or refuse_locked. Returns the slot index or the status.
  inline Result<std::uint32_t> claim_slot_locked(OpKind kind, PeerId peer, const Slice* local, const RemoteRef* remote,
                                          std::uint64_t remote_offset, std::uint64_t length,
                                          std::uint64_t operand, std::uint64_t compare) noexcept;
  // The backend accepted the op in slot `index`: it owns it from now on.
  inline void accept_locked(std::uint32_t index) noexcept;
  // The op in slot `index` was not posted: the slot goes back; its Slice is
  // moved to `local` (destroyed by the caller after unlocking).
  void refuse_locked(std::uint32_t index, Slice& local) noexcept;
  // Re-check a peer after the mutex was released (post retries).
  Status recheck_peer_locked(PeerId peer) const noexcept;
  // Inlined into put, get, send, post_recv and the atomics: each then
  // carries only its own kind's checks.
  inline Result<Token> submit(OpKind kind, PeerId peer, const Slice* local, const RemoteRef* remote,
                       std::uint64_t remote_offset, std::uint64_t length, std::uint64_t operand,
                       std::uint64_t compare, Callback&& cb, bool kept = false, const Slice* body = nullptr,
                       Slice* refused_body = nullptr) noexcept;
  void fail_ops_locked(PeerId peer, Status status, bool gone) noexcept;
  // Take back failed ops the backend still holds where do_abandon agrees
  // (one slot, or every such slot).
  void abandon_locked(std::uint32_t index) noexcept;
  void abandon_all_locked() noexcept;
  // The endpoint's mutex: one futex word (endpoint.cpp, "The mutex").
  // Locked and unlocked about twice per operation; pthread's trylock and
  // unlock cost about 55 instructions per round of the ~1,500 regpool adds
  // to a put, this a compare-exchange and an exchange.
  class Mutex {
   public:
    inline bool try_lock() noexcept;
    inline void lock() noexcept;
    inline void unlock() noexcept;

   private:
    // 0 free, 1 held, 2 held and some thread may be asleep on it.
    std::atomic<std::uint32_t> state_{0};
  };
  // Unlock, then destroy what was released under the mutex (bounded
  // batches, re-locking between them).
  void unlock_and_release(std::unique_lock<Mutex>& lk) noexcept;
  // Its cases: exactly one reference in releases_, several (or parked
  // exposure references).
  void unlock_releasing_one(std::unique_lock<Mutex>& lk) noexcept;
  void release_batches(std::unique_lock<Mutex>& lk) noexcept;
  // The oldest slot of releases_ (release_count_ > 0): its Slice, moved out
  // for the caller to drop after unlocking; the slot is freed if it may be.
  inline Slice take_release_locked() noexcept;
  // Slot `index`'s Slice (if any, and not queued yet) to releases_, for
  // the next unlock to drop.
  inline void release_slice_locked(std::uint32_t index) noexcept;
  // Every acquisition of mutex_ goes through these: a thread that finds
  // others blocked on it lets them have it first (endpoint.cpp, "Fair
  // hand-off").
  void lock_fair(std::unique_lock<Mutex>& lk) const noexcept;
  std::unique_lock<Mutex> lock_fair() const noexcept;
  inline std::size_t poll_locked() noexcept;
  void expire_locked(Clock::time_point now) noexcept;
  inline void maybe_free_locked(std::uint32_t index) noexcept;
  // Kept operations (post_recv_kept, send_kept): post slot `index` again
  // (it is parked or its callback just returned); the operation stays
  // parked if the post fails.
  // length: bytes of the slot's buffer to post; 0 = all of it.
  Status post_kept_locked(std::uint32_t index, std::uint64_t length = 0) noexcept;
  // A kept operation's post: a send's peer checks (removed, broken, too
  // long, settling), then do_post.
  Status post_kept_desc_locked(Slot& s) noexcept;
  // accept_locked for an op just posted (new, or a kept one posted again),
  // its completion if the provider finished it inside the post, and the
  // activity count.
  inline void accept_posted_locked(std::uint32_t index) noexcept;
  Status repost_impl(Token token, const Slice* local, std::uint64_t length = 0) noexcept;
  // A kept operation stops being kept: its buffer reference goes to the
  // release ring unless the backend still holds it (complete() then does).
  void unkeep_locked(std::uint32_t index) noexcept;
  // After a kept operation's callback returned: parked, posted again
  // (repost() asked from the callback) or ended (end_kept(), shutdown);
  // an ended one's callback is moved to `cb`, a buffer the repost replaced
  // to `old`, both destroyed after the unlock.
  void settle_kept_locked(std::uint32_t index, Callback& cb, Slice& old) noexcept;
  inline void finish_locked(Slot& s, std::uint32_t index, Status st, std::uint64_t bytes, std::uint64_t value,
                     PeerId peer) noexcept;
  void revoke_exposure(std::uint32_t index, std::uint64_t exposure_id, Slice& slice) noexcept;
  void progress_thread_main() noexcept;
  // progress(), also reporting the backend events its polls handled.
  std::size_t progress_counting(std::size_t& events) noexcept;
  // WaitMode sleep/adaptive. A waiting loop calls idle() without the mutex
  // after each progress round with the work that round did (`work`) and
  // the value of activity_ it saw before the round (`seen`). idle() spins
  // (returns) while there is work or, in adaptive mode, for wait_spin after
  // the last work; then it sleeps until the backend's wait object or the
  // wake eventfd fires, `until`, or a bound (10 ms). It returns at once
  // when activity_ moved past `seen` (a completion or a post since the
  // caller looked) or the backend has work pending.
  struct IdleState {
    // Last work seen; unset (epoch) until the first idle() call, so a wait
    // in spin mode, which never calls idle() past its first line, reads no
    // clock for it.
    Clock::time_point since{};
    std::uint32_t naps = 0;                  // consecutive sleeps (naps grow)
    std::uint32_t idle_rounds = 0;           // idle() calls without work since the last work
    // WaitMode::adaptive: the last kGaps idle gaps (last work to next work,
    // microseconds, saturating), a ring; see spin_window().
    static constexpr std::size_t kGaps = 8;
    std::uint32_t gaps[kGaps] = {};
    std::uint32_t gap_count = 0;  // gaps recorded (ring index = count % kGaps)
  };
  void idle(std::size_t work, Clock::time_point until, std::uint64_t seen, IdleState& st) noexcept;
  // WaitMode::adaptive: how long to keep polling after the last work
  // (EndpointConfig::wait_spin, or the learned window: see WaitMode).
  Clock::duration spin_window(const IdleState& st, Clock::time_point now) const noexcept;
  std::uint64_t activity() const noexcept;
  // Under the mutex: something a sleeper may wait for happened.
  void wake_sleepers_locked() noexcept;
  bool sleeps() const noexcept { return config_.wait_mode != WaitMode::spin; }
  Status reject(Status st) noexcept;
  // ok when `peer` (used, not broken) may be posted to; would_block while it
  // waits out reconnect_settle(); re-inserts it once that has passed.
  Status peer_ready_locked(PeerId peer) noexcept;
  Result<Exposure> expose_impl(const Slice& slice, RemoteAccess access, PeerId peer, ExposureMode mode) noexcept;
  // An exposure through the object's own registration with domain()
  // (standard mode): no registration.
  Result<ExposureInfo> standard_exposure(const Slice& slice, RemoteAccess access) const noexcept;
  // Scoped mode without per-peer keys: a registration of exactly the slice
  // with exactly the rights (or, with reuse_scoped, an open one of the same
  // bytes and rights). `reg` receives its index (Impl::scoped), `registered`
  // whether a new registration was made.
  Result<ExposureInfo> scoped_registration_locked(const Slice& slice, RemoteAccess access, std::uint32_t& reg,
                                                  bool& registered) noexcept;
  // Drops a hold on scoped registration `reg` (closed with the last hold)
  // and sets `reg` to kNoExposure; nothing when it is already.
  void release_scoped_locked(std::uint32_t& reg) noexcept;
  // Exposure table (slab + free list, so expose/revoke do not allocate once
  // it has grown to the number of exposures alive at once).
  static constexpr std::uint32_t kNoExposure = ~std::uint32_t{0};
  Result<std::uint32_t> claim_exposure_locked() noexcept;
  void free_exposure_locked(std::uint32_t index) noexcept;
  void quarantine_locked(std::uint32_t index, Slice&& slice, Clock::time_point now) noexcept;
  // Moves quarantined entries whose interval has passed to the release list.
  void expire_quarantine_locked(Clock::time_point now) noexcept;
  void queue_release_locked(std::uint32_t index) noexcept;
  std::uint32_t find_handle_locked(std::uint64_t handle) const noexcept;

  EndpointConfig config_;
  ExposureSupport support_;
  mutable Mutex mutex_;
  mutable std::atomic<std::uint32_t> lock_waiters_{0};  // threads blocked in lock_fair
  std::unique_ptr<Slot[]> slots_;
  std::vector<std::uint32_t> free_;      // stack of free slot indices, reserved
  // post_batch's list of the ops it hands to do_post_batch (reserved to
  // max_in_flight, used under the mutex only).
  std::vector<const BackendOp*> batch_;
  std::vector<std::uint32_t> ready_;     // callback ops ready to deliver (ring)
  std::size_t ready_head_ = 0;
  std::size_t ready_count_ = 0;
  std::vector<Peer> peers_;
  // Backend handle -> the used, non-settling peer holding it (the lowest
  // PeerId when several share one), kAnyPeer otherwise: a completion finds
  // its sender in O(1). Maintained wherever a peer's used, settling or
  // handle changes; grown only when a larger handle first appears (handles
  // are small indices, endpoint_backend.hpp).
  std::vector<PeerId> peer_by_handle_;
  bool index_peer_locked(PeerId peer) noexcept;  // false: handle too large or out of memory
  void unindex_peer_locked(PeerId peer) noexcept;
  // Kept operations whose repost the provider refused for now (would_block):
  // retried by every poll until they post or their post_timeout passes
  // (reserved to max_in_flight; each slot at most once).
  std::vector<std::uint32_t> kept_retry_;
  void retry_kept_locked() noexcept;
  // A kept send to `peer` among kept_retry_[0, upto) still waiting: a send
  // to that peer must wait behind it (sends go out in the order asked).
  bool send_queued_locked(PeerId peer, std::size_t upto) const noexcept;
  // A send to `peer` must wait behind a kept send's repost still in
  // kept_retry_ (one empty() test when nothing waits).
  bool send_held_locked(PeerId peer) const noexcept {
    return !kept_retry_.empty() && send_queued_locked(peer, kept_retry_.size());
  }
  // The end of a kept operation that could not be posted again: its last
  // completion, with `st`.
  void fail_kept_locked(std::uint32_t index, Status st) noexcept;
  std::vector<std::uint32_t> releases_;  // slots whose Slice awaits release (ring)
  std::size_t release_head_ = 0;
  std::size_t release_count_ = 0;
  // Gathered sends' bodies taken with their slot's Slice by
  // take_release_locked, dropped with it after the same unlock (capacity
  // max_in_flight: never grows).
  std::vector<Slice> body_releases_;
  // free -> (binding ->) live -> [revoking ->] revoked -> free, or
  // live -> quarantined -> revoked -> free; binding -> failed -> free.
  // `revoked` entries wait on the release list for an unlock to drop their
  // parked reference.
  enum class ExposureState : std::uint8_t { free, binding, live, failed, revoking, quarantined, revoked };
  struct ExposureEntry {
    std::uint64_t id = 0;      // the RemoteRef's exposure_id (0 = free)
    std::uint64_t handle = 0;  // backend's (when owned)
    std::uint64_t key = 0;     // as in the RemoteRef (apply_remote_atomic)
    std::uint64_t address = 0;
    std::uint64_t length = 0;
    std::byte* base = nullptr;
    Clock::time_point release_at{};  // quarantined: when the bytes may go
    ExposureState state = ExposureState::free;
    Status status = Status::ok;  // of a settled bind
    RemoteAccess access = RemoteAccess::read_only;
    std::uint32_t scoped = kNoExposure;  // its scoped registration (Impl::scoped), if any
    bool owned = false;            // the backend holds `handle` (do_expose)
    bool target_revokes = false;   // enforcement(mode, per_peer).revocation
    bool late_revoke = false;      // reuse_scoped: the registration closes when the quarantine ends
    std::uint32_t next = kNoExposure;  // free list / quarantine FIFO / release list
    Slice parked;  // held while binding, revoking or quarantined
  };
  std::vector<ExposureEntry> exposures_;
  std::uint32_t free_exposures_ = kNoExposure;
  std::uint32_t quarantine_head_ = kNoExposure;  // oldest first (one interval for all)
  std::uint32_t quarantine_tail_ = kNoExposure;
  std::uint32_t release_list_ = kNoExposure;     // revoked entries awaiting an unlock
  ExposureStats exposure_stats_;              // guarded by mutex_
  bool revoke_deferred_ = false;      // set by revoke_deferred() during do_revoke
  std::shared_ptr<detail::ExposureLink> link_;
  std::uint64_t next_exposure_id_ = 1;
  std::uint64_t exposure_nonce_ = 0;
  Clock::time_point next_expiry_scan_{};
  // The last poll found completions and did not read the clock for the
  // expiry scan (poll_locked): the next poll reads it.
  bool expiry_read_skipped_ = false;
  Clock::time_point next_abandon_scan_{};
  // Whether some slot may be an orphan the backend still holds: the
  // periodic abandon scan walks the slots only then, not whenever any op
  // is in flight.
  bool orphans_maybe_ = false;
  std::size_t backend_owned_ = 0;
  std::size_t last_poll_events_ = 0;
  // One AtomicWords per slot (max_in_flight), registered by start().
  std::unique_ptr<AtomicWords[]> atomic_words_;
  Registration atomic_reg_;

  std::atomic<bool> usable_{true};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> receive_side_claimed_{false};
  // The progress thread and the condition variable wait() sleeps on in
  // progress thread mode (defined in endpoint.cpp, so this header needs
  // neither <thread> nor <condition_variable>; neither is on the post path).
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<std::uint32_t> waiters_{0};  // sleeping on impl_->done_cv
  // Sleeping waits: an eventfd (owned) that wakes every sleeper, how many
  // are inside sleep_until_work, and a counter of completions and posts
  // (all under the mutex) so no wake-up between a look and a sleep is lost.
  int wake_fd_ = -1;
  std::uint32_t sleepers_ = 0;
  // The backend's doorbell (do_wait_bell(), read once by start()); sleepers
  // then sleep on its futex word instead of wake_fd_.
  std::atomic<std::uint32_t>* bell_seq_ = nullptr;
  std::atomic<std::uint32_t>* bell_sleepers_ = nullptr;
  std::atomic<std::uint64_t> bell_wakes_{0};
  std::uint64_t activity_ = 0;
  std::atomic<std::uint64_t> sleeps_{0};
  std::atomic<std::uint64_t> unknown_source_{0};

  std::atomic<std::uint64_t> posted_{0};
  std::atomic<std::uint64_t> completed_{0};
  std::atomic<std::uint64_t> failed_{0};
  std::atomic<std::uint64_t> rejected_{0};
  std::atomic<std::uint64_t> timeouts_{0};
  std::atomic<std::uint64_t> retries_{0};
  std::atomic<std::uint64_t> reconnects_{0};
  std::atomic<std::uint64_t> abandoned_{0};
  std::atomic<std::uint64_t> stale_completions_{0};
  std::atomic<std::uint64_t> dropped_at_removal_{0};
  bool completed_at_post_ = false;  // complete_at_post(), read by submit
  // The receive side's sink (set_message_sink) and whether a take since
  // its last settle() asked for one (both under the mutex).
  std::shared_ptr<detail::MessageSink> sink_;
  bool sink_took_ = false;
  // Completed kept receives are offered to the sink (take_kept_locked):
  // set with a sink on a backend that does not show messages in place
  // (where it does, each message was offered where it lay, and a bounce
  // holds only what the sink declined there).
  bool sink_bounces_ = false;
  std::size_t sink_takes_ = 0;  // takes since the last progress round (deliveries)
};

}  // namespace regpool
