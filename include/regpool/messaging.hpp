#pragma once
// Messaging for data services (docs/messaging.md): tagged send/receive with
// MPI-style matching, unexpected messages held in pool LDOs under a byte
// budget with per-peer credits, eager below a threshold and rendezvous
// (notice + remote get of an exposure) above, and request/response on top.
//
// Written once above the backend interface: a Messenger uses only an
// Endpoint's public send/post_recv/get/expose, so it works the same on
// libfabric shm, tcp;ofi_rxm and verbs.
//
// Ownership: a Messenger owns its endpoint's receive side. It posts
// MessengerConfig::receive_buffers receives at construction and consumes
// every message that arrives; do not call Endpoint::post_recv on that
// endpoint yourself. A second Messenger on the same endpoint is refused
// (Error, invalid_argument) until the first is destroyed. Besides its
// receives, a Messenger keeps one kept send (Endpoint::send_kept) for each
// of up to 8 peers it sends small eager messages to: each holds one of the
// endpoint's max_in_flight slots while its peer is known (fail_peer() ends
// it; after the Messenger is destroyed, it ends with the endpoint). The Endpoint and
// the Pool must outlive the Messenger; destroy the Messenger, then the
// endpoint, then the pool. The two sides of a conversation may be
// configured differently: each announces its eager threshold and its
// credits on every message, and a sender never exceeds what its receiver
// announced (before hearing from it: eager up to 64 bytes, one credit).
//
// Thread-safety: every public member may be called from any thread (unless
// MessengerConfig::serialized, where calls must not overlap); an
// internal mutex serialises them, and it is never held while posting to
// the endpoint, while waiting, or while running callbacks. Callbacks run on
// the thread calling progress()/wait() (never under a lock), so they may
// call into the Messenger. Protocol work (matching, rendezvous gets, fin,
// credits) happens in the endpoint's completion callbacks: on whichever
// thread progresses the endpoint (its progress thread, if configured).
//
// Data path: every operation returns Status/Result and never throws; only
// the constructor throws (setup).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "regpool/endpoint.hpp"
#include "regpool/error.hpp"
#include "regpool/ldo.hpp"
#include "regpool/pool.hpp"
#include "regpool/slice.hpp"

