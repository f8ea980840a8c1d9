#include "regpool/aggregator.hpp"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "patterns/aggregate_wire.hpp"
#include "patterns/done_flag.hpp"

namespace regpool {
namespace {

using Clock = std::chrono::steady_clock;
using patterns::done_status;
using patterns::done_value;
using patterns::kPending;
constexpr std::uint32_t kMinBatch = 32;

// What the endpoint's callbacks write (on whatever thread progresses) and
// the owner reads: per buffer, the completion status (+1; 0 = in flight),
// and for receives the length and the sender, published by the status.
struct Completions {
  explicit Completions(std::uint32_t n)
      : done(new std::atomic<std::uint8_t>[n]), bytes(new std::atomic<std::uint64_t>[n]),
        peer(new std::atomic<PeerId>[n]) {
    for (std::uint32_t i = 0; i < n; ++i) {
      done[i].store(kPending, std::memory_order_relaxed);
      bytes[i].store(0, std::memory_order_relaxed);
      peer[i].store(kAnyPeer, std::memory_order_relaxed);
    }
  }
  std::unique_ptr<std::atomic<std::uint8_t>[]> done;
  std::unique_ptr<std::atomic<std::uint64_t>[]> bytes;
  std::unique_ptr<std::atomic<PeerId>[]> peer;
};

struct Buffer {
  Ldo ldo;
  Slice whole;
};

std::vector<Buffer> make_buffers(Pool& pool, std::uint32_t n, std::uint32_t bytes) {
  std::vector<Buffer> v(n);
  for (auto& b : v) {
    auto r = pool.allocate(bytes);
    if (!r) throw Error(r.status(), 0, "aggregation buffer: allocating a batch buffer failed");
    b.ldo = std::move(*r);
    auto s = Slice::data(b.ldo, 0, bytes);
    if (!s) throw Error(s.status(), 0, "aggregation buffer: slice of a batch buffer");
    b.whole = std::move(*s);
  }
  return v;
}

void check_config(const AggregatorConfig& c) {
  if (c.batch_bytes < kMinBatch) {
    throw Error(Status::invalid_argument, 0,
                "aggregation buffer: batch_bytes " + std::to_string(c.batch_bytes) + " is below 32");
  }
  if (c.buffers == 0) throw Error(Status::invalid_argument, 0, "aggregation buffer: buffers must be at least 1");
}

}  // namespace

// ---------------------------------------------------------------- sender

struct Aggregator::Impl {
  enum class State : std::uint8_t { free, filling, queued, sending };

  Endpoint& ep;
  PeerId peer;
  AggregatorConfig cfg;
  std::uint32_t n = 0;  // buffers
  std::size_t flush_bytes = 0;
  std::vector<Buffer> bufs;
  std::vector<State> state;
  std::vector<std::size_t> size;  // of a closed batch
  std::shared_ptr<Completions> comp;
  // Closed batches in send order: [head, head + posted) sending, then queued.
  std::vector<std::uint32_t> fifo;
  std::uint32_t fifo_head = 0;
  std::uint32_t fifo_count = 0;
  std::uint32_t fifo_posted = 0;
  std::int64_t current = -1;
  aggregate::BatchWriter writer;
  Clock::time_point first{};
  std::uint32_t sequence = 0;
  Status broken = Status::ok;
  AggregatorStats st;

  Impl(Endpoint& e, PeerId p, const AggregatorConfig& c) : ep(e), peer(p), cfg(c) {}

  Status fail(Status s) noexcept {
    if (broken == Status::ok) broken = s;
    return broken;
  }
  std::size_t max_record() const noexcept {
    return cfg.batch_bytes - aggregate::kBatchHeader - aggregate::kRecordHeader;
  }

  void reap() noexcept {
    while (fifo_posted > 0) {
      const std::uint32_t idx = fifo[fifo_head];
      const std::uint8_t v = comp->done[idx].load(std::memory_order_acquire);
      if (v == kPending) return;
      if (done_status(v) != Status::ok) {
        fail(done_status(v));
        return;
      }
      state[idx] = State::free;
      fifo_head = (fifo_head + 1) % n;
      --fifo_count;
      --fifo_posted;
    }
  }

  void post_queued() noexcept {
    while (broken == Status::ok && fifo_posted < fifo_count) {
      const std::uint32_t idx = fifo[(fifo_head + fifo_posted) % n];
      auto s = bufs[idx].whole.select(0, size[idx]);
      if (!s) {
        fail(s.status());
        return;
      }
      comp->done[idx].store(kPending, std::memory_order_relaxed);
      auto t = ep.send(peer, *s, [c = comp, idx](const Completion& done) {
        c->done[idx].store(done_value(done.status), std::memory_order_release);
      });
      if (!t) {
        if (t.status() != Status::would_block) fail(t.status());
        return;  // would_block: progress() posts it later, still in order
      }
      state[idx] = State::sending;
      ++fifo_posted;
      ++st.batches;
    }
  }

