#include "regpool/endpoint.hpp"

#include "regpool/endpoint_backend.hpp"

#include "platform/coarse_clock.hpp"
#include "platform/counter.hpp"
#include "platform/futex.hpp"
#include "transport/message_sink.hpp"
#include "transport/stack_batch.hpp"

#include <poll.h>
#include <sched.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <unordered_map>

namespace regpool {
namespace {

// Code layout: the per-op path (post, poll, complete, wait, progress) is
// [[gnu::hot]], grouped by the linker with the Messenger's and the
// backend's hot functions; failure paths (reject, refuse, fail, expire,
// reconnect) are [[gnu::cold]], out of the way of the path. On tcp each
// message crosses the kernel's socket path, which evicts the caches, so
// the lines and pages the path's code spans are paid on every message
// (bench/RESULTS.md, "the eager path's code layout").

// Completions handed to callbacks per round of progress(); bounds the stack
// space progress() uses (callbacks and results are moved out of their slots
// so they can run without the endpoint's mutex).
constexpr std::size_t kDeliverBatch = 32;
// Deadlines are scanned at most this often: scanning walks every slot.
constexpr auto kExpiryScanInterval = std::chrono::milliseconds(1);
// How often failed ops the backend still holds are offered to do_abandon
// (a backend may look into /proc for each: not every millisecond).
constexpr auto kAbandonScanInterval = std::chrono::milliseconds(20);
// References released per unlock round (stack space of unlock_and_release).
constexpr std::size_t kReleaseBatch = 32;
// Yields at most before taking the mutex while other threads are blocked on
// it (lock_fair): each is a sched_yield, well under a microsecond when the
// core has nothing else to run.
constexpr std::uint32_t kHandoffYields = 1024;
// How long revoke() waits for a deferred revocation before leaving it parked.
constexpr auto kRevokeConfirmWait = std::chrono::milliseconds(20);
// Sleeping waits: the longest one sleep lasts (operation deadlines are
// checked at least this often), and the naps of backends without a wait
// object: from kNapMin, doubling per consecutive nap, up to kNapMax.
constexpr auto kMaxSleep = std::chrono::microseconds(10000);
constexpr auto kNapMin = std::chrono::microseconds(16);
constexpr auto kNapMax = std::chrono::microseconds(1000);
// WaitMode::adaptive: the longest learned spin window, and how much longer
// than the longest recent gap it spins (docs/progress.md, "Adaptive").
constexpr auto kSpinCap = std::chrono::microseconds(1000);
constexpr std::uint32_t kSpinGapFactor = 2;
// How often the runnable-process count is read (one /proc/loadavg read).
constexpr auto kLoadCheckInterval = std::chrono::milliseconds(10);

// Whether more processes are runnable now than this process may use CPUs:
// spinning then takes a core from someone who needs it. Read from
// /proc/loadavg (field 4, "running/total") at most every
// kLoadCheckInterval, process-wide; false when it cannot be read.
bool cpus_oversubscribed(std::chrono::steady_clock::time_point now) noexcept {
  static std::atomic<std::int64_t> next_check{0};
  static std::atomic<bool> over{false};
  static const long cpus = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) == 0) return static_cast<long>(CPU_COUNT(&set));
    return ::sysconf(_SC_NPROCESSORS_ONLN);
  }();
  const std::int64_t t = now.time_since_epoch().count();
  std::int64_t due = next_check.load(std::memory_order_relaxed);
  if (t < due || !next_check.compare_exchange_strong(
                     due, t + std::chrono::duration_cast<std::chrono::steady_clock::duration>(kLoadCheckInterval).count(),
                     std::memory_order_relaxed)) {
    return over.load(std::memory_order_relaxed);
  }
  bool result = false;
  const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[128];
    const ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n > 0) {
      buf[n] = '\0';
      double l1 = 0, l5 = 0, l15 = 0;
      long running = 0;
      if (std::sscanf(buf, "%lf %lf %lf %ld/", &l1, &l5, &l15, &running) == 4) result = cpus > 0 && running > cpus;
    }
  }
  over.store(result, std::memory_order_relaxed);
  return result;
}

bool needs_peer(OpKind k) noexcept { return k != OpKind::recv; }

// Ring arithmetic for the ready_ and releases_ rings (head < n, count <= n):
// a compare instead of a division on the path of every completion.
// A token's slot (low 32 bits) and the slot's generation (high 32 bits).
struct TokenParts {
  std::uint32_t index;
  std::uint32_t gen;
};
TokenParts parts_of(Token t) noexcept {
  return {static_cast<std::uint32_t>(t.value & 0xffffffffu), static_cast<std::uint32_t>(t.value >> 32)};
}

std::size_t ring_next(std::size_t i, std::size_t n) noexcept { return i + 1 == n ? 0 : i + 1; }
std::size_t ring_at(std::size_t head, std::size_t count, std::size_t n) noexcept {
  const std::size_t i = head + count;
  return i >= n ? i - n : i;
}

using platform::bump_locked;
using platform::wait_deadline;

// Between retries with the mutex released: let the thread that holds or
// wants it run first, then sleep briefly (growing to 1 ms) so a long wait
// (connection setup on a peer that does not progress yet) does not burn a
// core.
void back_off(std::uint32_t attempt) noexcept {
  if (attempt < 64) {
    std::this_thread::yield();
    return;
  }
  const std::uint32_t shift = std::min<std::uint32_t>(attempt - 64, 6);
  std::this_thread::sleep_for(std::chrono::microseconds(16u << shift));
}

}  // namespace

const char* to_string(WaitMode m) noexcept {
  switch (m) {
    case WaitMode::spin: return "spin";
    case WaitMode::sleep: return "sleep";
    case WaitMode::adaptive: return "adaptive";
  }
  return "?";
}

const char* to_string(OpKind k) noexcept {
  switch (k) {
    case OpKind::put: return "put";
    case OpKind::get: return "get";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
    case OpKind::fetch_add: return "fetch_add";
    case OpKind::compare_swap: return "compare_swap";
  }
  return "?";
}

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

struct Endpoint::Slot {
  BackendOp desc;
  Slice local;
  Slice body;  // a gathered send's second piece (send_gathered)
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
  // Completed for the user because its peer failed or was removed, still
  // held by the backend: offered to do_abandon.
  bool orphan = false;
  // Kept operations (post_recv_kept, send_kept): kept until ended; parked
  // between a taken completion and repost(); delivering while its callback
  // runs (in place, outside the mutex); repost_asked by that callback.
  bool kept = false;
  bool parked = false;
  bool delivering = false;
  bool repost_asked = false;
  bool repost_pending = false;  // in kept_retry_ (deadline: its post_timeout)
  std::uint32_t peer_epoch = 0;  // a kept op's Peer::epoch when it was posted first
  // A kept put's or get's length when it was posted first: the remote
  // range was checked for it, so no repost may move more.
  std::uint64_t rma_room = 0;
  // The buffer a repost asked for by the callback moves to, once the
  // callback (which may still read the old one) has returned.
  Slice next_local;
  std::uint64_t next_length = 0;  // and the length it asked for (0: the whole buffer)
  alignas(16) std::byte context[kBackendContextSize];
};

// State kept out of the public header because its types need <thread>,
// <condition_variable> and <unordered_map>, or because it is an
// implementation detail of the op deadlines. Setup, shutdown, wait(), a
// completion some thread is sleeping on (waiters_ > 0), scoped exposures
// (expose, revoke, the end of their quarantine) and accept_locked (the
// deadline span) reach it.
struct Endpoint::Impl {
  // No backend-owned op has a deadline before this (a lower bound: lowered
  // at accept, recomputed by the expiry scan), so the scan walks the slots
  // only once some deadline may have passed, not every interval.
  Clock::time_point next_op_deadline = Clock::time_point::max();
  // accept_locked's deadline span (deadline_for's, in floating point) for
  // the last length posted of each bound, [0] receives (recv_timeout) and
  // [1] everything else (op_timeout); Clock::duration::max(): no deadline.
  // An op of the same class and length as the last of its class reuses it:
  // floating point is software under qemu TCG (the Soft-RoCE guest). Two
  // entries, not one: a send ping-pong alternates receives and sends, and
  // with one entry recomputed the span on every post.
  struct SpanCache {
    bool valid = false;
    std::uint64_t length = 0;
    Clock::duration span{};
  };
  SpanCache spans[2];
  std::thread progress_thread;
  // progress_or_idle()'s state between calls, and who is using it.
  IdleState idle_state;
  std::atomic_flag idle_busy = ATOMIC_FLAG_INIT;
  // Progress thread mode: wait() sleeps here (any: it waits with the
  // endpoint's own Mutex).
  std::condition_variable_any done_cv;
  // Scoped registrations (a slab with a free list). One is shared by the
  // exposures (live or quarantined) of the same bytes and rights when
  // ExposureSupport::reuse_scoped is set.
  struct ScopedReg {
    Registration registration;
    const std::byte* base = nullptr;
    std::uint64_t length = 0;
    RemoteAccess access = RemoteAccess::read_only;
    std::uint32_t holders = 0;
  };
  std::vector<ScopedReg> scoped;
  std::vector<std::uint32_t> scoped_free;
  // reuse_scoped: open scoped registrations by their first byte's address.
  std::unordered_multimap<const std::byte*, std::uint32_t> scoped_by_base;
};

// ---------------------------------------------------------------- Exposure

Exposure& Exposure::operator=(Exposure&& o) noexcept {
  if (this != &o) {
    revoke();
    link_ = std::move(o.link_);
    slice_ = std::move(o.slice_);
    ref_ = o.ref_;
    index_ = o.index_;
    active_ = o.active_;
    o.active_ = false;
  }
  return *this;
}

void Exposure::revoke() noexcept {
  if (active_) {
    active_ = false;
    Endpoint* ep = nullptr;
    if (link_) {
      std::lock_guard<std::mutex> g(link_->mutex);
      ep = link_->ep;
      if (ep) ++link_->users;  // shutdown waits for us before the endpoint goes
    }
    if (ep) {
      // Takes slice_ when the revocation is not confirmed yet (parked).
      ep->revoke_exposure(index_, ref_.exposure_id, slice_);
      std::lock_guard<std::mutex> g(link_->mutex);
      if (--link_->users == 0) link_->idle.notify_all();
    }
  }
  link_.reset();
  // Only after the key is gone (or parked with the endpoint) may the bytes
  // go back to the pool.
  slice_ = Slice{};
}

// ---------------------------------------------------------------- Endpoint

// The mutex: platform/futex.hpp's futex mutex on a word of our own (the
// public header cannot include that one). Which thread gets it next is
// left to lock_fair (below). A sleeper only waits for a holder, never for
// the network: no hold waits (endpoint_backend.hpp).
bool Endpoint::Mutex::try_lock() noexcept { return platform::futex_mutex_try_lock(state_); }

void Endpoint::Mutex::lock() noexcept { platform::futex_mutex_lock(state_); }

void Endpoint::Mutex::unlock() noexcept { platform::futex_mutex_unlock(state_); }

// The endpoint's mutex, released through unlock_and_release so references
// dropped under it are destroyed after unlocking.
// The uncontended acquisition (nobody blocked, the mutex free) and the
// release with nothing to drop are inline; lock_fair and
// unlock_and_release handle the rest.
class Endpoint::Lock {
 public:
  // The fast paths use the mutex itself and adopt or release it in lk_:
  // unique_lock's own lock and unlock check for misuse on every call.
  [[gnu::always_inline]] explicit Lock(Endpoint& ep) : ep_(ep), lk_(acquire(ep)) {}
  [[gnu::always_inline]] ~Lock() {
    if (lk_.owns_lock()) unlock();
  }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;
  [[gnu::always_inline]] void unlock() noexcept {
    if (ep_.release_count_ == 0 && ep_.release_list_ == kNoExposure) {
      lk_.release()->unlock();
    } else {
      ep_.unlock_and_release(lk_);
    }
  }
  void relock() {
    // The fast unlock released the mutex from lk_ (release()).
    if (lk_.mutex() == nullptr) lk_ = std::unique_lock<Mutex>(ep_.mutex_, std::defer_lock);
    ep_.lock_fair(lk_);
  }
  std::unique_lock<Mutex>& native() noexcept { return lk_; }

 private:
  [[gnu::always_inline]] static std::unique_lock<Mutex> acquire(Endpoint& ep) noexcept {
    if (ep.lock_waiters_.load(std::memory_order_relaxed) == 0 && ep.mutex_.try_lock()) {
      return std::unique_lock<Mutex>(ep.mutex_, std::adopt_lock);
    }
    return ep.lock_fair();
  }
  Endpoint& ep_;
  std::unique_lock<Mutex> lk_;
};

