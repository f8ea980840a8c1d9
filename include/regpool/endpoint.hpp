#pragma once
// Layer 7: the transport. An Endpoint moves bytes between LDO slices of this
// process and remote references exposed by peers: put, get, send, post_recv,
// fetch_add and compare_swap. Endpoint is backend-neutral; FabricEndpoint
// (libfabric FI_EP_RDM) and the verbs endpoint derive from it.
//
// What the base class does for every backend (so backends cannot get it
// wrong, and so every backend gives the same statuses):
//  - checks before anything reaches the wire: local slice inside its object,
//    remote reference well formed (RemoteRef::well_formed(): malformed),
//    remote range inside the remote reference, remote reference from this
//    backend, access rights (put/atomics need a read-write export), 8-byte
//    alignment of atomic words, message size, peer known and not broken.
//    A violation returns the Status immediately and posts nothing;
//  - a preallocated in-flight table (EndpointConfig::max_in_flight slots).
//    Each slot holds a Slice, i.e. a reference to its LDO, from post until the
//    backend gives the operation back, so dropping the user's handle early
//    cannot free bytes under a transfer. Posting never allocates;
//  - tokens, wait(token, timeout), progress() running callbacks, quiesce(),
//    the optional background progress thread, per-operation timeouts scaled
//    by transfer size (Status::timeout), retrying posts the backend refuses
//    with would_block (after progressing, without holding the mutex while
//    backing off), per-peer broken state, usable() and reconnect().
//
// ---------------------------------------------------------------------------
// Backend interface (the protected virtuals below). A backend implements:
//
//   Backend backend_kind() const            fabric or verbs: stamped into
//                                           remote refs and checked on use.
//   Domain& domain() const                  the registration domain whose
//                                           regions (Ldo::region) it uses.
//   std::uint64_t max_message_size() const  largest send/recv.
//   bool needs_target_progress() const      true when a target must call
//                                           progress() for operations aimed
//                                           at it to complete (manual
//                                           progress, emulated atomics).
//   std::vector<std::byte> do_name() const  address blob peers insert (setup:
//                                           may throw Error).
//   std::uint64_t do_insert_peer(bytes)     make a peer addressable; returns
//                                           the backend's handle for it
//                                           (fi_addr_t, QP index...); setup:
//                                           throws Error on failure.
//   void do_remove_peer(handle)             forget a peer (noexcept).
//   Result<std::uint64_t> do_reconnect(peer, handle, name)
//                                           re-establish a broken peer; the
//                                           default removes and re-inserts.
//   milliseconds reconnect_settle() const   optional: how long a removed
//                                           peer must stay out of the
//                                           address table before it may be
//                                           inserted again (default 0). When
//                                           non-zero, reconnect() removes the
//                                           peer and returns at once; posts
//                                           to it answer would_block (retried
//                                           by the base without the mutex)
//                                           until the time has passed, then
//                                           the base re-inserts it.
//   Status do_put / do_get / do_send / do_recv / do_atomic(const OpDesc&)
//                                           post one operation. Return
//                                           - ok: posted; the backend owns
//                                             op.context (kBackendContextSize
//                                             bytes, 16-byte aligned, stable)
//                                             until it reports the op with
//                                             complete(op.index, ...);
//                                           - would_block: nothing posted;
//                                             the base calls do_poll and
//                                             retries until post_timeout;
//                                           - anything else: nothing posted,
//                                             returned to the caller as is.
//                                           The base has already done every
//                                           check listed above; the backend
//                                           only maps to its own calls.
//   std::size_t do_poll(std::size_t max)    reap up to `max` completions and
//                                           report each with complete();
//                                           also serve internal traffic
//                                           (connection setup, emulated
//                                           atomics). Returns how many events
//                                           it handled (0 = idle).
//   (index_of_context() maps a provider's context pointer back to an index.)
//   void do_cancel(const OpDesc&)           best effort abort of a timed-out
//                                           op. The user already got
//                                           Status::timeout; the slot (and
//                                           its LDO reference) stays owned by
//                                           the backend until it calls
//                                           complete() for it (any status is
//                                           then ignored) or the endpoint
//                                           closes.
//   Result<ExposureInfo> do_expose(slice, access)
//                                           make `slice` reachable by peers
//                                           with exactly `access` (scoped key
//                                           where the backend can: memory
//                                           window, sub-registration).
//   Result<ExposureInfo> do_expose_to(slice, access, peer, handle)
//                                           optional: the same for one peer
//                                           only (default: do_expose).
//   void do_revoke(handle)                  undo an exposure; later remote
//                                           use should fail (bad_key) where
//                                           the provider checks keys.
//
// Operations and exposures that take time (verbs: a window bind or
// invalidate queued behind other work requests) are never waited for inside
// a do_* call. A backend answers in one of these ways instead:
//  - would_block from do_expose_to (e.g. the connection is still being set
//    up): the base retries it exactly like a post (below);
//  - ExposureInfo::pending = true from do_expose/do_expose_to: the key is
//    not usable yet; the backend later reports the outcome with
//    exposure_settled(handle, status) from inside do_poll (status != ok:
//    the backend has already released the exposure and its handle);
//  - revoke_deferred(handle) called from inside do_revoke: the key may still
//    work; the backend reports the end with exposure_settled(handle, ...)
//    from inside do_poll (or releases it when the endpoint closes). Until
//    then the base keeps the exposed slice's LDO reference parked, so the
//    bytes are never reused while the key may still grant access.
//
// Rules for backends:
//  - every do_* call is made with the endpoint's mutex held, so calls are
//    serialised (FI_THREAD_DOMAIN is fine); complete(), mark_peer_broken(),
//    peer_for_handle(), exposure_settled() and revoke_deferred() may only be
//    called from inside them;
//  - no do_* call may wait for the network or for a peer (no loops until a
//    completion arrives): return would_block or pending and let the base
//    wait. The base never waits, sleeps or backs off with the mutex held: a
//    post the backend refuses with would_block is retried after a poll, with
//    the mutex released between attempts (yield, then short sleeps) until
//    EndpointConfig::post_timeout, so progress(), other posts and stats()
//    from other threads go on meanwhile;
//  - complete() must be called exactly once per op the backend accepted;
//    it must never be called for an op the backend refused;
//  - nothing a backend does under the mutex drops the last reference to a
//    user's object: complete() keeps the slot's Slice until the base has
//    released the mutex, and the base destroys Slices, callbacks and parked
//    exposure references only after unlocking (in bounded batches), because
//    the last drop may run the pool's free or a user LDO's cleanup, which
//    may call into this endpoint;
//  - the derived destructor must call shutdown() first (stops the progress
//    thread and revokes exposures while the backend still exists), then
//    close its resources; slots still held and parked exposure references
//    are released by the base after that, without running callbacks.
// ---------------------------------------------------------------------------

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "regpool/domain.hpp"
#include "regpool/error.hpp"
#include "regpool/ldo.hpp"
#include "regpool/remote_ref.hpp"
#include "regpool/slice.hpp"

