#pragma once
// Ring-buffer channel: one producer writes variable-size records into a ring
// that lives in the consumer's memory (an LDO the consumer exposes); the
// consumer reads them by looking at its own memory. No receive is posted and
// the consumer's CPU takes no part in a transfer (except on providers that
// need target-side progress, see below). docs/patterns.md has the protocol,
// the figures and a complete example.
//
//   consumer                                   producer
//   RingConsumer c(ep, pool, producer, cfg);
//   c.setup()  --- bytes over your bootstrap -->  RingProducer p(ep, pool, consumer, blob, cfg);
//   c.connect(blob)  <-- p.setup() ----------
//   c.peek() / c.pop()                          p.try_push(bytes) / p.progress()
//
// Protocol in short: the producer copies a record (16-byte header + payload,
// padded to 8) into a local mirror of the ring and puts it at the same offset
// of the consumer's ring; only after that put has completed does it put the
// new tail (bytes published) into the consumer's tail word, so a provider
// that reorders two puts can never expose a tail ahead of its records. The
// consumer validates the tail word and every record header (length inside
// the ring, sequence number, check field) before it uses a byte, and returns
// credits (bytes consumed: the head) by putting them into the producer's
// credit word, every RingConfig::credit_interval bytes or at once when the
// producer says it is waiting. The producer never writes past head +
// capacity. A record never wraps: a pad record fills the end of the ring.
//
// Peers are untrusted: a producer can only write into the ring object it was
// given; a malformed tail or record breaks the channel (Status::malformed)
// and never makes the consumer read outside its ring. A record's payload is
// a view into remotely writable memory: an honest producer does not touch it
// until it is popped, a hostile one can; copy (try_pop) when that matters.
//
// Progress: the producer must call progress() (or push()/drain(), which do)
// for completions, tails and credits to move. The consumer's peek() calls
// Endpoint::progress() when it finds nothing new. On providers where
// Endpoint::target_progress_required() is true (libfabric tcp;ofi_rxm) the
// producer's puts land in the consumer's memory only while the consumer's
// endpoint progresses: keep calling peek() (or run the endpoint's progress
// thread) while waiting for records; likewise the consumer's credits land
// only while the producer calls progress().
// Setup on verbs: each side exposes to the other through a window on their
// queue pair, which is made on first use (docs/scale.md); the side that is
// not constructing must keep its endpoint progressing (progress thread, or
// progress() from another thread) while it waits for the other's setup
// bytes, or the construction waits out post_timeout.
//
// A dead peer: while waiting (the consumer for records, the producer for
// credits) each side rewrites its control word every RingConfig::keepalive;
// when the peer is gone that put fails, and the channel reports
// peer_unreachable (or transport_error) within keepalive plus the endpoint's
// bound for failing an operation to a dead peer (EndpointConfig::op_timeout
// at most). A put the endpoint expires (timeout) breaks the channel as
// peer_unreachable, so timeout from push()/drain() only ever means their own
// deadline passed. A peer that stops without dying is not an error.
//
// Ownership and threads: each object holds a reference to the Endpoint and
// the Pool it was made with; destroy it before them. It owns its ring (or
// mirror) LDO and the Exposure of it; operations in flight keep their bytes
// alive after destruction, which never blocks. One object must be used by
// one thread at a time; the endpoint's callbacks (possibly on its progress
// thread) touch only atomics.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "regpool/endpoint.hpp"
#include "regpool/error.hpp"
#include "regpool/pool.hpp"