namespace regpool {

namespace detail {
struct MessengerCore;  // the library's (lib/messaging/messenger.cpp)
}  // namespace detail

// Names one messaging operation (slot index low 32 bits, generation high).
struct MessageToken {
  std::uint64_t value = 0;
  explicit operator bool() const noexcept { return value != 0; }
  friend bool operator==(MessageToken a, MessageToken b) noexcept { return a.value == b.value; }
};

enum class MessageOp : std::uint8_t { send, recv, request };
REGPOOL_API const char* to_string(MessageOp op) noexcept;

struct MessageCompletion {
  MessageToken token;
  MessageOp op = MessageOp::send;
  // ok; truncated (recv: the message was longer than the buffer, which
  // holds its first `received` bytes and nothing was written past it);
  // canceled; timeout; peer_unreachable (the peer died or was failed);
  // pool_exhausted; malformed; closed; in_progress (wait's own bound).
  Status status = Status::ok;
  PeerId peer = kAnyPeer;          // recv: the sender; send/request: the target
  std::uint64_t tag = 0;           // recv: the message's tag
  std::uint64_t length = 0;        // the message's full length
  std::uint64_t received = 0;      // recv: bytes placed in the buffer
  // recv: non-zero when the message is a request (Messenger::request);
  // answer it with Messenger::reply(peer, request_id, ...).
  std::uint64_t request_id = 0;
  // recv_ldo and request: the object holding the message (its data()
  // section is exactly the message; its meta section holds protocol bytes).
  Ldo ldo;
};

// Where a pending message comes from and how large it is (probe()).
struct MessageInfo {
  PeerId peer = kAnyPeer;
  std::uint64_t tag = 0;
  std::uint64_t length = 0;
  std::uint64_t request_id = 0;
};

// What a message operation calls when it completes (inline storage, like
// Callback). Receives the completion by reference and may move its Ldo out.
using MessageCallback = InlineCallback<MessageCompletion&>;

struct MessengerConfig {
  // Largest message sent eagerly (copied into a bounce LDO and sent in one
  // message); larger ones go by rendezvous. 0 = the provider's default,
  // measured (docs/messaging.md): shm 64 KiB, tcp (libfabric net) 128 KiB,
  // tcp;ofi_rxm 32 KiB; verbs 16 KiB (not measured).
  // Clamped to 64 .. the endpoint's message size limit minus the 64-byte
  // header. This is also the largest eager payload this Messenger accepts,
  // announced to its peers: a peer sends larger messages to it by
  // rendezvous whatever its own threshold.
  std::uint64_t eager_threshold = 0;
  // Receives kept posted, each a bounce LDO of 64 + eager_threshold bytes
  // from the pool, shared by every peer: receive memory does not grow with
  // the number of peers (docs/scale.md). Size it by traffic (messages that
  // arrive between two reposts); a message that finds none posted waits in
  // the provider (libfabric) or in RNR retries (verbs, retried without
  // limit), so too few costs speed, not messages. peers x peer_credits x 2
  // (messages plus control messages) avoids every such wait. Up to an
  // eighth of them may wait for their repost until a progress round finds
  // nothing to do (docs/messaging.md, "lazily").
  std::size_t receive_buffers = 64;
  // Eager messages and rendezvous notices each peer may have outstanding
  // here before credits come back (1 .. 65535): this side's grant,
  // announced to its peers, which use it instead of their own.
  std::uint32_t peer_credits = 32;
  // Bytes of unexpected messages (arrived, not yet received) the receiver
  // holds while still giving credits back at once. Past it, credits come
  // back only as the application receives, so each sender can add at most
  // peer_credits more messages: senders are flow-controlled, never dropped.
  std::uint64_t unexpected_budget = std::uint64_t{8} << 20;
  // Operations (sends, receives, requests) in flight at once; beyond it
  // calls answer would_block. Preallocated.
  std::size_t max_operations = 1024;
  // Unexpected messages held at once (entries; preallocated). Credits come
  // back at once only while the table keeps room for peer_credits more
  // from every peer heard from; at least peers x peer_credits, or a
  // receiver that does not read can run out of entries and drop messages.
  std::size_t max_unexpected = 4096;
  // PeerIds this Messenger serves (0 .. max_peers-1; preallocated).
  std::size_t max_peers = 1024;
  // Rendezvous: bytes per get (0 = the endpoint's message size limit, at
  // most 16 MiB) and gets in flight per message.
  std::uint64_t rendezvous_chunk = 0;
  std::uint32_t rendezvous_depth = 4;
  // Rendezvous gets in flight at once across all messages this Messenger
  // receives; messages matched beyond it wait their turn, in match order.
  // 0 = the backend's default: 1 where a get is a copy its initiator makes
  // inside the post (TransferTraits::initiator_copies: libfabric shm), so a
  // second one issued before the first's completion is seen only holds back
  // the first's fin (and with it the sender's window); no limit elsewhere
  // (gets proceed in parallel).
  std::uint32_t rendezvous_gets = 0;
  // Split rendezvous: a receive of at least this many bytes fetches the
  // first half with gets and grants the second half to the sender, which
  // puts it (a write-only exposure of that range of the receive buffer;
  // one more message each way). 0 = the backend's default: 512 KiB where a
  // transfer is a copy its initiator makes (TransferTraits::
  // initiator_copies: libfabric shm), so both processes' CPUs copy at once
  // instead of the receiver's alone; never elsewhere (the NIC or the
  // provider's progress moves the bytes either way). UINT64_MAX = never.
  // Decided by the receiver; any sender serves a grant.
  std::uint64_t rendezvous_split = 0;
  // Split eager: where the backend sends messages up to some size by a
  // faster path than longer ones (TransferTraits::fast_message_limit), an
  // eager payload of at most this many bytes that the 64-byte header
  // pushes past that size leaves as several messages within it (a lead
  // and parts, one credit each, sent only when the peer's credits cover
  // them all; docs/messaging.md, "Split eager"). libfabric shm without
  // regpool's rings: 4096 bytes, past which every message goes by CMA, a
  // system call at the receiver; with the rings (the default):
  // FabricEndpointOptions::shm_ring_copy_max. The receiver reassembles
  // them whatever its own setting. 0 = the backend's measured default
  // (TransferTraits::split_crossover: shm without rings 16 KiB, with them
  // never); never more than 8 messages or the eager threshold; no effect
  // where the backend has no such limit. UINT64_MAX = never.
  std::uint64_t eager_split = 0;
  // Gathered eager: where the backend can send one message of two pieces
  // each from where it lies (libfabric tcp, and shm without regpool's
  // rings; verbs), an eager payload of at least this many bytes leaves as
  // the 64-byte header and the caller's own bytes, gathered by the
  // provider or the NIC: no copy at the sender (UCX's eager zcopy). Such a
  // send holds `data` until the provider is done with it, as a rendezvous
  // send does; payloads of up to 192 bytes always go through the peer's
  // kept send. The receiver sees an ordinary eager message. 0 = the
  // default, 4 KiB (docs/messaging.md, "Gathered eager"); UINT64_MAX =
  // never (every eager payload copied into a message).
  std::uint64_t eager_gather = 0;
  // The longest eager payload sent gathered (see eager_gather); longer ones
  // are copied into a message. 0 = the default, what the backend measured
  // (Endpoint::transfer_traits().gather_limit less the 64-byte header:
  // 65344 bytes on libfabric tcp, where a gathered 64 KiB message was
  // measured 20-30% slower than a copied one, and no limit elsewhere;
  // docs/messaging.md, "Gathered eager"); UINT64_MAX = no limit.
  std::uint64_t eager_gather_max = 0;
  // Copied eager (messages in place): where the endpoint copies a message
  // straight into the transport (libfabric shm with regpool's rings), an
  // eager payload of at most this many bytes is copied by send() from the
  // caller's buffer into the peer's ring, and the send is complete when
  // send() returns; a longer one is built in a message object and posted.
  // Never more than the endpoint takes that way
  // (FabricEndpointOptions::shm_ring_copy_max less the 64-byte header).
  // 0 = the default, all the endpoint takes (docs/messaging.md, "Messages
  // in place"); UINT64_MAX = never.
  std::uint64_t eager_copy = 0;
  // Eager or rendezvous by measured cost: where the endpoint measures, per
  // pair, whether copying a message through the transport or the
  // receiver's read from the sender's memory costs less
  // (TransferTraits::read_choice_from: libfabric shm with regpool's rings,
  // above 16 KiB), an eager payload longer than this many bytes (never
  // below read_choice_from) that send() would copy into the peer's ring
  // (eager_copy; the ring holding no stream, as in a ping-pong or a
  // request and its reply) is sent by rendezvous instead while the pair's
  // figures say the read costs at most 3/4 of the two copies; now and then
  // messages go the other way to keep both figures current
  // (docs/messaging.md, "Eager or rendezvous, measured"). The receiver
  // needs nothing set: a rendezvous notice is served at any length.
  // 0 = the default, read_choice_from (every such payload over 16 KiB on
  // shm; never elsewhere). Measured: on an Intel Xeon host with the
  // processes far apart a 64 KiB ping-pong 4.7-6.9 us against 10.3-11.8
  // copied; near, and on an AMD EPYC host in both placements, the choice
  // stays on the copies and costs 1-4 %. UINT64_MAX = never.
  std::uint64_t rendezvous_choice = 0;
  // A rendezvous sender waiting for the receiver's fin, a receive whose
  // gets stall, and a peer noticed dead: fail after this (scaled like
  // EndpointConfig::op_timeout by length / min_bandwidth). 0 = never.
  std::chrono::milliseconds rendezvous_timeout{30000};
  // The application's promise that calls never overlap: no two threads use
  // this Messenger or its endpoint at the same time (one thread, or threads
  // taking turns under the application's own synchronisation, as with
  // MPI_THREAD_SERIALIZED or UCX's UCS_THREAD_MODE_SERIALIZED). The endpoint
  // counts because its progress (progress(), wait(), any thread's) runs
  // the Messenger's protocol work. The Messenger then takes no lock of its
  // own: about 10 ns less per message on shm (docs/messaging.md).
  // Refused with an endpoint that runs a progress thread. Breaking the
  // promise corrupts the Messenger's state.
  bool serialized = false;
};

struct MessengerStats {
  std::uint64_t eager_sent = 0;
  std::uint64_t eager_split = 0;        // of which sent as several messages (split eager)
  std::uint64_t eager_kept = 0;         // of which sent through the peer's kept send (small, from send())
  // Of those, the kept send's completions taken as the endpoint delivered
  // them (no callback, no lock round of its own: docs/messaging.md).
  std::uint64_t kept_sends_taken = 0;
  std::uint64_t eager_gathered = 0;     // of which sent gathered: header and the caller's bytes, uncopied
  // Messages in place (docs/messaging.md): eager sends the endpoint copied
  // straight into the transport (shm with message rings; no send
  // operation), and messages matched and copied where they arrived (in a
  // shm ring: no bounce receive; elsewhere in a bounce, as its receive
  // completed: no callback, no repost call).
  std::uint64_t eager_copied = 0;
  std::uint64_t received_in_place = 0;
  // Of those, messages whose completion went straight to the wait() that
  // was spinning for them (no lock round of the waiter's own to find it).
  std::uint64_t handed_off = 0;
  // Eager sends copied with the brief header (payloads of up to 16 bytes
  // once the peer knows our limits: one cache line with the ring's record
  // header, docs/messaging.md).
  std::uint64_t eager_brief = 0;
  std::uint64_t rendezvous_sent = 0;
  std::uint64_t rendezvous_chosen = 0;  // of which eager-sized, sent so by measured cost (rendezvous_choice)
  std::uint64_t rendezvous_split = 0;   // rendezvous receives split with their sender (grants sent)
  std::uint64_t received = 0;
  std::uint64_t unexpected = 0;         // messages that arrived before their receive
  std::uint64_t unexpected_held = 0;    // held now
  std::uint64_t unexpected_bytes = 0;   // bytes held now (LDO capacity)
  // Registered memory held for receiving, now: the bounce LDOs (capacity),
  // posted or waiting to be reposted. Fixed by receive_buffers and the
  // eager threshold, whatever the number of peers; add unexpected_bytes for
  // everything received and not yet handed to the application.
  std::uint64_t receive_buffer_bytes = 0;
  std::uint64_t credit_stalls = 0;      // sends that waited for credits
  std::uint64_t credits_withheld = 0;   // credits held back because of the budget
  std::uint64_t credit_messages = 0;    // credit-only messages sent
  std::uint64_t rejected = 0;           // messages dropped: malformed, unknown sender, stale replies
  std::uint64_t truncated = 0;
};

// Thread-safety and ownership: see the top of this header.
class REGPOOL_API Messenger {
 public:
  // Takes the endpoint's receive side and posts the receives. Throws Error:
  // invalid_argument (already attached, bad config), pool_exhausted.
  Messenger(Endpoint& endpoint, Pool& pool, const MessengerConfig& config = {});
  ~Messenger();
  Messenger(const Messenger&) = delete;
  Messenger& operator=(const Messenger&) = delete;