namespace regpool {

class Endpoint;

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
const char* to_string(OpKind k) noexcept;

struct Completion {
  Token token;
  OpKind op = OpKind::put;
  // ok, or the cause: bad_key, access_denied, peer_unreachable, timeout,
  // out_of_bounds (a received message larger than its buffer), canceled,
  // closed, transport_error. wait() also uses in_progress (its own bound
  // expired, the op goes on) and invalid_argument (unknown token).
  Status status = Status::ok;
  PeerId peer = kAnyPeer;    // target, or for recv the sender when known
  std::uint64_t bytes = 0;   // moved (recv: received)
  std::uint64_t value = 0;   // atomics: the remote word before the op
};

// A move-only callable with inline storage, so that storing a callback in an
// operation slot never allocates (std::function may). Captures up to
// kCapacity bytes; larger ones fail to compile.
class Callback {
 public:
  static constexpr std::size_t kCapacity = 48;

  Callback() noexcept = default;
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, Callback> &&
                                              std::is_invocable_v<F&, const Completion&>>>
  Callback(F&& f) noexcept {  // NOLINT: implicit by design, like std::function
    using Fn = std::decay_t<F>;
    static_assert(sizeof(Fn) <= kCapacity, "callback captures too much: capture a pointer instead");
    static_assert(alignof(Fn) <= alignof(std::max_align_t), "over-aligned callback");
    static_assert(std::is_nothrow_move_constructible_v<Fn>, "callback must be nothrow movable");
    new (storage_) Fn(std::forward<F>(f));
    ops_ = &kOps<Fn>;
  }
  Callback(Callback&& o) noexcept { move_from(o); }
  Callback& operator=(Callback&& o) noexcept {
    if (this != &o) {
      reset();
      move_from(o);
    }
    return *this;
  }
  Callback(const Callback&) = delete;
  Callback& operator=(const Callback&) = delete;
  ~Callback() { reset(); }