namespace regpool {

struct RingConfig {
  // Ring bytes (consumer; the producer takes the capacity from the setup
  // blob). A multiple of 8, at least 256. A record of n bytes takes
  // 16 + n rounded up to 8; the largest record is capacity - 16 bytes.
  std::uint64_t capacity = std::uint64_t{1} << 20;
  // Consumer: return credits once this many bytes have been consumed since
  // the last credit (0 = capacity / 4), and at once when the producer waits.
  std::uint64_t credit_interval = 0;
  // Producer: post appended records once this many bytes wait to be posted
  // (0 = post each record at once). Larger batches mean fewer, larger puts
  // (higher message rate, more latency); flush() posts a partial batch.
  std::uint64_t post_batch = 0;
  // Producer: record puts in flight at once.
  std::uint32_t max_puts = 32;
  // Both: while waiting on the peer, rewrite the own control word this
  // often, so a dead peer is noticed (see above). 0 = never.
  std::chrono::milliseconds keepalive{500};
  // How the ring (consumer) and the credit word (producer) are exposed; both
  // are exposed to the one peer only where the backend scopes keys per peer.
  ExposureMode exposure_mode = ExposureMode::standard;
};

struct RingStats {
  std::uint64_t records = 0;       // pushed (producer) / popped (consumer)
  std::uint64_t bytes = 0;         // payload bytes of those records
  std::uint64_t pads = 0;          // pad records written / skipped at the end of the ring
  std::uint64_t record_puts = 0;   // producer: puts carrying records
  std::uint64_t control_puts = 0;  // tail words (producer) / credit words (consumer) put
  std::uint64_t keepalives = 0;    // of which rewritten only to check the peer
  std::uint64_t full = 0;          // producer: try_push found no room
};

// The receiving side: owns the ring.
class REGPOOL_API RingConsumer {
 public:
  // Allocates the ring object from `pool` (whose domains must include the
  // endpoint's) and exposes it, write-only where the backend allows, to
  // `producer`. Throws Error: invalid_argument for a bad capacity, the pool's
  // or the exposure's status otherwise.
  RingConsumer(Endpoint& ep, Pool& pool, PeerId producer, const RingConfig& config = {});
  ~RingConsumer();
  RingConsumer(RingConsumer&&) noexcept;
  RingConsumer& operator=(RingConsumer&&) noexcept;

  // The blob the producer needs (kConsumerBlobSize bytes, checksummed).
  std::vector<std::byte> setup() const;
  // The producer's blob. Records can be read before this; credits (and so
  // more than one ring's worth of records) and keepalives need it. Throws
  // Error(malformed) for a blob that fails validation or belongs to another
  // channel, Error(unsupported) for another version.
  void connect(std::span<const std::byte> producer_setup);

  // The next record, as a view valid until pop(); would_block when there is
  // none yet; malformed when the producer wrote something invalid;
  // peer_unreachable (or transport_error) when a credit or keepalive to a
  // dead producer failed. Never throws, never blocks.
  Result<std::span<const std::byte>> peek() noexcept;
  // Releases the record peek() returned (invalid_argument when there is
  // none) and returns credits when due.
  Status pop() noexcept;
  // peek(), copy into `out`, pop(): the record's length. out_of_bounds (the
  // record stays) when `out` is too small.
  Result<std::size_t> try_pop(std::span<std::byte> out) noexcept;

  std::uint64_t capacity() const noexcept;
  // ok, or what broke the channel.
  Status status() const noexcept;
  RingStats stats() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The sending side: a local mirror of the ring, and the credit word.
class REGPOOL_API RingProducer {
 public:
  // Validates the consumer's blob (Error malformed/unsupported), allocates
  // the mirror (capacity + 64 bytes) from `pool` and exposes the credit word
  // to `consumer`. config.capacity is ignored (the consumer's counts).
  RingProducer(Endpoint& ep, Pool& pool, PeerId consumer, std::span<const std::byte> consumer_setup,
               const RingConfig& config = {});
  ~RingProducer();
  RingProducer(RingProducer&&) noexcept;
  RingProducer& operator=(RingProducer&&) noexcept;

  // The blob the consumer's connect() needs.
  std::vector<std::byte> setup() const;

  // Appends one record (copied) and posts it when due (RingConfig::
  // post_batch). would_block when the ring has no room until the consumer
  // returns credits (progress() and try again); invalid_argument for an
  // empty record or one longer than max_record(); the broken status
  // otherwise. Does not call into the endpoint's progress.
  Status try_push(std::span<const std::byte> record) noexcept;
  // try_push, progressing until it succeeds or `timeout` passes (timeout).
  Status push(std::span<const std::byte> record, std::chrono::milliseconds timeout) noexcept;
  // Posts every appended record not posted yet.
  Status flush() noexcept;
  // Progresses the endpoint, retires completed puts, publishes the tail,
  // reads credits, keeps the consumer checked while waiting. The broken
  // status, else ok.
  Status progress() noexcept;
  // Flushes and progresses until every pushed record is published to the
  // consumer (consumed too, when `consumed`), or `timeout` (timeout).
  Status drain(std::chrono::milliseconds timeout, bool consumed = false) noexcept;

  std::uint64_t capacity() const noexcept;
  std::uint64_t max_record() const noexcept;
  Status status() const noexcept;
  RingStats stats() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace regpool