// Fair hand-off. A mutex lets the thread that unlocks take the mutex
// again at once, ahead of a thread that blocked on it: the blocked one is
// woken by the kernel and needs microseconds to run, and a spinning loop
// (wait(), a progress thread with progress_idle_sleep 0, a post retry)
// relocks within nanoseconds. Such a loop used to leave a window by
// accident - reading steady_clock (about 100 ns on kvm-clock) and building
// 64 callback and slice objects outside the mutex every round - and with
// those gone a thread calling expose(), revoke() or stats() on an endpoint
// whose progress thread spins waited until the scheduler preempted the
// spinner in the right place (99th percentile 10-23 ms at load 14:
// bench-sendpath's contended figure, bench/RESULTS.md). So a thread that has to block counts itself in
// lock_waiters_, and a thread that finds the count non-zero yields first
// until those have taken the mutex (bounded by kHandoffYields, so a waiter
// that is descheduled for long cannot stall it). Uncontended, this costs
// one relaxed load per acquisition.
void Endpoint::lock_fair(std::unique_lock<Mutex>& lk) const noexcept {
  if (lock_waiters_.load(std::memory_order_relaxed) != 0) {
    for (std::uint32_t i = 0; i < kHandoffYields && lock_waiters_.load(std::memory_order_relaxed) != 0; ++i) {
      std::this_thread::yield();
    }
  }
  if (lk.try_lock()) return;
  lock_waiters_.fetch_add(1, std::memory_order_relaxed);
  lk.lock();
  lock_waiters_.fetch_sub(1, std::memory_order_relaxed);
}

std::unique_lock<Endpoint::Mutex> Endpoint::lock_fair() const noexcept {
  std::unique_lock<Mutex> lk(mutex_, std::defer_lock);
  lock_fair(lk);
  return lk;
}

[[gnu::always_inline]] inline Slice Endpoint::take_release_locked() noexcept {
  const std::uint32_t index = releases_[release_head_];
  release_head_ = ring_next(release_head_, releases_.size());
  --release_count_;
  Slot& s = slots_[index];
  Slice local = std::move(s.local);
  if (s.body) [[unlikely]] body_releases_.push_back(std::move(s.body));
  s.release_pending = false;
  maybe_free_locked(index);
  return local;
}

[[gnu::always_inline]] inline void Endpoint::release_slice_locked(std::uint32_t index) noexcept {
  Slot& s = slots_[index];
  if (!s.local || s.release_pending) return;
  s.release_pending = true;
  releases_[ring_at(release_head_, release_count_, releases_.size())] = index;
  ++release_count_;
}

[[gnu::hot]] void Endpoint::unlock_releasing_one(std::unique_lock<Mutex>& lk) noexcept {
  const Slice last = take_release_locked();
  if (!body_releases_.empty()) [[unlikely]] {
    // A gathered send's: the one take above pushed at most this one.
    const Slice body = std::move(body_releases_.back());
    body_releases_.pop_back();
    lk.unlock();
    return;
  }
  lk.unlock();
}

[[gnu::hot]] void Endpoint::unlock_and_release(std::unique_lock<Mutex>& lk) noexcept {
  if (release_list_ == kNoExposure && release_count_ <= 1) {
    // The usual cases: nothing to drop, or the one reference of the op this
    // hold completed (a put or get and its wait), dropped after the unlock
    // by a function without this one's batch frame.
    if (release_count_ == 0) {
      lk.unlock();
    } else {
      unlock_releasing_one(lk);
    }
    return;
  }
  release_batches(lk);
}

void Endpoint::release_batches(std::unique_lock<Mutex>& lk) noexcept {
  for (;;) {
    bool more = false;
    {
      // Destroyed at the end of this block, after the unlock below.
      detail::StackBatch<Slice, kReleaseBatch> batch;
      while (!batch.full() && release_count_ > 0) batch.emplace(take_release_locked());
      while (!batch.full() && !body_releases_.empty()) {
        batch.emplace(std::move(body_releases_.back()));
        body_releases_.pop_back();
      }
      while (!batch.full() && release_list_ != kNoExposure) {
        const std::uint32_t index = release_list_;
        ExposureEntry& e = exposures_[index];
        release_list_ = e.next;
        batch.emplace(std::move(e.parked));
        free_exposure_locked(index);
      }
      more = release_count_ > 0 || release_list_ != kNoExposure || !body_releases_.empty();
      lk.unlock();
    }
    if (!more) return;
    lk.lock();
  }
}

Endpoint::Endpoint(const EndpointConfig& config, const ExposureSupport& support)
    : config_(config), support_(support) {
  impl_ = std::make_unique<Impl>();
  if (config_.max_in_flight == 0 || config_.max_in_flight > (std::size_t{1} << 24)) {
    throw Error(Status::invalid_argument, 0,
                "endpoint: max_in_flight must be between 1 and 2^24 (got " + std::to_string(config_.max_in_flight) +
                    ")");
  }
  if (config_.poll_batch == 0) config_.poll_batch = 1;
  const std::size_t n = config_.max_in_flight;
  slots_ = std::make_unique<Slot[]>(n);
  free_.reserve(n);
  batch_.reserve(n);
  for (std::size_t i = n; i-- > 0;) free_.push_back(static_cast<std::uint32_t>(i));
  ready_.assign(n, 0);
  releases_.assign(n, 0);
  body_releases_.reserve(n);
  kept_retry_.reserve(n);
  atomic_words_ = std::make_unique<AtomicWords[]>(n);
  peers_.reserve(16);
  link_ = std::make_shared<detail::ExposureLink>();
  link_->ep = this;
  exposures_.reserve(64);
  if (sleeps()) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      const int err = errno;
      throw Error(Status::transport_error, err,
                  std::string("endpoint: eventfd for sleeping waits failed: ") + std::strerror(err));
    }
  }
  // Exposure ids differ between endpoint incarnations, so a reference from a
  // previous run of a peer is not mistaken for a current one.
  std::random_device rd;
  exposure_nonce_ = (static_cast<std::uint64_t>(rd()) & 0xffffffffu) | 1u;
}

Endpoint::~Endpoint() {
  // Derived destructors call shutdown(); this is the safety net for the
  // thread and the exposures' back pointer only (no virtual calls here).
  stopping_.store(true, std::memory_order_release);
  if (impl_->progress_thread.joinable()) impl_->progress_thread.join();
  if (link_) {
    std::unique_lock<std::mutex> g(link_->mutex);
    link_->ep = nullptr;
    link_->idle.wait(g, [this] { return link_->users == 0; });
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

WaitBell Endpoint::do_wait_bell() const noexcept { return {}; }

void Endpoint::start() {
  if (sleeps()) {
    const WaitBell bell = do_wait_bell();
    if (bell.seq && bell.sleepers) {
      bell_seq_ = bell.seq;
      bell_sleepers_ = bell.sleepers;
    }
  }
  // Providers write atomic results into local memory they must be able to
  // address (FI_MR_LOCAL descriptors, verbs lkeys): one registration for
  // every slot's words, made once. Emulated atomics need none.
  if (do_native_atomics() && !atomic_reg_) {
    atomic_reg_ = domain().register_memory(atomic_words_.get(), config_.max_in_flight * sizeof(AtomicWords),
                                           Access::local);
  }
  if (config_.progress_thread && !impl_->progress_thread.joinable()) {
    impl_->progress_thread = std::thread([this] { progress_thread_main(); });
  }
}

void Endpoint::shutdown() noexcept {
  stopping_.store(true, std::memory_order_release);
  {
    // Sleepers (the progress thread among them) wake and see stopping_.
    const auto g = lock_fair();
    ++activity_;
    wake_sleepers_locked();
  }
  if (impl_->progress_thread.joinable() && impl_->progress_thread.get_id() != std::this_thread::get_id()) {
    impl_->progress_thread.join();
  }
  {
    // From now on no Exposure calls in; wait for revokes already inside
    // (each is bounded, and none holds this link's mutex while inside).
    std::unique_lock<std::mutex> g(link_->mutex);
    link_->ep = nullptr;
    link_->idle.wait(g, [this] { return link_->users == 0; });
  }
  Lock g(*this);
  usable_.store(false, std::memory_order_release);
  for (std::uint32_t i = 0; i < exposures_.size(); ++i) {
    ExposureEntry& e = exposures_[i];
    if (e.state == ExposureState::live || e.state == ExposureState::binding) {
      if (e.state == ExposureState::live) {
        ++exposure_stats_.revoked;
        --exposure_stats_.live;
      }
      revoke_deferred_ = false;
      release_scoped_locked(exposures_[i].scoped);
      if (e.owned) do_revoke(e.handle);
      // Parked until the backend has closed its resources (which revokes
      // every key): the base destructor drops the rest.
      if (revoke_deferred_) e.state = ExposureState::revoking;
      else if (e.parked) queue_release_locked(i);  // a pending bind: after the unlock
      else free_exposure_locked(i);
    } else if (e.state == ExposureState::failed) {
      queue_release_locked(i);
    }
  }
  // Quarantined bytes go without waiting out their interval: the endpoint
  // closes, and with it every way in through it.
  while (quarantine_head_ != kNoExposure) {
    const std::uint32_t i = quarantine_head_;
    quarantine_head_ = exposures_[i].next;
    --exposure_stats_.quarantined;
    exposure_stats_.quarantined_bytes -= exposures_[i].length;
    release_scoped_locked(exposures_[i].scoped);  // reuse_scoped: still open
    queue_release_locked(i);
  }
  quarantine_tail_ = kNoExposure;
  // Parked kept operations end: their buffers go with the unlock, their
  // callbacks with the slots (repost() now answers closed).
  for (std::uint32_t i = 0; i < config_.max_in_flight; ++i) {
    if (slots_[i].kept && slots_[i].parked) unkeep_locked(i);
  }
  retry_kept_locked();  // reposts still waiting for the provider complete closed
  // Released by the unlock (the release list).
}

PeerId Endpoint::insert_peer(std::span<const std::byte> name) {
  if (name.empty()) throw Error(Status::invalid_argument, 0, "endpoint: empty peer name");
  Lock g(*this);
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    const Peer& p = peers_[i];
    if (p.used && p.name.size() == name.size() && std::equal(name.begin(), name.end(), p.name.begin())) {
      return static_cast<PeerId>(i);
    }
  }
  Peer p;
  p.name.assign(name.begin(), name.end());
  p.handle = do_insert_peer(name);
  p.message_limit = do_peer_message_limit(p.handle);
  p.used = true;
  const std::uint64_t handle = p.handle;
  std::size_t id = peers_.size();
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    if (!peers_[i].used) {
      id = i;
      break;
    }
  }
  if (id >= kAnyPeer) {
    do_remove_peer(handle);
    throw Error(Status::invalid_argument, 0, "endpoint: too many peers");
  }
  try {
    if (id == peers_.size()) {
      peers_.push_back(std::move(p));
    } else {
      p.epoch = peers_[id].epoch;
      peers_[id] = std::move(p);
    }
  } catch (...) {
    do_remove_peer(handle);
    throw Error(Status::out_of_memory, 0, "endpoint: out of memory inserting a peer");
  }
  if (!index_peer_locked(static_cast<PeerId>(id))) {
    do_remove_peer(handle);
    peers_[id].used = false;
    peers_[id].name.clear();
    throw Error(Status::out_of_memory, 0,
                "endpoint: cannot index peer handle " + std::to_string(handle) +
                    " (out of memory, or the backend's handle is not a small index)");
  }
  return static_cast<PeerId>(id);
}

bool Endpoint::index_peer_locked(PeerId peer) noexcept {
  // Handles are small indices (endpoint_backend.hpp): a table indexed by
  // them stays small, and grows (here, rarely) only when a handle larger
  // than any seen before appears.
  constexpr std::uint64_t kMaxHandle = std::uint64_t{1} << 24;
  const std::uint64_t h = peers_[peer].handle;
  if (h >= kMaxHandle) return false;
  if (h >= peer_by_handle_.size()) {
    try {
      peer_by_handle_.resize(std::max<std::size_t>(h + 1, 2 * peer_by_handle_.size()), kAnyPeer);
    } catch (...) {
      return false;
    }
  }
  PeerId& e = peer_by_handle_[h];
  if (e == kAnyPeer || e > peer) e = peer;
  return true;
}

void Endpoint::unindex_peer_locked(PeerId peer) noexcept {
  const std::uint64_t h = peers_[peer].handle;
  if (h >= peer_by_handle_.size() || peer_by_handle_[h] != peer) return;
  // Two peers may share a handle (a backend adopting one connection for
  // both): the next lowest one takes over. Setup and reconnect paths only.
  PeerId next = kAnyPeer;
  for (std::size_t i = 0; i < peers_.size() && next == kAnyPeer; ++i) {
    const Peer& q = peers_[i];
    if (i != peer && q.used && !q.settling && q.handle == h) next = static_cast<PeerId>(i);
  }
  peer_by_handle_[h] = next;
}

void Endpoint::remove_peer(PeerId peer) noexcept {
  Lock g(*this);
  if (peer >= peers_.size() || !peers_[peer].used) return;
  // Ops that already failed (timeout) while it was here are now orphans;
  // ones still running keep their timeout. Offered to do_abandon while the
  // backend still has the peer: a proof may need its address (tcp's probe).
  for (std::size_t i = 0; i < config_.max_in_flight; ++i) {
    Slot& s = slots_[i];
    if (s.backend_owned && s.completed && s.desc.kind != OpKind::recv && s.desc.peer == peer) {
      s.orphan = true;
      orphans_maybe_ = true;
    }
  }
  abandon_all_locked();
  if (!peers_[peer].settling) {
    unindex_peer_locked(peer);
    do_remove_peer(peers_[peer].handle);
  }
  peers_[peer].settling = false;
  peers_[peer].used = false;
  peers_[peer].broken = false;
  peers_[peer].name.clear();
  ++peers_[peer].epoch;  // kept sends to it stop here (post_kept_desc_locked)
}