  explicit operator bool() const noexcept { return ops_ != nullptr; }
  void operator()(const Completion& c) { ops_->call(storage_, c); }
  void reset() noexcept {
    if (ops_) ops_->destroy(storage_);
    ops_ = nullptr;
  }

 private:
  struct Ops {
    void (*call)(void*, const Completion&);
    void (*move)(void* dst, void* src) noexcept;
    void (*destroy)(void*) noexcept;
  };
  template <class Fn>
  static constexpr Ops kOps{
      [](void* p, const Completion& c) { (*static_cast<Fn*>(p))(c); },
      [](void* d, void* s) noexcept {
        new (d) Fn(std::move(*static_cast<Fn*>(s)));
        static_cast<Fn*>(s)->~Fn();
      },
      [](void* p) noexcept { static_cast<Fn*>(p)->~Fn(); }};
  void move_from(Callback& o) noexcept {
    if (o.ops_) {
      o.ops_->move(storage_, o.storage_);
      ops_ = o.ops_;
      o.ops_ = nullptr;
    }
  }
  alignas(std::max_align_t) unsigned char storage_[kCapacity];
  const Ops* ops_ = nullptr;
};

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
  // bounded by post_timeout, come before and do not count).
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
  std::chrono::microseconds progress_idle_sleep{20};
  // Completions reaped per backend poll.
  std::size_t poll_batch = 32;
};

// What a backend returns when it exposes a slice.
struct ExposureInfo {
  std::uint64_t key = 0;
  std::uint64_t address = 0;  // of the slice's first byte, per mode
  AddressMode mode = AddressMode::virtual_address;
  std::uint64_t handle = 0;   // backend's own, passed back to do_revoke
  // The key is not usable yet (a bind is in flight): the backend reports the
  // outcome with exposure_settled(handle, status) from do_poll.
  bool pending = false;
};

namespace detail {
// Shared between an endpoint and its exposures so an Exposure that outlives
// its endpoint does not touch it (the endpoint nulls `ep` at shutdown and
// then waits until no revoke is using it). `mutex` guards `ep` and `users`
// only and is never held while calling into the endpoint, so a revoke may
// run user code (an LDO cleanup) that destroys another Exposure.
struct ExposureLink {
  std::mutex mutex;
  std::condition_variable idle;
  Endpoint* ep = nullptr;
  std::uint32_t users = 0;  // revokes calling into `ep` right now
};
}  // namespace detail

// A slice made reachable by peers. Holds the Slice (so the LDO stays alive
// while peers may write to it) and the RemoteRef to send them. Revoked on
// destruction or revoke(); afterwards peers' operations fail where the
// provider checks keys (tcp: bad key / access denied; shm checks nothing,
// see fabric_endpoint.hpp). Where revoking takes a network round (verbs
// windows: an invalidate queued behind earlier work requests), revoke()
// waits for it only briefly (about 20 ms, polling without holding the
// endpoint's mutex); if it is not confirmed by then, the endpoint keeps the
// slice's LDO reference until its progress confirms the key is dead, so the
// bytes are never reused while the key may still work. Move-only.
// Thread-safety: revoke()/destruction may race with endpoint calls from other
// threads; one Exposure object must not be used from two threads at once.
class Exposure {
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
};