  void close(std::uint64_t& reason) noexcept {
    const auto idx = static_cast<std::uint32_t>(current);
    writer.finish(sequence++);
    size[idx] = writer.size();
    state[idx] = State::queued;
    fifo[(fifo_head + fifo_count) % n] = idx;
    ++fifo_count;
    current = -1;
    ++reason;
    post_queued();
  }

  bool open() noexcept {
    for (std::uint32_t i = 0; i < n; ++i) {
      if (state[i] == State::free) {
        state[i] = State::filling;
        current = i;
        writer = aggregate::BatchWriter(bufs[i].whole.bytes());
        return true;
      }
    }
    return false;
  }

  bool deadline_passed(Clock::time_point now) const noexcept {
    return current >= 0 && cfg.deadline.count() > 0 && !writer.empty() && now - first >= cfg.deadline;
  }

  Status append(std::span<const std::byte> record) noexcept {
    if (broken != Status::ok) return broken;
    if (record.size() > max_record()) return Status::invalid_argument;
    if (cfg.deadline.count() > 0 && deadline_passed(Clock::now())) close(st.by_deadline);
    if (current >= 0 && !writer.fits(record.size())) close(st.by_size);
    if (current < 0) {
      reap();
      if (broken != Status::ok) return broken;
      if (!open()) {
        ++st.would_block;
        return Status::would_block;
      }
    }
    if (writer.empty() && cfg.deadline.count() > 0) first = Clock::now();
    writer.append(record);
    ++st.records;
    st.bytes += record.size();
    if (writer.size() >= flush_bytes) close(st.by_size);
    return broken;
  }

  Status flush() noexcept {
    if (broken != Status::ok) return broken;
    if (current >= 0 && !writer.empty()) close(st.by_demand);
    post_queued();
    return broken;
  }

  Status progress() noexcept {
    if (broken != Status::ok) return broken;
    ep.progress();
    reap();
    if (deadline_passed(Clock::now())) close(st.by_deadline);
    post_queued();
    return broken;
  }
};

Aggregator::Aggregator(Endpoint& ep, Pool& pool, PeerId peer, const AggregatorConfig& config)
    : impl_(std::make_unique<Impl>(ep, peer, config)) {
  check_config(config);
  Impl& m = *impl_;
  m.n = config.buffers + 1;
  m.flush_bytes = config.flush_bytes == 0 || config.flush_bytes > config.batch_bytes ? config.batch_bytes
                                                                                     : config.flush_bytes;
  m.bufs = make_buffers(pool, m.n, config.batch_bytes);
  m.state.assign(m.n, Impl::State::free);
  m.size.assign(m.n, 0);
  m.fifo.assign(m.n, 0);
  m.comp = std::make_shared<Completions>(m.n);
}

Aggregator::~Aggregator() = default;
Aggregator::Aggregator(Aggregator&&) noexcept = default;
Aggregator& Aggregator::operator=(Aggregator&&) noexcept = default;

Status Aggregator::append(std::span<const std::byte> record) noexcept { return impl_->append(record); }
Status Aggregator::flush() noexcept { return impl_->flush(); }
Status Aggregator::progress() noexcept { return impl_->progress(); }

Status Aggregator::drain(std::chrono::milliseconds timeout) noexcept {
  const auto deadline = Clock::now() + timeout;
  if (const Status f = impl_->flush(); f != Status::ok) return f;
  for (;;) {
    if (const Status p = impl_->progress(); p != Status::ok) return p;
    if (impl_->fifo_count == 0) return Status::ok;
    if (Clock::now() >= deadline) return Status::timeout;
    std::this_thread::yield();
  }
}

std::size_t Aggregator::max_record() const noexcept { return impl_->max_record(); }
Status Aggregator::status() const noexcept { return impl_->broken; }
AggregatorStats Aggregator::stats() const noexcept { return impl_->st; }

// ---------------------------------------------------------------- receiver

struct AggregateReceiver::Impl {
  Endpoint& ep;
  AggregatorConfig cfg;
  std::uint32_t n = 0;
  std::vector<Buffer> bufs;
  std::shared_ptr<Completions> comp;
  // Posted receives in posting order (the order messages are matched in).
  std::vector<std::uint32_t> order;
  std::uint32_t order_head = 0;
  std::uint32_t order_count = 0;
  // Receives whose repost the endpoint refused for now (would_block).
  std::vector<std::uint32_t> unposted;
  std::int64_t current = -1;
  PeerId current_peer = kAnyPeer;
  aggregate::BatchCursor cursor;
  std::vector<std::uint32_t> expected;  // next batch sequence per sender (PeerIds are dense)
  std::vector<bool> seen;
  Status broken = Status::ok;
  AggregateReceiverStats st;