std::size_t Endpoint::peer_count() const noexcept {
  const auto g = lock_fair();
  return static_cast<std::size_t>(std::count_if(peers_.begin(), peers_.end(), [](const Peer& p) { return p.used; }));
}

[[gnu::hot]] bool Endpoint::usable(PeerId peer) const noexcept {
  const auto g = lock_fair();
  return usable() && peer < peers_.size() && peers_[peer].used && !peers_[peer].broken;
}

Result<std::uint64_t> Endpoint::do_reconnect(PeerId /*peer*/, std::uint64_t handle,
                                             std::span<const std::byte> name) noexcept {
  do_remove_peer(handle);
  try {
    return do_insert_peer(name);
  } catch (const Error& e) {
    return e.status() == Status::ok ? Status::transport_error : e.status();
  } catch (...) {
    return Status::transport_error;
  }
}

[[gnu::cold]] Status Endpoint::reconnect(PeerId peer) noexcept {
  Lock g(*this);
  if (!usable()) return Status::closed;
  if (peer >= peers_.size() || !peers_[peer].used) return Status::invalid_argument;
  // Operations still out to the old connection will never be answered by
  // it: give their owners an answer now (the peer stays: not orphans).
  fail_ops_locked(peer, Status::peer_unreachable, false);
  Peer& p = peers_[peer];
  const auto settle = reconnect_settle();
  if (settle.count() > 0) {
    // The backend needs the old address gone for a while before it may be
    // inserted again (rxm: until progress has seen the old connection's
    // shutdown). Waiting here would hold the mutex that progress needs, so
    // the peer re-enters the address table on the first post after the
    // settle time (peer_ready_locked) and posts meanwhile retry.
    if (!p.settling) {
      unindex_peer_locked(peer);
      do_remove_peer(p.handle);
    }
    p.settling = true;
    p.settle_until = Clock::now() + settle;
    p.broken = false;
    reconnects_.fetch_add(1, std::memory_order_relaxed);
    return Status::ok;
  }
  if (!p.settling) unindex_peer_locked(peer);
  auto r = do_reconnect(peer, p.handle, p.name);
  if (r) p.handle = *r;
  // A failed reconnect leaves the peer (broken) on its old handle, as it
  // was; its index entry was at most as large as before, so this cannot fail.
  if (!p.settling && !index_peer_locked(peer)) r = Status::out_of_memory;
  if (!r) {
    p.broken = true;
    return r.status();
  }
  p.broken = false;
  reconnects_.fetch_add(1, std::memory_order_relaxed);
  return Status::ok;
}

[[gnu::cold]] void Endpoint::fail_ops_locked(PeerId peer, Status status, bool gone) noexcept {
  // Their slots (and LDO references) stay with the backend until it lets go
  // of them (do_cancel), proves the provider has (do_abandon), or the
  // endpoint closes.
  for (std::size_t i = 0; i < config_.max_in_flight; ++i) {
    Slot& s = slots_[i];
    if (!s.backend_owned || s.desc.kind == OpKind::recv || s.desc.peer != peer) continue;
    if (!s.completed) {
      finish_locked(s, static_cast<std::uint32_t>(i), status, 0, 0, kAnyPeer);
      do_cancel(s.desc);
    }
    // Timed out earlier or failed now: if its peer is gone, offer it to
    // do_abandon. Not for a peer that stays (reconnect): proving an op
    // abandoned may end the peer's connection (tcp's probe), which would
    // take the new one down with it; remove_peer offers them later.
    if (!gone) continue;
    s.orphan = true;
    orphans_maybe_ = true;
    abandon_locked(static_cast<std::uint32_t>(i));
  }
}

[[gnu::cold]] void Endpoint::abandon_locked(std::uint32_t index) noexcept {
  Slot& s = slots_[index];
  // Only ops the user has already been answered for (completed), that the
  // backend still holds. Receives are not per-peer: they stay posted.
  if (!s.backend_owned || !s.completed || !s.orphan) return;
  if (!do_abandon(s.desc)) return;
  abandoned_.fetch_add(1, std::memory_order_relaxed);
  // As if the provider had reported it: the slot is no longer backend-owned
  // (so index_of_tag refuses this incarnation from now on), the LDO
  // reference goes after the unlock, the slot is free once the user has its
  // completion. The status is ignored: the op is already completed.
  complete(index, s.result.status, 0);
}

[[gnu::cold]] void Endpoint::abandon_all_locked() noexcept {
  if (backend_owned_ == 0 || !orphans_maybe_) return;
  bool left = false;
  for (std::size_t i = 0; i < config_.max_in_flight; ++i) {
    abandon_locked(static_cast<std::uint32_t>(i));
    const Slot& s = slots_[i];
    left = left || (s.backend_owned && s.completed && s.orphan);
  }
  // Orphans the backend could not give up yet are offered again next scan;
  // with none left, scans stop until an op is orphaned again.
  orphans_maybe_ = left;
}

[[gnu::cold]] void Endpoint::fail_peer(PeerId peer, Status status) noexcept {
  Lock g(*this);
  if (peer >= peers_.size() || !peers_[peer].used) return;
  peers_[peer].broken = true;
  fail_ops_locked(peer, status == Status::ok ? Status::peer_unreachable : status, true);
}

const char* to_string(ExposureMode mode) noexcept {
  switch (mode) {
    case ExposureMode::standard: return "standard";
    case ExposureMode::scoped: return "scoped";
  }
  return "?";
}

Result<Exposure> Endpoint::expose(const Slice& slice, RemoteAccess access) noexcept {
  return expose_impl(slice, access, kAnyPeer, config_.exposure_mode);
}

Result<Exposure> Endpoint::expose(const Slice& slice, RemoteAccess access, ExposureMode mode) noexcept {
  return expose_impl(slice, access, kAnyPeer, mode);
}

Result<Exposure> Endpoint::expose(const Slice& slice, RemoteAccess access, PeerId peer) noexcept {
  if (peer == kAnyPeer) return Status::invalid_argument;
  return expose_impl(slice, access, peer, config_.exposure_mode);
}

Result<Exposure> Endpoint::expose(const Slice& slice, RemoteAccess access, PeerId peer, ExposureMode mode) noexcept {
  if (peer == kAnyPeer) return Status::invalid_argument;
  return expose_impl(slice, access, peer, mode);
}

Result<ExposureInfo> Endpoint::standard_exposure(const Slice& slice, RemoteAccess access) const noexcept {
  // The object's own registration (the arena's, or the user block's, made
  // once on first use): nothing is registered here.
  auto region = slice.ldo().region(domain());
  if (!region) return region.status();
  // A peer using the reference needs these rights from the registration;
  // refusing now beats a remote access error later.
  if (!grants(region->access, registration_access(access))) return Status::access_denied;
  ExposureInfo info;
  info.key = region->remote_key;
  info.address = region->remote_base + slice.offset();
  info.mode = region->mode;
  return info;
}

Result<ExposureInfo> Endpoint::do_expose(const Slice& /*slice*/, RemoteAccess /*access*/, ExposureMode /*mode*/,
                                         std::uint64_t /*peer_handle*/) noexcept {
  return Status::unsupported;
}

Result<ExposureInfo> Endpoint::scoped_registration_locked(const Slice& slice, RemoteAccess access,
                                                          std::uint32_t& reg, bool& registered) noexcept {
  // A registration of exactly the slice with exactly the rights and the
  // domain's key: where the target checks keys it grants that slice only,
  // and closing it revokes it.
  Impl& m = *impl_;
  const std::byte* base = slice.address();
  auto info_of = [&](const Registration& r) {
    ExposureInfo info;
    info.key = r.remote_key();
    info.address = r.remote_address(slice.address());
    info.mode = r.address_mode();
    return info;
  };
  if (support_.reuse_scoped) {
    // An open registration of the same bytes and rights (its exposure live,
    // or revoked and quarantined: the bytes are then held until after the
    // registration is closed).
    auto [first, last] = m.scoped_by_base.equal_range(base);
    for (auto it = first; it != last; ++it) {
      Impl::ScopedReg& x = m.scoped[it->second];
      if (x.length != slice.length() || x.access != access) continue;
      ++x.holders;
      reg = it->second;
      return info_of(x.registration);
    }
  }
  auto r = domain().try_register(slice.address(), static_cast<std::size_t>(slice.length()), registration_access(access));
  if (!r) return r.status();
  std::uint32_t slot = static_cast<std::uint32_t>(m.scoped.size());
  try {
    if (m.scoped_free.empty()) {
      if (m.scoped.size() >= kNoExposure - 1) return Status::out_of_memory;
      m.scoped.emplace_back();
      m.scoped_free.reserve(m.scoped.size());  // so release never allocates
    } else {
      slot = m.scoped_free.back();
      m.scoped_free.pop_back();
    }
    if (support_.reuse_scoped) m.scoped_by_base.emplace(base, slot);
  } catch (...) {
    if (slot < m.scoped.size()) m.scoped_free.push_back(slot);
    return Status::out_of_memory;
  }
  Impl::ScopedReg& x = m.scoped[slot];
  x.registration = std::move(*r);
  x.base = base;
  x.length = slice.length();
  x.access = access;
  x.holders = 1;
  reg = slot;
  registered = true;
  return info_of(x.registration);
}

void Endpoint::release_scoped_locked(std::uint32_t& reg) noexcept {
  if (reg == kNoExposure) return;
  Impl& m = *impl_;
  const std::uint32_t slot = reg;
  reg = kNoExposure;
  Impl::ScopedReg& x = m.scoped[slot];
  if (x.holders > 1) {
    --x.holders;
    return;
  }
  x.holders = 0;
  x.registration.reset();
  if (support_.reuse_scoped) {
    auto [first, last] = m.scoped_by_base.equal_range(x.base);
    for (auto it = first; it != last; ++it) {
      if (it->second == slot) {
        m.scoped_by_base.erase(it);
        break;
      }
    }
  }
  x.base = nullptr;
  m.scoped_free.push_back(slot);  // capacity: one per slot, reserved when it was made
}

Result<std::uint32_t> Endpoint::claim_exposure_locked() noexcept {
  if (free_exposures_ != kNoExposure) {
    const std::uint32_t i = free_exposures_;
    free_exposures_ = exposures_[i].next;
    exposures_[i].next = kNoExposure;
    return i;
  }
  if (exposures_.size() >= kNoExposure - 1) return Status::out_of_memory;
  try {
    exposures_.emplace_back();  // grows the slab; never in steady state
  } catch (...) {
    return Status::out_of_memory;
  }
  return static_cast<std::uint32_t>(exposures_.size() - 1);
}

void Endpoint::free_exposure_locked(std::uint32_t index) noexcept {
  ExposureEntry& e = exposures_[index];
  // The parked reference (if any) has been moved out by the caller, to be
  // dropped after the unlock. Every path closes a scoped registration
  // before this; never leak a hold on one.
  release_scoped_locked(exposures_[index].scoped);
  e.id = 0;
  e.state = ExposureState::free;
  e.owned = false;
  e.next = free_exposures_;
  free_exposures_ = index;
}

void Endpoint::queue_release_locked(std::uint32_t index) noexcept {
  ExposureEntry& e = exposures_[index];
  e.state = ExposureState::revoked;
  e.next = release_list_;
  release_list_ = index;
}

void Endpoint::quarantine_locked(std::uint32_t index, Slice&& slice, Clock::time_point now) noexcept {
  ExposureEntry& e = exposures_[index];
  e.state = ExposureState::quarantined;
  e.parked = std::move(slice);
  e.release_at = now + config_.revoke_quarantine;
  e.next = kNoExposure;
  // One interval for every entry: appending keeps the list in deadline order.
  if (quarantine_tail_ == kNoExposure) {
    quarantine_head_ = index;
  } else {
    exposures_[quarantine_tail_].next = index;
  }
  quarantine_tail_ = index;
  ++exposure_stats_.quarantined;
  ++exposure_stats_.quarantine_total;
  exposure_stats_.quarantined_bytes += e.length;
}

void Endpoint::expire_quarantine_locked(Clock::time_point now) noexcept {
  while (quarantine_head_ != kNoExposure && exposures_[quarantine_head_].release_at <= now) {
    const std::uint32_t i = quarantine_head_;
    quarantine_head_ = exposures_[i].next;
    if (quarantine_head_ == kNoExposure) quarantine_tail_ = kNoExposure;
    --exposure_stats_.quarantined;
    exposure_stats_.quarantined_bytes -= exposures_[i].length;
    ++exposure_stats_.quarantine_released;
    // reuse_scoped kept the registration open for the interval: the key is
    // closed now, before the reference is dropped after the unlock.
    release_scoped_locked(exposures_[i].scoped);
    queue_release_locked(i);
  }
}

