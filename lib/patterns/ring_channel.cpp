#include "regpool/ring_channel.hpp"

#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "patterns/done_flag.hpp"
#include "patterns/ring_wire.hpp"

namespace regpool {
namespace {

using Clock = std::chrono::steady_clock;
using ring::kControlBytes;
using ring::kHeaderBytes;
using ring::kWordBytes;

using patterns::done_status;
using patterns::done_value;
using patterns::DoneFlag;
using patterns::kPending;

std::uint32_t random_nonce() {
  std::uint32_t v = 0;
  for (int tries = 0; tries < 8; ++tries) {
    const ssize_t n = ::getrandom(&v, sizeof v, 0);
    if (n == static_cast<ssize_t>(sizeof v)) return v;
    if (n < 0 && errno != EINTR) break;
  }
  throw Error(Status::transport_error, errno, "ring channel: getrandom for the channel nonce failed");
}

// 16 bytes another process may be writing right now: two aligned 64-bit
// loads (never torn at the word level on the platforms we build for), both
// acquire, so that the ring bytes read after a valid tail are at least as
// new as that tail (acquire loads rather than a fence: ThreadSanitizer
// does not support fences). A torn pair fails the word's check.
void load_word(const std::byte* p, std::span<std::byte, kWordBytes> out) noexcept {
  auto* w = reinterpret_cast<std::uint64_t*>(const_cast<std::byte*>(p));
  const std::uint64_t a = std::atomic_ref<std::uint64_t>(w[0]).load(std::memory_order_acquire);
  const std::uint64_t b = std::atomic_ref<std::uint64_t>(w[1]).load(std::memory_order_acquire);
  std::memcpy(out.data(), &a, 8);
  std::memcpy(out.data() + 8, &b, 8);
}

Ldo allocate_or_throw(Pool& pool, std::uint64_t bytes, const char* what) {
  auto r = pool.allocate(bytes);
  if (!r) throw Error(r.status(), 0, std::string("ring channel: allocating the ") + what + " failed");
  return std::move(*r);
}

Slice slice_or_throw(Result<Slice> r, const char* what) {
  if (!r) throw Error(r.status(), 0, std::string("ring channel: slice of the ") + what);
  return std::move(*r);
}

// Least privilege first: the peer only ever writes. Backends that cannot
// grant write-only (access_denied/unsupported) get read-write.
Exposure expose_or_throw(Endpoint& ep, const Slice& s, PeerId peer, ExposureMode mode, const char* what) {
  auto e = ep.expose(s, RemoteAccess::write_only, peer, mode);
  if (!e && (e.status() == Status::unsupported || e.status() == Status::access_denied)) {
    e = ep.expose(s, RemoteAccess::read_write, peer, mode);
  }
  if (!e) throw Error(e.status(), 0, std::string("ring channel: exposing the ") + what + " failed");
  return std::move(*e);
}

bool due(Clock::time_point last, std::chrono::milliseconds every, Clock::time_point now) noexcept {
  return every.count() > 0 && now - last >= every;
}

}  // namespace

// ---------------------------------------------------------------- consumer

struct RingConsumer::Impl {
  Endpoint& ep;
  PeerId peer;
  RingConfig cfg;
  std::uint64_t cap = 0;
  std::uint64_t credit_interval = 0;
  std::uint32_t nonce = 0;
  Ldo ring;            // data: [tail word][reserved][ring]
  std::byte* base = nullptr;
  Exposure exposure;
  Ldo credit_ldo;      // staging of the credit word we put
  Slice credit_slice;
  bool connected = false;
  RemoteRef credit_ref;

  std::uint64_t head = 0;        // next byte to read
  std::uint64_t known_tail = 0;  // last valid tail seen
  std::uint64_t credited = 0;    // last head sent
  std::uint32_t sequence = 0;    // expected at head
  bool want_credit = false;      // the producer said it waits for room
  bool have_record = false;
  ring::ParsedRecord current;

  std::shared_ptr<DoneFlag> credit_done = std::make_shared<DoneFlag>(kPending);
  bool credit_in_flight = false;
  Clock::time_point last_credit = Clock::now();
  Status broken = Status::ok;
  RingStats st;

  Impl(Endpoint& e, PeerId p, const RingConfig& c) : ep(e), peer(p), cfg(c) {}

  Status fail(Status s) noexcept {
    if (broken == Status::ok) broken = s;
    return broken;
  }

  void reap_credit() noexcept {
    if (!credit_in_flight) return;
    const std::uint8_t v = credit_done->load(std::memory_order_acquire);
    if (v == kPending) return;
    credit_in_flight = false;
    if (done_status(v) != Status::ok) fail(done_status(v));
  }

