#pragma once
// The backend contract of Endpoint: what a class deriving from Endpoint (a
// transport backend, such as FabricEndpoint or VerbsEndpoint) implements,
// and the rules it follows. Users of an endpoint never need this header;
// regpool/endpoint.hpp is the user API.
//
// What the base class does for every backend, so backends cannot get it
// wrong and every backend gives the same statuses:
//  - every check before the wire that endpoint.hpp lists (local slice
//    inside its object, remote reference well formed, remote range inside
//    it, reference from this backend, rights, atomic alignment, message
//    size, peer known and not broken): a violation never reaches a do_* call;
//  - the preallocated in-flight table (EndpointConfig::max_in_flight slots),
//    each slot holding its Slice (so its LDO) from post until the backend
//    gives the operation back with complete(); posting never allocates;
//  - tokens, wait(), progress() running callbacks, quiesce(), the optional
//    progress thread, per-operation timeouts, retrying posts the backend
//    refuses with would_block (after progressing, without holding the mutex
//    while backing off), per-peer broken state, usable() and reconnect();
//  - the one exposure table: ids, states, stats; standard exposures (the
//    object's own registration) and scoped ones (a registration of exactly
//    the slice, kept open for reuse with ExposureSupport::reuse_scoped) for
//    any peer, and for one peer where the backend has no per-peer keys;
//    quarantine of revoked bytes where the target cannot revoke;
//  - atomics' operand, compare and result words, one registered array for
//    every slot (atomic_words(), atomic_registration()), and, for backends
//    that emulate atomics for peers, applying a request to a live exposure
//    after checking key, range, rights and alignment (apply_remote_atomic).
//
// ---------------------------------------------------------------------------
// Backend interface (the protected virtuals of Endpoint). A backend
// implements:
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
//   TransferTraits do_transfer_traits() const
//                                           how the backend moves bytes
//                                           (endpoint.hpp, TransferTraits):
//                                           whether the initiator copies
//                                           inside a get/put post, and the
//                                           measured copy-versus-rendezvous
//                                           crossover of its transport. The
//                                           Messenger reads it; it never
//                                           asks which provider runs below.
//   std::vector<std::byte> do_name() const  address blob peers insert (setup:
//                                           may throw Error).
//   std::uint64_t do_insert_peer(bytes)     make a peer addressable; returns
//                                           the backend's handle for it, a
//                                           small index (peers_ slot, QP
//                                           index...; the base maps handles
//                                           to peers through a table indexed
//                                           by them, below 2^24); setup:
//                                           throws Error on failure.
//   void do_remove_peer(handle)             forget a peer (noexcept).
//   std::uint64_t do_peer_message_limit(handle)
//                                           optional: the largest message
//                                           the peer accepts, from its name
//                                           (default: no limit). The base
//                                           refuses longer sends with
//                                           Status::message_too_large.
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
//   Status do_post(const BackendOp& op)     post one operation of kind
//                                           op.kind (put, get, send, recv,
//                                           fetch_add, compare_swap). Return
//                                           - ok: posted; the backend owns
//                                             op.context (kBackendContextSize
//                                             bytes, 16-byte aligned, stable)
//                                             until it reports the op with
//                                             complete(op.index, ...);
//                                             An op complete when the post
//                                             returns (its bytes copied,
//                                             nothing left to report) may
//                                             call complete_at_post()
//                                             instead: the base completes
//                                             it, ok with all its bytes
//                                             (not from do_post_batch, and
//                                             a backend that calls it
//                                             overrides do_post_batch: the
//                                             default one calls do_post);
//                                           - would_block: nothing posted;
//                                             the base calls do_poll and
//                                             retries until post_timeout;
//                                           - anything else: nothing posted,
//                                             returned to the caller as is.
//                                           The base has already done every
//                                           check listed at the top; the
//                                           backend only maps to its own
//                                           calls.
//   Status do_post_batch(ops, posted)       optional: post the ops (put,
//                                           get, send; checked and given
//                                           slots like do_post's) in order,
//                                           handing them to the provider
//                                           together (verbs: chained work
//                                           requests, one ibv_post_send per
//                                           run on one QP; libfabric:
//                                           FI_MORE). Sets `posted` to how
//                                           many leading ops it accepted
//                                           (each then owned as after do_post
//                                           returned ok) and returns ok when
//                                           all were, else the status of
//                                           ops[posted] as do_post would
//                                           (would_block: the base polls and
//                                           retries from there). Never
//                                           accepts an op after refusing
//                                           one. The default calls do_post
//                                           for each in turn.
//   std::size_t do_poll(std::size_t max)    reap up to `max` completions and
//                                           report each with complete()
//                                           (an atomic's old value in its
//                                           result word);
//                                           also serve internal traffic
//                                           (connection setup, emulated
//                                           atomics). Returns how many events
//                                           it handled (0 = idle).
//   (index_of_context() maps a provider's context pointer back to an index.)
//   int do_wait_fd() const                  optional: a file descriptor that
//                                           becomes readable when do_poll
//                                           may find work (default -1: none;
//                                           the base then naps).
//   bool do_arm(microseconds& max_sleep)    optional: called after a poll
//                                           found nothing, before the base
//                                           sleeps on do_wait_fd(): make the
//                                           fd report anything that arrives
//                                           from now on (fi_trywait,
//                                           ibv_req_notify_cq) and return
//                                           true, or return false when work
//                                           is already pending (the base
//                                           polls again). May lower
//                                           max_sleep when something needs
//                                           progress by time, not by event.
//                                           Never blocks.
//   WaitBell do_wait_bell() const           optional: a doorbell, for a
//                                           backend whose provider has no
//                                           wait object but whose peers can
//                                           ring it (shm: a futex word in a
//                                           file peers map). When seq is
//                                           non-null the base sleeps on it
//                                           instead of naps and do_wait_fd():
//                                           sleepers++ (seq_cst), read seq,
//                                           poll once more, then futex-wait
//                                           on that value (bounded like every
//                                           sleep), sleepers--. A peer that
//                                           gives the endpoint work (its
//                                           post, then a seq_cst fence) and
//                                           finds sleepers non-zero bumps
//                                           seq and wakes the futex, so a
//                                           message posted before the
//                                           increment is seen by the last
//                                           poll and one posted after it
//                                           ends the sleep. The base's own
//                                           wake-ups (another thread's post
//                                           or completion, shutdown) bump
//                                           and wake it too. The words may
//                                           be in memory peers can write:
//                                           any value there can only cause
//                                           a spurious or a missed wake-up.
//                                           Fixed once the endpoint is
//                                           constructed.
//   bool do_messages_in_place() const       optional (default false): the
//                                           backend can copy a message into
//                                           its transport within a call and
//                                           show incoming ones where they
//                                           lie (shm with message rings).
//                                           Then a Messenger on the endpoint
//                                           uses the two calls below
//                                           (docs/architecture.md, "Messages
//                                           in place").
//   bool do_gathered_sends() const          optional (default false): the
//                                           backend sends an op whose `body`
//                                           is set as one message of both
//                                           pieces, each from where it lies
//                                           (an iovec of two, two scatter-
//                                           gather entries). Then a
//                                           Messenger sends its longer eager
//                                           messages as its header and the
//                                           caller's bytes, uncopied
//                                           (docs/messaging.md, "Gathered
//                                           eager"). Fixed once the
//                                           endpoint is constructed.
//   Status do_send_copy(handle, head, body, the message head + body to the
//                       may_read)           peer, copied now: ok (no
//                                           completion follows), would_block
//                                           (it cannot now; the caller posts
//                                           the message instead), or why the
//                                           peer cannot be sent to. With
//                                           may_read (the caller can send it
//                                           by rendezvous instead), also
//                                           in_progress: not copied, as the
//                                           pair measured the receiver's read
//                                           from the sender's memory cheaper
//                                           (TransferTraits::
//                                           read_choice_from; the answer is
//                                           counted for the backend's probes
//                                           of the other path). The base
//                                           has checked the peer and that no
//                                           send to it waits to be posted.
//   offer_in_place(peer, bytes)             (the base's, from do_poll) an
//                                           incoming message where it lies,
//                                           before a posted receive takes it:
//                                           true when the receive side's
//                                           sink took it (consume it), false
//                                           to deliver it as usual. Only
//                                           worth calling while
//                                           has_message_sink().
//   void do_cancel(const BackendOp&)           best effort abort of a timed-out
//                                           op. The user already got
//                                           Status::timeout; the slot (and
//                                           its LDO reference) stays owned by
//                                           the backend until it calls
//                                           complete() for it (any status is
//                                           then ignored), do_abandon agrees
//                                           to give it up, or the endpoint
//                                           closes.
//   bool do_abandon(const BackendOp&)      optional (default false): the op
//                                           has already completed for the
//                                           user (timeout, or its peer failed
//                                           or was removed) and the backend
//                                           still holds it. Return true only
//                                           when the provider provably never
//                                           reads or writes op's buffers
//                                           again (local slice, atomic words)
//                                           and any completion it may still
//                                           report carries op.tag (so
//                                           index_of_tag() drops it): the
//                                           base then takes the slot and its
//                                           LDO reference back as if
//                                           complete() had been called, and
//                                           the backend must never call
//                                           complete() for this incarnation.
//                                           Asked when the op fails, after a
//                                           peer is removed or reconnected,
//                                           and every kAbandonScanInterval
//                                           while such ops exist; the answer
//                                           may not depend on op.peer_handle
//                                           still naming the same peer (it may
//                                           have been reused).
//   Result<ExposureInfo> do_expose(slice, access, mode, peer_handle)
//                                           only with ExposureSupport::
//                                           per_peer (given to the Endpoint
//                                           constructor): a key scoped to one
//                                           peer (verbs: a type-2 window on
//                                           its QP). Every other exposure is
//                                           made by the base and never
//                                           reaches the backend.
//   void do_revoke(handle)                  undo what do_expose made; later
//                                           remote use fails where the
//                                           target enforces revocation.
//   Enforcement do_enforcement(mode, per_peer)
//                                           what the target enforces (keys,
//                                           bounds, rights, revocation):
//                                           measured facts, never more. The
//                                           base quarantines revoked bytes
//                                           where revocation is false.
//
// Operations and exposures that take time (verbs: a window bind or
// invalidate queued behind other work requests) are never waited for inside
// a do_* call. A backend answers in one of these ways instead:
//  - would_block from do_expose (e.g. the connection is still being set
//    up): the base retries it exactly like a post (below);
//  - ExposureInfo::pending = true from do_expose: the key is
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

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "regpool/endpoint.hpp"