std::uint32_t Endpoint::find_handle_locked(std::uint64_t handle) const noexcept {
  for (std::uint32_t i = 0; i < exposures_.size(); ++i) {
    const ExposureEntry& e = exposures_[i];
    if (e.owned && e.handle == handle && (e.state == ExposureState::binding || e.state == ExposureState::revoking)) {
      return i;
    }
  }
  return kNoExposure;
}

Result<std::uint64_t> Endpoint::apply_remote_atomic(OpKind op, std::uint64_t key, std::uint64_t address,
                                                    std::uint64_t operand, std::uint64_t compare) noexcept {
  constexpr std::uint64_t kWord = 8;
  // Checked against this endpoint's live exposures (both modes): the key,
  // the exposure's own range and rights, so emulated atomics are scoped even
  // when the key is an arena's.
  const ExposureEntry* found = nullptr;
  bool key_known = false;
  for (const ExposureEntry& e : exposures_) {
    if (e.state != ExposureState::live || e.key != key) continue;
    key_known = true;
    if (address < e.address || address - e.address > e.length || e.length - (address - e.address) < kWord) continue;
    found = &e;
    break;
  }
  if (!found) return key_known ? Status::out_of_bounds : Status::bad_key;
  if (found->access != RemoteAccess::read_write) return Status::access_denied;
  std::byte* p = found->base + (address - found->address);
  if (reinterpret_cast<std::uintptr_t>(p) % kWord != 0) return Status::invalid_argument;
  // atomic_ref: atomic against the target's own std::atomic_ref users too,
  // not only against other emulated requests (which are serialised by the
  // endpoint's mutex anyway).
  std::atomic_ref<std::uint64_t> word(*reinterpret_cast<std::uint64_t*>(p));
  if (op == OpKind::fetch_add) return word.fetch_add(operand, std::memory_order_acq_rel);
  if (op != OpKind::compare_swap) return Status::invalid_argument;
  std::uint64_t expected = compare;
  word.compare_exchange_strong(expected, operand, std::memory_order_acq_rel);
  return expected;
}

Result<Exposure> Endpoint::expose_impl(const Slice& slice, RemoteAccess access, PeerId peer,
                                       ExposureMode mode) noexcept {
  if (!slice || slice.length() == 0) return Status::invalid_argument;
  if (!slice.within_object()) return Status::out_of_bounds;
  if (!known_access(access)) return Status::invalid_argument;
  if (mode != ExposureMode::standard && mode != ExposureMode::scoped) return Status::invalid_argument;
  Slice dropped;  // a failed bind's reference: destroyed after the lock
  Lock g(*this);
  if (!usable() || stopping_.load(std::memory_order_relaxed)) return Status::closed;
  // Quarantined bytes whose time has come go now (dropped after the unlock),
  // so a process that exposes without calling progress() does not hoard them.
  if (quarantine_head_ != kNoExposure) expire_quarantine_locked(Clock::now());
  Result<ExposureInfo> info = Status::in_progress;
  // Keys scoped to one peer are the backend's (verbs windows); everything
  // else is backend-neutral: standard, the object's registration with the
  // bounds and rights in the reference (no registration, no wait); scoped,
  // a registration of the slice.
  const bool backend_keys = peer != kAnyPeer && support_.per_peer;
  std::uint32_t scoped = kNoExposure;
  bool registered = false;
  auto expose_here = [&]() -> Result<ExposureInfo> {
    if (mode == ExposureMode::standard) return standard_exposure(slice, access);
    return scoped_registration_locked(slice, access, scoped, registered);
  };
  if (peer == kAnyPeer) {
    info = expose_here();
  } else {
    Clock::time_point deadline{};
    for (std::uint32_t attempt = 0;; ++attempt) {
      if (!usable() || stopping_.load(std::memory_order_relaxed)) return Status::closed;
      if (peer != kAnyPeer) {
        if (peer >= peers_.size() || !peers_[peer].used) return Status::invalid_argument;
        if (peers_[peer].broken) return Status::peer_unreachable;
        const Status ready = peer_ready_locked(peer);
        if (ready != Status::ok) {
          info = ready;
        } else {
          info = backend_keys ? do_expose(slice, access, mode, peers_[peer].handle) : expose_here();
        }
      }
      if (info || info.status() != Status::would_block) break;
      // Not now (verbs: the connection is still being set up): progress and
      // retry like a post, without the mutex while backing off.
      (void)poll_locked();
      const auto now = Clock::now();
      if (attempt == 0) deadline = now + config_.post_timeout;
      if (now >= deadline) return Status::would_block;
      g.unlock();
      back_off(attempt);
      g.relock();
    }
  }
  if (!info) return info.status();
  auto claimed = claim_exposure_locked();
  if (!claimed) {
    if (backend_keys) do_revoke(info->handle);
    release_scoped_locked(scoped);
    return claimed.status();
  }
  const std::uint32_t index = *claimed;
  const std::uint64_t id = (exposure_nonce_ << 32) | (next_exposure_id_++ & 0xffffffffu);
  {
    ExposureEntry& entry = exposures_[index];
    entry.id = id;
    entry.handle = info->handle;
    entry.owned = backend_keys;
    entry.scoped = scoped;
    entry.key = info->key;
    entry.address = info->address;
    entry.length = slice.length();
    entry.base = slice.address();
    entry.access = access;
    entry.target_revokes = do_enforcement(mode, peer != kAnyPeer).revocation;
    entry.late_revoke = scoped != kNoExposure && support_.reuse_scoped && !entry.target_revokes;
    entry.state = info->pending ? ExposureState::binding : ExposureState::live;
  }
  if (registered) ++exposure_stats_.registrations;
  if (info->pending) {
    // Keep the bytes alive while the bind is in flight, whatever happens to
    // the caller's handles; wait for the backend's verdict through progress,
    // releasing the mutex between polls. (Entries never move to another
    // index, and this one is not freed while it is binding.)
    exposures_[index].parked = slice;
    const auto bound = Clock::now() + config_.post_timeout;
    for (std::uint32_t attempt = 0;; ++attempt) {
      (void)poll_locked();
      ExposureEntry& e = exposures_[index];
      if (e.id != id) return Status::closed;
      if (e.state == ExposureState::live) {
        e.parked = Slice{};  // the Exposure below holds the slice from now on
        break;
      }
      if (e.state == ExposureState::failed) {
        const Status st = e.status;
        dropped = std::move(e.parked);
        free_exposure_locked(index);
        return st;
      }
      if (e.state != ExposureState::binding || stopping_.load(std::memory_order_relaxed)) {
        return Status::closed;  // shutdown took it over
      }
      if (Clock::now() >= bound) {
        // Never confirmed: take it back. The reference stays parked until
        // the backend says the key is dead.
        revoke_deferred_ = false;
        do_revoke(e.handle);
        if (revoke_deferred_) {
          e.state = ExposureState::revoking;
        } else {
          dropped = std::move(e.parked);
          free_exposure_locked(index);
        }
        return Status::timeout;
      }
      g.unlock();
      back_off(attempt);
      g.relock();
    }
  }
  ++exposure_stats_.created;
  ++exposure_stats_.live;
  if (mode == ExposureMode::scoped) ++exposure_stats_.scoped;
  Exposure e;
  e.link_ = link_;
  e.slice_ = slice;
  e.ref_.backend = backend_kind();
  e.ref_.access = access;
  e.ref_.mode = info->mode;
  e.ref_.key = info->key;
  e.ref_.address = info->address;
  e.ref_.length = slice.length();
  e.ref_.exposure_id = id;
  e.ref_.flags = reinterpret_cast<std::uintptr_t>(slice.address()) % 8 == 0 ? RemoteRef::kFlagAligned8 : 0;
  e.index_ = index;
  e.active_ = true;
  return e;
}

void Endpoint::revoke_exposure(std::uint32_t index, std::uint64_t exposure_id, Slice& slice) noexcept {
  Lock g(*this);
  const auto now = Clock::now();
  if (quarantine_head_ != kNoExposure) expire_quarantine_locked(now);
  if (index >= exposures_.size() || exposures_[index].id != exposure_id ||
      exposures_[index].state != ExposureState::live) {
    return;
  }
  ++exposure_stats_.revoked;
  --exposure_stats_.live;
  revoke_deferred_ = false;
  // The key keeps working at the target (shm; tcp's arena key; a scoped
  // registration kept for reuse): the bytes stay ours for the interval, so a
  // late write lands in them and never in an object allocated there
  // afterwards. A scoped registration kept open for reuse (late_revoke) is
  // closed only when the interval ends (expire_quarantine_locked), so the
  // key dies before the bytes go.
  const bool quarantine = !exposures_[index].target_revokes && config_.revoke_quarantine.count() > 0;
  const bool late = quarantine && exposures_[index].late_revoke;
  if (!late) release_scoped_locked(exposures_[index].scoped);
  if (exposures_[index].owned) do_revoke(exposures_[index].handle);
  if (!revoke_deferred_) {
    if (quarantine) {
      quarantine_locked(index, std::move(slice), now);
      return;
    }
    free_exposure_locked(index);
    return;  // the caller drops the slice, after the lock
  }
  // The key may still work: the bytes must not go back to the pool before
  // the backend confirms. Wait briefly for that, polling without holding
  // the mutex in between; if it takes longer, leave the reference parked.
  exposures_[index].state = ExposureState::revoking;
  exposures_[index].parked = std::move(slice);
  const auto bound = now + kRevokeConfirmWait;
  for (std::uint32_t attempt = 0;; ++attempt) {
    (void)poll_locked();
    if (exposures_[index].id != exposure_id || exposures_[index].state != ExposureState::revoking) return;
    if (Clock::now() >= bound) return;
    g.unlock();
    back_off(attempt);
    g.relock();
  }
}

void Endpoint::exposure_settled(std::uint64_t handle, Status status) noexcept {
  const std::uint32_t index = find_handle_locked(handle);
  if (index == kNoExposure) return;
  ExposureEntry& e = exposures_[index];
  if (e.state == ExposureState::binding) {
    e.state = status == Status::ok ? ExposureState::live : ExposureState::failed;
    e.status = status;
    return;
  }
  // Revoking: confirmed dead; the parked reference goes after the unlock.
  queue_release_locked(index);
}

void Endpoint::revoke_deferred(std::uint64_t /*handle*/) noexcept { revoke_deferred_ = true; }

ExposureStats Endpoint::exposure_stats() const noexcept {
  const auto g = lock_fair();
  return exposure_stats_;
}

[[gnu::cold]] Status Endpoint::reject(Status st) noexcept {
  rejected_.fetch_add(1, std::memory_order_relaxed);
  return st;
}

Result<Token> Endpoint::put(const Slice& local, PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset,
                            Callback cb) noexcept {
  return submit(OpKind::put, peer, &local, &remote, remote_offset, local.length(), 0, 0, std::move(cb));
}

Result<Token> Endpoint::get(PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset, const Slice& local,
                            Callback cb) noexcept {
  return submit(OpKind::get, peer, &local, &remote, remote_offset, local.length(), 0, 0, std::move(cb));
}

[[gnu::hot]] Result<Token> Endpoint::send(PeerId peer, const Slice& local, Callback cb) noexcept {
  return submit(OpKind::send, peer, &local, nullptr, 0, local.length(), 0, 0, std::move(cb));
}

Result<Token> Endpoint::send_gathered(PeerId peer, const Slice& head, const Slice& body, Callback cb) noexcept {
  if (!do_gathered_sends()) return reject(Status::unsupported);
  if (const Status c = check_op(OpKind::send, &body, nullptr, 0, body.length()); c != Status::ok) return reject(c);
  // A refused post's second reference, dropped after submit's unlock.
  Slice refused_body;
  return submit(OpKind::send, peer, &head, nullptr, 0, head.length() + body.length(), 0, 0, std::move(cb), false,
                &body, &refused_body);
}

[[gnu::hot]] Result<Token> Endpoint::post_recv(const Slice& local, Callback cb) noexcept {
  return submit(OpKind::recv, kAnyPeer, &local, nullptr, 0, local.length(), 0, 0, std::move(cb));
}

Result<Token> Endpoint::post_recv_kept(const Slice& local, Callback cb) noexcept {
  return submit(OpKind::recv, kAnyPeer, &local, nullptr, 0, local.length(), 0, 0, std::move(cb), true);
}

Result<Token> Endpoint::send_kept(PeerId peer, const Slice& local, Callback cb) noexcept {
  return submit(OpKind::send, peer, &local, nullptr, 0, local.length(), 0, 0, std::move(cb), true);
}

Result<Token> Endpoint::send_kept(PeerId peer, const Slice& local, std::uint64_t length, Callback cb) noexcept {
  if (length > local.length()) return reject(Status::invalid_argument);
  return submit(OpKind::send, peer, &local, nullptr, 0, length, 0, 0, std::move(cb), true);
}

Result<Token> Endpoint::put_kept(const Slice& local, PeerId peer, const RemoteRef& remote,
                                 std::uint64_t remote_offset, Callback cb) noexcept {
  return submit(OpKind::put, peer, &local, &remote, remote_offset, local.length(), 0, 0, std::move(cb), true);
}

Result<Token> Endpoint::get_kept(PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset,
                                 const Slice& local, Callback cb) noexcept {
  return submit(OpKind::get, peer, &local, &remote, remote_offset, local.length(), 0, 0, std::move(cb), true);
}