  void send_credit(bool keepalive) noexcept {
    if (!connected || credit_in_flight || broken != Status::ok) return;
    ring::encode_word(credit_slice.bytes().first<kWordBytes>(), ring::WordKind::credit, {head, 0}, nonce);
    credit_done->store(kPending, std::memory_order_relaxed);
    auto t = ep.put(credit_slice, peer, credit_ref, 0, [done = credit_done](const Completion& c) {
      done->store(done_value(c.status), std::memory_order_release);
    });
    if (!t) {
      if (t.status() != Status::would_block) fail(t.status());
      return;
    }
    credit_in_flight = true;
    credited = head;
    last_credit = Clock::now();
    ++st.control_puts;
    if (keepalive) ++st.keepalives;
  }

  // Credits go back every credit_interval bytes, and when the producer says
  // it waits, once we have caught up with what it published (then it gets
  // all the room there is with one put, rather than one put per record).
  void maybe_credit() noexcept {
    reap_credit();
    if (!connected || head == credited) return;
    if (head - credited < credit_interval && !(want_credit && head == known_tail)) return;
    if (credit_in_flight) {
      ep.progress();
      reap_credit();
    }
    send_credit(false);
  }

  void refresh_tail() noexcept {
    if (ep.target_progress_required() || credit_in_flight) ep.progress();
    std::array<std::byte, kWordBytes> w{};
    load_word(base, w);
    auto word = ring::decode_word(w, ring::WordKind::tail, nonce);
    if (!word) return;  // never written yet, torn, or garbage: nothing new
    if (word->position < known_tail) return;  // an older tail (a keepalive overtaken)
    if (word->position % ring::kAlign != 0 || word->position - head > cap) {
      fail(Status::malformed);
      return;
    }
    known_tail = word->position;
    want_credit = (word->flags & ring::kWantCredit) != 0;
  }

  // Nothing to read: credits the producer waits for, keepalives, a peer the
  // endpoint already knows is gone.
  Status idle() noexcept {
    reap_credit();
    if (broken != Status::ok) return broken;
    if (connected) {
      if (want_credit && head != credited) send_credit(false);
      if (!credit_in_flight && due(last_credit, cfg.keepalive, Clock::now())) send_credit(true);
      if (!ep.usable(peer)) return fail(Status::peer_unreachable);
    }
    return broken == Status::ok ? Status::would_block : broken;
  }

  Result<std::span<const std::byte>> peek() noexcept {
    if (broken != Status::ok) return broken;
    if (have_record) return payload();
    for (;;) {
      if (head == known_tail) {
        refresh_tail();
        if (broken != Status::ok) return broken;
        if (head == known_tail) return idle();
      }
      const std::uint64_t off = head % cap;
      const std::uint64_t room = cap - off;
      if (room < kHeaderBytes) {  // too short for a header: both sides skip it
        head += room;
        continue;
      }
      // Copy the header out of the shared ring before validating it, so the
      // bytes checked are the bytes used.
      std::array<std::byte, kHeaderBytes> h{};
      std::memcpy(h.data(), base + kControlBytes + off, kHeaderBytes);
      auto r = ring::parse_record(h, head, known_tail, cap, sequence, nonce);
      if (!r) return fail(Status::malformed);
      if (r->header.kind == ring::RecordKind::pad) {
        head += r->advance;
        ++sequence;
        ++st.pads;
        maybe_credit();
        continue;
      }
      current = *r;
      have_record = true;
      return payload();
    }
  }

  std::span<const std::byte> payload() const noexcept {
    return {base + kControlBytes + current.payload_offset, current.header.length};
  }