  Impl(Endpoint& e, const AggregatorConfig& c) : ep(e), cfg(c) {}

  Status post(std::uint32_t idx) noexcept {
    comp->done[idx].store(kPending, std::memory_order_relaxed);
    auto t = ep.post_recv(bufs[idx].whole, [c = comp, idx](const Completion& done) {
      c->bytes[idx].store(done.bytes, std::memory_order_relaxed);
      c->peer[idx].store(done.peer, std::memory_order_relaxed);
      c->done[idx].store(done_value(done.status), std::memory_order_release);
    });
    if (!t) return t.status();
    order[(order_head + order_count) % n] = idx;
    ++order_count;
    return Status::ok;
  }

  void repost(std::uint32_t idx) noexcept {
    const Status s = post(idx);
    if (s == Status::would_block) {
      unposted.push_back(idx);  // capacity reserved: never allocates
    } else if (s != Status::ok && broken == Status::ok) {
      broken = s;
    }
  }

  void check_sequence(PeerId peer, std::uint32_t seq) {
    if (peer == kAnyPeer) return;
    if (peer >= expected.size()) {
      // Peers are dense and few: grows once per new sender, not per batch.
      expected.resize(peer + 1, 0);
      seen.resize(peer + 1, false);
    }
    if (seen[peer] && seq != expected[peer]) ++st.out_of_order;
    seen[peer] = true;
    expected[peer] = seq + 1;
  }

  Result<AggregateRecord> next() noexcept {
    for (;;) {
      if (current >= 0) {
        std::span<const std::byte> rec;
        if (cursor.next(rec)) {
          ++st.records;
          return AggregateRecord{current_peer, rec};
        }
        repost(static_cast<std::uint32_t>(current));
        current = -1;
      }
      if (broken != Status::ok) return broken;
      while (!unposted.empty()) {
        const std::uint32_t idx = unposted.back();
        unposted.pop_back();
        repost(idx);
        if (!unposted.empty() && unposted.back() == idx) break;  // still refused
      }
      if (order_count == 0) return Status::would_block;
      const std::uint32_t idx = order[order_head];
      std::uint8_t v = comp->done[idx].load(std::memory_order_acquire);
      if (v == kPending) {
        ep.progress();
        v = comp->done[idx].load(std::memory_order_acquire);
        if (v == kPending) return Status::would_block;
      }
      order_head = (order_head + 1) % n;
      --order_count;
      if (done_status(v) != Status::ok) {
        if (done_status(v) == Status::closed || done_status(v) == Status::canceled) {
          broken = done_status(v);
          return broken;
        }
        ++st.failed;
        repost(idx);
        continue;
      }
      const std::uint64_t got = comp->bytes[idx].load(std::memory_order_relaxed);
      if (got > cfg.batch_bytes) {
        ++st.failed;
        repost(idx);
        continue;
      }
      const std::span<const std::byte> msg = bufs[idx].whole.bytes().first(static_cast<std::size_t>(got));
      auto info = aggregate::parse_batch(msg);
      if (!info) {
        ++st.malformed;
        repost(idx);
        continue;
      }
      current_peer = comp->peer[idx].load(std::memory_order_relaxed);
      try {
        check_sequence(current_peer, info->sequence);
      } catch (...) {
        // Out of memory growing the per-sender table: skip the check.
      }
      ++st.batches;
      current = idx;
      cursor = aggregate::BatchCursor(msg);
    }
  }
};

AggregateReceiver::AggregateReceiver(Endpoint& ep, Pool& pool, const AggregatorConfig& config)
    : impl_(std::make_unique<Impl>(ep, config)) {
  check_config(config);
  Impl& m = *impl_;
  m.n = config.buffers;
  m.bufs = make_buffers(pool, m.n, config.batch_bytes);
  m.comp = std::make_shared<Completions>(m.n);
  m.order.assign(m.n, 0);
  m.unposted.reserve(m.n);
  for (std::uint32_t i = 0; i < m.n; ++i) {
    if (const Status s = m.post(i); s != Status::ok) {
      throw Error(s, 0, "aggregation buffer: posting a receive failed");
    }
  }
}

AggregateReceiver::~AggregateReceiver() = default;
AggregateReceiver::AggregateReceiver(AggregateReceiver&&) noexcept = default;
AggregateReceiver& AggregateReceiver::operator=(AggregateReceiver&&) noexcept = default;

Result<AggregateRecord> AggregateReceiver::next() noexcept { return impl_->next(); }
Status AggregateReceiver::status() const noexcept { return impl_->broken; }
AggregateReceiverStats AggregateReceiver::stats() const noexcept { return impl_->st; }

}  // namespace regpool