[[gnu::hot]] Status Endpoint::repost(Token token) noexcept { return repost_impl(token, nullptr); }

Status Endpoint::repost(Token token, const Slice& local) noexcept {
  // A send's, a put's, a get's and a receive's checks of the new buffer
  // without a lock are the same; the peer checks come with the post
  // (post_kept_desc_locked), a put's or get's remote range with the lock
  // (repost_impl: no longer than the first buffer).
  if (const Status c = check_op(OpKind::recv, &local, nullptr, 0, local.length()); c != Status::ok) return reject(c);
  return repost_impl(token, &local);
}

[[gnu::hot]] Status Endpoint::repost(Token token, std::uint64_t length) noexcept {
  if (length == 0) return Status::invalid_argument;
  return repost_impl(token, nullptr, length);
}

[[gnu::hot]] Status Endpoint::repost_impl(Token token, const Slice* local, std::uint64_t length) noexcept {
  const auto [index, gen] = parts_of(token);
  if (!token || index >= config_.max_in_flight) return Status::invalid_argument;
  Slice old;  // the replaced buffer's reference: dropped after the unlock
  Lock g(*this);
  Slot& s = slots_[index];
  if (s.gen != gen || !s.kept || !(s.parked || s.delivering) || s.repost_asked) return Status::invalid_argument;
  if (length > s.local.length()) return Status::invalid_argument;
  // A put's or get's new buffer: its remote range was checked for the first.
  if (local != nullptr && (s.desc.kind == OpKind::put || s.desc.kind == OpKind::get) &&
      local->length() > s.rma_room) [[unlikely]] {
    return Status::out_of_bounds;
  }
  if (!usable() || stopping_.load(std::memory_order_relaxed)) return Status::closed;
  if (s.delivering) {
    // Its callback is running: settle_kept_locked posts once it returns,
    // so the callback never runs twice at once (and may still read the old
    // buffer meanwhile).
    s.repost_asked = true;
    if (local != nullptr) s.next_local = *local;
    s.next_length = length;
    return Status::ok;
  }
  if (local != nullptr) {
    old = std::move(s.local);
    s.local = *local;
  }
  return post_kept_locked(index, length);
}

[[gnu::hot]] Status Endpoint::post_kept_desc_locked(Slot& s) noexcept {
  if (s.desc.kind != OpKind::recv) [[unlikely]] {
    const PeerId peer = s.desc.peer;
    // Removed since (its id may name another peer now), or failed.
    if (!peers_[peer].used || peers_[peer].epoch != s.peer_epoch || peers_[peer].broken) {
      return Status::peer_unreachable;
    }
    if (s.desc.kind == OpKind::send && s.desc.length > peers_[peer].message_limit) return Status::message_too_large;
    if (peers_[peer].settling) {
      if (const Status st = peer_ready_locked(peer); st != Status::ok) return st;
    }
    s.desc.peer_handle = peers_[peer].handle;  // reconnect may change it
  }
  return do_post(s.desc);
}

[[gnu::hot]] Status Endpoint::post_kept_locked(std::uint32_t index, std::uint64_t length) noexcept {
  Slot& s = slots_[index];
  s.parked = false;
  s.repost_asked = false;
  s.completed = false;
  s.result = Completion{s.result.token, s.desc.kind, Status::in_progress, s.desc.peer, 0, 0};
  s.desc.length = length != 0 ? length : s.local.length();
  // Reserved while posting, as a new op's slot is (claim_slot_locked).
  s.user_pending = true;
  // A send queues behind another kept send to its peer still waiting for
  // the provider, so sends to a peer go out in the order asked.
  const bool behind = s.desc.kind == OpKind::send && send_held_locked(s.desc.peer);
  const Status st = behind ? Status::would_block : post_kept_desc_locked(s);
  if (st == Status::would_block) {
    // The provider wants progress first (a full queue, shm's region lock
    // held by a peer posting to us): every poll retries it from now on,
    // without anyone waiting here (this may run inside progress()).
    retries_.fetch_add(1, std::memory_order_relaxed);
    s.repost_pending = true;
    s.deadline = Clock::now() + config_.post_timeout;
    kept_retry_.push_back(index);  // reserved: never allocates
    return Status::ok;
  }
  if (st != Status::ok) {
    s.user_pending = false;
    s.parked = true;
    return st;
  }
  accept_posted_locked(index);
  if (sleepers_ > 0) wake_sleepers_locked();
  return Status::ok;
}

[[gnu::always_inline]] inline void Endpoint::accept_posted_locked(std::uint32_t index) noexcept {
  accept_locked(index);
  if (completed_at_post_) {
    // A send the provider finished inside the post (shm's inject): it
    // completes (a kept one parks again, or reaches its callback) before
    // the posting call returns.
    completed_at_post_ = false;
    complete(index, Status::ok, slots_[index].desc.length);
  }
  ++activity_;
}

[[gnu::cold]] void Endpoint::retry_kept_locked() noexcept {
  const bool closing = !usable() || stopping_.load(std::memory_order_relaxed);
  const auto now = Clock::now();
  std::size_t keep = 0;
  for (const std::uint32_t index : kept_retry_) {
    Slot& s = slots_[index];
    if (!s.repost_pending) continue;  // ended meanwhile (end_kept)
    // A send stays behind an earlier one to its peer that still waits
    // (the list is in the order asked): sends go out in that order.
    const bool behind = !closing && s.desc.kind == OpKind::send && send_queued_locked(s.desc.peer, keep);
    const Status st = closing ? Status::closed : behind ? Status::would_block : post_kept_desc_locked(s);
    if (st == Status::ok) {
      s.repost_pending = false;
      accept_posted_locked(index);
    } else if (st == Status::would_block && now < s.deadline) {
      kept_retry_[keep++] = index;
    } else {
      s.repost_pending = false;
      fail_kept_locked(index, st);
    }
  }
  kept_retry_.resize(keep);
  if (sleepers_ > 0) wake_sleepers_locked();
}

bool Endpoint::send_queued_locked(PeerId peer, std::size_t upto) const noexcept {
  for (std::size_t i = 0; i < upto; ++i) {
    const Slot& q = slots_[kept_retry_[i]];
    if (q.repost_pending && q.desc.kind == OpKind::send && q.desc.peer == peer) return true;
  }
  return false;
}

void Endpoint::fail_kept_locked(std::uint32_t index, Status st) noexcept {
  Slot& s = slots_[index];
  unkeep_locked(index);
  s.user_pending = true;
  finish_locked(s, index, st, 0, 0, kAnyPeer);
}

void Endpoint::unkeep_locked(std::uint32_t index) noexcept {
  Slot& s = slots_[index];
  s.kept = false;
  s.parked = false;
  s.repost_asked = false;
  // complete() kept the reference while the receive was kept; posted, it
  // still owns the buffer and complete() releases it then.
  if (!s.backend_owned) release_slice_locked(index);
}

Status Endpoint::end_kept(Token token) noexcept {
  const auto [index, gen] = parts_of(token);
  if (!token || index >= config_.max_in_flight) return Status::invalid_argument;
  Callback cb;  // a parked operation's callback: destroyed after the unlock
  Lock g(*this);
  Slot& s = slots_[index];
  if (s.gen != gen || !s.kept) return Status::invalid_argument;
  // A repost waiting for the provider ends as a parked receive does (the
  // retry list lets go of it).
  const bool parked = s.parked || s.repost_pending;
  if (s.repost_pending) {
    // Out of the list now, so a slot is never in it twice.
    s.repost_pending = false;
    s.user_pending = false;
    const auto at = std::find(kept_retry_.begin(), kept_retry_.end(), index);
    if (at != kept_retry_.end()) {
      *at = kept_retry_.back();
      kept_retry_.pop_back();
    }
  }
  unkeep_locked(index);
  if (s.delivering) return Status::ok;  // settle_kept_locked frees it
  if (parked) {
    cb = std::move(s.cb);
    s.has_callback = false;
    maybe_free_locked(index);
  }
  // Posted, or completed and not yet taken: it ends as a post_recv() or a
  // send() does.
  return Status::ok;
}

void Endpoint::settle_kept_locked(std::uint32_t index, Callback& cb, Slice& old) noexcept {
  Slot& s = slots_[index];
  s.delivering = false;
  if (s.kept && (!usable() || stopping_.load(std::memory_order_relaxed))) unkeep_locked(index);
  if (!s.kept) {
    // Ended while its callback ran: a buffer its repost asked for is not
    // used (its own buffer went to the release ring with the end).
    old = std::move(s.next_local);
    s.next_local = Slice{};
    s.next_length = 0;
    cb = std::move(s.cb);
    s.has_callback = false;
    maybe_free_locked(index);
    return;
  }
  if (!s.repost_asked) {
    s.parked = true;
    return;
  }
  if (s.next_local) {
    // The buffer its repost asked for; the old one goes after the unlock.
    old = std::move(s.local);
    s.local = std::move(s.next_local);
    s.next_local = Slice{};
  }
  const std::uint64_t length = s.next_length;
  s.next_length = 0;
  const Status st = post_kept_locked(index, length);
  // The callback was told ok: a failure comes as the receive's last
  // completion.
  if (st != Status::ok) fail_kept_locked(index, st);
}

Result<Token> Endpoint::fetch_add(PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset,
                                  std::uint64_t addend, Callback cb) noexcept {
  return submit(OpKind::fetch_add, peer, nullptr, &remote, remote_offset, 8, addend, 0, std::move(cb));
}

Result<Token> Endpoint::compare_swap(PeerId peer, const RemoteRef& remote, std::uint64_t remote_offset,
                                     std::uint64_t expected, std::uint64_t desired, Callback cb) noexcept {
  return submit(OpKind::compare_swap, peer, nullptr, &remote, remote_offset, 8, desired, expected, std::move(cb));
}

[[gnu::hot]] Status Endpoint::peer_ready_locked(PeerId peer) noexcept {
  Peer& p = peers_[peer];
  if (!p.settling) return Status::ok;
  if (Clock::now() < p.settle_until) return Status::would_block;
  p.settling = false;
  Status st = Status::ok;
  try {
    p.handle = do_insert_peer(p.name);
  } catch (const Error& e) {
    p.broken = true;
    st = e.status() == Status::ok ? Status::transport_error : e.status();
  } catch (...) {
    p.broken = true;
    st = Status::transport_error;
  }
  // A failed insert leaves the peer (broken) on its stale handle, as before.
  if (!index_peer_locked(peer) && st == Status::ok) {
    p.broken = true;
    st = Status::out_of_memory;
  }
  return st;
}

[[gnu::always_inline]] inline
Status Endpoint::check_op(OpKind kind, const Slice* local, const RemoteRef* remote, std::uint64_t remote_offset,
                          std::uint64_t length) const noexcept {
  if (local) {
    if (!*local || length == 0) return Status::invalid_argument;
    if (!local->within_object()) return Status::out_of_bounds;
  }
  if (remote) {
    // A reference built or altered by hand meets decode()'s rules too.
    if (!remote->well_formed()) return Status::malformed;
    if (remote->backend != backend_kind()) return Status::invalid_argument;
    if (!remote->contains(remote_offset, length)) return Status::out_of_bounds;
    const bool atomic = kind == OpKind::fetch_add || kind == OpKind::compare_swap;
    // Atomics read the old word and write the new one: read-write only.
    if (atomic && !remote->allows_atomics()) return Status::access_denied;
    if (kind == OpKind::put && !remote->allows_write()) return Status::access_denied;
    if (kind == OpKind::get && !remote->allows_read()) return Status::access_denied;
    if (atomic && !remote->aligned_word(remote_offset)) return Status::invalid_argument;
  }
  if ((kind == OpKind::send || kind == OpKind::recv) && length > max_message_size()) {
    return Status::invalid_argument;
  }
  return Status::ok;
}

[[gnu::always_inline]] inline
Result<std::uint32_t> Endpoint::claim_slot_locked(OpKind kind, PeerId peer, const Slice* local,
                                                  const RemoteRef* remote, std::uint64_t remote_offset,
                                                  std::uint64_t length, std::uint64_t operand,
                                                  std::uint64_t compare) noexcept {
  if (!usable() || stopping_.load(std::memory_order_relaxed)) return Status::closed;
  std::uint64_t peer_handle = 0;
  if (needs_peer(kind)) {
    if (peer >= peers_.size() || !peers_[peer].used) return Status::invalid_argument;
    if (peers_[peer].broken) return Status::peer_unreachable;
    // Refused here, never posted: on some transports (net) a message the
    // peer's receive cannot absorb stalls the whole connection.
    if (kind == OpKind::send && length > peers_[peer].message_limit) return Status::message_too_large;
    peer_handle = peers_[peer].handle;
  }
  if (free_.empty()) {
    // Completed operations give their slots back during a poll.
    (void)poll_locked();
    if (free_.empty()) return Status::would_block;
  }
  const std::uint32_t index = free_.back();
  free_.pop_back();
  Slot& s = slots_[index];
  if (++s.gen == 0) s.gen = 1;
  if (local) s.local = *local;  // the in-flight reference to the LDO
  if (remote) s.remote = *remote;
  const Token token{(static_cast<std::uint64_t>(s.gen) << 32) | index};
  // Every field written once (no clearing first).
  s.desc = BackendOp{.index = index,
                     .kind = kind,
                     .peer = needs_peer(kind) ? peer : kAnyPeer,
                     .peer_handle = peer_handle,
                     .local = local ? &s.local : nullptr,
                     .length = length,
                     .remote = remote ? &s.remote : nullptr,
                     .remote_address = remote ? remote->address_at(remote_offset) : 0,
                     .context = s.context,
                     .tag = token.value};
  if (kind == OpKind::fetch_add || kind == OpKind::compare_swap) {
    AtomicWords& w = atomic_words_[index];
    w.operand = operand;
    w.compare = compare;
    w.result = 0;
  }
  s.has_callback = false;
  s.orphan = false;
  s.kept = false;
  s.parked = false;
  s.delivering = false;
  s.repost_asked = false;
  s.repost_pending = false;
  s.result = Completion{token, kind, Status::in_progress, s.desc.peer, 0, 0};
  s.completed = false;
  // The slot is reserved (not free, not backend-owned) while the post
  // retries: pollers, expiry and reconnect leave it alone, and nobody else
  // knows its token yet.
  s.user_pending = true;
  return index;
}

