// Messenger (regpool/messaging.hpp): matching, unexpected messages, credits,
// eager/rendezvous and request/response above Endpoint's public operations.
//
// Structure: one Core, shared with the endpoint's completion callbacks (so
// a callback that runs after the Messenger is gone finds a closed Core, not
// freed memory). Every table is preallocated at construction:
//   ops_         operation slots (user sends/receives/requests and internal
//                sends), with intrusive links for the posted-receive list
//                (posting order) and the per-peer credit queues (FIFO);
//   unexpected_  arrived messages not yet received, each keeping the bounce
//                LDO it arrived in (no copy, no malloc), in arrival order;
//                out-of-sequence arrivals wait there too ("early");
//   posts_       a ring of endpoint posts decided under the mutex and made
//                after it is released, by one drainer at a time, in order
//                (so sends to a peer leave in sequence order). One post
//                skips it: an eager send made when the ring is empty and
//                nobody drains goes out from send() itself, holding the
//                drain role meanwhile, so order holds the same way (see
//                send_eager_direct).
// The message header and its validation live in messaging_wire.hpp.
//
// Code layout: the functions a small message's path runs through are
// [[gnu::hot]] (grouped in .text.hot with the endpoint's, by the linker),
// and what a small message never reaches (rendezvous, errors, the scan,
// early arrivals) is [[gnu::cold]] and out of line, so the eager path is
// straight code on few lines. On tcp every message crosses the kernel's
// socket path, which evicts the caches, and the path's code footprint is
// paid again on every message: a profile-guided build of this file alone
// made a tcp tagged ping-pong 1.3-3.8 % faster, and these marks get most of
// that, 2.7 % in the same rounds (bench/RESULTS.md, "the eager path's code
// layout").
// The eager arrival (on_message, arrive, deliver) is inlined into on_recv
// for the same reason.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "messaging/messaging_wire.hpp"
#include "platform/coarse_clock.hpp"
#include "platform/copy.hpp"
#include "platform/futex.hpp"
#include "pool/post_registration.hpp"
#include "regpool/messaging.hpp"
#include "transport/message_sink.hpp"

namespace regpool {

namespace mw = detail::msgwire;

const char* to_string(MessageOp op) noexcept {
  switch (op) {
    case MessageOp::send: return "send";
    case MessageOp::recv: return "recv";
    case MessageOp::request: return "request";
  }
  return "unknown";
}

// MessengerConfig::eager_gather's default: the payload size from which a
// gathered send is at least even with copying into a message
// (bench/RESULTS.md, "gathered eager sends": 4 KiB 0.98 of the copy's
// latency on tcp and on verbs, larger payloads more). Smaller payloads
// were not measured: their copy is a few cache lines.
constexpr std::uint64_t kDefaultGather = 4096;

std::uint64_t default_eager_threshold(Endpoint& endpoint) noexcept {
  // The backend's measured copy-versus-rendezvous crossover (TransferTraits).
  return endpoint.transfer_traits().copy_crossover;
}

namespace {
using Clock = std::chrono::steady_clock;
constexpr std::uint32_t kNone = ~std::uint32_t{0};
// An unexpected message is copied out of its bounce when it fills at most
// this fraction of it (see Core::arrive).
constexpr std::uint64_t kCompactRatio = 4;

std::uint64_t make_token(std::uint32_t gen, std::uint32_t index) noexcept {
  return (static_cast<std::uint64_t>(gen) << 32) | index;
}

// The Messenger's mutex (a futex word, platform/futex.hpp), or, when the
// application promises that calls never overlap (MessengerConfig::
// serialized), a plain flag: no locked instruction, about 10 ns less per
// shm message (bench/RESULTS.md). The flag still makes try_lock refuse
// while the mutex is "held", since take() is reached from inside our own
// calls on the same thread (a post that polls) and must decline then, as
// it does with the futex.
class CoreMutex {
 public:
  explicit CoreMutex(bool serialized) noexcept : serialized_(serialized) {}
  bool try_lock() noexcept {
    if (!serialized_) return futex_.try_lock();
    if (held_) return false;
    held_ = true;
    return true;
  }
  void lock() noexcept {
    if (serialized_) {
      held_ = true;
    } else {
      futex_.lock();
    }
  }
  void unlock() noexcept {
    if (serialized_) {
      held_ = false;
    } else {
      futex_.unlock();
    }
  }

 private:
  platform::FutexMutex futex_;
  bool held_ = false;
  const bool serialized_;
};
}  // namespace

namespace detail {
// The sink of messages in place (transport/message_sink.hpp): on endpoints
// whose backend has that path, incoming eager messages are matched and
// copied where they lie, and small sends are copied into the transport.
struct MessengerCore final : MessageSink {
  enum class State : std::uint8_t { free, posted, queued, active, done };
  enum class Kind : std::uint8_t { send, recv, request, internal };

  struct Op {
    std::uint32_t gen = 0;
    State state = State::free;
    Kind kind = Kind::send;
    bool has_cb = false;
    bool zero_copy = false;
    bool rendezvous = false;
    bool fin_wait = false;  // rendezvous send: rts out, waiting for the fin
    bool fetch_wait = false;  // rendezvous receive: matched, waiting for a get slot (linked by next)
    bool put_wait = false;    // split rendezvous receive: granted a range, waiting for the sender's done
    // Split rendezvous. Receive: grant_sent, a grant went out (the fin
    // says so); fin_sent, our gets are over and the fin went out (the
    // receive completes once the done is in too). Send: granted, the grant
    // came and its puts started; fin_seen, the fin came (fin_granted: it
    // announced a grant); the send completes once both are over.
    bool grant_sent = false, fin_sent = false;
    bool granted = false, fin_seen = false, fin_granted = false;
    // A receive matched by a split eager message's lead, filled by its
    // parts (PeerState::as_op names it). A split eager send counts its
    // parts' completions in `gets`, the first failure in rdv_status.
    bool assembling = false;
    mw::Space space = mw::Space::user;
    PeerId peer = kAnyPeer;
    std::uint64_t tag = 0;
    std::uint64_t ignore = 0;
    std::uint64_t reply_id = 0;
    Slice buf;  // send payload or receive buffer
    Exposure exposure;
    // Receive side of a rendezvous: gets of [issued, want) from the
    // sender's ref; `take` bytes in all (want stops short of it when the
    // tail was granted to the sender's puts). Send side of a split one:
    // puts of [issued, want) to the receiver's ref at offset - put_base,
    // rdv_msg the receiver's id for the done; `gets` counts the puts.
    RemoteRef ref;
    std::uint64_t want = 0, issued = 0, done = 0, rdv_msg = 0, take = 0, put_base = 0;
    std::uint32_t gets = 0;
    Status rdv_status = Status::ok;
    // request <-> its internal send
    std::uint32_t link = kNone, link_gen = 0;
    Clock::time_point deadline = Clock::time_point::max();
    std::uint32_t prev = kNone, next = kNone;
    MessageCallback cb;
    MessageCompletion result;
  };

  struct Unexp {
    bool used = false;
    bool early = false;
    bool credit_held = false;
    PeerId peer = kAnyPeer;
    mw::Header hdr;
    RemoteRef ref;
    Ldo ldo;
    std::uint64_t charged = 0;
    std::uint64_t bytes = 0;  // early: the payload bytes the message carried
    std::uint32_t prev = kNone, next = kNone;
  };

  // What we know of one peer. Until its first message tells us its limits
  // (messaging_wire.hpp, "Negotiation") we assume the smallest any
  // Messenger has: one credit, eager payloads up to kMinEager.
  struct PeerState {
    std::uint32_t credits = 1;            // messages we may still send it
    std::uint32_t grant = 1;              // credits it grants us (announced)
    std::uint64_t peer_eager = mw::kMinEager;  // largest eager payload it accepts (announced)
    bool announced = false;               // it has had a message from us (our limits)
    bool heard = false;                   // we have had a message from it (counted in peers_heard)
    std::uint32_t owed = 0;
    std::uint64_t send_seq = 0;
    std::uint64_t recv_seq = 1;  // next expected
    std::uint32_t qhead = kNone, qtail = kNone;
    // Its messages held ahead of sequence (Unexp::early): release_early
    // walks the unexpected list only when there are some, so an in-sequence
    // message costs O(1) however many messages other peers have waiting.
    std::uint32_t early = 0;
    // Its split eager message being received (messaging_wire.hpp, "Split
    // eager"): into receive as_op (generation as_gen) when a posted receive
    // matched the lead; else into as_ldo (the lead's header in as_hdr),
    // matched like any eager message once complete; neither: its bytes are
    // dropped (the receive went away).
    mw::Assembly as;
    std::uint32_t as_op = kNone, as_gen = 0;
    mw::Header as_hdr;
    Ldo as_ldo;
    // Its kept eager send (see kKeptSends): the message buffer, the
    // endpoint's token (learnt from the first completion), whether a
    // message is in it and in flight (ks_op, generation ks_gen, the op it
    // completes), and ks_id, which kept send this state made (0: none): a
    // completion whose id is not the peer's any more (the peer failed
    // since) ends it.
    Ldo ks_buf;
    Token ks_token;
    std::uint32_t ks_op = kNone, ks_gen = 0;
    std::uint32_t ks_id = 0;
    bool ks_busy = false;
  };

  // recv: a bounce's kept receive posted (post_recv_kept); repost: posted
  // again (Post::local set: into a new bounce LDO).
  enum class PostKind : std::uint8_t { recv, repost, send, rts, get, grant, put };
  struct Post {
    PostKind kind = PostKind::recv;
    PeerId peer = kAnyPeer;
    std::uint32_t op = kNone, gen = 0;
    std::uint32_t bounce = 0;
    Token token;  // repost: the bounce's kept receive
    std::uint64_t remote_offset = 0;
    Slice local;  // recv: the bounce; send: the message (gathered: its header); rts/grant: the bytes to expose;
                  // get/put: the local side
    Slice msg;    // rts/grant: the notice; a gathered send: the caller's payload, sent after `local`
    RemoteRef ref;
  };

  Endpoint& ep;
  Pool& pool;
  MessengerConfig cfg;
  std::uint64_t threshold = 0;
  std::uint64_t chunk = 0;
  // Split eager (MessengerConfig::eager_split): payload bytes per message
  // (the backend's fast message limit less the header) and the largest
  // payload split; 0 = never.
  std::uint64_t part_size = 0;
  std::uint64_t split_upto = 0;
  // Messages in place (install_sink): the endpoint copies our sends into
  // the transport (up to copy_limit bytes with the header) and offers us
  // incoming messages where they lie.
  bool in_place = false;
  std::uint64_t copy_limit = 0;
  // Copied messages with payloads longer than this ask the endpoint
  // whether a rendezvous costs less (MessengerConfig::rendezvous_choice);
  // UINT64_MAX = never.
  std::uint64_t choice_from = ~std::uint64_t{0};
  // Gathered eager (MessengerConfig::eager_gather): eager payloads of at
  // least this many bytes leave as a header message and the caller's
  // bytes in one gathered send (Endpoint::send_gathered), uncopied.
  // UINT64_MAX = never (the backend cannot, or the config says so).
  std::uint64_t gather_from = ~std::uint64_t{0};
  std::uint64_t gather_to = ~std::uint64_t{0};  // and at most this many (MessengerConfig::eager_gather_max)
  static constexpr std::uint32_t kMaxParts = 8;
  // Rendezvous receives of at least this many bytes are split with the
  // sender (MessengerConfig::rendezvous_split); 0 = never.
  std::uint64_t split_from = 0;
  std::uint32_t credit_batch = 1;
  // Rendezvous gets in flight across all receives, their cap, and the
  // receives waiting for one (FIFO through Op::next).
  std::uint32_t gets_in_flight = 0;
  std::uint32_t max_gets = ~std::uint32_t{0};
  std::uint32_t fetch_head = kNone, fetch_tail = kNone;

