#pragma once
// The Messenger's path past the endpoint's operation table: sends copied
// within a call and messages shown where they lie, on backends that can
// (libfabric shm with regpool's message rings; docs/architecture.md,
// "Messages in place"), and on the other backends the messages of
// completed receives, before their callbacks.
//
// Sending: Endpoint::send_copy writes a message (a header and a body) into
// the transport at once and returns; no operation, no completion. Where it
// cannot or should not (a full ring, a send to the peer still waiting to be
// posted, a message over 16 KiB into a ring not yet emptied or for a pair
// that reads large records, a backend without the path) it answers
// would_block and the caller posts the message as any other.
//
// Receiving: the backend offers each incoming message to the sink while it
// still lies in the transport, before it takes a posted receive for it. A
// sink that takes it has consumed it (matched it and copied its bytes
// where they go); one that declines leaves it to the posted receives. The
// two copies a message made through a bounce receive (ring to bounce,
// bounce to the user's buffer) become one, and the receive's slot,
// completion and repost go. On a backend without that path, the endpoint
// offers each completed kept receive's message instead (the Messenger owns
// all receives: its bounces) before the receive's callback would run;
// taken, the receive is posted again at once and its callback does not
// run (the delivery batch, the callback and the Messenger's repost go).
//
// Sent: on every backend, a kept send that completed ok is offered to the
// sink (sent()) before its callback; taken, the send is parked for its
// owner's next repost, as after a callback that asked for none.
//
// Not installed: the Endpoint's public header names only the incomplete
// type.

#include <cstddef>
#include <span>

#include "regpool/endpoint.hpp"

namespace regpool::detail {

class MessageSink {
 public:
  enum class Take {
    declined,  // left to the posted receives
    taken,     // consumed
    settle,    // consumed, and settle() has work (posts it caused)
  };
  // With the endpoint's mutex held, from its poll or its delivery of
  // completions: the message `bytes` from `peer` (kAnyPeer: a sender the
  // endpoint has not inserted), valid only during the call. They may be
  // in memory the sender can still write (a ring; a hostile sender may
  // change them while they are read): each byte is read once, into the
  // sink's own variables, before it is believed. Must not call the
  // endpoint, and must not wait (a lock it cannot take at once is a reason
  // to decline).
  virtual Take take(PeerId peer, std::span<const std::byte> bytes) noexcept = 0;
  // Same rules as take(), from the endpoint's delivery of completions: the
  // completion `c` (status ok) of a kept send of the endpoint's, before
  // its callback. A sink that takes it has done what its callback would
  // (the send is parked after the call); a kept send that is not the
  // sink's (someone else's on the same endpoint) is declined.
  virtual Take sent(const Completion& c) noexcept = 0;
  // Without the endpoint's mutex, after a progress round in which take()
  // or sent() answered settle: the work that needs the endpoint (posts the taken
  // messages caused, such as credits going back).
  virtual void settle() noexcept = 0;

 protected:
  ~MessageSink() = default;
};

}  // namespace regpool::detail