// Thread-safety: every public member may be called from any thread; calls
// are serialised by an internal mutex (backends need not be thread-safe).
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
class Endpoint {
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
  void remove_peer(PeerId peer) noexcept;
  std::size_t peer_count() const noexcept;

  // Expose a slice to peers with the given rights. Data path: no throw.
  Result<Exposure> expose(const Slice& slice, RemoteAccess access) noexcept;
  // Expose a slice to one peer only, where the backend can scope a key to a
  // connection (verbs: a type-2 memory window bound on that peer's queue
  // pair, so the key grants exactly this slice to exactly this peer).
  // Backends without per-peer keys give the same key expose(slice, access)
  // would. invalid_argument for an unknown peer, peer_unreachable for a
  // broken one.
  Result<Exposure> expose(const Slice& slice, RemoteAccess access, PeerId peer) noexcept;

  // --- operations (never throw; a failed check posts nothing) ---
  // Completion goes to `cb` when given (then the token is only informative:
  // wait() on it answers invalid_argument), else it is kept for wait(token).
  // An op posted without a callback keeps its slot until wait() returns it.
  Result<Token> put(const Slice& local, PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset,
                    Callback cb = {}) noexcept;
  Result<Token> get(PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset, const Slice& local,
                    Callback cb = {}) noexcept;
  Result<Token> send(PeerId peer, const Slice& local, Callback cb = {}) noexcept;
  // Receive one message from any peer into `local` (messages from one peer
  // are matched to posted receives in posting order).
  Result<Token> post_recv(const Slice& local, Callback cb = {}) noexcept;
  // 64-bit atomics on an 8-byte aligned word at remote_offset of a
  // read-write export; Completion::value is the word before the op.
  Result<Token> fetch_add(PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset, std::uint64_t addend,
                          Callback cb = {}) noexcept;
  Result<Token> compare_swap(PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset,
                             std::uint64_t expected, std::uint64_t desired, Callback cb = {}) noexcept;

  // --- completion ---
  // Poll the backend, time out overdue ops, run ready callbacks. Returns the
  // number of user completions delivered.
  std::size_t progress() noexcept;
  // Block (progressing, or sleeping when the progress thread runs) until the
  // op completes or `timeout` passes (then status in_progress; the op goes
  // on and may be waited for again).
  Completion wait(Token token, std::chrono::milliseconds timeout) noexcept;
  // Progress until no user-visible operation is in flight other than posted
  // receives (ok) or `timeout` passes (Status::timeout).
  Status quiesce(std::chrono::milliseconds timeout) noexcept;
  // Progress for `duration` (serving a target role on manual-progress
  // providers).
  void progress_for(std::chrono::milliseconds duration) noexcept;

  // --- health ---
  bool usable() const noexcept { return usable_.load(std::memory_order_acquire); }
  bool usable(PeerId peer) const noexcept;
  // Re-establish a broken peer (after peer_unreachable). Fails ops still in
  // flight to it with peer_unreachable. Returns ok or the cause.
  Status reconnect(PeerId peer) noexcept;

  // --- properties ---
  Backend backend() const noexcept { return backend_kind(); }
  bool native_atomics() const noexcept { return do_native_atomics(); }
  bool target_progress_required() const noexcept { return needs_target_progress(); }
  const EndpointConfig& config() const noexcept { return config_; }
  EndpointStats stats() const noexcept;

 protected:
  // One operation as handed to a backend. Pointers stay valid until the
  // backend reports the op with complete().
  struct OpDesc {
    std::uint32_t index = 0;        // report back to complete()
    OpKind kind = OpKind::put;
    PeerId peer = kAnyPeer;
    std::uint64_t peer_handle = 0;  // from do_insert_peer (recv: unused)
    const Slice* local = nullptr;   // put/get/send/recv; nullptr for atomics
    std::uint64_t length = 0;       // bytes (atomics: 8)
    const RemoteRef* remote = nullptr;  // put/get/atomics
    std::uint64_t remote_address = 0;   // remote->address_at(remote_offset)
    std::uint64_t operand = 0;      // fetch_add addend; compare_swap desired
    std::uint64_t compare = 0;      // compare_swap expected
    void* context = nullptr;        // kBackendContextSize bytes, 16-aligned
  };