  Status pop() noexcept {
    if (!have_record) return Status::invalid_argument;
    head += current.advance;
    ++sequence;
    ++st.records;
    st.bytes += current.header.length;
    have_record = false;
    maybe_credit();
    return Status::ok;
  }
};

RingConsumer::RingConsumer(Endpoint& ep, Pool& pool, PeerId producer, const RingConfig& config)
    : impl_(std::make_unique<Impl>(ep, producer, config)) {
  Impl& m = *impl_;
  if (!ring::valid_capacity(config.capacity)) {
    throw Error(Status::invalid_argument, 0,
                "ring channel: capacity " + std::to_string(config.capacity) +
                    " must be a multiple of 8 between 256 bytes and 1 TiB");
  }
  m.cap = config.capacity;
  m.credit_interval = config.credit_interval ? std::min(config.credit_interval, m.cap) : m.cap / 4;
  m.nonce = random_nonce();
  m.ring = allocate_or_throw(pool, kControlBytes + m.cap, "ring");
  m.base = m.ring.data().data();
  // A zero tail word fails its check: no records until the producer writes.
  std::memset(m.base, 0, kControlBytes);
  const Slice whole = slice_or_throw(Slice::data(m.ring, 0, kControlBytes + m.cap), "ring");
  m.exposure = expose_or_throw(ep, whole, producer, config.exposure_mode, "ring");
  m.credit_ldo = allocate_or_throw(pool, kWordBytes, "credit staging word");
  m.credit_slice = slice_or_throw(Slice::data(m.credit_ldo, 0, kWordBytes), "credit staging word");
}

RingConsumer::~RingConsumer() = default;
RingConsumer::RingConsumer(RingConsumer&&) noexcept = default;
RingConsumer& RingConsumer::operator=(RingConsumer&&) noexcept = default;

std::vector<std::byte> RingConsumer::setup() const {
  return ring::encode_consumer_setup({impl_->nonce, impl_->cap, impl_->exposure.ref()});
}

void RingConsumer::connect(std::span<const std::byte> producer_setup) {
  auto s = ring::decode_producer_setup(producer_setup);
  if (!s) throw Error(s.status(), 0, "ring channel: the producer's setup blob failed validation");
  if (s->nonce != impl_->nonce) {
    throw Error(Status::malformed, 0, "ring channel: the producer's setup blob belongs to another channel (nonce)");
  }
  impl_->credit_ref = s->credit;
  impl_->connected = true;
  impl_->last_credit = Clock::now();
}

Result<std::span<const std::byte>> RingConsumer::peek() noexcept { return impl_->peek(); }
Status RingConsumer::pop() noexcept { return impl_->pop(); }

Result<std::size_t> RingConsumer::try_pop(std::span<std::byte> out) noexcept {
  auto r = impl_->peek();
  if (!r) return r.status();
  if (r->size() > out.size()) return Status::out_of_bounds;
  const std::size_t n = r->size();
  std::memcpy(out.data(), r->data(), n);
  impl_->pop();
  return n;
}

std::uint64_t RingConsumer::capacity() const noexcept { return impl_->cap; }
Status RingConsumer::status() const noexcept { return impl_->broken; }
RingStats RingConsumer::stats() const noexcept { return impl_->st; }

// ---------------------------------------------------------------- producer

struct RingProducer::Impl {
  // Mirror object (data section): [credit word][tail staging][reserved][ring mirror]
  static constexpr std::uint64_t kTailStaging = 16;

  Endpoint& ep;
  PeerId peer;
  RingConfig cfg;
  ring::ConsumerSetup remote;
  std::uint64_t cap = 0;
  Ldo mirror;
  std::byte* base = nullptr;
  Slice ring_slice;  // the mirror ring, [64, 64 + cap) of the data section
  Slice tail_slice;
  Exposure credit_exposure;

  std::uint64_t appended = 0;  // records copied into the mirror
  std::uint64_t posted = 0;    // of which put
  std::uint64_t durable = 0;   // of which completed (in the consumer's memory)
  std::uint64_t head = 0;      // consumed, per the last valid credit
  std::uint64_t tail_sent = 0;     // highest tail put
  std::uint64_t published = 0;     // highest tail whose put completed
  std::uint32_t flags_sent = 0;
  std::uint32_t sequence = 0;
  bool want_credit = false;

  // Record puts in flight, oldest first (a ring of max_puts entries).
  std::unique_ptr<std::uint64_t[]> put_end;
  std::shared_ptr<DoneFlag[]> put_done;
  std::uint32_t fifo_head = 0;
  std::uint32_t fifo_count = 0;

  std::shared_ptr<DoneFlag> tail_done = std::make_shared<DoneFlag>(kPending);
  bool tail_in_flight = false;
  std::uint64_t tail_value = 0;
  Clock::time_point last_tail = Clock::now();
  Status broken = Status::ok;
  RingStats st;

  Impl(Endpoint& e, PeerId p, const RingConfig& c) : ep(e), peer(p), cfg(c) {}

  Status fail(Status s) noexcept {
    if (broken == Status::ok) broken = s;
    return broken;
  }

  std::uint64_t room_for(std::uint64_t bytes) const noexcept { return appended + bytes - head <= cap; }