namespace regpool {

// One operation as handed to a backend. Pointers stay valid until the
// backend reports the op with complete().
struct BackendOp {
  std::uint32_t index = 0;        // report back to complete()
  OpKind kind = OpKind::put;
  PeerId peer = kAnyPeer;
  std::uint64_t peer_handle = 0;  // from do_insert_peer (recv: unused)
  const Slice* local = nullptr;   // put/get/send/recv; nullptr for atomics
  std::uint64_t length = 0;       // bytes (atomics: 8)
  const RemoteRef* remote = nullptr;  // put/get/atomics
  std::uint64_t remote_address = 0;   // remote->address_at(remote_offset)
  // Atomics: operand, compare and the result word are in atomic_words(index).
  void* context = nullptr;        // Endpoint::kBackendContextSize bytes, 16-aligned
  // This incarnation of the slot: (generation << 32) | index, never 0. A
  // provider that takes an opaque context (no FI_CONTEXT/FI_CONTEXT2 mode,
  // a verbs wr_id) can be handed the tag instead of `context`;
  // index_of_tag() then recognises a completion that arrives after the base
  // took the slot back (do_abandon) and it was reused.
  std::uint64_t tag = 0;
  // A gathered send's second piece (do_gathered_sends): one message of
  // local's bytes, then body's, `length` covering both. Null for every
  // other op.
  const Slice* body = nullptr;
};

// A doorbell a backend offers (do_wait_bell): two 32-bit words, both
// possibly shared with other processes. Null when there is none.
struct WaitBell {
  std::atomic<std::uint32_t>* seq = nullptr;       // futex word, bumped by every ring
  std::atomic<std::uint32_t>* sleepers = nullptr;  // threads about to sleep or asleep on seq
};

// What a backend returns when it exposes a slice to one peer (do_expose).
struct ExposureInfo {
  std::uint64_t key = 0;
  std::uint64_t address = 0;  // of the slice's first byte, per mode
  AddressMode mode = AddressMode::virtual_address;
  std::uint64_t handle = 0;   // backend's own, passed back to do_revoke
  // The key is not usable yet (a bind is in flight): the backend reports the
  // outcome with exposure_settled(handle, status) from do_poll.
  bool pending = false;
};

}  // namespace regpool