[[gnu::always_inline]] inline void Endpoint::accept_locked(std::uint32_t index) noexcept {
  Slot& s = slots_[index];
  // A coarse reading plus its lag bound: never before the precise post
  // time, at most three ticks (12 ms here) after it, for a seventh of the cost.
  Impl& m = *impl_;
  Impl::SpanCache& c = m.spans[s.desc.kind == OpKind::recv ? 0 : 1];
  if (!c.valid || s.desc.length != c.length) {
    // deadline_for from the epoch is the span itself (or max: none).
    const Clock::time_point d = deadline_for(s.desc.kind, s.desc.length, Clock::time_point{});
    c.span = d == Clock::time_point::max() ? Clock::duration::max() : d.time_since_epoch();
    c.length = s.desc.length;
    c.valid = true;
  }
  s.deadline = c.span == Clock::duration::max()
                   ? Clock::time_point::max()
                   : platform::CoarseClock::after(platform::CoarseClock::now() + platform::CoarseClock::max_lag(), c.span);
  if (s.deadline < m.next_op_deadline) m.next_op_deadline = s.deadline;
  s.backend_owned = true;
  ++backend_owned_;
  bump_locked(posted_);
}

[[gnu::cold]] void Endpoint::refuse_locked(std::uint32_t index, Slice& local) noexcept {
  Slot& s = slots_[index];
  s.user_pending = false;
  s.has_callback = false;
  local = std::move(s.local);
  maybe_free_locked(index);
}

[[gnu::cold]] Status Endpoint::recheck_peer_locked(PeerId peer) const noexcept {
  if (!usable() || stopping_.load(std::memory_order_relaxed)) return Status::closed;
  if (peer >= peers_.size() || !peers_[peer].used) return Status::invalid_argument;
  if (peers_[peer].broken) return Status::peer_unreachable;
  return Status::ok;
}

[[gnu::always_inline]] inline
Result<Token> Endpoint::submit(OpKind kind, PeerId peer, const Slice* local, const RemoteRef* remote,
                               std::uint64_t remote_offset, std::uint64_t length, std::uint64_t operand,
                               std::uint64_t compare, Callback&& cb, bool kept, const Slice* body,
                               Slice* refused_body) noexcept {
  // Checks that need no lock first: they are the ones users hit.
  if (const Status c = check_op(kind, local, remote, remote_offset, length); c != Status::ok) return reject(c);

  // What a refused post gives back: destroyed after the lock (its last drop
  // may run user code).
  Slice refused_local;
  Lock g(*this);
  auto claimed = claim_slot_locked(kind, peer, local, remote, remote_offset, length, operand, compare);
  if (!claimed) return reject(claimed.status());
  const std::uint32_t index = *claimed;
  Slot& s = slots_[index];
  if (body) {
    // send_gathered's second piece: held, and handed to the backend, as
    // the first is.
    s.body = *body;
    s.desc.body = &s.body;
  }
  s.kept = kept;
  if (kept && needs_peer(kind)) {
    s.peer_epoch = peers_[peer].epoch;
    s.rma_room = length;  // a put's or get's: its remote range was checked for this length
  }
  // The callback goes in before the post: a completion may be reaped by the
  // first retry's poll.
  s.has_callback = static_cast<bool>(cb);
  // A slot's callback is empty once delivered or given back: moving an
  // empty one in (wait()'s ops) would only clear it again.
  if (s.has_callback || s.cb) s.cb = std::move(cb);

  Status st = Status::ok;
  Clock::time_point retry_until{};
  for (std::uint32_t attempt = 0;; ++attempt) {
    // peer_ready_locked only has work while the peer settles.
    st = needs_peer(kind) && peers_[peer].settling ? peer_ready_locked(peer) : Status::ok;
    // Sends to a peer go out in the order asked: behind a kept send's
    // repost the provider has not taken yet (retry_kept_locked).
    if (st == Status::ok && kind == OpKind::send && send_held_locked(peer)) [[unlikely]] st = Status::would_block;
    if (st == Status::ok) {
      if (needs_peer(kind)) s.desc.peer_handle = peers_[peer].handle;
      st = do_post(s.desc);
    }
    if (st != Status::would_block) break;
    retries_.fetch_add(1, std::memory_order_relaxed);
    // The provider wants progress first (connection setup, full queues).
    (void)poll_locked();
    const auto now = Clock::now();
    if (attempt == 0) retry_until = now + config_.post_timeout;
    if (now >= retry_until) break;
    // Back off without the mutex: progress, other posts and stats() from
    // other threads go on meanwhile.
    g.unlock();
    back_off(attempt);
    g.relock();
    // The world may have changed while unlocked.
    st = needs_peer(kind) ? recheck_peer_locked(peer)
                          : (usable() && !stopping_.load(std::memory_order_relaxed) ? Status::ok : Status::closed);
    if (st != Status::ok) break;
    if (needs_peer(kind)) s.desc.peer_handle = peers_[peer].handle;  // reconnect may change it
  }
  if (st != Status::ok) {
    // The callback was never given to anyone: it goes back to the caller's
    // frame and is destroyed there after unlocking, as the Slice is.
    cb = std::move(s.cb);
    if (body) *refused_body = std::move(s.body);
    refuse_locked(index, refused_local);
    return reject(st);
  }
  accept_posted_locked(index);
  // A sleeping progress thread or waiter may need to progress this op (or
  // at least to bound its sleep by the op's deadline).
  if (sleepers_ > 0) wake_sleepers_locked();
  return s.result.token;
}

Status Endpoint::do_post_batch(std::span<const BackendOp* const> ops, std::size_t& posted) noexcept {
  posted = 0;
  for (const BackendOp* op : ops) {
    if (const Status st = do_post(*op); st != Status::ok) return st;
    ++posted;
  }
  return Status::ok;
}

std::size_t Endpoint::post_batch(std::span<BatchOp> ops) noexcept {
  for (BatchOp& op : ops) {
    op.token = Token{};
    op.status = Status::canceled;
  }
  // Lock-free checks first; the batch ends before the first op failing them.
  std::size_t limit = ops.size();
  Status limit_status = Status::ok;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const BatchOp& op = ops[i];
    Status c = Status::ok;
    if (op.kind != OpKind::put && op.kind != OpKind::get && op.kind != OpKind::send) {
      c = Status::invalid_argument;
    } else if (op.local == nullptr || ((op.kind == OpKind::send) != (op.remote == nullptr))) {
      c = Status::invalid_argument;
    } else {
      c = check_op(op.kind, op.local, op.remote, op.remote_offset, op.local->length());
    }
    if (c != Status::ok) {
      limit = i;
      limit_status = c;
      break;
    }
  }
  if (ops.empty()) return 0;

  // Slices of ops claimed but not posted, destroyed after the lock (declared
  // before it). At most one op is refused after claiming in each attempt
  // round, but every claimed op past a failure is given back, so keep them
  // in the slots' own storage: refuse_locked moves each into `refused`,
  // whose old value (the previous refusal's) is dropped under the mutex -
  // safe, because the caller's BatchOp still holds a reference to that LDO
  // (its `local`) for the whole call, so it is never the last one.
  Slice refused;
  Lock g(*this);
  // Claim slots for the prefix [0, claimed).
  std::size_t claimed = 0;
  for (; claimed < limit; ++claimed) {
    BatchOp& op = ops[claimed];
    auto slot = claim_slot_locked(op.kind, op.peer, op.local, op.remote, op.remote_offset,
                                        op.local->length(), 0, 0);
    if (!slot) {
      limit = claimed;
      limit_status = slot.status();
      break;
    }
    batch_.push_back(&slots_[*slot].desc);
  }
  // Post [done, claimed), retrying what the provider refuses for now.
  std::size_t done = 0;
  Status st = Status::ok;
  Clock::time_point retry_until{};
  for (std::uint32_t attempt = 0; done < claimed; ++attempt) {
    // Post up to the first op whose peer cannot take it now (broken, gone,
    // or settling after a reconnect); the world may have changed while the
    // mutex was released.
    std::size_t end = done;
    st = Status::ok;
    for (; end < claimed; ++end) {
      st = recheck_peer_locked(ops[end].peer);
      if (st == Status::ok) st = peer_ready_locked(ops[end].peer);
      if (st == Status::ok && ops[end].kind == OpKind::send && send_held_locked(ops[end].peer)) {
        st = Status::would_block;  // behind a kept send's repost, as in submit()
      }
      if (st != Status::ok) break;
      slots_[batch_[end]->index].desc.peer_handle = peers_[ops[end].peer].handle;
    }
    std::size_t n = 0;
    if (end > done) {
      const Status bst = do_post_batch(std::span<const BackendOp* const>(batch_.data() + done, end - done), n);
      for (std::size_t k = done; k < done + n; ++k) {
        Slot& s = slots_[batch_[k]->index];
        // Before any poll can reap it.
        s.has_callback = static_cast<bool>(ops[k].cb);
        s.cb = std::move(ops[k].cb);
        accept_locked(batch_[k]->index);
        ops[k].token = s.result.token;
        ops[k].status = Status::ok;
      }
      done += n;
      if (done < end) st = bst;
    }
    if (done == claimed || st != Status::would_block) break;
    retries_.fetch_add(1, std::memory_order_relaxed);
    // The provider wants progress first (connection setup, full queues).
    (void)poll_locked();
    const auto now = Clock::now();
    // post_timeout runs from the last attempt that posted something.
    if (attempt == 0 || n > 0) retry_until = now + config_.post_timeout;
    if (now >= retry_until) break;
    g.unlock();
    back_off(n > 0 ? 0 : attempt);
    g.relock();
  }
  if (done < claimed) {
    limit_status = st;
    for (std::size_t k = done; k < claimed; ++k) refuse_locked(batch_[k]->index, refused);
  }
  batch_.clear();
  if (done < ops.size()) {
    ops[done].status = limit_status;
    rejected_.fetch_add(1, std::memory_order_relaxed);
  }
  if (done > 0) {
    ++activity_;
    if (sleepers_ > 0) wake_sleepers_locked();
  }
  return done;
}

Endpoint::Clock::time_point Endpoint::deadline_for(OpKind kind, std::uint64_t length,
                                                   Clock::time_point now) const noexcept {
  const auto bound = kind == OpKind::recv ? config_.recv_timeout : config_.op_timeout;
  if (bound.count() <= 0) return Clock::time_point::max();
  // op_timeout + length / min_bandwidth (see EndpointConfig), saturating.
  constexpr double kMaxSeconds = 1e9;  // ~30 years: "no bound" in practice
  double seconds = std::chrono::duration<double>(bound).count();
  if (config_.min_bandwidth > 0) seconds += static_cast<double>(length) / static_cast<double>(config_.min_bandwidth);
  if (!(seconds < kMaxSeconds)) return Clock::time_point::max();
  const auto span = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  if (now > Clock::time_point::max() - span) return Clock::time_point::max();
  return now + span;
}

[[gnu::always_inline]] inline std::size_t Endpoint::poll_locked() noexcept {
  const std::size_t n = do_poll(config_.poll_batch);
  last_poll_events_ = n;
  if (!kept_retry_.empty()) [[unlikely]] retry_kept_locked();
  // The poll a message's latency runs through may skip the clock: the scan
  // comes at most one poll later (platform::clock_read_due).
  if (!platform::clock_read_due(n > 0, expiry_read_skipped_)) return n;
  // Is a scan due? Asked of the coarse clock (three ticks behind at most), so
  // scans come every max(kExpiryScanInterval, one tick); the scan itself
  // compares deadlines with the precise clock, so nothing expires early.
  if ((backend_owned_ > 0 || quarantine_head_ != kNoExposure) && platform::CoarseClock::now() >= next_expiry_scan_) {
    const auto now = Clock::now();
    next_expiry_scan_ = now + kExpiryScanInterval;
    if (backend_owned_ > 0 && now >= impl_->next_op_deadline) expire_locked(now);
    expire_quarantine_locked(now);
    if (backend_owned_ > 0 && now >= next_abandon_scan_) {
      next_abandon_scan_ = now + kAbandonScanInterval;
      abandon_all_locked();
    }
  }
  return n;
}