  void reap() noexcept {
    while (fifo_count > 0) {
      const std::uint8_t v = put_done[fifo_head].load(std::memory_order_acquire);
      if (v == kPending) break;
      if (done_status(v) != Status::ok) {
        fail(done_status(v));
        return;
      }
      durable = put_end[fifo_head];
      fifo_head = (fifo_head + 1) % cfg.max_puts;
      --fifo_count;
    }
    if (tail_in_flight) {
      const std::uint8_t v = tail_done->load(std::memory_order_acquire);
      if (v != kPending) {
        tail_in_flight = false;
        if (done_status(v) != Status::ok) {
          fail(done_status(v));
          return;
        }
        published = std::max(published, tail_value);
      }
    }
  }

  void read_credit() noexcept {
    std::array<std::byte, kWordBytes> w{};
    load_word(base, w);
    auto word = ring::decode_word(w, ring::WordKind::credit, remote.nonce);
    if (!word || word->position <= head) return;  // nothing new (or torn: read again later)
    if (word->position % ring::kAlign != 0 || word->position > tail_sent || word->flags != 0) {
      fail(Status::malformed);  // credit for bytes never published
      return;
    }
    head = word->position;
  }

  // The tail goes out only once the records it covers are durable, so the
  // consumer never sees a tail ahead of its records, whatever order the
  // provider applies two puts in.
  void publish(Clock::time_point now) noexcept {
    if (tail_in_flight || broken != Status::ok) return;
    const std::uint32_t flags = want_credit ? ring::kWantCredit : 0;
    const bool keepalive = want_credit && due(last_tail, cfg.keepalive, now);
    if (durable == tail_sent && flags == flags_sent && !keepalive) return;
    ring::encode_word(tail_slice.bytes().first<kWordBytes>(), ring::WordKind::tail, {durable, flags}, remote.nonce);
    tail_done->store(kPending, std::memory_order_relaxed);
    auto t = ep.put(tail_slice, peer, remote.ring, 0, [done = tail_done](const Completion& c) {
      done->store(done_value(c.status), std::memory_order_release);
    });
    if (!t) {
      if (t.status() != Status::would_block) fail(t.status());
      return;
    }
    if (durable == tail_sent && flags == flags_sent) ++st.keepalives;
    tail_in_flight = true;
    tail_value = durable;
    tail_sent = durable;
    flags_sent = flags;
    last_tail = now;
    ++st.control_puts;
  }

  Status flush() noexcept {
    if (broken != Status::ok) return broken;
    while (posted < appended && fifo_count < cfg.max_puts) {
      const std::uint64_t off = posted % cap;
      const std::uint64_t len = std::min(appended - posted, cap - off);
      auto s = ring_slice.select(off, len);
      if (!s) return fail(s.status());
      const std::uint32_t idx = (fifo_head + fifo_count) % cfg.max_puts;
      put_done[idx].store(kPending, std::memory_order_relaxed);
      auto t = ep.put(*s, peer, remote.ring, kControlBytes + off, [done = put_done, idx](const Completion& c) {
        done[idx].store(done_value(c.status), std::memory_order_release);
      });
      if (!t) {
        if (t.status() == Status::would_block) break;  // retried by progress()
        return fail(t.status());
      }
      put_end[idx] = posted + len;
      ++fifo_count;
      posted += len;
      ++st.record_puts;
    }
    return Status::ok;
  }

  Status try_push(std::span<const std::byte> record) noexcept {
    if (broken != Status::ok) return broken;
    if (record.empty() || record.size() > ring::max_payload(cap)) return Status::invalid_argument;
    const std::uint64_t need = ring::record_bytes(record.size());
    for (;;) {
      const std::uint64_t off = appended % cap;
      const std::uint64_t room = cap - off;
      if (room >= need) break;
      // The record does not fit before the end: pad (or skip a gap too short
      // for a header) to the start of the ring.
      if (!room_for(room)) return full();
      if (room >= kHeaderBytes) {
        ring::encode_header(std::span<std::byte, kHeaderBytes>(base + kControlBytes + off, kHeaderBytes),
                            {ring::RecordKind::pad, static_cast<std::uint32_t>(room - kHeaderBytes), sequence},
                            remote.nonce);
        ++sequence;
        ++st.pads;
      }
      appended += room;
    }
    if (!room_for(need)) return full();
    std::byte* p = base + kControlBytes + appended % cap;
    ring::encode_header(std::span<std::byte, kHeaderBytes>(p, kHeaderBytes),
                        {ring::RecordKind::data, static_cast<std::uint32_t>(record.size()), sequence}, remote.nonce);
    std::memcpy(p + kHeaderBytes, record.data(), record.size());
    // Padding goes on the wire too: never let it carry stale bytes.
    std::memset(p + kHeaderBytes + record.size(), 0, need - kHeaderBytes - record.size());
    appended += need;
    ++sequence;
    ++st.records;
    st.bytes += record.size();
    want_credit = false;
    if (appended - posted >= cfg.post_batch) return flush();
    return Status::ok;
  }