  // A futex word (platform/futex.hpp): a tagged round takes it about eight
  // times, and pthread's lock and unlock ran ~60 instructions a round. A
  // flag when MessengerConfig::serialized.
  mutable CoreMutex mu;
  bool closed = false;
  std::vector<Op> ops;
  std::vector<std::uint32_t> free_ops;
  std::uint32_t posted_head = kNone, posted_tail = kNone;
  std::vector<Unexp> unexpected;
  std::vector<std::uint32_t> free_unexp;
  std::uint32_t peers_heard = 0;  // peers with PeerState::heard
  // High-water marks the periodic scan stops at: every op slot at or above
  // ops_high has always been free (the free stack hands out fresh slots in
  // ascending order, so ops_high is the peak number in use), and every peer
  // at or above peers_high has never sent us a message (so is owed no
  // credits). The whole preallocated tables (max_operations x 448 bytes,
  // max_peers x 176) are about 640 KB by default, far more than the L1
  // cache, walked once a millisecond for the few entries in use.
  std::uint32_t ops_high = 0;
  PeerId peers_high = 0;
  std::uint32_t unexp_head = kNone, unexp_tail = kNone;
  std::vector<PeerState> peers;
  std::vector<Ldo> bounces;   // receive bounce LDOs, by slot
  // Each bounce is received into by one kept receive (Endpoint::
  // post_recv_kept), reposted after each message rather than posted anew:
  // its token (learnt from its completions; empty before the first and
  // once it ended) and the base of the LDO it holds (a bounce kept by an
  // unexpected message is replaced, and the receive reposted into the new
  // one; the old one cannot be freed, so no new LDO can have its base,
  // while the receive holds it).
  std::vector<Token> bounce_tokens;
  std::vector<const std::byte*> bounce_bases;
  // Bounces not posted (the pool or the ring refused a refill or a repost),
  // for the scan to retry, and how many there are: the scan skips the walk
  // when none is (bytes, not vector<bool>: read on every arrival).
  std::vector<std::uint8_t> bounce_empty;
  std::uint32_t bounces_empty = 0;
  void mark_empty(std::uint32_t b) noexcept {
    if (!bounce_empty[b]) ++bounces_empty;
    bounce_empty[b] = 1;
  }
  // Bounces emptied and due for reposting, held back until the caller's
  // progress round finds nothing to do (or lazy_limit of them wait): a
  // repost is a whole endpoint post, and made at once it sits between a
  // message's arrival and the wait() that returns it. The other bounces
  // stay posted meanwhile.
  std::vector<std::uint32_t> lazy;
  std::size_t lazy_limit = 1;
  // Message LDOs for small eager sends, allocated ahead by progress rounds
  // that find nothing to do: a pool allocation made between a message's
  // arrival and the reply's post reads the thread's cache and bin, lines
  // the system calls of a network round trip have evicted (0.10 us of a
  // tcp turnaround measured 0.6 us; bench/RESULTS.md). Each holds a header
  // and up to kSparePayload bytes.
  std::vector<Ldo> spares;
  // A refill the pool refused waits for the next scan (a failed allocation
  // is a slow path: not one per spin round).
  bool spares_starved = false;
  static constexpr std::size_t kSpares = 4;
  static constexpr std::uint64_t kSparePayload = 192;
  // Kept eager sends: a peer sent small eager messages from send() itself
  // (send_eager_direct) gets one message buffer (make_kept_locked) and one kept
  // send (Endpoint::send_kept), reposted with each message's length
  // (Endpoint::repost(token, length)) instead of a new send of a new
  // message object: no endpoint slot claimed, no reference taken and
  // dropped, no callback moved, no spare used up (bench/RESULTS.md, "kept
  // eager sends"). Each holds an endpoint slot while its peer is known (a
  // failed peer's is ended; a closed Messenger's end with the endpoint),
  // so at most kKeptSends peers have one; a message to another peer, or
  // finding its peer's buffer still in flight, goes as before.
  static constexpr std::uint32_t kKeptSends = 8;
  std::uint32_t kept_sends = 0;  // peers with one
  std::uint32_t kept_ids = 0;    // the last ks_id handed out
  // Kept sends of failed peers, parked: ended by drain() (an endpoint call,
  // made without the mutex), which runs right after every path that adds
  // one. Reserved (2 * kKeptSends); one that finds it full stays parked
  // until the endpoint closes, never an allocation here.
  std::vector<Token> kept_ended;
  std::vector<Post> posts;    // ring
  std::size_t post_head = 0, post_count = 0;
  bool draining = false;
  std::vector<std::uint32_t> ready;  // ring of op indices with callbacks
  std::size_t ready_head = 0, ready_count = 0;
  std::vector<Exposure> graveyard;  // revoked after the mutex is released
  Clock::time_point next_scan{};
  // The last round's endpoint round delivered and it did not read the
  // clock for the scan (progress_round): the next round reads it.
  bool scan_read_skipped = false;
  MessengerStats st;
  // Moves (under the mutex, by a plain store: one writer at a time) in
  // every lock round that may change what a waiter looks at: an op
  // completed, work queued, a bounce emptied, the Messenger closed. A
  // wait() whose last round left nothing to do spins on the endpoint alone
  // while it stands still (Messenger::wait); any move sends it back to a
  // full round.
  std::atomic<std::uint64_t> changes{0};
  void changed() noexcept { changes.store(changes.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

  // The hand-off to a spinning waiter. A wait() whose first round did not
  // find its receive done claims `handoff_token` (one waiter at a time; 0:
  // none). A take() that completes that very receive (in place, under the
  // mutex) moves its completion to `handoff`, frees the op and sets
  // `handoff_ready` (release); the waiter sees the flag (acquire) after its
  // endpoint round and returns, without the lock round that would look the
  // op up, move its completion and free it (measured: bench/RESULTS.md,
  // "the waiter's hand-off"). The waiter gives the slot back on every
  // return; one that gives up (its deadline) does so under the mutex, so
  // a completion handed off meanwhile is returned, never lost.
  // A receive's buffer, an eager message copied into it: the Messenger's
  // reference to it is dropped at the next lock round that cannot delay a
  // reply (a send after its bytes left, a receive posted, a progress or
  // wait round, the Messenger's end), not in the round that completes it. The caller usually still holds the
  // buffer, so that drop is a locked decrement, and the round completing a
  // receive is the one a ping-pong's reply waits for (bench/RESULTS.md, "a
  // copied send before its op"). One buffer at a time: a second completed
  // in the same round drops the first at once.
  Slice spent_buffer;
  void drop_spent() noexcept {
    if (spent_buffer) spent_buffer = Slice{};
  }

  std::atomic<std::uint64_t> handoff_token{0};
  std::atomic<bool> handoff_ready{false};
  MessageCompletion handoff;
  // Op i, just completed by take(), goes to the waiter that claimed it.
  [[gnu::always_inline]] void hand_off_if_awaited(std::uint32_t i) noexcept {
    Op& o = ops[i];
    if (handoff_token.load(std::memory_order_relaxed) != o.result.token.value || o.state != State::done || o.has_cb) {
      return;
    }
    handoff = std::move(o.result);
    free_op(i);
    ++st.handed_off;
    handoff_ready.store(true, std::memory_order_release);
  }
  // The claiming waiter's: the handed-off completion, and the slot free.
  MessageCompletion take_handoff() noexcept {
    MessageCompletion m = std::move(handoff);
    handoff_ready.store(false, std::memory_order_relaxed);
    handoff_token.store(0, std::memory_order_release);
    return m;
  }

  MessengerCore(Endpoint& e, Pool& p, const MessengerConfig& c) : ep(e), pool(p), cfg(c), mu(c.serialized) {}

  // What enable_shared_from_this would give (set once, by the Messenger's
  // constructor, before anything can call it). Not that base: its friend
  // function in namespace std, instantiated for this type, is exported
  // from the library when a build does not inline it (-O0), naming an
  // internal type (api-exports-symbols).
  std::weak_ptr<MessengerCore> weak_self;
  std::shared_ptr<MessengerCore> shared_from_this() noexcept { return weak_self.lock(); }

  // ---------- small helpers (mutex held) ----------
  bool matches(const Op& r, PeerId src, mw::Space sp, std::uint64_t tag) const noexcept {
    return r.space == sp && (r.peer == kAnyPeer || r.peer == src) && ((r.tag ^ tag) & ~r.ignore) == 0;
  }

  // The generation op i gets at its next claim (never 0).
  std::uint32_t next_gen(std::uint32_t i) const noexcept { return ops[i].gen + 1 == 0 ? 1 : ops[i].gen + 1; }
  // The token the next claim_op will give (free_ops not empty): what a
  // copied send puts in its header before it claims its op.
  MessageToken next_token() const noexcept {
    const std::uint32_t i = free_ops.back();
    return MessageToken{make_token(next_gen(i), i)};
  }

  [[gnu::hot]] Result<std::uint32_t> claim_op(Kind kind) noexcept {
    if (closed) return Status::closed;
    if (free_ops.empty()) return Status::would_block;
    const std::uint32_t i = free_ops.back();
    free_ops.pop_back();
    if (i >= ops_high) ops_high = i + 1;
    Op& o = ops[i];
    o.gen = next_gen(i);
    o.state = State::active;
    o.kind = kind;
    o.has_cb = false;
    o.zero_copy = o.rendezvous = o.fin_wait = o.fetch_wait = o.put_wait = false;
    o.grant_sent = o.fin_sent = o.granted = o.fin_seen = o.fin_granted = false;
    o.assembling = false;
    o.space = mw::Space::user;
    o.peer = kAnyPeer;
    o.tag = o.ignore = o.reply_id = 0;
    o.want = o.issued = o.done = o.rdv_msg = o.take = o.put_base = 0;
    o.gets = 0;
    o.rdv_status = Status::ok;
    o.link = kNone;
    o.link_gen = 0;
    o.deadline = Clock::time_point::max();
    o.prev = o.next = kNone;
    o.result = MessageCompletion{};
    o.result.token = MessageToken{make_token(o.gen, i)};
    o.result.op = kind == Kind::recv ? MessageOp::recv : kind == Kind::request ? MessageOp::request : MessageOp::send;
    return i;
  }

  [[gnu::hot]] void free_op(std::uint32_t i) noexcept {
    Op& o = ops[i];
    o.state = State::free;
    o.buf = Slice{};
    o.cb.reset();
    o.result.ldo.reset();
    if (o.exposure) graveyard.push_back(std::move(o.exposure));
    free_ops.push_back(i);
  }

  Op* find(MessageToken t) noexcept {
    const auto i = static_cast<std::uint32_t>(t.value & 0xffffffffu);
    const auto g = static_cast<std::uint32_t>(t.value >> 32);
    if (i >= ops.size() || ops[i].gen != g || ops[i].state == State::free) return nullptr;
    return &ops[i];
  }

  // Completes op i: internal ops are freed; user ops go to the ready ring
  // (callback) or stay for wait().
  [[gnu::hot]] void complete(std::uint32_t i, Status s) noexcept {
    Op& o = ops[i];
    if (o.state == State::free || o.state == State::done) return;
    if (o.exposure) graveyard.push_back(std::move(o.exposure));
    o.buf = Slice{};
    if (o.kind == Kind::internal) {
      // A request whose send failed fails too.
      if (s != Status::ok && o.link != kNone) {
        Op& r = ops[o.link];
        if (r.gen == o.link_gen && r.state == State::posted) {
          unlink_posted(o.link);
          complete(o.link, s);
        }
      }
      free_op(i);
      return;
    }
    if (o.kind == Kind::request && s != Status::ok) drop_queued_request_send(i);
    o.result.status = s;
    if (s == Status::truncated) ++st.truncated;
    o.state = State::done;
    if (o.has_cb) {
      ready[(ready_head + ready_count) % ready.size()] = i;
      ++ready_count;
    }
  }

  void unlink_posted(std::uint32_t i) noexcept {
    Op& o = ops[i];
    if (o.prev != kNone) ops[o.prev].next = o.next; else posted_head = o.next;
    if (o.next != kNone) ops[o.next].prev = o.prev; else posted_tail = o.prev;
    o.prev = o.next = kNone;
    o.state = State::active;
  }
  void link_posted(std::uint32_t i) noexcept {
    Op& o = ops[i];
    o.state = State::posted;
    o.prev = posted_tail;
    o.next = kNone;
    if (posted_tail != kNone) ops[posted_tail].next = i; else posted_head = i;
    posted_tail = i;
  }

  void unlink_unexp(std::uint32_t u) noexcept {
    Unexp& e = unexpected[u];
    if (e.prev != kNone) unexpected[e.prev].next = e.next; else unexp_head = e.next;
    if (e.next != kNone) unexpected[e.next].prev = e.prev; else unexp_tail = e.prev;
    e.prev = e.next = kNone;
  }
  void release_unexp(std::uint32_t u) noexcept {
    Unexp& e = unexpected[u];
    unlink_unexp(u);
    if (e.early) {
      e.early = false;
      if (e.peer < peers.size() && peers[e.peer].early > 0) --peers[e.peer].early;
    }
    st.unexpected_bytes -= e.charged;
    --st.unexpected_held;
    e.ldo.reset();
    e.used = false;
    free_unexp.push_back(u);
  }

  bool push_post(Post&& p) noexcept {
    if (post_count == posts.size()) return false;
    posts[(post_head + post_count) % posts.size()] = std::move(p);
    ++post_count;
    return true;
  }

  [[gnu::hot]] Result<Ldo> alloc_message(std::uint64_t bytes) noexcept {
    LdoShape shape;
    shape.data_size = bytes;
    shape.zeroing = Zeroing::uninitialized;
    return pool.allocate(shape);
  }
  // An unexpected message's right-sized copy: the bounce's layout (header
  // in the meta section, payload in the data section) for `payload` bytes.
  Result<Ldo> alloc_held(std::uint64_t payload) noexcept {
    LdoShape shape;
    shape.meta_size = mw::kHeaderSize;
    shape.data_size = payload;
    shape.zeroing = Zeroing::uninitialized;
    return pool.allocate(shape);
  }
  Result<Ldo> alloc_bounce() noexcept {
    LdoShape shape;
    shape.meta_size = mw::kHeaderSize;
    shape.data_size = threshold;
    shape.zeroing = Zeroing::uninitialized;
    return pool.allocate(shape);
  }

  [[gnu::hot]] void post_bounce(std::uint32_t b) noexcept {
    Post p;
    p.bounce = b;
    p.token = bounce_tokens[b];
    if (p.token && bounce_bases[b] == bounces[b].base()) {
      p.kind = PostKind::repost;  // the same buffer: no Slice, no reference taken
    } else {
      auto s = Slice::raw(bounces[b], kWireHeaderSize, mw::kHeaderSize + threshold);
      if (!s) {
        mark_empty(b);
        return;
      }
      p.kind = p.token ? PostKind::repost : PostKind::recv;
      p.local = std::move(*s);
      bounce_bases[b] = bounces[b].base();
    }
    if (!push_post(std::move(p))) mark_empty(b);
  }
  // Whether anyone but the bounce table (and its kept receive) holds bounce
  // b's LDO: an unexpected message kept in it.
  bool bounce_held(std::uint32_t b) const noexcept {
    const std::uint32_t own = 1 + (bounce_tokens[b] && bounce_bases[b] == bounces[b].base() ? 1 : 0);
    return bounces[b].use_count() > own;
  }

  // Our limits, on every message we send (messaging_wire.hpp).
  void stamp(mw::Header& h) const noexcept {
    h.accept_eager = static_cast<std::uint32_t>(threshold);
    h.grant = cfg.peer_credits;
  }
  // The limits a message from the peer announces: a changed grant keeps
  // the messages already outstanding counted against the new one.
  static void learn(PeerState& ps, const mw::Header& h) noexcept {
    ps.peer_eager = h.accept_eager;
    if (h.grant != ps.grant) {
      const std::uint32_t outstanding = ps.grant - std::min(ps.credits, ps.grant);
      ps.grant = h.grant;
      ps.credits = h.grant > outstanding ? h.grant - outstanding : 0;
    }
  }

  // A control message (fin, credit) to `peer`.
  void send_control(PeerId peer, mw::Type type, std::uint64_t msg_id, Status status,
                    std::uint64_t reply_id = 0) noexcept {
    auto m = alloc_message(mw::kHeaderSize);
    if (!m) return;  // credits stay owed (retried by the scan); a lost fin ends in the sender's timeout
    mw::Header h;
    h.type = type;
    h.msg_id = msg_id;
    h.reply_id = reply_id;
    h.status = static_cast<std::uint32_t>(status);
    PeerState& ps = peers[peer];
    h.credits = std::min(ps.owed, cfg.peer_credits);
    stamp(h);
    ps.owed -= h.credits;
    mw::encode(h, m->data().data());
    Post p;
    p.kind = PostKind::send;
    p.peer = peer;
    p.local = *Slice::data(std::move(*m));
    if (!push_post(std::move(p))) {
      ps.owed += h.credits;
    } else {
      ps.announced = true;
    }
  }

  // Credits go back in batches; and at once to a peer that has not heard
  // from us yet: it holds one credit until it learns our grant.
  void maybe_return_credits(PeerId peer) noexcept {
    PeerState& ps = peers[peer];
    if (ps.owed >= credit_batch || (!ps.announced && ps.owed > 0)) {
      ++st.credit_messages;
      send_control(peer, mw::Type::credit, 0, Status::ok);
    }
  }

  // Sends op i now (a credit is available and nothing is queued before it).
  // Its bytes are `data`, or o.buf when null (an op that waited for
  // credits). Given `data`, an eager send copies from it and o.buf is
  // never set: the op holds no reference to the caller's object (one
  // reference count round trip less per eager message).
  bool goes_eager(const PeerState& ps, std::uint64_t len) const noexcept {
    return len <= std::min(threshold, ps.peer_eager);
  }

  // A send to `ps` waits for a credit when none is left or others already
  // wait: a peer's messages leave in the order they were sent.
  static bool must_wait_credit(const PeerState& ps) noexcept { return ps.credits == 0 || ps.qhead != kNone; }
  // Op i joins the end of its peer's credit queue; drain_queue sends it
  // once a credit comes.
  void queue_for_credit(PeerState& ps, std::uint32_t i) noexcept {
    ++st.credit_stalls;
    Op& o = ops[i];
    o.state = State::queued;
    o.next = kNone;
    if (ps.qtail != kNone) ops[ps.qtail].next = i; else ps.qhead = i;
    ps.qtail = i;
  }
  // Queued op i leaves its peer's credit queue (timed out or canceled)
  // and is active again, for complete().
  void unqueue_for_credit(std::uint32_t i) noexcept {
    PeerState& ps = peers[ops[i].peer];
    std::uint32_t prev = kNone;
    for (std::uint32_t q = ps.qhead; q != kNone; prev = q, q = ops[q].next) {
      if (q != i) continue;
      if (prev == kNone) ps.qhead = ops[q].next; else ops[prev].next = ops[q].next;
      if (ps.qtail == q) ps.qtail = prev;
      break;
    }
    ops[i].state = State::active;
  }
  // Request r ends unanswered (canceled, timed out, its peer failed) while
  // its send still waits for credits: the send is dropped, so the peer
  // never serves a request nobody awaits and the credit goes to the next
  // message. Only a send still queued: one already leaving completes on its
  // own (and a peer failure completes queued sends itself, marked active
  // first).
  void drop_queued_request_send(std::uint32_t r) noexcept {
    const Op& ro = ops[r];
    if (ro.peer >= peers.size()) return;
    for (std::uint32_t q = peers[ro.peer].qhead; q != kNone; q = ops[q].next) {
      const Op& so = ops[q];
      if (so.state != State::queued || so.kind != Kind::internal || so.link != r || so.link_gen != ro.gen) continue;
      unqueue_for_credit(q);
      free_op(q);
      return;
    }
  }
  // A claimed op made a send of `length` bytes to `peer` with `tag` (a user
  // tag, or a request's id in the reply space), completing to `cb` or to a
  // waiter.
  void set_send(Op& o, PeerId peer, std::uint64_t tag, std::uint64_t length, MessageCallback&& cb) noexcept {
    o.peer = peer;
    o.tag = tag;
    o.has_cb = static_cast<bool>(cb);
    o.cb = std::move(cb);
    o.result.peer = peer;
    o.result.tag = tag;
    o.result.length = length;
  }

  // Op i's header for a message of `len` bytes (the caller sets the type).
  mw::Header header_for(std::uint32_t i, std::uint64_t len) const noexcept {
    const Op& o = ops[i];
    mw::Header h;
    h.space = o.space;
    h.tag = o.tag;
    h.length = len;
    h.msg_id = make_token(o.gen, i);
    h.reply_id = o.reply_id;
    return h;
  }

  // Spends a credit of `ps` and its next sequence number on `h`, adds the
  // credits we owe it and our limits, and writes `h` at `at`.
  void seal(PeerState& ps, mw::Header& h, std::byte* at) noexcept {
    spend(ps, h);
    stamp(h);
    mw::encode(h, at);
  }
  // seal()'s accounting, for a header the caller encodes (a brief one).
  void spend(PeerState& ps, mw::Header& h) noexcept {
    --ps.credits;
    h.seq = ++ps.send_seq;
    h.credits = std::min(ps.owed, cfg.peer_credits);
    ps.owed -= h.credits;
  }

  // Op i's eager message of the bytes `src`, sealed, written at `at`.
  [[gnu::always_inline]] void write_eager(std::uint32_t i, const Slice& src, std::byte* at) noexcept {
    const std::uint64_t len = src.length();
    std::memcpy(at + mw::kHeaderSize, src.address(), len);
    seal_eager(i, len, at);
  }
  // Op i's eager header for a payload of `len` bytes, sealed, written at `at`.
  [[gnu::always_inline]] void seal_eager(std::uint32_t i, std::uint64_t len, std::byte* at) noexcept {
    mw::Header h = header_for(i, len);
    h.type = mw::Type::eager;
    seal(peers[ops[i].peer], h, at);
    ++st.eager_sent;
  }

  // Whether the eager payload `data` leaves gathered (its header message,
  // then the caller's bytes where they lie): long enough, and in memory the
  // endpoint's domain has registered (bytes from elsewhere, a pool of
  // another domain, are copied into a message as before: only the
  // Messenger's own message objects need to be registered for an eager
  // send).
  bool gathers(const Slice& data) const noexcept {
    return data.length() >= gather_from && data.length() <= gather_to &&
           detail::post_registration(data.ldo(), ep.domain()).ok();
  }
  // Whether `endpoint`'s backend sends gathered messages (a friend's view
  // of a protected member).
  static bool gathered_sends(const Endpoint& endpoint) noexcept { return endpoint.do_gathered_sends(); }
  // Op i's header message for a gathered eager payload of `len` bytes,
  // sealed: in a spare when there is one (a header always fits), else in
  // a fresh pool object.
  Result<Slice> gathered_header(std::uint32_t i, std::uint64_t len) noexcept {
    Result<Ldo> m = Status::would_block;
    if (!spares.empty()) {
      m = std::move(spares.back());
      spares.pop_back();
      (void)m->resize_data(mw::kHeaderSize);  // within its capacity
    } else {
      m = alloc_message(mw::kHeaderSize);
      if (!m) return m.status();
    }
    seal_eager(i, len, m->data().data());
    ++st.eager_gathered;
    return Slice::data(std::move(*m));
  }

  // Op i's eager message of the bytes `src`, sealed: in a spare when it
  // fits one, else in a fresh pool object.
  [[gnu::hot]] Result<Slice> eager_message(std::uint32_t i, const Slice& src) noexcept {
    const std::uint64_t len = src.length();
    Result<Ldo> m = Status::would_block;
    if (len <= kSparePayload && !spares.empty()) {
      m = std::move(spares.back());
      spares.pop_back();
      (void)m->resize_data(mw::kHeaderSize + len);  // within its capacity
    } else {
      m = alloc_message(mw::kHeaderSize + len);
      if (!m) return m.status();
    }
    write_eager(i, src, m->data().data());
    return Slice::data(std::move(*m));
  }

  // How many messages an eager payload of `len` bytes to `ps` leaves in:
  // more than one when the header pushes it past the backend's fast
  // message limit, it is at most split_upto and the peer's credits cover
  // every part (a stream short of credits sends whole messages: one
  // credit each, and the slower path matters less to bandwidth).
  std::uint32_t parts_for(const PeerState& ps, std::uint64_t len) const noexcept {
    if (len <= part_size || len > split_upto) return 1;
    const auto k = static_cast<std::uint32_t>((len + part_size - 1) / part_size);
    return k <= ps.credits ? k : 1;
  }

  // Op i's eager payload `src` as a lead and k - 1 parts (messaging_wire.hpp,
  // "Split eager"), sealed in order: consecutive sequence numbers, one
  // credit each. Everything is allocated before anything is sealed, so a
  // refused allocation leaves the peer's counters as they were.
  Status split_message(std::uint32_t i, const Slice& src, std::uint32_t k, std::array<Slice, kMaxParts>& out) noexcept {
    const Op& o = ops[i];
    PeerState& ps = peers[o.peer];
    const std::uint64_t len = src.length();
    std::array<Ldo, kMaxParts> m;
    for (std::uint32_t j = 0; j < k; ++j) {
      auto l = alloc_message(mw::kHeaderSize + std::min(part_size, len - j * part_size));
      if (!l) return l.status();
      m[j] = std::move(*l);
    }
    for (std::uint32_t j = 0; j < k; ++j) {
      const std::uint64_t off = j * part_size;
      const std::uint64_t n = std::min(part_size, len - off);
      std::memcpy(m[j].data().data() + mw::kHeaderSize, src.address() + off, n);
      mw::Header h;
      if (j == 0) {
        h = header_for(i, len);
        h.type = mw::Type::lead;
      } else {
        h.type = mw::Type::part;
        h.space = o.space;
        h.tag = off;
        h.length = n;
        h.msg_id = make_token(o.gen, i);
      }
      seal(ps, h, m[j].data().data());
      out[j] = *Slice::data(std::move(m[j]));
    }
    ++st.eager_sent;
    ++st.eager_split;
    return Status::ok;
  }

  // dispatch_send's split eager message: its k messages through the ring
  // (the caller checked there is room for them).
  [[gnu::cold]] void dispatch_split(std::uint32_t i, const Slice& src, std::uint32_t k, bool copied_from_op) noexcept {
    Op& o = ops[i];
    std::array<Slice, kMaxParts> msgs;
    if (const Status s = split_message(i, src, k, msgs); s != Status::ok) return complete(i, s);
    if (copied_from_op) o.buf = Slice{};
    o.gets = k;
    for (std::uint32_t j = 0; j < k; ++j) {
      Post p;
      p.kind = PostKind::send;
      p.peer = o.peer;
      p.op = i;
      p.gen = o.gen;
      p.local = std::move(msgs[j]);
      (void)push_post(std::move(p));
    }
    peers[o.peer].announced = true;
  }

  // `read`: a rendezvous whatever the length (Messenger::send's choice by
  // measured cost, rendezvous_choice).
  void dispatch_send(std::uint32_t i, const Slice* data = nullptr, bool read = false) noexcept {
    Op& o = ops[i];
    PeerState& ps = peers[o.peer];
    const Slice& src = data ? *data : o.buf;
    const std::uint64_t len = src.length();
    const bool eager = !read && goes_eager(ps, len);
    if (eager) {
      const std::uint32_t k = parts_for(ps, len);
      if (k > 1 && posts.size() - post_count >= k) return dispatch_split(i, src, k, data == nullptr);
    }
    Post p;
    p.peer = o.peer;
    p.op = i;
    p.gen = o.gen;
    std::uint32_t returned = 0;  // credits the message gives back
    if (eager) {
      const bool gathered = gathers(src);
      const std::uint32_t owed = ps.owed;
      auto m = gathered ? gathered_header(i, len) : eager_message(i, src);
      if (!m) return complete(i, m.status());
      returned = owed - ps.owed;
      p.kind = PostKind::send;
      p.local = std::move(*m);
      if (gathered) {
        p.msg = data ? *data : std::move(o.buf);  // the send holds the caller's bytes until the provider is done
      } else if (!data) {
        o.buf = Slice{};  // copied: the user's bytes are free
      }
    } else {
      auto m = alloc_message(mw::kRtsSize);
      if (!m) return complete(i, m.status());
      mw::Header h = header_for(i, len);
      h.type = mw::Type::rts;
      if (data) o.buf = *data;  // read by the receiver's gets (and our puts) until the fin
      o.rendezvous = true;
      o.fin_wait = true;
      o.deadline = deadline_for(len);
      p.kind = PostKind::rts;
      p.local = o.buf;
      p.msg = *Slice::data(std::move(*m));
      seal(ps, h, p.msg.address());
      returned = h.credits;
      ++st.rendezvous_sent;
      if (read) ++st.rendezvous_chosen;
    }
    if (!push_post(std::move(p))) {
      ++ps.credits;
      --ps.send_seq;
      ps.owed += returned;
      complete(i, Status::would_block);
    } else {
      ps.announced = true;
    }
  }

  // Messenger::send's eager message when nothing is queued to post and no
  // thread drains: built here and posted straight away, not through the
  // post ring (one Post built, moved in and moved out less, and no ring
  // arithmetic, on the path a small message's latency is made of;
  // post_direct).
  [[gnu::hot]] void send_eager_direct(std::unique_lock<CoreMutex>& g, std::uint32_t i, const Slice& data) noexcept {
    PeerState& ps = peers[ops[i].peer];
    if (const std::uint32_t k = parts_for(ps, data.length()); k > 1) return send_split_direct(g, i, data, k);
    if (data.length() <= kSparePayload && !ps.ks_busy &&
        (ps.ks_token || (!ps.ks_buf && kept_sends < kKeptSends && make_kept_locked(ps)))) {
      return send_kept_direct(g, i, data);
    }
    const bool gathered = gathers(data);
    auto m = gathered ? gathered_header(i, data.length()) : eager_message(i, data);
    if (!m) return complete(i, m.status());
    Slice one[1] = {std::move(*m)};
    post_direct(g, i, one, gathered ? &data : nullptr);
  }

  // Messenger::send's eager message copied into the transport by the
  // endpoint (send_copy), the mutex held throughout: the header built into
  // `head`, the payload copied once, straight from the caller's buffer, and
  // the op done as the copy returns (no operation of the endpoint's, no
  // completion). Holding the mutex keeps the order of sends without the
  // drain role, and lets a refusal undo the seal (nothing else can have
  // been sealed for the peer meanwhile); the endpoint's poll never waits
  // for this mutex (MessageSink::take only tries it). Returns ok (done),
  // would_block (sealed in `head`, but the endpoint cannot take it now: the
  // caller posts it, post_sealed) or the peer's refusal (unsealed).
  // A payload of up to kBriefMax bytes to a peer that has had a full
  // header from us since it last knew nothing of us (our limits) goes with
  // the brief header (messaging_wire.hpp): header and payload then fill
  // one cache line of the ring. `head_size` says which header `head` holds.
  // A copied send's message (Messenger::send), written into the transport
  // before its op is claimed: its header names the token the op will get
  // (`token`, next_token()). Returns what the endpoint said: ok (the send
  // is complete), would_block (sealed in `head`, to be posted), or a
  // refusal (nothing spent).
  // `may_read`: the endpoint may answer in_progress instead (the pair
  // measured a rendezvous cheaper; unsealed, nothing sent).
  [[gnu::hot]] Status send_copy_first(PeerState& ps, PeerId peer, std::uint64_t tag, MessageToken token,
                                      const Slice& data, std::array<std::byte, mw::kHeaderSize>& head,
                                      std::size_t& head_size, bool may_read) noexcept {
    mw::Header h;
    h.type = mw::Type::eager;
    h.space = mw::Space::user;
    h.tag = tag;
    h.length = data.length();
    h.msg_id = token.value;
    if (ps.announced && data.length() <= mw::kBriefMax) {
      spend(ps, h);
      mw::encode_brief(h, head.data());
      head_size = mw::kBriefHeaderSize;
    } else {
      seal(ps, h, head.data());
      head_size = mw::kHeaderSize;
    }
    const Status s = ep.send_copy(peer, std::span<const std::byte>(head.data(), head_size), data, may_read);
    if (s == Status::ok || s == Status::would_block || s == Status::message_too_large) {
      ++st.eager_sent;
      if (head_size == mw::kBriefHeaderSize) ++st.eager_brief;
      ps.announced = true;
      if (s != Status::ok) return Status::would_block;
      ++st.eager_copied;
      return Status::ok;
    }
    ++ps.credits;
    --ps.send_seq;
    ps.owed += h.credits;
    return s;
  }

  // send_copy_locked's message, sealed in `head`, that the endpoint could
  // not take at once: posted as any eager message, in a message object.
  [[gnu::cold]] void post_sealed(std::unique_lock<CoreMutex>& g, std::uint32_t i,
                                 std::span<const std::byte> head, const Slice& data) noexcept {
    Result<Ldo> m = alloc_message(head.size() + data.length());
    if (!m) {
      complete(i, m.status());
      return;
    }
    std::memcpy(m->data().data(), head.data(), head.size());
    std::memcpy(m->data().data() + head.size(), data.address(), data.length());
    Slice one[1] = {*Slice::data(std::move(*m))};
    post_direct(g, i, one);
  }

  // send_eager_direct's message through its peer's kept send: the first
  // one makes it (in the buffer make_kept_locked gave), later ones repost it with
  // their length. Posted as post_direct posts, with the mutex released and
  // the drain role held. A post that fails fails the op; the kept send
  // stays for the next message (parked after a failed repost), unless it is
  // gone: the first post's, or a repost the endpoint refuses because its
  // peer was removed or failed, end it.
  [[gnu::hot]] void send_kept_direct(std::unique_lock<CoreMutex>& g, std::uint32_t i,
                                     const Slice& data) noexcept {
    const PeerId peer = ops[i].peer;
    const std::uint32_t gen = ops[i].gen;
    PeerState& ps = peers[peer];
    const bool first = !ps.ks_token;
    // The first post's reference to the buffer (the state keeps its own).
    Slice whole = first ? *Slice::data(ps.ks_buf) : Slice{};
    write_eager(i, data, ps.ks_buf.data().data());
    ++st.eager_kept;
    ps.ks_busy = true;
    ps.ks_op = i;
    ps.ks_gen = gen;
    ps.announced = true;
    const Token token = ps.ks_token;
    const std::uint32_t id = ps.ks_id;
    const std::uint64_t n = mw::kHeaderSize + data.length();
    draining = true;
    g.unlock();
    Status s;
    if (first) [[unlikely]] {
      s = ep.send_kept(peer, whole, n,
                       [self = shared_from_this(), peer, id](const Completion& c) { self->on_kept_sent(peer, id, c); })
              .status();
      whole = Slice{};
    } else {
      s = ep.repost(token, n);
    }
    g.lock();
    draining = false;
    if (s != Status::ok) [[unlikely]] {
      PeerState& q = peers[peer];
      if (q.ks_id == id) {
        q.ks_busy = false;
        q.ks_op = kNone;
        if (first) {
          forget_kept_locked(q);
        } else if (s == Status::peer_unreachable || s == Status::invalid_argument || s == Status::closed) {
          end_kept_locked(q);
        }
      }
      send_post_failed_locked(peer, i, gen, s);
    }
    drain(g);
  }

  // Op i's (generation gen) message to `peer`, posted from send() itself,
  // was refused with `s`: it fails as a refused post from the ring does.
  [[gnu::cold]] void send_post_failed_locked(PeerId peer, std::uint32_t i, std::uint32_t gen, Status s) noexcept {
    changed();
    Post p;
    p.kind = PostKind::send;
    p.peer = peer;
    p.op = i;
    p.gen = gen;
    post_failed(p, s);
  }

  // A buffer for a peer's kept send, whose first post comes next (a spare
  // if there is one: a one-off either way). False when the pool refuses.
  [[gnu::cold]] bool make_kept_locked(PeerState& ps) noexcept {
    if (!spares.empty()) {
      ps.ks_buf = std::move(spares.back());
      spares.pop_back();
    } else {
      auto m = alloc_message(mw::kHeaderSize + kSparePayload);
      if (!m) return false;
      ps.ks_buf = std::move(*m);
    }
    if (++kept_ids == 0) kept_ids = 1;
    ps.ks_id = kept_ids;
    ++kept_sends;
    return true;
  }

  // The peer's kept send is not its any more: parked, it is ended after
  // the mutex (drain); in flight, its completion finds the id changed and
  // ends it (on_kept_sent).
  void end_kept_locked(PeerState& ps) noexcept {
    if (!ps.ks_buf) return;
    if (!ps.ks_busy && ps.ks_token && kept_ended.size() < kept_ended.capacity()) kept_ended.push_back(ps.ks_token);
    forget_kept_locked(ps);
  }
  void forget_kept_locked(PeerState& ps) noexcept {
    if (!ps.ks_buf) return;
    --kept_sends;
    ps.ks_buf.reset();
    ps.ks_token = Token{};
    ps.ks_id = 0;
  }

  // The op whose message the peer's kept send carries still waits for it
  // (not completed or reused since).
  bool kept_op_waiting(const PeerState& ps) const noexcept {
    return ps.ks_op != kNone && ops[ps.ks_op].gen == ps.ks_gen && ops[ps.ks_op].state == State::active;
  }

  // A kept eager send's completion: the op whose message it carried
  // completes, and the buffer is free for the next message. Any status but
  // ok ended the kept send (Endpoint::send_kept); the next message makes a
  // new one.
  [[gnu::hot]] void on_kept_sent(PeerId peer, std::uint32_t id, const Completion& c) noexcept {
    bool end = false;
    {
      std::unique_lock<CoreMutex> g(mu);
      if (closed) return;  // parked until the endpoint closes
      PeerState& ps = peers[peer];
      if (ps.ks_id != id) {
        // Its peer failed since: parked now, so ended here (it never
        // completes again).
        end = c.status == Status::ok;
      } else {
        const std::uint32_t i = ps.ks_op;
        const bool waiting = kept_op_waiting(ps);
        ps.ks_busy = false;
        ps.ks_op = kNone;
        if (c.status == Status::ok) {
          ps.ks_token = c.token;
        } else {
          forget_kept_locked(ps);
        }
        if (waiting) {
          ops[i].result.length = c.bytes >= mw::kHeaderSize ? c.bytes - mw::kHeaderSize : 0;
          complete(i, c.status);
        }
        changed();
        drain(g);
      }
    }
    if (end) (void)ep.end_kept(c.token);
  }

  // send_eager_direct's split message: its k messages posted straight
  // away, in order. A part whose post fails fails the send, and the parts
  // after it are not posted (a receive the lead matched fails at its
  // deadline, as any message's does whose post failed after its sequence
  // number was spent: the peer is gone or going).
  [[gnu::cold]] void send_split_direct(std::unique_lock<CoreMutex>& g, std::uint32_t i, const Slice& data,
                                       std::uint32_t k) noexcept {
    std::array<Slice, kMaxParts> msgs;
    if (const Status s = split_message(i, data, k, msgs); s != Status::ok) return complete(i, s);
    ops[i].gets = k;
    post_direct(g, i, std::span<Slice>(msgs.data(), k));
  }

  // Posts op i's sealed messages `msgs` in order, with the mutex released
  // and the drain role taken around the posts, so posts others queue
  // meanwhile go out after these, in order, as the ring would have sent
  // them. Each message's reference is dropped before the mutex is taken
  // back; the first failed post fails the op and ends the posting. Given
  // `body` (the caller's bytes, gathered), the one message is its header
  // and goes as a gathered send of both.
  [[gnu::always_inline]] void post_direct(std::unique_lock<CoreMutex>& g, std::uint32_t i, std::span<Slice> msgs,
                                          const Slice* body = nullptr) noexcept {
    const PeerId peer = ops[i].peer;
    const std::uint32_t gen = ops[i].gen;
    peers[peer].announced = true;
    draining = true;
    g.unlock();
    Status s = Status::ok;
    for (Slice& m : msgs) {
      if (s == Status::ok) {
        auto done = [self = shared_from_this(), i, gen](const Completion& c) { self->on_sent(i, gen, c); };
        s = (body ? ep.send_gathered(peer, m, *body, std::move(done)) : ep.send(peer, m, std::move(done))).status();
      }
      m = Slice{};
    }
    g.lock();
    draining = false;
    if (s != Status::ok) send_post_failed_locked(peer, i, gen, s);
    drain(g);
  }

  void drain_queue(PeerId peer) noexcept {
    PeerState& ps = peers[peer];
    while (ps.credits > 0 && ps.qhead != kNone) {
      const std::uint32_t i = ps.qhead;
      ps.qhead = ops[i].next;
      if (ps.qhead == kNone) ps.qtail = kNone;
      ops[i].next = kNone;
      ops[i].state = State::active;
      dispatch_send(i);
    }
  }

  Clock::time_point deadline_for(std::uint64_t length) const noexcept {
    if (cfg.rendezvous_timeout.count() <= 0) return Clock::time_point::max();
    double seconds = std::chrono::duration<double>(cfg.rendezvous_timeout).count();
    const auto bw = ep.config().min_bandwidth;
    if (bw > 0) seconds += static_cast<double>(length) / static_cast<double>(bw);
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }

  // ---------- arrival ----------
  // Receive o matched the message `h` from src: what its completion says
  // of the message.
  [[gnu::always_inline]] void note_match(Op& o, PeerId src, const mw::Header& h) noexcept {
    o.result.peer = src;
    o.result.tag = h.tag;
    o.result.length = h.length;
    o.result.request_id = h.space == mw::Space::user ? h.reply_id : 0;
    ++st.received;
  }

  // A matched eager message or rts for receive op i. `ldo` is the bounce it
  // arrived in; returns true when the receive kept it (zero copy).
  [[gnu::always_inline]] bool deliver(std::uint32_t i, PeerId src, const mw::Header& h, const RemoteRef& ref,
                                      Ldo& ldo) noexcept {
    Op& o = ops[i];
    note_match(o, src, h);
    if (h.type == mw::Type::eager) {
      if (o.zero_copy) {
        (void)ldo.resize_data(h.length);
        o.result.received = h.length;
        o.result.ldo = std::move(ldo);
        complete(i, Status::ok);
        return true;
      }
      copy_eager(i, src, h, ldo.data().data(), false);
      return false;
    }
    start_rendezvous_recv(i, src, h, ref);
    return false;
  }

  // Receive i (a copying one) takes the eager message `h` of src, its
  // payload at `payload`; `note`: its completion does not say so yet.
  [[gnu::always_inline]] void copy_eager(std::uint32_t i, PeerId src, const mw::Header& h, const std::byte* payload,
                                         bool note = true) noexcept {
    Op& o = ops[i];
    if (note) note_match(o, src, h);
    const std::uint64_t n = std::min<std::uint64_t>(h.length, o.buf.length());
    platform::copy_message(o.buf.address(), payload, n);
    o.result.received = n;
    spent_buffer = std::move(o.buf);  // its reference dropped later (spent_buffer)
    complete(i, n < h.length ? Status::truncated : Status::ok);
  }

  // Receive i matched an rts: pull the payload with gets, then fin. Out of
  // line and cold: a rendezvous moves at least the eager threshold's bytes,
  // and the eager path stays the straight code it runs through.
  [[gnu::cold]] void start_rendezvous_recv(std::uint32_t i, PeerId src, const mw::Header& h,
                                           const RemoteRef& ref) noexcept {
    Op& o = ops[i];
    o.state = State::active;
    o.rendezvous = true;
    o.peer = src;
    o.ref = ref;
    o.rdv_msg = h.msg_id;
    if (o.zero_copy) {
      auto m = alloc_message(h.length);
      if (!m) {
        send_control(src, mw::Type::fin, h.msg_id, m.status());
        complete(i, m.status());
        return;
      }
      o.buf = *Slice::data(std::move(*m));
    }
    o.want = std::min<std::uint64_t>(h.length, o.buf.length());
    o.take = o.want;
    if (!ref.contains(0, o.want)) {
      ++st.rejected;
      send_control(src, mw::Type::fin, h.msg_id, Status::malformed);
      complete(i, Status::malformed);
      return;
    }
    if (split_from != 0 && o.want >= split_from) grant_tail(i, h.msg_id);
    issue_gets(i);
  }

  // Split rendezvous: the second half of receive i's bytes (from a page
  // boundary) goes to the sender's puts through a write-only exposure of
  // that range; the receiver gets the first half meanwhile. Where the
  // provider's transfers are copies made by their initiator, both
  // processes' CPUs copy at once instead of the receiver's alone. Queued
  // before the first get, so the sender starts while we copy. Anything
  // that fails here leaves the whole message to the gets.
  [[gnu::cold]] void grant_tail(std::uint32_t i, std::uint64_t msg_id) noexcept {
    Op& o = ops[i];
    const std::uint64_t head = (o.want / 2) & ~std::uint64_t{4095};
    if (head == 0) return;
    auto tail = o.buf.select(head, o.want - head);
    if (!tail) return;
    auto m = alloc_message(mw::kRtsSize);
    if (!m) return;
    mw::Header h;
    h.type = mw::Type::grant;
    h.tag = head;
    h.length = o.want - head;
    h.msg_id = msg_id;
    h.reply_id = make_token(o.gen, i);
    // No credits ride on a grant: it can still fail in its post (the
    // expose) after this, and credits in it would be lost.
    stamp(h);
    Post p;
    p.kind = PostKind::grant;
    p.peer = o.peer;
    p.op = i;
    p.gen = o.gen;
    p.local = std::move(*tail);
    p.msg = *Slice::data(std::move(*m));
    mw::encode(h, p.msg.address());
    if (!push_post(std::move(p))) return;
    o.want = head;
    o.put_wait = o.grant_sent = true;
    o.deadline = deadline_for(o.take - head);
    ++st.rendezvous_split;
  }

  // The grant could not be made or sent: receive i fetches its tail itself,
  // unless its fin (announcing the grant) is out already: then it fails.
  [[gnu::cold]] void ungrant(std::uint32_t i, Status s) noexcept {
    Op& o = ops[i];
    o.put_wait = false;
    if (o.fin_sent) {
      if (o.rdv_status == Status::ok) o.rdv_status = s;
      if (o.gets == 0 && !o.fetch_wait) finish_rendezvous_recv(i);
      return;
    }
    o.grant_sent = false;
    o.want = o.take;
    o.deadline = Clock::time_point::max();
    if (!o.fetch_wait) issue_gets(i);
    pump_fetches();
  }

  // Queues op i's next chunk (bytes [issued, issued + chunk) of its buffer)
  // as a get from or a put to `remote_offset` of its peer's reference;
  // false, with rdv_status set, when it cannot.
  [[gnu::cold]] bool push_chunk(std::uint32_t i, PostKind kind, std::uint64_t remote_offset) noexcept {
    Op& o = ops[i];
    const std::uint64_t n = std::min(chunk, o.want - o.issued);
    auto local = o.buf.select(o.issued, n);
    if (!local) {
      o.rdv_status = local.status();
      return false;
    }
    Post p;
    p.kind = kind;
    p.peer = o.peer;
    p.op = i;
    p.gen = o.gen;
    p.local = std::move(*local);
    p.ref = o.ref;
    p.remote_offset = remote_offset;
    if (!push_post(std::move(p))) {
      o.rdv_status = Status::would_block;
      return false;
    }
    o.issued += n;
    ++o.gets;
    return true;
  }

  // Issues the puts of split send i that the per-message depth allows
  // (its bytes leave only after the grant: no Messenger-wide cap, the
  // receiver's gets are capped on its side); once none is in flight and
  // none is left (or one failed), tells the receiver with a done.
  [[gnu::cold]] void issue_puts(std::uint32_t i) noexcept {
    Op& o = ops[i];
    while (o.gets < cfg.rendezvous_depth && o.issued < o.want && o.rdv_status == Status::ok) {
      if (!push_chunk(i, PostKind::put, o.issued - o.put_base)) break;
    }
    if (o.gets != 0 || (o.issued < o.want && o.rdv_status == Status::ok)) return;
    if (o.want != 0) {
      send_control(o.peer, mw::Type::done, o.rdv_msg, o.rdv_status);
      o.want = o.issued = 0;
    }
    try_finish_send(i);
  }

  // Rendezvous send i completes once the receiver's fin is in, no put
  // reads its buffer any more, and no grant the fin announced is still
  // due. rdv_status holds the first failure (ours or the fin's).
  [[gnu::cold]] void try_finish_send(std::uint32_t i) noexcept {
    Op& o = ops[i];
    if (!o.fin_seen || o.gets != 0 || (o.granted ? o.want != 0 : o.fin_granted)) return;
    o.fin_wait = false;
    complete(i, o.rdv_status);
  }

  // Issues the gets of receive i that the per-message depth and the
  // Messenger-wide cap allow; a receive that gets none while it still has
  // bytes to fetch waits in the fetch queue for another's get to finish.
  [[gnu::cold]] void issue_gets(std::uint32_t i) noexcept {
    Op& o = ops[i];
    while (o.gets < cfg.rendezvous_depth && o.issued < o.want && o.rdv_status == Status::ok) {
      if (gets_in_flight >= max_gets) {
        if (o.gets == 0) enqueue_fetch(i);
        return;
      }
      if (!push_chunk(i, PostKind::get, o.issued)) break;
      ++gets_in_flight;
    }
    if (o.gets == 0 && (o.issued >= o.want || o.rdv_status != Status::ok)) finish_rendezvous_recv(i);
  }

  [[gnu::cold]] void enqueue_fetch(std::uint32_t i) noexcept {
    Op& o = ops[i];
    o.fetch_wait = true;
    o.next = kNone;
    if (fetch_tail != kNone) ops[fetch_tail].next = i; else fetch_head = i;
    fetch_tail = i;
  }
  [[gnu::cold]] void unlink_fetch(std::uint32_t i) noexcept {
    std::uint32_t prev = kNone;
    for (std::uint32_t q = fetch_head; q != kNone; prev = q, q = ops[q].next) {
      if (q != i) continue;
      if (prev == kNone) fetch_head = ops[q].next; else ops[prev].next = ops[q].next;
      if (fetch_tail == q) fetch_tail = prev;
      break;
    }
    ops[i].next = kNone;
    ops[i].fetch_wait = false;
  }
  // A get finished (or failed to post): the slot goes to the receives
  // waiting for one, in match order.
  [[gnu::cold]] void pump_fetches() noexcept {
    while (fetch_head != kNone && gets_in_flight < max_gets) {
      const std::uint32_t i = fetch_head;
      fetch_head = ops[i].next;
      if (fetch_head == kNone) fetch_tail = kNone;
      ops[i].next = kNone;
      ops[i].fetch_wait = false;
      issue_gets(i);  // issues at least one: there is a slot
    }
  }

  // Our gets of receive i are over: the fin goes out at once (the sender's
  // buffer is free of our gets; it need not wait for our done), announcing
  // the grant if one went out; the receive completes once the sender's
  // done is in too (its puts write our buffer until then).
  [[gnu::cold]] void finish_rendezvous_recv(std::uint32_t i) noexcept {
    Op& o = ops[i];
    const Status s = o.rdv_status;
    if (!o.fin_sent) {
      o.fin_sent = true;
      if (ep.usable(o.peer)) {
        send_control(o.peer, mw::Type::fin, o.rdv_msg, s, o.grant_sent ? make_token(o.gen, i) : 0);
      }
    }
    if (o.put_wait) return;
    if (s == Status::ok && o.zero_copy) o.result.ldo = o.buf.ldo();
    o.result.received = s == Status::ok ? o.take : 0;
    complete(i, s != Status::ok ? s : o.take < o.result.length ? Status::truncated : Status::ok);
  }

  // An in-sequence eager/rts message from src. Returns true when `ldo` was
  // kept (matched zero-copy or held as unexpected).
  [[gnu::always_inline]] bool arrive(PeerId src, const mw::Header& h, const RemoteRef& ref, Ldo& ldo,
                                     bool credit_counted) noexcept {
    for (std::uint32_t i = posted_head; i != kNone; i = ops[i].next) {
      if (!matches(ops[i], src, h.space, h.tag)) continue;
      unlink_posted(i);
      if (!credit_counted) ++peers[src].owed;
      return deliver(i, src, h, ref, ldo);
    }
    return hold_unexpected(src, h, ref, ldo, credit_counted);
  }

  // An in-sequence message of src, `carried` payload bytes after its
  // header: the split eager path when one is being received or this one
  // belongs to it, else arrive(). Returns true when `ldo` was kept.
  [[gnu::always_inline]] bool arrive_in_seq(PeerId src, const mw::Header& h, const RemoteRef& ref, Ldo& ldo,
                                            std::uint64_t carried) noexcept {
    if (peers[src].as.active || h.type == mw::Type::lead || h.type == mw::Type::part) [[unlikely]] {
      return arrive_split(src, h, ref, ldo, carried);
    }
    return arrive(src, h, ref, ldo, false);
  }

  [[gnu::noinline]] bool arrive_split(PeerId src, const mw::Header& h, const RemoteRef& ref, Ldo& ldo,
                                      std::uint64_t carried) noexcept {
    PeerState& ps = peers[src];
    if (h.type == mw::Type::part) {
      ++ps.owed;  // copied out of its bounce below: the credit comes back
      if (!ps.as.next(h)) {
        // Not the next part of the message being received, or none is: the
        // peer broke the protocol; that message is lost.
        ++st.rejected;
        if (ps.as.active) abandon_assembly(src, Status::malformed);
        return false;
      }
      take_part(src, h.tag, ldo.data().data(), h.length);
      return false;
    }
    if (ps.as.active) {
      // A new message before the last one's parts were all in.
      ++st.rejected;
      abandon_assembly(src, Status::malformed);
    }
    if (h.type == mw::Type::lead) return start_lead(src, h, ldo, carried);
    return arrive(src, h, ref, ldo, false);
  }

  // A lead: the earliest posted receive that matches takes the message as
  // its parts come (zero copy: into an LDO of its length); none matches:
  // the message is assembled aside, in an LDO with the bounce's layout
  // (or, the pool refusing one, in the bounce itself, which has room for
  // any eager payload), and matched as a whole eager message once
  // complete. Its credit comes back when a receive takes it, as an eager
  // message's would.
  bool start_lead(PeerId src, const mw::Header& h, Ldo& ldo, std::uint64_t carried) noexcept {
    PeerState& ps = peers[src];
    ps.as.start(h, carried);
    ps.as_hdr = h;
    ps.as_op = kNone;
    for (std::uint32_t i = posted_head; i != kNone; i = ops[i].next) {
      if (!matches(ops[i], src, h.space, h.tag)) continue;
      unlink_posted(i);
      ++ps.owed;
      Op& o = ops[i];
      note_match(o, src, h);
      o.peer = src;  // fail_peer finds it
      if (o.zero_copy) {
        auto m = alloc_message(h.length);
        if (!m) {
          complete(i, m.status());  // the parts are dropped as they come
          return false;
        }
        o.buf = *Slice::data(std::move(*m));
      }
      o.assembling = true;  // its deadline is set by the next scan: no clock read here
      ps.as_op = i;
      ps.as_gen = o.gen;
      copy_part(o, 0, ldo.data().data(), carried);
      return false;
    }
    if (auto held = alloc_held(h.length)) {
      ps.as_ldo = std::move(*held);
      std::memcpy(ps.as_ldo.data().data(), ldo.data().data(), carried);
      return false;
    }
    ps.as_ldo = std::move(ldo);
    return true;
  }

  // Bytes [off, off + n) of a split message into receive o's buffer, as
  // much of them as it holds (the rest is truncated).
  static void copy_part(const Op& o, std::uint64_t off, const std::byte* from, std::uint64_t n) noexcept {
    if (off >= o.buf.length()) return;
    std::memcpy(o.buf.address() + off, from, std::min(n, o.buf.length() - off));
  }

  // A part of src's split message (checked by Assembly::next); the last
  // one completes it.
  void take_part(PeerId src, std::uint64_t off, const std::byte* from, std::uint64_t n) noexcept {
    PeerState& ps = peers[src];
    if (ps.as_op != kNone) {
      Op& o = ops[ps.as_op];
      if (o.gen == ps.as_gen && o.state == State::active && o.assembling) {
        copy_part(o, off, from, n);
      } else {
        ps.as_op = kNone;
      }
    } else if (ps.as_ldo) {
      std::memcpy(ps.as_ldo.data().data() + off, from, n);
    }
    if (ps.as.active) return;
    if (ps.as_op != kNone) {
      const std::uint32_t i = ps.as_op;
      ps.as_op = kNone;
      Op& o = ops[i];
      o.assembling = false;
      const std::uint64_t take = std::min(o.result.length, o.buf.length());
      o.result.received = take;
      if (o.zero_copy) o.result.ldo = o.buf.ldo();
      complete(i, take < o.result.length ? Status::truncated : Status::ok);
    } else if (ps.as_ldo) {
      Ldo l = std::move(ps.as_ldo);
      mw::Header e = ps.as_hdr;
      e.type = mw::Type::eager;
      (void)arrive(src, e, RemoteRef{}, l, false);
    }
  }

  // src's split message is over before its last part: its receive
  // completes with `s`, or the copy aside is dropped (and its credit
  // comes back).
  [[gnu::cold]] void abandon_assembly(PeerId src, Status s) noexcept {
    PeerState& ps = peers[src];
    if (ps.as_op != kNone) {
      Op& o = ops[ps.as_op];
      if (o.gen == ps.as_gen && o.state == State::active && o.assembling) {
        o.assembling = false;
        complete(ps.as_op, s);
      }
    } else if (ps.as_ldo) {
      ps.as_ldo.reset();
      ++ps.owed;
    }
    ps.as = mw::Assembly{};
    ps.as_op = kNone;
  }

  // A message no posted receive matched: held (arrive). Out of line so
  // that the matched path stays short.
  [[gnu::noinline]] bool hold_unexpected(PeerId src, const mw::Header& h, const RemoteRef& ref, Ldo& ldo,
                                         bool credit_counted) noexcept {
    if (h.space == mw::Space::reply || free_unexp.empty()) {
      // A reply nobody waits for (its request was canceled or timed out),
      // or no room to hold it (only a sender ignoring credits gets here).
      ++st.rejected;
      if (!credit_counted) ++peers[src].owed;
      return false;
    }
    // A message much smaller than its bounce is held as a right-sized copy
    // and the bounce goes straight back to the receive ring: otherwise
    // every unexpected message pins a whole bounce (64 + eager threshold
    // bytes, 64 KiB on shm), and a server with N senders each using its
    // credits holds N x peer_credits bounces (receive memory growing with
    // the number of peers, docs/scale.md). Copying a small message costs
    // less than its bounce's memory; a large one is held as it is.
    bool kept = true;
    Ldo held;
    const std::uint64_t payload = h.type == mw::Type::eager ? h.length : 0;
    if (mw::kHeaderSize + payload <= ldo.capacity() / kCompactRatio) {
      if (auto copy = alloc_held(payload)) {
        std::memcpy(copy->base() + kWireHeaderSize, ldo.base() + kWireHeaderSize, mw::kHeaderSize + payload);
        held = std::move(*copy);
        kept = false;
      }
    }
    Unexp& e = unexpected[hold(src, h, ref, kept ? ldo : held, false)];
    ++st.unexpected;
    // Credits come back at once only while both budgets hold with room
    // for what every sender we know may still send on the credits it has
    // (peer_credits each): bytes, and entries of the unexpected table, so
    // a table filling faster than the bytes (small messages held as
    // copies) withholds credits instead of dropping messages.
    if (!credit_counted) {
      if (st.unexpected_bytes <= cfg.unexpected_budget &&
          st.unexpected_held + std::uint64_t{peers_heard} * cfg.peer_credits <= cfg.max_unexpected) {
        ++peers[src].owed;
      } else {
        e.credit_held = true;
        ++st.credits_withheld;
      }
    }
    return kept;
  }

  // Takes a free unexpected entry (the caller checked there is one) for a
  // message of `src`, charges its LDO to the budget and appends it to the
  // arrival-ordered list.
  std::uint32_t hold(PeerId src, const mw::Header& h, const RemoteRef& ref, Ldo& ldo, bool early,
                     std::uint64_t bytes = 0) noexcept {
    const std::uint32_t u = free_unexp.back();
    free_unexp.pop_back();
    Unexp& e = unexpected[u];
    e.used = true;
    e.early = early;
    if (early) ++peers[src].early;
    e.credit_held = false;
    e.peer = src;
    e.hdr = h;
    e.ref = ref;
    e.ldo = std::move(ldo);
    e.bytes = bytes;
    e.charged = e.ldo.capacity();
    st.unexpected_bytes += e.charged;
    ++st.unexpected_held;
    e.prev = unexp_tail;
    e.next = kNone;
    if (unexp_tail != kNone) unexpected[unexp_tail].next = u; else unexp_head = u;
    unexp_tail = u;
    return u;
  }

  // Early arrivals of `src` that are now in sequence. The walk of the
  // unexpected list happens only while `src` has early arrivals (rare: two
  // threads running completion callbacks); before 2026-11-26 it ran for every
  // in-sequence message, and with N senders streaming into a receiver that
  // holds their messages as unexpected it was O(N x peer_credits) per message
  // (68% of a 32-peer shm server's CPU, docs/scale.md).
  [[gnu::cold]] void release_early(PeerId src) noexcept {
    for (bool found = true; found && peers[src].early > 0;) {
      found = false;
      for (std::uint32_t u = unexp_head; u != kNone; u = unexpected[u].next) {
        Unexp& e = unexpected[u];
        if (!e.early || e.peer != src || e.hdr.seq != peers[src].recv_seq) continue;
        ++peers[src].recv_seq;
        Ldo l = std::move(e.ldo);
        const mw::Header h = e.hdr;
        const RemoteRef r = e.ref;
        const std::uint64_t carried = e.bytes;
        release_unexp(u);
        (void)arrive_in_seq(src, h, r, l, carried);
        found = true;
        break;
      }
    }
  }

  // A rendezvous's control message (fin, grant, done) for one of our ops,
  // checked against it (on_message). Cold: one per rendezvous chunk set,
  // not per message.
  [[gnu::cold]] void on_rendezvous_control(PeerId src, const mw::Header& h, std::span<const std::byte> bytes) noexcept {
    switch (h.type) {
      case mw::Type::fin: {
        const auto i = static_cast<std::uint32_t>(h.msg_id & 0xffffffffu);
        if (i < ops.size() && ops[i].gen == static_cast<std::uint32_t>(h.msg_id >> 32) &&
            ops[i].state == State::active && ops[i].fin_wait && ops[i].peer == src) {
          Op& o = ops[i];
          const auto s = static_cast<Status>(h.status);
          if (s != Status::truncated && s != Status::ok && o.rdv_status == Status::ok) o.rdv_status = s;
          o.fin_seen = true;
          o.fin_granted = h.reply_id != 0;  // a grant comes (or came): serve it first
          try_finish_send(i);
        } else {
          ++st.rejected;
        }
        break;
      }
      case mw::Type::grant: {
        // Our rendezvous send i: the receiver wants [tag, tag + length)
        // put into its exposure. Checked against the message we sent; a
        // grant we cannot serve gets a failed done, so the receiver does
        // not wait for its deadline.
        const auto i = static_cast<std::uint32_t>(h.msg_id & 0xffffffffu);
        auto r = RemoteRef::decode(bytes.subspan(mw::kHeaderSize, mw::kRefSize));
        const bool mine = i < ops.size() && ops[i].gen == static_cast<std::uint32_t>(h.msg_id >> 32) &&
                          ops[i].state == State::active && ops[i].fin_wait && ops[i].peer == src &&
                          !ops[i].granted;
        if (!mine || !r || !r->contains(0, h.length) || h.tag + h.length > ops[i].buf.length()) {
          ++st.rejected;
          send_control(src, mw::Type::done, h.reply_id, Status::malformed);
          break;
        }
        Op& o = ops[i];
        o.ref = *r;
        o.put_base = o.issued = h.tag;
        o.want = h.tag + h.length;
        o.rdv_msg = h.reply_id;
        o.granted = true;
        issue_puts(i);
        break;
      }
      case mw::Type::done: {
        // The sender's puts into the range we granted receive i are over.
        const auto i = static_cast<std::uint32_t>(h.msg_id & 0xffffffffu);
        if (i < ops.size() && ops[i].gen == static_cast<std::uint32_t>(h.msg_id >> 32) &&
            ops[i].state == State::active && ops[i].put_wait && ops[i].peer == src) {
          Op& o = ops[i];
          o.put_wait = false;
          const auto s = static_cast<Status>(h.status);
          if (s != Status::ok && o.rdv_status == Status::ok) o.rdv_status = s;
          if (!o.fetch_wait) issue_gets(i);  // finishes it when its gets are done too
        } else {
          ++st.rejected;
        }
        break;
      }
      default: break;
    }
  }

  // What any message of src's (checked) tells us: that it is there, its
  // limits, the credits it gives back.
  [[gnu::always_inline]] PeerState& heard_from(PeerId src, const mw::Header& h) noexcept {
    PeerState& ps = peers[src];
    if (!ps.heard) {
      ps.heard = true;
      ++peers_heard;
      if (src >= peers_high) peers_high = src + 1;
    }
    if (!h.brief) learn(ps, h);  // a brief header carries no limits
    ps.credits = std::min(ps.grant, ps.credits + h.credits);
    return ps;
  }

  // --- messages in place (MessageSink) ---

  // The endpoint's poll, its mutex held, shows us src's message where it
  // lies (a shm ring), or its delivery of completions a completed bounce's
  // message before the bounce's callback (other backends). Taken only on
  // the plain path: an eager message in sequence for which a copying
  // receive is posted, the mutex free at once. Everything else (a control
  // message, a rendezvous, a split message, one out of sequence or
  // unexpected, a zero-copy receive, a message that does not parse) is
  // declined, and comes (back) through a bounce receive's callback to
  // on_message, which handles it and counts what it rejects. The header is
  // read once, by parse, into `h`; the payload is copied once, into the
  // receive's buffer.
  [[gnu::hot]] Take take(PeerId src, std::span<const std::byte> bytes) noexcept override {
    std::unique_lock<CoreMutex> g(mu, std::try_to_lock);
    if (!g.owns_lock() || closed || src >= peers.size()) return Take::declined;
    mw::Header h;
    if (mw::parse(bytes, threshold, h) != Status::ok || h.type != mw::Type::eager) return Take::declined;
    PeerState& ps = peers[src];
    if (h.seq != ps.recv_seq || ps.as.active || ps.early > 0) return Take::declined;
    std::uint32_t i = posted_head;
    while (i != kNone && !matches(ops[i], src, h.space, h.tag)) i = ops[i].next;
    if (i == kNone || ops[i].zero_copy) return Take::declined;
    (void)heard_from(src, h);
    ++ps.recv_seq;
    unlink_posted(i);
    ++ps.owed;
    copy_eager(i, src, h, bytes.data() + h.header_size());
    ++st.received_in_place;
    hand_off_if_awaited(i);
    // Posts these cause (credits back, sends the credits let go) wait for
    // settle(): the endpoint's mutex is held here.
    drain_queue(src);
    maybe_return_credits(src);
    changed();
    return post_count != 0 || !graveyard.empty() || !kept_ended.empty() ? Take::settle : Take::taken;
  }

  // A kept send's completion before its callback (MessageSink::sent): what
  // on_kept_sent does for an ok completion of the peer's current kept send,
  // with the drain left to settle(). Declined when the lock is busy, the
  // send is not the peer's current one (its first completion, which
  // brings the token; one ended since; someone else's) or the core closed:
  // the callback then runs as before.
  [[gnu::hot]] Take sent(const Completion& c) noexcept override {
    std::unique_lock<CoreMutex> g(mu, std::try_to_lock);
    if (!g.owns_lock() || closed || c.peer >= peers.size()) return Take::declined;
    PeerState& ps = peers[c.peer];
    if (!ps.ks_busy || !ps.ks_token || ps.ks_token != c.token) return Take::declined;
    const std::uint32_t i = ps.ks_op;
    const bool waiting = kept_op_waiting(ps);
    ps.ks_busy = false;
    ps.ks_op = kNone;
    if (waiting) {
      ops[i].result.length = c.bytes >= mw::kHeaderSize ? c.bytes - mw::kHeaderSize : 0;
      complete(i, Status::ok);
    }
    ++st.kept_sends_taken;
    changed();
    return post_count != 0 || !graveyard.empty() || !kept_ended.empty() ? Take::settle : Take::taken;
  }

  void settle() noexcept override {
    std::unique_lock<CoreMutex> g(mu);
    if (post_count != 0 || !graveyard.empty() || !kept_ended.empty()) drain(g);
  }

  // At the end of construction: the endpoint offers us its messages in
  // place where its backend can (never removed: the endpoint may outlive
  // the Messenger, and a closed core declines everything). send() copies
  // eager payloads of up to `copy_max` bytes straight into the transport
  // (MessengerConfig::eager_copy), as far as the transport takes them.
  void install_sink(const std::shared_ptr<MessengerCore>& self, std::uint64_t copy_max) {
    in_place = ep.set_message_sink(std::shared_ptr<MessageSink>(self, self.get()));
    const std::uint64_t fast = ep.transfer_traits().fast_message_limit;
    copy_limit = !in_place || copy_max == ~std::uint64_t{0} ? 0
                 : copy_max == 0                             ? fast
                                                             : std::min(fast, mw::kHeaderSize + copy_max);
  }

  // A bounce receive completed (mutex held). Returns whether the bounce
  // LDO must be replaced (it was kept).
  [[gnu::always_inline]] bool on_message(PeerId src, std::span<const std::byte> bytes, Ldo& ldo) noexcept {
    mw::Header h;
    if (mw::parse(bytes, threshold, h) != Status::ok || src == kAnyPeer || src >= peers.size()) {
      ++st.rejected;
      return false;
    }
    if (h.brief) [[unlikely]] {
      // Arrived in a bounce: its payload moves to where a full header's
      // would be (at most kBriefMax bytes), so the bounce is laid out as
      // every eager message's (data() is the payload; recv_ldo hands it
      // over as it is).
      std::byte* const at = ldo.base() + kWireHeaderSize;
      std::memmove(at + mw::kHeaderSize, at + mw::kBriefHeaderSize, h.length);
    }
    const std::uint64_t carried = mw::carried(bytes, h);
    PeerState& ps = heard_from(src, h);
    bool kept = false;
    switch (h.type) {
      case mw::Type::credit: break;
      case mw::Type::fin:
      case mw::Type::grant:
      case mw::Type::done:
        on_rendezvous_control(src, h, bytes);
        break;
      case mw::Type::eager:
      case mw::Type::rts:
      case mw::Type::lead:
      case mw::Type::part: {
        RemoteRef ref;
        if (h.type == mw::Type::rts) {
          auto r = RemoteRef::decode(bytes.subspan(mw::kHeaderSize, mw::kRefSize));
          if (!r || r->length < h.length) {
            ++st.rejected;
            ++ps.owed;
            send_control(src, mw::Type::fin, h.msg_id, Status::malformed);
            break;
          }
          ref = *r;
        }
        if (h.seq == 1 && ps.recv_seq != 1) {
          // The peer started over (a new incarnation): it knows nothing of us.
          if (ps.as.active) abandon_assembly(src, Status::peer_unreachable);
          ps.recv_seq = 1;
          ps.announced = false;
        }
        if (h.seq == ps.recv_seq) {
          ++ps.recv_seq;
          kept = arrive_in_seq(src, h, ref, ldo, carried);
          if (ps.early > 0) release_early(src);
        } else if (h.seq > ps.recv_seq && !free_unexp.empty() && h.seq - ps.recv_seq < ops.size()) {
          // Ahead of a message still being handed over (two threads ran
          // completion callbacks): hold it until its turn.
          (void)hold(src, h, ref, ldo, true, carried);
          kept = true;
        } else {
          ++st.rejected;  // a duplicate or a sequence nobody sent
        }
        break;
      }
    }
    drain_queue(src);
    maybe_return_credits(src);
    return kept;
  }

  [[gnu::hot]] void on_recv(std::uint32_t b, const Completion& c) noexcept {
    {
      std::unique_lock<CoreMutex> g(mu);
      // The kept receive goes on (parked, for a repost) after these; any
      // other status ended it, and the next post of b is a new one.
      bounce_tokens[b] = c.status == Status::ok || c.status == Status::out_of_bounds ? c.token : Token{};
      if (closed || c.status == Status::closed || c.status == Status::canceled) return;
      if (c.status == Status::ok) {
        Ldo& ldo = bounces[b];
        const std::span<const std::byte> bytes{ldo.base() + kWireHeaderSize, static_cast<std::size_t>(c.bytes)};
        if (on_message(c.peer, bytes, ldo)) {
          auto fresh = alloc_bounce();
          if (!fresh) {
            mark_empty(b);  // refilled by the scan once the pool has room
          } else {
            bounces[b] = std::move(*fresh);
          }
        }
      } else {
        ++st.rejected;
      }
      if (!bounce_empty[b]) {
        lazy.push_back(b);
        if (lazy.size() >= lazy_limit) repost_lazy_locked();
      }
      changed();
      drain(g);
    }
  }

  [[gnu::hot]] void repost_lazy_locked() noexcept {
    for (const std::uint32_t b : lazy) post_bounce(b);
    lazy.clear();
  }

  [[gnu::hot]] void on_sent(std::uint32_t i, std::uint32_t gen, const Completion& c) noexcept {
    {
      std::unique_lock<CoreMutex> g(mu);
      if (closed || i == kNone || i >= ops.size() || ops[i].gen != gen) return;
      Op& o = ops[i];
      if (o.state != State::active) return;
      if (o.fin_wait) {
        if (c.status != Status::ok) {
          o.fin_wait = false;
          complete(i, c.status);
        }
      } else if (o.gets > 0) {
        // A split eager send: done when its last part is.
        if (c.status != Status::ok && o.rdv_status == Status::ok) o.rdv_status = c.status;
        if (--o.gets == 0) complete(i, o.rdv_status);
      } else {
        o.result.length = c.bytes >= mw::kHeaderSize ? c.bytes - mw::kHeaderSize : 0;
        complete(i, c.status);
      }
      changed();
      drain(g);
    }
  }

  [[gnu::cold]] void on_got(std::uint32_t i, std::uint32_t gen, const Completion& c) noexcept {
    {
      std::unique_lock<CoreMutex> g(mu);
      if (i >= ops.size() || ops[i].gen != gen) return;
      Op& o = ops[i];
      if (o.gets > 0) {
        --o.gets;
        --gets_in_flight;
      }
      if (closed) return;
      if (c.status != Status::ok && o.rdv_status == Status::ok) o.rdv_status = c.status;
      o.done += c.status == Status::ok ? c.bytes : 0;
      issue_gets(i);  // its next chunk first: the earliest matched message finishes first
      pump_fetches();
      changed();
      drain(g);
    }
  }

  [[gnu::cold]] void on_put(std::uint32_t i, std::uint32_t gen, const Completion& c) noexcept {
    {
      std::unique_lock<CoreMutex> g(mu);
      if (i >= ops.size() || ops[i].gen != gen) return;
      Op& o = ops[i];
      if (o.gets > 0) --o.gets;
      if (closed || o.state != State::active) return;
      if (c.status != Status::ok && o.rdv_status == Status::ok) o.rdv_status = c.status;
      issue_puts(i);
      changed();
      drain(g);
    }
  }

  // The grant's send completed: a failed one never reached the sender.
  [[gnu::cold]] void on_granted(std::uint32_t i, std::uint32_t gen, const Completion& c) noexcept {
    {
      std::unique_lock<CoreMutex> g(mu);
      if (closed || i >= ops.size() || ops[i].gen != gen || ops[i].state != State::active) return;
      if (c.status != Status::ok && ops[i].put_wait) ungrant(i, c.status);
      changed();
      drain(g);
    }
  }

  // ---------- posting (no mutex) ----------
  void run_posts() noexcept {
    std::unique_lock<CoreMutex> g(mu);
    drain(g);
  }
  // Makes the queued posts (and revokes) unless another thread is at it;
  // called and returning with `g` holding the mutex, released around each
  // post. Callers that just queued under the mutex call it before letting
  // go: the same lock round, not a second one (a small message's path
  // takes the mutex a handful of times; each round trip counts).
  [[gnu::hot]] void drain(std::unique_lock<CoreMutex>& g) noexcept {
    if (draining || (post_count == 0 && graveyard.empty() && kept_ended.empty())) return;
    draining = true;
    while (post_count > 0 || !graveyard.empty() || !kept_ended.empty()) {
      if (!kept_ended.empty()) [[unlikely]] {
        const Token t = kept_ended.back();
        kept_ended.pop_back();
        g.unlock();
        (void)ep.end_kept(t);
        g.lock();
        continue;
      }
      if (!graveyard.empty()) {
        Exposure dead = std::move(graveyard.back());
        graveyard.pop_back();
        g.unlock();
        dead.revoke();
        g.lock();
        continue;
      }
      Post p = std::move(posts[post_head]);
      post_head = (post_head + 1) % posts.size();
      --post_count;
      g.unlock();
      const Status s = execute(p);
      g.lock();
      if (s != Status::ok) {
        post_failed(p, s);
        changed();
      }
    }
    draining = false;
  }

  // An rts or a grant: exposes p.local to the peer for `access`, writes the
  // reference behind the notice's header, keeps the exposure on the op
  // (dropped, i.e. revoked, when the op stopped `waiting` meanwhile) and
  // sends the notice.
  Status post_notice(std::shared_ptr<MessengerCore> self, Post& p, RemoteAccess access, bool Op::*waiting,
                     void (MessengerCore::*on_done)(std::uint32_t, std::uint32_t, const Completion&)) noexcept {
    auto x = ep.expose(p.local, access, p.peer);
    if (!x) return x.status();
    const auto wire = x->encode();
    std::memcpy(p.msg.address() + mw::kHeaderSize, wire.data(), wire.size());
    {
      std::lock_guard<CoreMutex> g(mu);
      Op& o = ops[p.op];
      if (o.gen != p.gen || o.state != State::active || !(o.*waiting)) return Status::ok;  // failed meanwhile: revoke
      o.exposure = std::move(*x);
    }
    const std::uint32_t i = p.op, gen = p.gen;
    auto t = ep.send(p.peer, p.msg,
                     [self = std::move(self), i, gen, on_done](const Completion& c) { ((*self).*on_done)(i, gen, c); });
    return t.status();
  }

  [[gnu::hot]] Status execute(Post& p) noexcept {
    // A repost makes no callback (the kept receive has its own): no
    // reference to the Core either.
    if (p.kind == PostKind::repost) return p.local ? ep.repost(p.token, p.local) : ep.repost(p.token);
    // Moved into the one callback each other post makes: one reference
    // count round trip per post instead of two.
    auto self = shared_from_this();
    switch (p.kind) {
      case PostKind::recv: {
        const std::uint32_t b = p.bounce;
        auto t = ep.post_recv_kept(p.local, [self = std::move(self), b](const Completion& c) { self->on_recv(b, c); });
        return t.status();
      }
      case PostKind::repost:
        break;  // above
      case PostKind::send: {
        const std::uint32_t i = p.op, gen = p.gen;
        auto done = [self = std::move(self), i, gen](const Completion& c) { self->on_sent(i, gen, c); };
        auto t = p.msg ? ep.send_gathered(p.peer, p.local, p.msg, std::move(done))
                       : ep.send(p.peer, p.local, std::move(done));
        return t.status();
      }
      case PostKind::rts:
        return post_notice(std::move(self), p, RemoteAccess::read_only, &Op::fin_wait, &MessengerCore::on_sent);
      case PostKind::get: {
        const std::uint32_t i = p.op, gen = p.gen;
        auto t = ep.get(p.peer, p.ref, p.remote_offset, p.local,
                        [self = std::move(self), i, gen](const Completion& c) { self->on_got(i, gen, c); });
        return t.status();
      }
      case PostKind::grant:
        return post_notice(std::move(self), p, RemoteAccess::write_only, &Op::put_wait, &MessengerCore::on_granted);
      case PostKind::put: {
        const std::uint32_t i = p.op, gen = p.gen;
        auto t = ep.put(p.local, p.peer, p.ref, p.remote_offset,
                        [self = std::move(self), i, gen](const Completion& c) { self->on_put(i, gen, c); });
        return t.status();
      }
    }
    return Status::invalid_argument;
  }

  [[gnu::cold]] void post_failed(Post& p, Status s) noexcept {
    switch (p.kind) {
      case PostKind::recv:
      case PostKind::repost:
        // Retried by the scan: into a new receive if the kept one is gone
        // (invalid_argument: it ended meanwhile), with its Slice again.
        if (s == Status::invalid_argument && bounce_tokens[p.bounce] == p.token) bounce_tokens[p.bounce] = Token{};
        bounce_bases[p.bounce] = nullptr;
        if (s != Status::closed) mark_empty(p.bounce);
        break;
      case PostKind::send:
      case PostKind::rts:
        if (p.op != kNone && p.op < ops.size() && ops[p.op].gen == p.gen && ops[p.op].state == State::active) {
          ops[p.op].fin_wait = false;
          complete(p.op, s);
        }
        break;
      case PostKind::get:
        if (p.op < ops.size() && ops[p.op].gen == p.gen) {
          Op& o = ops[p.op];
          if (o.gets > 0) {
            --o.gets;
            --gets_in_flight;
          }
          if (o.rdv_status == Status::ok) o.rdv_status = s;
          issue_gets(p.op);
          pump_fetches();
        }
        break;
      case PostKind::grant:
        if (p.op < ops.size() && ops[p.op].gen == p.gen && ops[p.op].state == State::active && ops[p.op].put_wait) {
          ungrant(p.op, s);
        }
        break;
      case PostKind::put:
        if (p.op < ops.size() && ops[p.op].gen == p.gen) {
          Op& o = ops[p.op];
          if (o.gets > 0) --o.gets;
          if (o.state != State::active) break;
          if (o.rdv_status == Status::ok) o.rdv_status = s;
          issue_puts(p.op);
        }
        break;
    }
  }

  // ---------- peers, deadlines ----------
  [[gnu::cold]] void fail_peer_locked(PeerId peer, Status s) noexcept {
    if (peer >= peers.size()) return;
    for (std::uint32_t i = 0; i < ops_high; ++i) {
      Op& o = ops[i];
      if (o.peer != peer) continue;
      if (o.state == State::posted) {
        unlink_posted(i);
        complete(i, s);
      } else if (o.state == State::queued) {
        o.state = State::active;
        complete(i, s);
      } else if (o.state == State::active && o.fin_wait) {
        o.fin_wait = false;
        complete(i, s);
      } else if (o.state == State::active && o.assembling) {
        o.assembling = false;
        complete(i, s);
      } else if (o.state == State::active && (o.fetch_wait || o.put_wait)) {
        // Matched, no get of ours in flight (or none besides the dead
        // peer's puts): nothing else writes its buffer.
        if (o.fetch_wait) unlink_fetch(i);
        o.put_wait = false;
        if (o.rdv_status == Status::ok) o.rdv_status = s;
        if (o.gets == 0) finish_rendezvous_recv(i);
      }
      // Rendezvous receives in progress finish when their gets do (the
      // endpoint fails those): their buffer is written until then.
    }
    for (std::uint32_t u = unexp_head; u != kNone;) {
      const std::uint32_t next = unexpected[u].next;
      if (unexpected[u].peer == peer) release_unexp(u);
      u = next;
    }
    if (peers[peer].heard) --peers_heard;
    {
      // Its kept send's message in flight: that op completes now (its bytes
      // were copied into the kept buffer; the kept send's own completion
      // will not find it once the state is reset).
      PeerState& ps = peers[peer];
      if (ps.ks_busy && kept_op_waiting(ps)) complete(ps.ks_op, s);
      end_kept_locked(ps);
    }
    peers[peer] = PeerState{};
  }

  // What a wait() round found of the operation it waits for.
  enum class Awaited : std::uint8_t { pending, done, invalid };

  // What a round saw of the Messenger for the quiet spin (Messenger::wait):
  // `quiet` when it left nothing to do (no repost, spare, post, revoke or
  // callback pending) at change count `seen`, with the scan due at `scan_at`.
  // `coarse`: the round's coarse clock reading, which the waiter's deadline
  // check reuses (a read is ~11 ns on an AMD EPYC guest, ~10 per round).
  struct Quiet {
    bool quiet = false;
    std::uint64_t seen = 0;
    Clock::time_point scan_at{};
    Clock::time_point coarse{};
  };

  // One round of progress (Messenger::progress, and each round of wait):
  // the endpoint's (unless the caller's own endpoint round just delivered
  // `polled` callbacks, polled >= 0), then the Messenger's own work
  // (lazy reposts, the scan, queued posts) in one lock round, in which the
  // operation `token` names, when one is given, is looked at too: done, its
  // completion is moved to `out` and its slot freed, so wait() takes no
  // lock round of its own; then the callbacks that became ready. Returns
  // how many callbacks ran.
  [[gnu::hot]] std::size_t progress_round(MessageToken token, Awaited& awaited, MessageCompletion& out,
                             Quiet* q = nullptr, std::ptrdiff_t polled = -1) noexcept {
    const bool idle = (polled >= 0 ? static_cast<std::size_t>(polled) : ep.progress()) == 0;
    {
      std::unique_lock<CoreMutex> g(mu);
      drop_spent();
      // Nothing arrived this round: the time to repost emptied bounces and
      // to allocate the next small messages.
      if (idle && !closed) {
        if (!lazy.empty()) repost_lazy_locked();
        while (spares.size() < kSpares && !spares_starved) {
          auto m = alloc_message(mw::kHeaderSize + kSparePayload);
          if (!m) {
            spares_starved = true;
            break;
          }
          spares.push_back(std::move(*m));
        }
      }
      // The scan's rate limit on the coarse clock (a precise reading costs
      // about 100 ns on this kind of VM, and this runs every spin round);
      // the scan itself, once per millisecond or so, takes a precise one.
      // A round whose endpoint round delivered (the one a waited message
      // completes in) may skip the reading: the scan comes at most one
      // round later (platform::clock_read_due), and so does a waiter's
      // deadline check, which reuses the reading.
      const bool read_clock = platform::clock_read_due(!idle, scan_read_skipped);
      Clock::time_point coarse{};
      if (read_clock) {
        coarse = platform::CoarseClock::now();
        if (coarse >= next_scan && !closed) {
          const auto now = Clock::now();
          next_scan = now + std::chrono::milliseconds{1};
          scan_locked(now);
          changed();
        }
      }
      // Whoever queues a post later drains it itself; the usual spin round
      // has nothing to post.
      if (post_count != 0 || !graveyard.empty() || !kept_ended.empty()) drain(g);
      if (token) {
        Op* o = find(token);
        if (!o || o->has_cb) {
          awaited = Awaited::invalid;
        } else if (o->state == State::done) {
          awaited = Awaited::done;
          out = std::move(o->result);
          free_op(static_cast<std::uint32_t>(token.value & 0xffffffffu));
        }
      }
      if (q) {
        q->quiet = lazy.empty() && (spares.size() == kSpares || spares_starved) && post_count == 0 &&
                   graveyard.empty() && kept_ended.empty() && ready_count == 0 && !closed;
        q->seen = changes.load(std::memory_order_relaxed);
        q->scan_at = next_scan;
        if (read_clock) q->coarse = coarse;
      }
      if (ready_count == 0) return 0;
    }
    std::size_t delivered = 0;
    for (;;) {
      MessageCompletion done;
      MessageCallback cb;
      {
        std::lock_guard<CoreMutex> g(mu);
        if (ready_count == 0) break;
        const std::uint32_t i = ready[ready_head];
        ready_head = (ready_head + 1) % ready.size();
        --ready_count;
        Op& o = ops[i];
        done = std::move(o.result);
        cb = std::move(o.cb);
        free_op(i);
      }
      cb(done);
      ++delivered;
    }
    return delivered;
  }

  [[gnu::cold]] void scan_locked(Clock::time_point now) noexcept {
    repost_lazy_locked();
    spares_starved = false;
    // Dead peers and deadlines.
    for (std::uint32_t i = 0; i < ops_high; ++i) {
      Op& o = ops[i];
      if (o.state == State::free || o.state == State::done) continue;
      if ((o.fetch_wait || o.put_wait || o.assembling) && !ep.usable(o.peer)) {
        fail_peer_locked(o.peer, Status::peer_unreachable);
        continue;
      }
      if (o.assembling) {
        // The first scan since its lead sets the deadline (the lead's
        // arrival reads no clock); at it, the parts that never came (a post
        // of the sender's failed) fail the receive and later ones are
        // rejected.
        if (o.deadline == Clock::time_point::max()) {
          o.deadline = deadline_for(o.result.length);
        } else if (o.deadline <= now) {
          abandon_assembly(o.peer, Status::timeout);
        }
        continue;
      }
      if (o.put_wait && o.deadline <= now) {
        // The sender's done never came: finish (fin with the timeout) once
        // our own gets are over; the exposure is revoked on completion.
        o.put_wait = false;
        if (o.rdv_status == Status::ok) o.rdv_status = Status::timeout;
        if (!o.fetch_wait) issue_gets(i);
        continue;
      }
      const bool waiting = o.state == State::posted || o.state == State::queued || o.fin_wait;
      if (!waiting) continue;
      if (o.peer != kAnyPeer && !ep.usable(o.peer)) {
        fail_peer_locked(o.peer, Status::peer_unreachable);
        continue;
      }
      if (o.deadline <= now) {
        if (o.state == State::posted) unlink_posted(i);
        if (o.state == State::queued) unqueue_for_credit(i);
        o.fin_wait = false;
        complete(i, Status::timeout);
      }
    }
    // Bounces the pool could not refill, credits a full pool kept owed.
    for (std::uint32_t b = 0; bounces_empty > 0 && b < bounces.size(); ++b) {
      if (!bounce_empty[b]) continue;
      if (!bounces[b] || bounce_held(b)) {
        auto fresh = alloc_bounce();
        if (!fresh) break;
        bounces[b] = std::move(*fresh);
      }
      bounce_empty[b] = 0;
      --bounces_empty;
      post_bounce(b);
    }
    for (PeerId p = 0; p < peers_high; ++p) {
      if (peers[p].owed > 0) maybe_return_credits(p);
    }
  }
};

}  // namespace detail

using Core = detail::MessengerCore;

// ---------- Messenger ----------

Messenger::Messenger(Endpoint& endpoint, Pool& pool, const MessengerConfig& config)
    : core_(std::make_shared<Core>(endpoint, pool, config)) {
  core_->weak_self = core_;
  Core& c = *core_;
  const auto& cfg = c.cfg;
  if (cfg.receive_buffers == 0 || cfg.peer_credits == 0 || cfg.max_operations == 0 || cfg.max_peers == 0 ||
      cfg.rendezvous_depth == 0 || cfg.max_operations > 0x7fffffff || cfg.peer_credits > mw::kMaxCredits) {
    throw Error(Status::invalid_argument, 0,
                "messenger: receive_buffers, peer_credits, max_operations, max_peers and rendezvous_depth must be "
                "positive, peer_credits at most 65535");
  }
  if (cfg.serialized && endpoint.config().progress_thread) {
    throw Error(Status::invalid_argument, 0,
                "messenger: serialized promises that calls never overlap, but the endpoint runs a progress thread, "
                "which runs the Messenger's protocol work beside the application's calls");
  }
  const std::uint64_t limit = endpoint.message_size_limit();
  // What one message may carry: what our endpoint sends, and what it lets
  // peers send it (peers send eagerly at most what we tell them).
  const std::uint64_t incoming = endpoint.transfer_traits().incoming_message_limit;
  const std::uint64_t both_ways = std::min(limit, incoming);
  if (both_ways < 2 * mw::kRtsSize) {
    throw Error(Status::unsupported, 0,
                "messenger: the endpoint " + std::string(limit < incoming ? "sends" : "accepts") + " messages of " +
                    std::to_string(both_ways) + " bytes at most, too small for the protocol header");
  }
  c.threshold = cfg.eager_threshold ? cfg.eager_threshold : default_eager_threshold(endpoint);
  // At least kMinEager (an rts fits; the limit every peer assumes of us
  // before we tell it ours), at most what one message both ways and the
  // header field carry (accept_eager).
  c.threshold = std::clamp<std::uint64_t>(c.threshold, mw::kMinEager,
                                          std::min<std::uint64_t>(both_ways - mw::kHeaderSize, mw::kMaxEager));
  // Split eager: only where the backend has a faster path for shorter
  // messages (TransferTraits::fast_message_limit), for payloads the header
  // pushes past it, up to kMaxParts messages and the threshold.
  const TransferTraits traits = endpoint.transfer_traits();
  if (traits.fast_message_limit > 2 * mw::kHeaderSize && cfg.eager_split != ~std::uint64_t{0}) {
    c.part_size = std::min(traits.fast_message_limit, both_ways) - mw::kHeaderSize;
    c.split_upto = cfg.eager_split != 0 ? cfg.eager_split : traits.split_crossover;
    c.split_upto = std::min({c.split_upto, c.part_size * Core::kMaxParts, c.threshold});
  }
  // Gathered eager: where the backend sends a message of two pieces and
  // sends are not copied into the transport anyway (messages in place).
  if (cfg.eager_gather != ~std::uint64_t{0} && Core::gathered_sends(endpoint)) {
    c.gather_from = std::max<std::uint64_t>(cfg.eager_gather != 0 ? cfg.eager_gather : kDefaultGather, 1);
    // Up to the backend's measured limit (TransferTraits::gather_limit, a
    // whole message) unless the config says otherwise.
    const std::uint64_t traits_limit = endpoint.transfer_traits().gather_limit;
    c.gather_to = cfg.eager_gather_max != 0 ? cfg.eager_gather_max
                  : traits_limit == ~std::uint64_t{0}
                      ? traits_limit
                      : traits_limit - std::min<std::uint64_t>(traits_limit, mw::kHeaderSize);
  }
  // Eager or rendezvous by measured cost, for copied messages (in_place,
  // set by install_sink below; copy_limit bounds them anyway): by default
  // from the backend's read_choice_from (never where it has none).
  if (cfg.rendezvous_choice != ~std::uint64_t{0}) {
    c.choice_from = std::max(cfg.rendezvous_choice, traits.read_choice_from);
  }
  c.chunk = cfg.rendezvous_chunk ? cfg.rendezvous_chunk : std::min<std::uint64_t>(limit, 16 << 20);
  c.chunk = std::min(c.chunk, limit);
  if (cfg.rendezvous_split != 0) {
    c.split_from = cfg.rendezvous_split == ~std::uint64_t{0} ? 0 : cfg.rendezvous_split;
  } else if (endpoint.transfer_traits().initiator_copies) {
    // The receiver's gets alone would leave the sender's CPU idle while
    // the receiver's copies every byte (docs/messaging.md, "Split
    // rendezvous"). 512 KiB: the crossover bench/split-crossover measured
    // on an idle machine (tagged MB/s, split / unsplit, three placements):
    // 0.80-0.95 at 256 KiB, 1.02-1.11 at 512 KiB, 1.19-1.32 at 1 MiB,
    // 2.1-2.5 at 16 MiB. Both processes on one CPU lose at most 5% by it
    // (0.95-0.98 at 512 KiB-4 MiB), within the spread of rounds.
    c.split_from = std::uint64_t{512} << 10;
  }
  if (cfg.rendezvous_gets != 0) {
    c.max_gets = cfg.rendezvous_gets;
  } else if (endpoint.transfer_traits().initiator_copies) {
    // Gets issued together are copied back to back inside their posts, and
    // every fin would wait for the last copy (docs/messaging.md): one at a time.
    c.max_gets = 1;
  }
  // Credits go back in batches (a quarter of the window), or riding on any
  // message to that peer: a stream keeps flowing with one credit message
  // per quarter window.
  c.credit_batch = std::max<std::uint32_t>(1, cfg.peer_credits / 4);
  if (!endpoint.claim_receive_side()) {
    throw Error(Status::invalid_argument, 0,
                "messenger: this endpoint's receive side already belongs to a Messenger (one per endpoint)");
  }
  c.ops.resize(cfg.max_operations);
  c.free_ops.reserve(cfg.max_operations);
  for (std::size_t i = cfg.max_operations; i-- > 0;) c.free_ops.push_back(static_cast<std::uint32_t>(i));
  c.unexpected.resize(cfg.max_unexpected);
  c.free_unexp.reserve(cfg.max_unexpected);
  for (std::size_t i = cfg.max_unexpected; i-- > 0;) c.free_unexp.push_back(static_cast<std::uint32_t>(i));
  c.peers.resize(cfg.max_peers);
  // Posts in the ring at once: a send or notice per op, the gets of every
  // rendezvous, a fin per op, a repost per bounce, a credit per peer.
  c.posts.resize(cfg.max_operations * (2 + cfg.rendezvous_depth) + cfg.receive_buffers + cfg.max_peers);
  c.ready.resize(cfg.max_operations);
  c.graveyard.reserve(cfg.max_operations);
  // Every kept send ended and not yet drained: at most one per peer that
  // had one since the last drain, and a peer gets one only while fewer than
  // kKeptSends exist; twice that covers a burst of failures and new peers.
  c.kept_ended.reserve(2 * Core::kKeptSends);
  c.spares.reserve(Core::kSpares);
  c.bounces.resize(cfg.receive_buffers);
  c.bounce_tokens.resize(cfg.receive_buffers);
  c.bounce_bases.assign(cfg.receive_buffers, nullptr);
  c.bounce_empty.assign(cfg.receive_buffers, 0);
  c.lazy.reserve(cfg.receive_buffers);
  c.lazy_limit = std::max<std::size_t>(1, cfg.receive_buffers / 8);
  for (std::uint32_t b = 0; b < cfg.receive_buffers; ++b) {
    auto l = c.alloc_bounce();
    if (!l) throw Error(l.status(), 0, "messenger: allocating receive bounce buffers from the pool");
    c.bounces[b] = std::move(*l);
  }
  {
    std::lock_guard<CoreMutex> g(c.mu);
    for (std::uint32_t b = 0; b < cfg.receive_buffers; ++b) c.post_bounce(b);
  }
  c.run_posts();
  {
    std::lock_guard<CoreMutex> g(c.mu);
    if (c.bounces_empty > 0) {
      throw Error(Status::would_block, 0, "messenger: posting the receive buffers failed (max_in_flight?)");
    }
  }
  c.install_sink(core_, cfg.eager_copy);
}

Messenger::~Messenger() {
  // The endpoint's receives into the bounces (kept receives, posted or
  // parked) keep the Core alive (their callbacks hold it) and find it
  // closed; the receive side stays claimed, since those receives are still
  // the endpoint's. They end with the endpoint, not here: this may run
  // after the endpoint is gone (nothing here calls into it).
  std::vector<Exposure> dead;
  {
    std::lock_guard<CoreMutex> g(core_->mu);
    core_->closed = true;
    core_->changed();
    core_->spares.clear();
    core_->drop_spent();
    for (auto& o : core_->ops) {
      if (o.exposure) core_->graveyard.push_back(std::move(o.exposure));
      o.cb.reset();
      o.buf = Slice{};
      o.result.ldo.reset();
    }
    for (std::uint32_t u = core_->unexp_head; u != kNone;) {
      const std::uint32_t next = core_->unexpected[u].next;
      core_->release_unexp(u);
      u = next;
    }
    for (PeerId p = 0; p < core_->peers_high; ++p) core_->peers[p].as_ldo.reset();
    // Kept eager sends stay the endpoint's (parked, or in flight) until it
    // closes; their buffers go with them. Any peer may have one, heard from
    // or not: the whole table, once.
    for (auto& ps : core_->peers) ps.ks_buf.reset();
    dead.swap(core_->graveyard);
  }
  dead.clear();
}

[[gnu::hot]] Result<MessageToken> Messenger::send(PeerId peer, std::uint64_t tag, const Slice& data,
                                                  MessageCallback cb) noexcept {
  Core& c = *core_;
  if (!data || data.length() == 0 || data.length() > mw::kMaxLength) return Status::invalid_argument;
  MessageToken t;
  {
    std::unique_lock<CoreMutex> g(c.mu);
    if (peer >= c.peers.size()) return Status::invalid_argument;
    Core::PeerState& ps = c.peers[peer];
    // Copied into the transport by the endpoint (shm rings): its checks of
    // the peer are the copy's own.
    const bool copy = c.in_place && !Core::must_wait_credit(ps) && c.post_count == 0 && !c.draining &&
                      mw::kHeaderSize + data.length() <= c.copy_limit && c.goes_eager(ps, data.length());
    if (copy) {
      // The message goes first and its op is claimed after: everything
      // between a received message and the reply it prompts delays the
      // reply, and claiming and filling in an op (about 200 instructions)
      // need not come before the bytes leave (bench/RESULTS.md, "a copied
      // send before its op"). The header names the token the claim will
      // give; claim_op's refusals are checked first, so a message never
      // leaves without its op.
      if (c.closed) return Status::closed;
      if (c.free_ops.empty()) return Status::would_block;
      t = c.next_token();
      alignas(8) std::array<std::byte, mw::kHeaderSize> head;
      std::size_t head_size = 0;
      const Status s = c.send_copy_first(ps, peer, tag, t, data, head, head_size, data.length() > c.choice_from);
      // Refused as usable() would have refused it: no op, as then.
      if (s != Status::ok && s != Status::would_block && s != Status::in_progress) return Status::peer_unreachable;
      const std::uint32_t i = *c.claim_op(Core::Kind::send);
      c.set_send(c.ops[i], peer, tag, data.length(), std::move(cb));
      if (s == Status::in_progress) [[unlikely]] {
        // Not copied: the pair's measured costs say the receiver's read
        // beats the two copies (MessengerConfig::rendezvous_choice; the
        // endpoint's probes send one the other way now and then to keep
        // both figures current).
        c.dispatch_send(i, &data, true);
        c.drain(g);
        c.drop_spent();
        return t;
      }
      if (s == Status::ok) {
        c.complete(i, Status::ok);
      } else {
        c.post_sealed(g, i, std::span<const std::byte>(head.data(), head_size), data);
      }
      c.drop_spent();
      return t;
    }
    if (!c.ep.usable(peer)) return Status::peer_unreachable;
    auto r = c.claim_op(Core::Kind::send);
    if (!r) return r.status();
    Core::Op& o = c.ops[*r];
    c.set_send(o, peer, tag, data.length(), std::move(cb));
    t = o.result.token;
    if (Core::must_wait_credit(ps)) {
      o.buf = data;  // held until its credit comes
      c.queue_for_credit(ps, *r);
    } else if (c.post_count == 0 && !c.draining && c.goes_eager(ps, data.length())) {
      c.send_eager_direct(g, *r, data);
    } else {
      c.dispatch_send(*r, &data);
      c.drain(g);
    }
    c.drop_spent();
  }
  return t;
}

namespace {
[[gnu::hot]] Result<MessageToken> post_receive(Core& c, PeerId source, std::uint64_t tag, std::uint64_t ignore,
                                               const Slice* buffer, MessageCallback&& cb) noexcept {
  MessageToken t;
  Ldo spare;  // a bounce handed over: dropped after the unlock
  {
    std::unique_lock<CoreMutex> g(c.mu);
    if (source != kAnyPeer && source >= c.peers.size()) return Status::invalid_argument;
    auto r = c.claim_op(Core::Kind::recv);
    if (!r) return r.status();
    const std::uint32_t i = *r;
    Core::Op& o = c.ops[i];
    o.peer = source;
    o.tag = tag;
    o.ignore = ignore;
    o.zero_copy = buffer == nullptr;
    if (buffer) o.buf = *buffer;
    o.has_cb = static_cast<bool>(cb);
    o.cb = std::move(cb);
    t = o.result.token;
    // An unexpected message first (earliest arrival that matches).
    bool matched = false;
    for (std::uint32_t u = c.unexp_head; u != kNone && !matched; u = c.unexpected[u].next) {
      Core::Unexp& e = c.unexpected[u];
      if (e.early || !c.matches(o, e.peer, e.hdr.space, e.hdr.tag)) continue;
      const PeerId src = e.peer;
      const mw::Header h = e.hdr;
      const RemoteRef ref = e.ref;
      if (e.credit_held) ++c.peers[src].owed;
      Ldo l = std::move(e.ldo);
      c.release_unexp(u);
      if (!c.deliver(i, src, h, ref, l)) spare = std::move(l);
      c.maybe_return_credits(src);
      matched = true;
      break;
    }
    if (!matched) c.link_posted(i);
    c.drop_spent();
    c.drain(g);
  }
  return t;
}
}  // namespace

Result<MessageToken> Messenger::recv(PeerId source, std::uint64_t tag, std::uint64_t ignore, const Slice& buffer,
                                     MessageCallback cb) noexcept {
  if (!buffer || buffer.length() == 0) return Status::invalid_argument;
  return post_receive(*core_, source, tag, ignore, &buffer, std::move(cb));
}

Result<MessageToken> Messenger::recv_ldo(PeerId source, std::uint64_t tag, std::uint64_t ignore,
                                         MessageCallback cb) noexcept {
  return post_receive(*core_, source, tag, ignore, nullptr, std::move(cb));
}

Result<MessageInfo> Messenger::probe(PeerId source, std::uint64_t tag, std::uint64_t ignore) noexcept {
  Core& c = *core_;
  (void)c.ep.progress();
  c.run_posts();
  std::lock_guard<CoreMutex> g(c.mu);
  Core::Op probe;
  probe.peer = source;
  probe.tag = tag;
  probe.ignore = ignore;
  for (std::uint32_t u = c.unexp_head; u != kNone; u = c.unexpected[u].next) {
    const Core::Unexp& e = c.unexpected[u];
    if (e.early || !c.matches(probe, e.peer, e.hdr.space, e.hdr.tag)) continue;
    return MessageInfo{e.peer, e.hdr.tag, e.hdr.length, e.hdr.reply_id};
  }
  return Status::would_block;
}

Result<MessageToken> Messenger::request(PeerId peer, std::uint64_t tag, const Slice& data,
                                        std::chrono::milliseconds timeout, MessageCallback cb) noexcept {
  Core& c = *core_;
  if (!data || data.length() == 0 || data.length() > mw::kMaxLength) return Status::invalid_argument;
  MessageToken t;
  {
    std::unique_lock<CoreMutex> g(c.mu);
    if (peer >= c.peers.size()) return Status::invalid_argument;
    if (!c.ep.usable(peer)) return Status::peer_unreachable;
    if (c.free_ops.size() < 2) return c.closed ? Status::closed : Status::would_block;
    const std::uint32_t r = *c.claim_op(Core::Kind::request);
    const std::uint32_t s = *c.claim_op(Core::Kind::internal);
    Core::Op& ro = c.ops[r];
    ro.peer = peer;
    ro.space = mw::Space::reply;
    ro.tag = make_token(ro.gen, r);
    ro.zero_copy = true;
    ro.has_cb = static_cast<bool>(cb);
    ro.cb = std::move(cb);
    if (timeout.count() > 0) ro.deadline = Clock::now() + timeout;
    t = ro.result.token;
    c.link_posted(r);  // the reply's receive exists before the request leaves
    Core::Op& so = c.ops[s];
    so.peer = peer;
    so.tag = tag;
    so.buf = data;
    so.reply_id = ro.tag;
    so.link = r;
    so.link_gen = ro.gen;
    Core::PeerState& ps = c.peers[peer];
    if (Core::must_wait_credit(ps)) {
      c.queue_for_credit(ps, s);
    } else {
      c.dispatch_send(s);
    }
    c.drain(g);
  }
  return t;
}

Result<MessageToken> Messenger::reply(PeerId peer, std::uint64_t request_id, const Slice& data,
                                      MessageCallback cb) noexcept {
  Core& c = *core_;
  if (!data || data.length() == 0 || data.length() > mw::kMaxLength || request_id == 0) {
    return Status::invalid_argument;
  }
  MessageToken t;
  {
    std::unique_lock<CoreMutex> g(c.mu);
    if (peer >= c.peers.size()) return Status::invalid_argument;
    if (!c.ep.usable(peer)) return Status::peer_unreachable;
    auto r = c.claim_op(Core::Kind::send);
    if (!r) return r.status();
    Core::Op& o = c.ops[*r];
    c.set_send(o, peer, request_id, data.length(), std::move(cb));
    o.space = mw::Space::reply;
    o.buf = data;
    t = o.result.token;
    Core::PeerState& ps = c.peers[peer];
    if (Core::must_wait_credit(ps)) {
      c.queue_for_credit(ps, *r);
    } else {
      c.dispatch_send(*r);
    }
    c.drain(g);
  }
  return t;
}

Status Messenger::cancel(MessageToken token) noexcept {
  Core& c = *core_;
  std::lock_guard<CoreMutex> g(c.mu);
  Core::Op* o = c.find(token);
  if (!o || o->kind == Core::Kind::internal) return Status::invalid_argument;
  const auto i = static_cast<std::uint32_t>(token.value & 0xffffffffu);
  if (o->state == Core::State::done) return Status::ok;
  if (o->state == Core::State::posted) {
    c.unlink_posted(i);
    c.complete(i, Status::canceled);
    c.changed();
    return Status::ok;
  }
  if (o->state == Core::State::queued) {
    c.unqueue_for_credit(i);
    c.complete(i, Status::canceled);
    c.changed();
    return Status::ok;
  }
  return Status::in_progress;
}

std::size_t Messenger::progress() noexcept {
  Core::Awaited none = Core::Awaited::pending;
  MessageCompletion unused;
  return core_->progress_round(MessageToken{}, none, unused);
}

[[gnu::hot]] MessageCompletion Messenger::wait(MessageToken token, std::chrono::milliseconds timeout) noexcept {
  Core& c = *core_;
  // Clock reads are kept off the spin: the deadline is checked on the
  // coarse clock (platform::wait_deadline), and only a waiter that may
  // sleep notes when work last happened. The deadline itself is read after
  // the first round that did not finish the operation, as Endpoint::wait
  // does: a message already in (a ping-pong's reply arrives during the
  // waits before) returns without a clock read, 11-20 ns on an AMD EPYC
  // guest. The wait then ends one round later than it would have, never
  // earlier.
  Clock::time_point until{};
  bool until_set = false;
  // Spin as the endpoint's wait_mode says: spin for ever, adaptive for
  // wait_spin after the last activity, sleep at once; then sleep on the
  // provider (bounded by 10 ms so deadlines are noticed).
  const WaitMode mode = c.ep.config().wait_mode;
  const auto spin = mode == WaitMode::adaptive ? Clock::duration(c.ep.config().wait_spin) : Clock::duration::zero();
  auto last_work = mode == WaitMode::spin ? Clock::time_point{} : Clock::now();
  MessageCompletion done;
  auto answer = [token](Status s) {
    MessageCompletion m;
    m.token = token;
    m.status = s;
    return m;
  };
  // Once the adaptive spin is over: sleep on the provider (at most 10 ms,
  // so deadlines are noticed); true when it did.
  auto nap = [&]() {
    if (mode == WaitMode::spin || Clock::now() - last_work < spin) return false;
    if (c.ep.progress_or_idle(std::chrono::milliseconds{10}) > 0) last_work = Clock::now();
    return true;
  };
  Core::Quiet q;
  constexpr std::uint32_t kQuietClockRounds = 8;
  std::uint32_t quiet_rounds = 0;
  // The hand-off slot (Core::handoff_token), claimed with the deadline:
  // after the first round that did not find the operation done, so a wait
  // for one already done (a copied send, a message already in) pays no
  // atomic exchange for it.
  bool owner = false;
  // Returns `s` (the deadline) with the slot given back under the mutex:
  // a completion handed off meanwhile is returned instead.
  auto give_up = [&](Status s) {
    if (owner) {
      std::lock_guard<CoreMutex> g(c.mu);
      if (c.handoff_ready.load(std::memory_order_relaxed)) return c.take_handoff();
      c.handoff_token.store(0, std::memory_order_relaxed);
    }
    return answer(s);
  };
  for (;;) {
    // After a round that left the Messenger nothing to do, a spin round is
    // the endpoint's alone for as long as it delivers nothing and no lock
    // round elsewhere changed anything (the count `changes`): our op cannot
    // have completed, and the Messenger's lock round, clock read and lookup
    // would only lengthen the spin (a tcp spin round measured 1.30 us
    // plain, 1.40 us with them; half of that is added to every message's
    // detection on average).
    std::ptrdiff_t delivered = -1;
    if (q.quiet) {
      delivered = static_cast<std::ptrdiff_t>(c.ep.progress());
      if (delivered != 0 && owner && c.handoff_ready.load(std::memory_order_acquire)) return c.take_handoff();
      if (delivered == 0 && c.changes.load(std::memory_order_acquire) == q.seen) {
        // One clock reading for the scan's time and the deadline every
        // kQuietClockRounds idle rounds (none when something came: the full
        // round below looks at it at once). A reading costs 11-20 ns on an
        // AMD EPYC guest, a third of an idle round on shm, and a message's
        // detection waits half a round on average; the scan (1 ms) and the
        // deadline (coarse already) notice a few rounds later at most.
        if (++quiet_rounds % kQuietClockRounds != 0) continue;
        const auto now = platform::CoarseClock::now();
        if (now < q.scan_at) {
          if (now >= until - platform::CoarseClock::max_lag() && platform::CoarseClock::reached(until)) {
            return give_up(Status::in_progress);
          }
          if (nap()) q.quiet = false;  // what it delivered is looked at by a full round
          continue;
        }
      }
    }
    // The round looks at the operation in its own lock round: no second
    // one per spin round for the lookup.
    Core::Awaited awaited = Core::Awaited::pending;
    if (c.progress_round(token, awaited, done, &q, delivered) > 0 && mode != WaitMode::spin) last_work = Clock::now();
    if (owner) {
      // Handed off in this round's endpoint round (or a nap's, or another
      // thread's): the lookup found the op freed.
      if (c.handoff_ready.load(std::memory_order_acquire)) return c.take_handoff();
      if (awaited != Core::Awaited::pending) c.handoff_token.store(0, std::memory_order_relaxed);
    }
    if (awaited == Core::Awaited::done) return done;
    if (awaited == Core::Awaited::invalid) return answer(Status::invalid_argument);
    if (!until_set) {
      until = platform::wait_deadline(timeout);
      until_set = true;
      std::uint64_t none = 0;
      owner = token && c.handoff_token.compare_exchange_strong(none, token.value, std::memory_order_relaxed);
    }
    if (q.coarse >= until - platform::CoarseClock::max_lag() && platform::CoarseClock::reached(until)) {
      return give_up(Status::in_progress);
    }
    (void)nap();
  }
}

void Messenger::fail_peer(PeerId peer, Status status) noexcept {
  {
    std::lock_guard<CoreMutex> g(core_->mu);
    core_->fail_peer_locked(peer, status);
    core_->changed();
  }
  core_->run_posts();
}

std::uint64_t Messenger::eager_threshold() const noexcept { return core_->threshold; }

MessengerStats Messenger::stats() const noexcept {
  std::lock_guard<CoreMutex> g(core_->mu);
  MessengerStats st = core_->st;
  for (const Ldo& b : core_->bounces) {
    if (b) st.receive_buffer_bytes += b.capacity();
  }
  return st;
}

}  // namespace regpool