[[gnu::cold]] void Endpoint::expire_locked(Clock::time_point now) noexcept {
  Clock::time_point next = Clock::time_point::max();
  for (std::size_t i = 0; i < config_.max_in_flight; ++i) {
    Slot& s = slots_[i];
    if (!s.backend_owned || s.completed) continue;
    if (s.deadline > now) {
      next = std::min(next, s.deadline);
      continue;
    }
    timeouts_.fetch_add(1, std::memory_order_relaxed);
    finish_locked(s, static_cast<std::uint32_t>(i), Status::timeout, 0, 0, kAnyPeer);
    // Whatever state the connection is in, it did not answer in time: make
    // the user decide (reconnect) before more operations pile up behind it.
    if (s.desc.peer != kAnyPeer && s.desc.peer < peers_.size()) peers_[s.desc.peer].broken = true;
    do_cancel(s.desc);
  }
  impl_->next_op_deadline = next;
}

[[gnu::hot]] void Endpoint::complete(std::uint32_t index, Status status, std::uint64_t bytes, PeerId peer) noexcept {
  if (index >= config_.max_in_flight) return;
  Slot& s = slots_[index];
  if (!s.backend_owned) return;  // a backend bug; never free a slot twice
  s.backend_owned = false;
  --backend_owned_;
  if (!s.completed && s.desc.kind == OpKind::recv && status == Status::ok && peer == kAnyPeer) {
    unknown_source_.fetch_add(1, std::memory_order_relaxed);
  }
  const bool atomic = s.desc.kind == OpKind::fetch_add || s.desc.kind == OpKind::compare_swap;
  const std::uint64_t value = atomic && status == Status::ok ? atomic_words_[index].result : 0;
  if (!s.completed) finish_locked(s, index, status, bytes, value, peer);
  // The provider is done with the bytes: the in-flight reference goes now,
  // even if the user has not looked at the completion yet - but not under
  // the mutex (it may be the last one, and its cleanup may call into this
  // endpoint): the unlock releases it.
  if (!s.kept) release_slice_locked(index);
  maybe_free_locked(index);
}

[[gnu::always_inline]] inline
void Endpoint::finish_locked(Slot& s, std::uint32_t index, Status st, std::uint64_t bytes, std::uint64_t value,
                             PeerId peer) noexcept {
  s.completed = true;
  s.result.status = st;
  s.result.bytes = bytes;
  s.result.value = value;
  if (peer != kAnyPeer) s.result.peer = peer;
  // A kept operation goes on after a message or a send (or a message too
  // long for a receive); any other end is its last. Decided here, where
  // every completion passes (a timeout or a peer's failure finishes an op
  // the backend still holds, complete() comes later), so a failed one is
  // never parked while the backend holds it.
  if (s.kept && st != Status::ok && !(st == Status::out_of_bounds && s.desc.kind == OpKind::recv)) [[unlikely]] {
    s.kept = false;
  }
  bump_locked(completed_);
  if (st != Status::ok) bump_locked(failed_);
  if (st == Status::peer_unreachable && s.desc.peer != kAnyPeer && s.desc.peer < peers_.size()) {
    peers_[s.desc.peer].broken = true;
  }
  if (s.has_callback) {
    ready_[ring_at(ready_head_, ready_count_, ready_.size())] = index;
    ++ready_count_;
  }
  if (waiters_.load(std::memory_order_relaxed) > 0) impl_->done_cv.notify_all();
  ++activity_;
  if (sleepers_ > 0) wake_sleepers_locked();
}

[[gnu::always_inline]] inline void Endpoint::maybe_free_locked(std::uint32_t index) noexcept {
  Slot& s = slots_[index];
  // A slot goes back only once its Slice has been released outside the
  // mutex (unlock_and_release); its callback was moved out to run (or, for
  // a refused post, to be destroyed) outside it too.
  if (s.backend_owned || s.user_pending || s.release_pending || s.parked || s.delivering) return;
  s.completed = false;
  free_.push_back(index);
}

[[gnu::cold]] void Endpoint::mark_peer_broken(PeerId peer) noexcept {
  if (peer < peers_.size()) peers_[peer].broken = true;
}

[[gnu::cold]] void Endpoint::fail_peer_ops(PeerId peer, Status st) noexcept {
  if (peer >= peers_.size()) return;
  peers_[peer].broken = true;
  fail_ops_locked(peer, st, true);
}

PeerId Endpoint::peer_for_handle(std::uint64_t handle) const noexcept {
  return handle < peer_by_handle_.size() ? peer_by_handle_[handle] : kAnyPeer;
}

[[gnu::hot]] std::uint32_t Endpoint::index_of_context(const void* context) const noexcept {
  const auto* first = reinterpret_cast<const std::byte*>(&slots_[0].context);
  const auto* p = static_cast<const std::byte*>(context);
  if (p < first) return kNoIndex;
  const auto delta = static_cast<std::size_t>(p - first);
  if (delta % sizeof(Slot) != 0) return kNoIndex;
  const std::size_t index = delta / sizeof(Slot);
  return index < config_.max_in_flight ? static_cast<std::uint32_t>(index) : kNoIndex;
}

[[gnu::hot]] std::uint32_t Endpoint::index_of_tag(std::uint64_t tag) noexcept {
  const auto index = static_cast<std::uint32_t>(tag & 0xffffffffU);
  if (index >= config_.max_in_flight) return kNoIndex;
  const Slot& s = slots_[index];
  if (!s.backend_owned || s.desc.tag != tag) {
    stale_completions_.fetch_add(1, std::memory_order_relaxed);
    return kNoIndex;
  }
  return index;
}

const BackendOp& Endpoint::op_at(std::uint32_t index) const noexcept { return slots_[index].desc; }

[[gnu::hot]] std::size_t Endpoint::progress() noexcept {
  std::size_t events = 0;
  return progress_counting(events);
}

// --- messages in place (lib/transport/message_sink.hpp) ---

bool Endpoint::set_message_sink(std::shared_ptr<detail::MessageSink> sink) noexcept {
  std::shared_ptr<detail::MessageSink> old;  // dropped after the unlock
  Lock g(*this);
  old = std::move(sink_);
  sink_ = std::move(sink);
  sink_took_ = false;
  // Installed on every backend: records in place where the backend shows
  // them, completed kept receives (take_kept_locked) where it does not.
  const bool in_place = do_messages_in_place();
  sink_bounces_ = sink_ != nullptr && !in_place;
  return in_place;
}

[[gnu::hot]] bool Endpoint::offer_in_place(PeerId peer, std::span<const std::byte> bytes) noexcept {
  if (!sink_) return false;
  const detail::MessageSink::Take t = sink_->take(peer, bytes);
  if (t == detail::MessageSink::Take::declined) return false;
  if (t == detail::MessageSink::Take::settle) sink_took_ = true;
  ++sink_takes_;
  ++activity_;
  return true;
}

[[gnu::hot]] Status Endpoint::send_copy(PeerId peer, std::span<const std::byte> head, const Slice& body,
                                         bool may_read) noexcept {
  if (!body) return Status::invalid_argument;
  Lock g(*this);
  // recheck_peer_locked's checks, inline: that one is marked cold (a
  // post's retry), and a call to it would mark this path unlikely.
  if (!usable() || stopping_.load(std::memory_order_relaxed)) return Status::closed;
  if (peer >= peers_.size() || !peers_[peer].used) return Status::invalid_argument;
  const Peer& p = peers_[peer];
  if (p.broken) return Status::peer_unreachable;
  if (head.size() + body.length() > p.message_limit) return Status::message_too_large;
  // Behind a send still waiting to be posted (a kept send's repost, a
  // settling peer): it goes as a posted send, in order.
  if (p.settling || send_held_locked(peer)) return Status::would_block;
  const Status st = do_send_copy(p.handle, head, {body.address(), static_cast<std::size_t>(body.length())}, may_read);
  if (st == Status::ok) {
    ++activity_;
    if (sleepers_ > 0) wake_sleepers_locked();
  }
  return st;
}

// A completed kept receive, offered to the receive side's sink before its
// callback, on a backend without messages in place (a Messenger owns every
// receive of its endpoint: these are its bounces). Taken, the message was
// matched and copied where it lay, and the receive goes straight back to
// the provider, as the callback's repost would have put it: no delivery
// batch, no callback, no repost call through the Messenger. Declined (out
// of sequence, a control or rendezvous message, no receive posted for it,
// the Messenger busy on another thread), it goes to the callback as before.
[[gnu::hot]] bool Endpoint::take_kept_locked(std::uint32_t index) noexcept {
  Slot& s = slots_[index];
  if (s.result.status != Status::ok || s.result.peer == kAnyPeer || !usable() ||
      stopping_.load(std::memory_order_relaxed)) {
    return false;
  }
  if (!offer_in_place(s.result.peer, {s.local.address(), static_cast<std::size_t>(s.result.bytes)})) return false;
  const Status st = post_kept_locked(index, 0);
  // A failed repost ends the receive: its callback gets that completion
  // (queued again, delivered by the caller's loop), as after a callback.
  if (st != Status::ok) fail_kept_locked(index, st);
  return true;
}

// A kept send's completion, offered to the sink before its callback, on
// every backend (the Messenger's kept sends carry its eager messages off
// the rings). Taken, the sink did what the callback would have (the op
// its message carried completes, the buffer is free for the next one) and
// the send is parked, as settle_kept_locked parks one whose callback asked
// for no repost: the delivery batch, the callback with its lock round and
// the settling relock go.
[[gnu::hot]] bool Endpoint::take_sent_locked(std::uint32_t index) noexcept {
  Slot& s = slots_[index];
  if (s.result.status != Status::ok || s.repost_asked || !usable() || stopping_.load(std::memory_order_relaxed)) {
    return false;
  }
  const detail::MessageSink::Take t = sink_->sent(s.result);
  if (t == detail::MessageSink::Take::declined) return false;
  if (t == detail::MessageSink::Take::settle) sink_took_ = true;
  ++sink_takes_;
  ++activity_;
  s.user_pending = false;
  s.parked = true;
  return true;
}

void Endpoint::settle_sink(Lock& g) noexcept {
  sink_took_ = false;
  std::shared_ptr<detail::MessageSink> sink = sink_;  // alive through settle() even if removed meanwhile
  g.unlock();
  sink->settle();
  sink.reset();
  g.relock();
}

[[gnu::hot]] std::size_t Endpoint::progress_counting(std::size_t& events) noexcept {
  Lock g(*this);
  if (!stopping_.load(std::memory_order_relaxed)) events += poll_locked();
  std::size_t delivered = 0;
  // Messages the receive side's sink took in place (in the poll, or from a
  // completed bounce below) count as deliveries (each completed a receive
  // of its owner's, as a callback would have), and the work their takes
  // left for outside the mutex (posts) runs now.
  auto count_takes = [&] {
    if (sink_takes_ == 0) [[likely]] return;
    delivered += std::exchange(sink_takes_, 0);
    if (sink_took_) settle_sink(g);  // set only while a sink is installed
  };
  count_takes();
  // Most rounds of a spin-wait deliver nothing: the batch below is built
  // only when there is something to deliver.
  while (ready_count_ > 0) {
    {
      struct Delivery {
        Callback cb;
        Completion result;
        std::uint32_t kept;  // a kept operation's slot (its callback runs in place), or kNoIndex
        Slice old;           // a kept operation's buffer its repost replaced
      };
      detail::StackBatch<Delivery, kDeliverBatch> batch;
      bool any_kept = false;
      while (ready_count_ > 0 && !batch.full()) {
        const std::uint32_t index = ready_[ready_head_];
        ready_head_ = ring_next(ready_head_, ready_.size());
        --ready_count_;
        Slot& s = slots_[index];
        if (s.kept) {
          if (sink_bounces_ && s.desc.kind == OpKind::recv && take_kept_locked(index)) continue;
          if (sink_ && s.desc.kind == OpKind::send && take_sent_locked(index)) continue;
          // Its callback stays in the slot for the next message; nobody
          // touches it while delivering (repost and end_kept only ask).
          s.delivering = true;
          any_kept = true;
          batch.emplace(Callback{}, s.result, index, Slice{});
        } else {
          batch.emplace(std::move(s.cb), s.result, kNoIndex, Slice{});
        }
        s.user_pending = false;
        maybe_free_locked(index);
      }
      // Before the callbacks (settle_sink unlocks and locks again: the
      // batch's slots are marked delivering or freed already).
      count_takes();
      // Callbacks run, and are destroyed (end of this block), without the
      // mutex.
      g.unlock();
      const std::size_t k = batch.size();
      for (std::size_t i = 0; i < k; ++i) {
        if (batch[i].kept != kNoIndex) {
          Callback& cb = slots_[batch[i].kept].cb;
          if (cb) cb(batch[i].result);
        } else if (batch[i].cb) {
          batch[i].cb(batch[i].result);
        }
      }
      delivered += k;
      if (any_kept) {
        // Park, repost or end them; an ended one's callback and a replaced
        // buffer join the batch, to be destroyed after this unlock.
        g.relock();
        for (std::size_t i = 0; i < k; ++i) {
          if (batch[i].kept != kNoIndex) settle_kept_locked(batch[i].kept, batch[i].cb, batch[i].old);
        }
        g.unlock();
      }
      if (k < kDeliverBatch) return delivered;
    }
    g.relock();
    if (!stopping_.load(std::memory_order_relaxed)) events += poll_locked();
  }
  return delivered;
}

