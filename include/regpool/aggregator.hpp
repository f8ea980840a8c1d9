#pragma once
// Aggregation buffer: many small records to one peer travel as one message.
// An Aggregator copies records into a batch (an LDO) and sends the batch when
// it holds AggregatorConfig::flush_bytes, when its oldest record has waited
// AggregatorConfig::deadline, or on flush(): message rate for latency. An
// AggregateReceiver posts receives of batch-sized LDOs, validates each batch
// as a whole and hands out its records in order. docs/patterns.md has the
// wire format, the figures per flush setting and an example.
//
// (Batching puts: the ring channel, regpool/ring_channel.hpp, does it with
// RingConfig::post_batch: records appended to its mirror go out as one put.)
//
// Order and delivery: records appended to one Aggregator reach the receiver
// once each and in append order, as long as the provider delivers one
// sender's messages in order (libfabric with FI_ORDER_SAS, which the fabric
// domain asks for; verbs RC). Each batch carries a per-sender sequence
// number; the receiver counts gaps (AggregateReceiverStats::out_of_order).
//
// Hostile senders: a batch that fails validation (wrong magic, a record past
// the end, trailing bytes, a count that does not match) is dropped whole and
// counted, never partly delivered. Senders must use the receiver's
// batch_bytes or less: a larger message fails its receive (and on
// tcp;ofi_rxm stalls that sender's later messages, docs/provider-facts.md).
//
// The receiver owns the endpoint's untagged receives: do not post other
// receives on the same endpoint.
//
// Progress: both sides progress the endpoint in progress()/next(); a
// deadline is noticed in append() and progress(), so call one of them at
// least as often as the deadline. Ownership and threads: as the ring channel
// (hold the Endpoint and Pool longer; one thread per object; callbacks touch
// only atomics; destruction never blocks, sends in flight keep their LDOs).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "regpool/endpoint.hpp"
#include "regpool/error.hpp"
#include "regpool/pool.hpp"

namespace regpool {

struct AggregatorConfig {
  // Size of one batch message, header included (both sides: the receiver's
  // buffers; a sender's must not be larger). A record takes 4 bytes + its
  // length; the largest record is batch_bytes - 20.
  std::uint32_t batch_bytes = 8192;
  // Sender: send a batch once it holds this many bytes (0 or more than
  // batch_bytes = when the next record would not fit).
  std::uint32_t flush_bytes = 0;
  // Sender: send a batch once its oldest record has waited this long
  // (0 = no deadline; then only size and flush()).
  std::chrono::microseconds deadline{0};
  // Sender: batches that may be in flight at once (the one filling aside).
  // Receiver: receives kept posted.
  std::uint32_t buffers = 8;
};

struct AggregatorStats {
  std::uint64_t records = 0;
  std::uint64_t bytes = 0;        // payload bytes appended
  std::uint64_t batches = 0;      // sent
  std::uint64_t by_size = 0;      // batches sent because they were full
  std::uint64_t by_deadline = 0;  // ... because the deadline passed
  std::uint64_t by_demand = 0;    // ... because of flush()/drain()
  std::uint64_t would_block = 0;  // append() found every buffer in flight
};

struct AggregateReceiverStats {
  std::uint64_t records = 0;
  std::uint64_t batches = 0;
  std::uint64_t malformed = 0;     // batches dropped by validation
  std::uint64_t failed = 0;        // receives completed with an error (e.g. too large)
  std::uint64_t out_of_order = 0;  // batches whose sequence was not the sender's next
};

class REGPOOL_API Aggregator {
 public:
  // Allocates config.buffers + 1 batch LDOs from `pool`. Throws Error
  // (invalid_argument for batch_bytes < 32 or buffers == 0, the pool's status).
  Aggregator(Endpoint& ep, Pool& pool, PeerId peer, const AggregatorConfig& config = {});
  ~Aggregator();
  Aggregator(Aggregator&&) noexcept;
  Aggregator& operator=(Aggregator&&) noexcept;

  // Copies one record into the current batch, sending batches when due.
  // would_block when every buffer is in flight (progress() and retry);
  // invalid_argument for a record larger than max_record(); a send's
  // failure status (peer_unreachable, ...) once the channel broke.
  Status append(std::span<const std::byte> record) noexcept;
  // Sends the current batch now, if it holds anything.
  Status flush() noexcept;
  // Progresses the endpoint, retires sent batches, sends what is due
  // (deadline, sends refused earlier). The broken status, else ok.
  Status progress() noexcept;
  // flush(), then progress until every batch has been sent (completed), or
  // `timeout` (timeout: only ever this call's own deadline; a send the
  // endpoint expired at op_timeout breaks the channel as peer_unreachable).
  Status drain(std::chrono::milliseconds timeout) noexcept;

  std::size_t max_record() const noexcept;
  Status status() const noexcept;
  AggregatorStats stats() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One record handed out by the receiver: valid until the next call to next().
struct AggregateRecord {
  PeerId peer = kAnyPeer;  // the sender, as the endpoint identifies it
  std::span<const std::byte> bytes;
};

class REGPOOL_API AggregateReceiver {
 public:
  // Allocates config.buffers batch LDOs and posts a receive on each. Throws
  // Error (invalid_argument, the pool's or the post's status).
  AggregateReceiver(Endpoint& ep, Pool& pool, const AggregatorConfig& config = {});
  ~AggregateReceiver();
  AggregateReceiver(AggregateReceiver&&) noexcept;
  AggregateReceiver& operator=(AggregateReceiver&&) noexcept;

  // The next record; would_block when none has arrived. Progresses the
  // endpoint when the current batch is used up. Never throws or blocks.
  Result<AggregateRecord> next() noexcept;

  Status status() const noexcept;
  AggregateReceiverStats stats() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace regpool