  explicit Endpoint(const EndpointConfig& config);

  // Start the progress thread if configured: call at the end of the derived
  // constructor, once do_poll can run.
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
  void complete(std::uint32_t index, Status status, std::uint64_t bytes, std::uint64_t value = 0,
                PeerId peer = kAnyPeer) noexcept;
  void mark_peer_broken(PeerId peer) noexcept;
  // The peer is gone (e.g. its process died): every operation in flight to
  // it completes with `st` now, and the peer is marked broken. As after a
  // timeout, the backend keeps the slots until it reports them itself.
  void fail_peer_ops(PeerId peer, Status st) noexcept;
  void mark_unusable() noexcept { usable_.store(false, std::memory_order_release); }
  // PeerId whose handle is `handle`, or kAnyPeer.
  PeerId peer_for_handle(std::uint64_t handle) const noexcept;
  // The op in slot `index` (valid while the backend owns it).
  const OpDesc& op_at(std::uint32_t index) const noexcept;
  // Slot index of an OpDesc::context pointer handed back by a provider, or
  // kNoIndex when it is not one (providers may overwrite the context bytes
  // themselves, FI_CONTEXT2, so the index cannot be stored inside them).
  static constexpr std::uint32_t kNoIndex = ~std::uint32_t{0};
  std::uint32_t index_of_context(const void* context) const noexcept;

  // --- the backend interface (see the comment at the top) ---
  virtual Backend backend_kind() const noexcept = 0;
  virtual Domain& domain() const noexcept = 0;
  virtual std::uint64_t max_message_size() const noexcept = 0;
  virtual bool needs_target_progress() const noexcept = 0;
  virtual bool do_native_atomics() const noexcept = 0;
  virtual std::vector<std::byte> do_name() const = 0;
  virtual std::uint64_t do_insert_peer(std::span<const std::byte> name) = 0;
  virtual void do_remove_peer(std::uint64_t handle) noexcept = 0;
  virtual std::chrono::milliseconds reconnect_settle() const noexcept { return std::chrono::milliseconds{0}; }
  virtual Result<std::uint64_t> do_reconnect(PeerId peer, std::uint64_t handle,
                                             std::span<const std::byte> name) noexcept;
  virtual Status do_put(const OpDesc& op) noexcept = 0;
  virtual Status do_get(const OpDesc& op) noexcept = 0;
  virtual Status do_send(const OpDesc& op) noexcept = 0;
  virtual Status do_recv(const OpDesc& op) noexcept = 0;
  virtual Status do_atomic(const OpDesc& op) noexcept = 0;
  virtual std::size_t do_poll(std::size_t max) noexcept = 0;
  virtual void do_cancel(const OpDesc& op) noexcept = 0;
  virtual Result<ExposureInfo> do_expose(const Slice& slice, RemoteAccess access) noexcept = 0;
  // Per-peer exposure (see expose(slice, access, peer)); the default ignores
  // the peer.
  virtual Result<ExposureInfo> do_expose_to(const Slice& slice, RemoteAccess access, PeerId /*peer*/,
                                            std::uint64_t /*peer_handle*/) noexcept {
    return do_expose(slice, access);
  }
  virtual void do_revoke(std::uint64_t handle) noexcept = 0;

 private:
  friend class Exposure;
  using Clock = std::chrono::steady_clock;
  class Lock;