  Status full() noexcept {
    ++st.full;
    want_credit = true;
    // Everything appended must reach the consumer, or its credits never come.
    return flush() == Status::ok ? Status::would_block : broken;
  }

  Status progress() noexcept {
    if (broken != Status::ok) return broken;
    ep.progress();
    reap();
    if (broken != Status::ok) return broken;
    read_credit();
    if (broken != Status::ok) return broken;
    flush();
    publish(Clock::now());
    if (broken == Status::ok && want_credit && !ep.usable(peer)) fail(Status::peer_unreachable);
    return broken;
  }
};

RingProducer::RingProducer(Endpoint& ep, Pool& pool, PeerId consumer, std::span<const std::byte> consumer_setup,
                           const RingConfig& config)
    : impl_(std::make_unique<Impl>(ep, consumer, config)) {
  Impl& m = *impl_;
  auto s = ring::decode_consumer_setup(consumer_setup);
  if (!s) throw Error(s.status(), 0, "ring channel: the consumer's setup blob failed validation");
  if (s->ring.backend != ep.backend()) {
    throw Error(Status::malformed, 0, "ring channel: the consumer's ring is exposed by another backend");
  }
  if (config.max_puts == 0) throw Error(Status::invalid_argument, 0, "ring channel: max_puts must be at least 1");
  m.remote = *s;
  m.cap = s->capacity;
  m.mirror = allocate_or_throw(pool, kControlBytes + m.cap, "ring mirror");
  m.base = m.mirror.data().data();
  // Zeroed once, so that pad bytes and gaps put to the consumer never carry
  // this process's earlier data; a zero credit word fails its check.
  std::memset(m.base, 0, kControlBytes + m.cap);
  m.ring_slice = slice_or_throw(Slice::data(m.mirror, kControlBytes, m.cap), "ring mirror");
  m.tail_slice = slice_or_throw(Slice::data(m.mirror, Impl::kTailStaging, kWordBytes), "tail staging word");
  const Slice credit = slice_or_throw(Slice::data(m.mirror, 0, kWordBytes), "credit word");
  m.credit_exposure = expose_or_throw(ep, credit, consumer, config.exposure_mode, "credit word");
  m.put_end = std::make_unique<std::uint64_t[]>(config.max_puts);
  m.put_done = std::shared_ptr<DoneFlag[]>(new DoneFlag[config.max_puts]);
  for (std::uint32_t i = 0; i < config.max_puts; ++i) m.put_done[i].store(kPending, std::memory_order_relaxed);
}

RingProducer::~RingProducer() = default;
RingProducer::RingProducer(RingProducer&&) noexcept = default;
RingProducer& RingProducer::operator=(RingProducer&&) noexcept = default;

std::vector<std::byte> RingProducer::setup() const {
  return ring::encode_producer_setup({impl_->remote.nonce, impl_->credit_exposure.ref()});
}

Status RingProducer::try_push(std::span<const std::byte> record) noexcept { return impl_->try_push(record); }
Status RingProducer::flush() noexcept { return impl_->flush(); }
Status RingProducer::progress() noexcept { return impl_->progress(); }

Status RingProducer::push(std::span<const std::byte> record, std::chrono::milliseconds timeout) noexcept {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const Status s = impl_->try_push(record);
    if (s != Status::would_block) return s;
    if (const Status p = impl_->progress(); p != Status::ok) return p;
    if (Clock::now() >= deadline) return Status::timeout;
    std::this_thread::yield();
  }
}

Status RingProducer::drain(std::chrono::milliseconds timeout, bool consumed) noexcept {
  Impl& m = *impl_;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (const Status f = m.flush(); f != Status::ok) return f;
    if (const Status p = m.progress(); p != Status::ok) return p;
    if (m.published == m.appended && (!consumed || m.head == m.appended)) return Status::ok;
    // Waiting for the consumer to consume: ask for the credit now.
    if (consumed) m.want_credit = m.head != m.appended;
    if (Clock::now() >= deadline) return Status::timeout;
    std::this_thread::yield();
  }
}

std::uint64_t RingProducer::capacity() const noexcept { return impl_->cap; }
std::uint64_t RingProducer::max_record() const noexcept { return ring::max_payload(impl_->cap); }
Status RingProducer::status() const noexcept { return impl_->broken; }
RingStats RingProducer::stats() const noexcept { return impl_->st; }

}  // namespace regpool