  // Send `data` to `peer` with `tag`. Completes when the bytes are out of
  // `data` (eager: sent; rendezvous: the receiver fetched them and said so).
  // The slice is held until then.
  Result<MessageToken> send(PeerId peer, std::uint64_t tag, const Slice& data, MessageCallback cb = {}) noexcept;
  // Receive a message whose tag matches `tag` on the bits not set in
  // `ignore`, from `source` (kAnyPeer = any) into `buffer`. Earliest posted
  // matching receive takes the earliest arriving matching message. The
  // buffer's slice is held until the receive completes; after an eager
  // message was copied into it, the Messenger lets go of it at its next
  // call (any send, receive, progress or wait, or its destruction), not
  // in the round that completed it, which a reply would wait for.
  Result<MessageToken> recv(PeerId source, std::uint64_t tag, std::uint64_t ignore, const Slice& buffer,
                            MessageCallback cb = {}) noexcept;
  // Zero-copy receive: the completion's `ldo` is the object holding the
  // message (an unexpected message's own bounce LDO, or for rendezvous an
  // object of the message's size the payload was fetched into).
  Result<MessageToken> recv_ldo(PeerId source, std::uint64_t tag, std::uint64_t ignore,
                                MessageCallback cb = {}) noexcept;
  // The earliest pending (arrived, unreceived) matching message, without
  // receiving it; would_block when none. Progresses the endpoint first.
  Result<MessageInfo> probe(PeerId source, std::uint64_t tag, std::uint64_t ignore) noexcept;