  struct Slot {
    OpDesc desc;
    Slice local;
    RemoteRef remote;
    Callback cb;
    Completion result;
    Clock::time_point deadline{};
    std::uint32_t gen = 0;
    bool backend_owned = false;  // the backend holds desc.context
    bool user_pending = false;   // completion not yet delivered/retrieved
    bool completed = false;      // result is final
    bool has_callback = false;
    bool release_pending = false;  // `local` waits in releases_ for an unlock
    alignas(16) std::byte context[kBackendContextSize];
  };
  struct Peer {
    bool used = false;
    bool broken = false;
    // Removed by reconnect() and waiting out reconnect_settle() before it is
    // inserted again: `handle` is stale meanwhile.
    bool settling = false;
    Clock::time_point settle_until{};
    std::uint64_t handle = 0;
    std::vector<std::byte> name;
  };

  Result<Token> submit(OpKind kind, PeerId peer, const Slice* local, const RemoteRef* remote,
                       std::uint64_t remote_offset, std::uint64_t length, std::uint64_t operand,
                       std::uint64_t compare, Callback&& cb) noexcept;
  Status post_once(Slot& s) noexcept;
  Clock::time_point deadline_for(OpKind kind, std::uint64_t length, Clock::time_point now) const noexcept;
  // Unlock, then destroy what was released under the mutex (bounded
  // batches, re-locking between them).
  void unlock_and_release(std::unique_lock<std::mutex>& lk) noexcept;
  std::size_t poll_locked() noexcept;
  void expire_locked(Clock::time_point now) noexcept;
  void maybe_free_locked(std::uint32_t index) noexcept;
  void finish_locked(Slot& s, std::uint32_t index, Status st, std::uint64_t bytes, std::uint64_t value,
                     PeerId peer) noexcept;
  void revoke_exposure(std::uint64_t exposure_id, Slice& slice) noexcept;
  void progress_thread_main() noexcept;
  Status reject(Status st) noexcept;
  // ok when `peer` (used, not broken) may be posted to; would_block while it
  // waits out reconnect_settle(); re-inserts it once that has passed.
  Status peer_ready_locked(PeerId peer) noexcept;
  Result<Exposure> expose_impl(const Slice& slice, RemoteAccess access, PeerId peer) noexcept;

  EndpointConfig config_;
  mutable std::mutex mutex_;
  std::unique_ptr<Slot[]> slots_;
  std::vector<std::uint32_t> free_;      // stack of free slot indices, reserved
  std::vector<std::uint32_t> ready_;     // callback ops ready to deliver (ring)
  std::size_t ready_head_ = 0;
  std::size_t ready_count_ = 0;
  std::vector<Peer> peers_;
  std::vector<std::uint32_t> releases_;  // slots whose Slice awaits release (ring)
  std::size_t release_head_ = 0;
  std::size_t release_count_ = 0;
  enum class ExposureState : std::uint8_t { binding, live, failed, revoking, revoked };
  struct ExposureEntry {
    std::uint64_t handle = 0;  // backend's
    ExposureState state = ExposureState::live;
    Status status = Status::ok;  // of a settled bind
    Slice parked;                // held while binding or revoking
  };
  std::unordered_map<std::uint64_t, ExposureEntry> exposures_;  // by exposure id
  std::size_t settled_revokes_ = 0;   // entries in state revoked
  bool revoke_deferred_ = false;      // set by revoke_deferred() during do_revoke
  std::shared_ptr<detail::ExposureLink> link_;
  std::uint64_t next_exposure_id_ = 1;
  std::uint64_t exposure_nonce_ = 0;
  Clock::time_point next_expiry_scan_{};
  std::size_t backend_owned_ = 0;
  std::size_t last_poll_events_ = 0;

  std::atomic<bool> usable_{true};
  std::atomic<bool> stopping_{false};
  std::thread progress_thread_;
  std::condition_variable done_cv_;    // progress thread mode: wait() sleeps here
  std::atomic<std::uint32_t> waiters_{0};

  std::atomic<std::uint64_t> posted_{0};
  std::atomic<std::uint64_t> completed_{0};
  std::atomic<std::uint64_t> failed_{0};
  std::atomic<std::uint64_t> rejected_{0};
  std::atomic<std::uint64_t> timeouts_{0};
  std::atomic<std::uint64_t> retries_{0};
  std::atomic<std::uint64_t> reconnects_{0};
};

}  // namespace regpool