std::uint64_t Endpoint::activity() const noexcept {
  const auto g = lock_fair();
  return activity_;
}

void Endpoint::wake_sleepers_locked() noexcept {
  if (bell_seq_) {
    // Sleepers are on the doorbell's futex, not on wake_fd_.
    bell_seq_->fetch_add(1, std::memory_order_seq_cst);
    platform::futex_wake_all(*bell_seq_);
    return;
  }
  if (wake_fd_ < 0) return;
  const std::uint64_t one = 1;
  // EAGAIN (the counter is saturated) still leaves the fd readable.
  if (::write(wake_fd_, &one, sizeof one) < 0) return;
}

Endpoint::Clock::duration Endpoint::spin_window(const IdleState& st, Clock::time_point now) const noexcept {
  const Clock::duration base = config_.wait_spin;
  if (st.gap_count == 0) return base;
  std::uint32_t longest = 0;
  const std::size_t n = std::min<std::size_t>(st.gap_count, IdleState::kGaps);
  for (std::size_t i = 0; i < n; ++i) longest = std::max(longest, st.gaps[i]);
  // Long gaps (a pause, a slow peer): spinning through them would only burn
  // the core. Short ones: spin a little longer than the longest, so the
  // next message finds us awake - unless others are waiting for a CPU.
  const auto longest_us = std::chrono::microseconds(longest);
  if (longest_us > kSpinCap) return base;
  const Clock::duration learned = std::min<Clock::duration>(kSpinCap, longest_us * kSpinGapFactor);
  if (learned <= base) return base;
  // The caller's reading of the clock: a spin round reads it once.
  if (cpus_oversubscribed(now)) return base;
  return learned;
}

[[gnu::hot]] void Endpoint::idle(std::size_t work, Clock::time_point until, std::uint64_t seen,
                               IdleState& st) noexcept {
  if (!sleeps()) return;
  const auto now = Clock::now();
  if (st.since == Clock::time_point{}) st.since = now;  // the first idle round
  auto note_work = [&st](Clock::time_point t) {
    if (st.idle_rounds > 0) {
      // An idle gap ended: remember how long it was (adaptive window).
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t - st.since).count();
      st.gaps[st.gap_count % IdleState::kGaps] =
          static_cast<std::uint32_t>(std::min<std::int64_t>(std::max<std::int64_t>(us, 0), 0xffffffff));
      ++st.gap_count;
    }
    st.since = t;
    st.naps = 0;
    st.idle_rounds = 0;
  };
  if (work > 0) {
    note_work(now);
    return;
  }
  if (st.idle_rounds < ~std::uint32_t{0}) ++st.idle_rounds;
  if (config_.wait_mode == WaitMode::adaptive && now - st.since < spin_window(st, now)) return;
  if (now >= until) return;
  std::chrono::microseconds max_sleep = kMaxSleep;
  int fd = -1;
  std::uint32_t bell_seen = 0;
  {
    // Lock, not a bare unique_lock: the doorbell's last poll below may
    // complete operations, whose references go after the unlock.
    Lock g(*this);
    if (stopping_.load(std::memory_order_relaxed) || activity_ != seen || ready_count_ > 0) return;
    if (!do_arm(max_sleep)) return;
    if (bell_seq_) {
      // The doorbell protocol (endpoint_backend.hpp, do_wait_bell): count
      // ourselves, read seq, then look once more. A peer that posted before
      // the increment did not ring, and this poll sees its message; one
      // that posts after it rings, and the futex sees seq move.
      bell_sleepers_->fetch_add(1, std::memory_order_seq_cst);
      bell_seen = bell_seq_->load(std::memory_order_seq_cst);
      const std::size_t found = poll_locked();
      if (found > 0 || activity_ != seen || ready_count_ > 0) {
        bell_sleepers_->fetch_sub(1, std::memory_order_seq_cst);
        if (found > 0) note_work(now);
        return;
      }
    } else {
      fd = do_wait_fd();
      if (sleepers_ == 0) {
        // Wake-ups before this point are in the state the caller checks
        // (activity_); only someone already asleep could still need one.
        std::uint64_t drained = 0;
        if (::read(wake_fd_, &drained, sizeof drained) < 0) drained = 0;
      }
    }
    ++sleepers_;
  }
  auto bound = max_sleep;
  if (fd < 0) {
    // No wait object: a nap, growing while nothing happens. A doorbell cuts
    // it short, but senders that cannot ring (one that never inserted us,
    // or could not map the bell) are still heard within a nap.
    bound = std::min({bound, kNapMax, kNapMin * (1u << std::min<std::uint32_t>(st.naps, 6))});
  }
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(until - now);
  if (left < bound) bound = left;
  ++st.naps;
  if (bell_seq_) {
    if (platform::futex_wait(*bell_seq_, bell_seen, bound)) bell_wakes_.fetch_add(1, std::memory_order_relaxed);
  } else {
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(bound.count() / 1000000);
    ts.tv_nsec = static_cast<long>((bound.count() % 1000000) * 1000);
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {fd, POLLIN, 0}};
    (void)::ppoll(fds, fd >= 0 ? 2 : 1, &ts, nullptr);
  }
  sleeps_.fetch_add(1, std::memory_order_relaxed);
  {
    const auto g = lock_fair();
    --sleepers_;
  }
  if (bell_seq_) bell_sleepers_->fetch_sub(1, std::memory_order_seq_cst);
}

[[gnu::hot]] Completion Endpoint::wait(Token token, std::chrono::milliseconds timeout) noexcept {
  const auto [index, gen] = parts_of(token);
  Completion bad{token, OpKind::put, Status::invalid_argument, kAnyPeer, 0, 0};
  if (!token || index >= config_.max_in_flight) return bad;
  // The deadline is read from the clock at the first look that finds the
  // op still running: an op the provider completed inside its post (shm's
  // puts and gets, small sends) returns from the first look without a clock
  // read. The wait then ends one look later than it would have, never
  // earlier.
  Clock::time_point deadline{};
  bool deadline_set = false;
  const bool threaded = impl_->progress_thread.joinable();
  IdleState idle_state;
  for (;;) {
    std::uint64_t seen = 0;
    std::size_t events = 0;
    bool deliver = true;  // run progress_counting after the look
    {
      Lock lk(*this);
      Slot& s = slots_[index];
      if (s.gen != gen || !s.user_pending || s.has_callback) return bad;
      // The round's poll goes under the same hold as the look at the slot:
      // one mutex round per spin round instead of two, and an op this poll
      // completes is returned now instead of one round later (under qemu
      // TCG, where the Soft-RoCE guest runs user code about ten times
      // slower than a CPU, each round is a visible part of a verbs op's
      // latency). Only when no callback is waiting to be delivered, and
      // only if this poll makes none ready: callbacks go out through
      // progress_counting before wait() returns, as they always did.
      bool polled = false;
      if (!s.completed && !threaded && ready_count_ == 0 && !stopping_.load(std::memory_order_relaxed)) {
        seen = activity_;
        events = poll_locked();
        polled = true;
        deliver = ready_count_ > 0;
      }
      if (s.completed && !(polled && deliver)) {
        Completion c = s.result;
        s.user_pending = false;
        s.parked = s.kept;  // complete() ended it unless it goes on
        maybe_free_locked(index);
        return c;
      }
      // An op this round's poll completed while it also made callbacks
      // ready is returned next round, after they go out, whatever the
      // deadline: never in_progress once it is complete.
      if (!s.completed) {
        if (!deadline_set) {
          deadline = wait_deadline(timeout);
          deadline_set = true;
        }
        if (platform::CoarseClock::reached(deadline)) {
          Completion c = s.result;
          c.status = Status::in_progress;
          return c;
        }
      }
      if (threaded) {
        // The progress thread completes it and notifies; a condition
        // variable sleeps in every wait mode.
        waiters_.fetch_add(1, std::memory_order_relaxed);
        impl_->done_cv.wait_until(lk.native(), std::min(deadline, Clock::now() + std::chrono::milliseconds(2)));
        waiters_.fetch_sub(1, std::memory_order_relaxed);
        continue;
      }
      if (!polled) seen = activity_;
    }
    const std::size_t delivered = deliver ? progress_counting(events) : 0;
    idle(delivered + events, deadline, seen, idle_state);
  }
}

Status Endpoint::quiesce(std::chrono::milliseconds timeout) noexcept {
  const auto deadline = wait_deadline(timeout);
  IdleState idle_state;
  for (;;) {
    std::size_t events = 0;
    const std::size_t delivered = progress_counting(events);
    std::uint64_t seen = 0;
    {
      Lock g(*this);
      bool busy = ready_count_ > 0;
      for (std::size_t i = 0; !busy && i < config_.max_in_flight; ++i) {
        const Slot& s = slots_[i];
        busy = s.user_pending && !s.completed && s.desc.kind != OpKind::recv;
      }
      if (!busy) return Status::ok;
      seen = activity_;
    }
    if (platform::CoarseClock::reached(deadline)) return Status::timeout;
    if (impl_->progress_thread.joinable()) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    } else {
      // Snapshot taken after this round's progress: a completion since then
      // (another thread's progress) ends the sleep at once.
      idle(delivered + events, deadline, seen, idle_state);
    }
  }
}

void Endpoint::progress_for(std::chrono::milliseconds duration) noexcept {
  const auto deadline = wait_deadline(duration);
  IdleState idle_state;
  while (!platform::CoarseClock::reached(deadline)) {
    if (impl_->progress_thread.joinable()) {
      std::this_thread::sleep_for(std::min<Clock::duration>(deadline - Clock::now(), std::chrono::milliseconds(1)));
    } else {
      const std::uint64_t seen = sleeps() ? activity() : 0;
      std::size_t events = 0;
      const std::size_t delivered = progress_counting(events);
      idle(delivered + events, deadline, seen, idle_state);
    }
  }
}

std::size_t Endpoint::progress_or_idle(std::chrono::milliseconds max) noexcept {
  if (impl_->progress_thread.joinable()) {
    // The progress thread does the polling; take one look and nap briefly.
    const std::size_t delivered = progress();
    if (delivered == 0) std::this_thread::sleep_for(std::min<Clock::duration>(max, std::chrono::microseconds(50)));
    return delivered;
  }
  const std::uint64_t seen = sleeps() ? activity() : 0;
  std::size_t events = 0;
  const std::size_t delivered = progress_counting(events);
  // One state across calls, so naps grow and the adaptive window learns
  // the gaps between calls that found work (a server loop calls this
  // between its own rounds). A second thread in here at the same time
  // uses a fresh state, which only spins and naps less well.
  if (!impl_->idle_busy.test_and_set(std::memory_order_acquire)) {
    idle(delivered + events, Clock::now() + max, seen, impl_->idle_state);
    impl_->idle_busy.clear(std::memory_order_release);
  } else {
    IdleState st;
    idle(delivered + events, Clock::now() + max, seen, st);
  }
  return delivered;
}

void Endpoint::progress_thread_main() noexcept {
  IdleState idle_state;
  while (!stopping_.load(std::memory_order_acquire)) {
    // progress() counts user completions only; internal traffic (emulated
    // atomics served for peers, connection setup) is activity too, and
    // sleeping through it would add the idle sleep to a peer's latency.
    const std::uint64_t seen = sleeps() ? activity() : 0;
    std::size_t events = 0;
    const std::size_t delivered = progress_counting(events);
    if (sleeps()) {
      idle(delivered + events, Clock::time_point::max(), seen, idle_state);
    } else if (delivered == 0 && events == 0 && config_.progress_idle_sleep.count() > 0) {
      std::this_thread::sleep_for(config_.progress_idle_sleep);
    }
  }
}

EndpointStats Endpoint::stats() const noexcept {
  EndpointStats st;
  st.posted = posted_.load(std::memory_order_relaxed);
  st.completed = completed_.load(std::memory_order_relaxed);
  st.failed = failed_.load(std::memory_order_relaxed);
  st.rejected = rejected_.load(std::memory_order_relaxed);
  st.timeouts = timeouts_.load(std::memory_order_relaxed);
  st.post_retries = retries_.load(std::memory_order_relaxed);
  st.reconnects = reconnects_.load(std::memory_order_relaxed);
  st.unknown_source = unknown_source_.load(std::memory_order_relaxed);
  st.abandoned = abandoned_.load(std::memory_order_relaxed);
  st.stale_completions = stale_completions_.load(std::memory_order_relaxed);
  st.dropped_at_removal = dropped_at_removal_.load(std::memory_order_relaxed);
  st.sleeps = sleeps_.load(std::memory_order_relaxed);
  st.bell_wakes = bell_wakes_.load(std::memory_order_relaxed);
  const auto g = lock_fair();
  st.in_flight = backend_owned_;
  return st;
}

}  // namespace regpool