  // Request/response: send `data` with `tag` to `peer`; the completion
  // (op request) carries the response in `ldo`. Fails with timeout after
  // `timeout` (0 = none), canceled after cancel(), peer_unreachable when
  // the peer is failed (fail_peer, Endpoint::fail_peer, membership). A
  // request that ends so while its send still waits for credits is never
  // sent.
  Result<MessageToken> request(PeerId peer, std::uint64_t tag, const Slice& data, std::chrono::milliseconds timeout,
                               MessageCallback cb = {}) noexcept;
  // Answer a received request (MessageCompletion::request_id). A reply to
  // a request that was canceled or timed out is dropped by the requester.
  Result<MessageToken> reply(PeerId peer, std::uint64_t request_id, const Slice& data,
                             MessageCallback cb = {}) noexcept;

  // Cancel a receive or request not matched yet, or a send still waiting
  // for credits: it completes with canceled. in_progress when it is already
  // moving bytes; invalid_argument for an unknown token.
  Status cancel(MessageToken token) noexcept;
  // Progress the endpoint, run messaging callbacks; the number delivered.
  std::size_t progress() noexcept;
  // Until the operation (posted without a callback) completes or `timeout`.
  MessageCompletion wait(MessageToken token, std::chrono::milliseconds timeout) noexcept;
  // The peer is gone: its pending operations fail with `status`, its
  // unexpected messages are dropped, its credits reset. Also noticed by
  // itself when the endpoint reports the peer unusable.
  void fail_peer(PeerId peer, Status status = Status::peer_unreachable) noexcept;

  std::uint64_t eager_threshold() const noexcept;
  MessengerStats stats() const noexcept;


 private:
  // Shared with the endpoint's completion callbacks, which may outlive this
  // handle (they then find it closed).
  std::shared_ptr<detail::MessengerCore> core_;
};

// The measured default eager threshold of the endpoint's transport
// (TransferTraits::copy_crossover: shm 64 KiB, tcp (net) 128 KiB,
// tcp;ofi_rxm 32 KiB, verbs 16 KiB).
REGPOOL_API std::uint64_t default_eager_threshold(Endpoint& endpoint) noexcept;

}  // namespace regpool
