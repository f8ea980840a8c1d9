#pragma once
// libfabric shm and dead peers (docs/provider-facts.md, "shm and dead
// peers"). libfabric 1.17's shm provider guards each endpoint's shared
// region with a pthread spin lock that lives in the region itself
// (/dev/shm/<pid>:<domain>:<endpoint>, offset 0x18). A peer takes *our*
// lock whenever it posts to us (and holds it across the whole CMA copy of a
// fast RMA) and then sets the region's `signal` word; our fi_cq_read takes
// it whenever it finds that word set (measured 2026-11-27: with the word
// clear it returns without the lock); and we take a peer's lock in every
// post to it. A process killed while holding a lock
// leaves it held for ever, and the next provider call that wants it spins
// for ever: no timeout of ours can fire from inside that call.
//
// What this file gives FabricEndpoint so that it never makes such a call:
//  - the pid a shm address names ("fi_shm://<pid>:<n>:<n>"; a pure
//    function, fuzzed in test/fuzz/fabric_name_fuzz.cpp), and whether that
//    process still exists;
//  - RegionLock: our own mapping of the first page of a region, on which we
//    *try* the provider's lock (pthread_spin_trylock, the same glibc
//    protocol the provider uses) before any call that would spin on it, and
//    which can release it once its holder is proven dead;
//  - who maps a region (from /proc), the evidence for that proof;
//  - LockRescuer: a thread that releases a lock under a provider call
//    already stuck behind it (our own lock, or a dead target's under a
//    post), which no check before the call can prevent.
// Everything here is used only when the region header has the exact layout
// measured on libfabric 1.17 (RegionLock::open checks it), so another
// libfabric version gets the pid checks only, never a write into its
// region.

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "regpool/endpoint_backend.hpp"

namespace regpool::fabric_shm {

// The process id in a shm address: scheme, decimal pid (1..2^31-1, no
// leading zero), ':', rest. 0 when the address is not of that shape. The
// address may carry its terminating NUL.
inline std::int64_t pid_from_address(std::span<const std::byte> addr, std::string_view scheme) noexcept {
  if (addr.size() <= scheme.size()) return 0;
  for (std::size_t i = 0; i < scheme.size(); ++i) {
    if (static_cast<char>(addr[i]) != scheme[i]) return 0;
  }
  std::int64_t pid = 0;
  std::size_t i = scheme.size();
  const std::size_t first = i;
  for (; i < addr.size(); ++i) {
    const auto c = static_cast<unsigned char>(addr[i]);
    if (c < '0' || c > '9') break;
    if (i == first && c == '0') return 0;
    pid = pid * 10 + (c - '0');
    if (pid > 0x7fffffff) return 0;
  }
  if (i == first || i >= addr.size() || static_cast<char>(addr[i]) != ':') return 0;
  return pid;
}

// The region's file name under /dev/shm: the address without its scheme and
// NUL. Empty when it is not one.
std::string region_name(std::span<const std::byte> addr, std::string_view scheme);

// Whether process `pid` exists and is not a zombie (a killed process whose
// parent has not reaped it yet is dead for us). Pids that cannot be checked
// (EPERM) count as alive.
bool process_alive(std::int64_t pid) noexcept;

// Whether every thread of process `pid` has finished for good: the pid is
// gone, or it is a zombie whose thread group is down to the zombie leader
// itself (a zombie leader may outlive threads that still run, e.g. inside
// process_vm_readv). Stricter than !process_alive: what it takes before our
// memory may be reused under a cross-memory read the process had been asked
// to do. A pid that cannot be checked counts as not gone.
bool process_finished(std::int64_t pid) noexcept;

// Whether this process may read `pid`'s memory with process_vm_readv (CMA,
// what shm uses for messages beyond its inject size and for RMA): probed
// with a read of address 0, which fails EFAULT once the kernel has let us
// in. Returns 0 then, else the probe's errno: EPERM (refused: another user,
// Yama's ptrace_scope, a container without CAP_SYS_PTRACE, a target that
// is not dumpable), ESRCH (no such process).
int cross_memory_probe(std::int64_t pid) noexcept;

// Whether process `pid` maps /dev/shm/<region> (read from
// /proc/<pid>/maps): an shm endpoint maps its own region for as long as it
// is open, so `yes` proves that the process a peer's name names is the one
// behind the region the name names. A name is the peer's word; the pid in
// it decides whose memory cross-memory attach reads and writes (ours for
// puts, gets and large messages; libfabric's for its own copies), and a
// process allowed to attach to others (CAP_SYS_PTRACE) must not be steered
// into a third process by a peer that names it. `gone`: no such process
// (or a zombie); `unreadable`: its maps may not be read (then nothing is
// proven either way).
enum class MapsRegion : std::uint8_t { yes, no, gone, unreadable };
MapsRegion process_maps_region(std::int64_t pid, std::string_view region) noexcept;

// Copies `length` bytes between `local` in this process and `remote` in
// process `pid` by cross-memory attach: process_vm_writev when `write`,
// else process_vm_readv, again after a short count until all are moved.
// Returns 0, or the errno that stopped it: ESRCH (no such process), EFAULT
// (`remote` is not that process's memory, or not all of it), EPERM (no
// longer allowed to attach), anything else the kernel gives.
int cross_memory_copy(std::int64_t pid, bool write, std::byte* local, std::uint64_t remote,
                      std::uint64_t length) noexcept;

// Whether `value` (an environment variable's, null when unset) is true as
// libfabric reads a boolean parameter (fi_param_get_bool): 1, on, true or
// yes, in any case. Anything else, unset included, is not (libfabric
// ignores a value it cannot read).
bool env_flag_true(const char* value) noexcept;

// Why shm between this process and `pid` would run without cross-memory
// attach, which regpool does not support (docs/provider-facts.md, "shm
// without cross-memory attach"): FI_SHM_DISABLE_CMA's value
// `disable_cma` (null when unset) turns it off, or `probe_errno` (from
// cross_memory_probe) refuses it. Empty when CMA works, and for a process
// that no longer exists (ESRCH: a dead peer, handled as one). A pure
// function, so the message is tested without another user's process.
std::string cma_refusal(const char* disable_cma, std::int64_t pid, int probe_errno);

// libfabric 1.17 shm names an endpoint's region /dev/shm/<pid>:<domain>:<ep>
// and never removes the region of a killed process. A later process given
// the same pid then cannot open an endpoint whose name is taken: fi_enable
// fails with -FI_EBUSY (seen in CI after many killed peers). A region named
// with our own pid that was created before this process started can only be
// a dead process's (no other live process has our pid in this pid
// namespace): remove those. Returns how many were removed.
std::size_t remove_stale_own_regions() noexcept;
// The rule itself, for tests: remove /dev/shm/<pid>:* created before
// start_ns (CLOCK_REALTIME nanoseconds).
std::size_t remove_stale_regions(long pid, std::int64_t start_ns) noexcept;

// The regions that killed processes left: /dev/shm/<pid>:<domain>:<ep>
// whose pid no longer exists, regular files of our euid whose header says
// version 4 and names the same pid (so only libfabric shm regions, never
// another program's files). Each is a 16 MiB file of which the dead
// process touched about 4 MiB: a machine whose peers get killed collected
// 835 of them (3.1 GiB of tmpfs, i.e. memory) before this sweep. Opening
// an shm endpoint calls it on /dev/shm. A survivor that still maps such a
// region keeps a valid mapping (unlink leaves it alive). Returns how many
// were removed.
std::size_t sweep_dead_regions(const char* dir) noexcept;
// The pid in a file name of libfabric shm's exact shape
// "<pid>:<domain>:<ep>" (three decimal fields, nothing else, the pid at
// most INT32_MAX), or 0 for any other name. File names under /dev/shm are anyone's bytes: fuzzed.
std::int64_t region_file_pid(std::string_view name) noexcept;

// The provider's spin lock of one shm region, through our own mapping of
// the region's first page. Not thread-safe (used under the endpoint's mutex).
class RegionLock {
 public:
  RegionLock() = default;
  RegionLock(const RegionLock&) = delete;
  RegionLock& operator=(const RegionLock&) = delete;
  ~RegionLock();

  // Maps /dev/shm/<name> and checks that its header is the libfabric 1.17
  // layout (version 4, `pid` at offset 4, total size at 0x28 equal to the
  // file's size). false (and nothing mapped) otherwise.
  bool open(const std::string& name, std::int64_t pid) noexcept;
  bool valid() const noexcept { return header_ != nullptr; }
  const std::string& name() const noexcept { return name_; }
  // The region's owner, as open() found it in the header.
  std::int64_t owner() const noexcept { return owner_; }

  // true when someone holds the lock right now; never waits. glibc x86-64:
  // a read of the lock word (free when positive); elsewhere a try that, when
  // it succeeds, gives the lock back at once.
  bool held() noexcept;
  // true when the lock is still held after `patience`: held(), and while
  // it is, a spin (pauses and held(); a try only every 16th round where
  // held() is one) that ends when the holder lets go or after `patience`.
  // A live holder lets go within its own provider call; a dead one never
  // does, so this is bounded, never a wait for ever.
  bool held_for(std::chrono::nanoseconds patience) noexcept;
  // Releases the lock on behalf of a holder proven dead.
  void force_release() noexcept;
  // Whether the region's `signal` word is set: a peer posted to the
  // region's owner since its last fi_cq_read (which clears it). A read of
  // the word, nothing more; true when nothing is mapped.
  bool signalled() const noexcept;
  // For tests that play a peer killed holding the lock. try_take takes it
  // when it is free (pthread_spin_trylock; false when held or nothing is
  // mapped). waited_on: while we hold it, whether some thread is spinning
  // in pthread_spin_lock for it, i.e. inside a provider call (glibc x86-64:
  // each waiter's locked decrement leaves the word negative; elsewhere
  // always false).
  bool try_take() noexcept;
  bool waited_on() noexcept;

 private:
  void* header_ = nullptr;
  std::size_t mapped_ = 0;
  std::int64_t owner_ = 0;
  std::string name_;
};

// Processes other than this one that map /dev/shm/<name>, from /proc/*/maps.
// `stopped`: of those, how many are stopped or traced (one of them may be
// holding the lock and will release it when it runs on). Processes whose
// maps we may not read (`unreadable`: other users', a sandbox's init) are
// not counted: the region is mode 0600 and ours, so only a privileged
// process could map it. `complete` is false when /proc could not be read.
struct Mappers {
  std::size_t live = 0;
  std::size_t stopped = 0;
  std::size_t unreadable = 0;
  bool complete = true;
};
Mappers region_mappers(const std::string& name) noexcept;
// The rule both the endpoint's recovery and the rescuer apply to a lock
// held past the patience: its holder is proven dead when no other live
// process maps the region, or a peer died and no mapper is stopped or
// traced (a stopped one may be the holder and let go when it runs on).
inline bool holder_proven_dead(const Mappers& m, bool peer_died) noexcept {
  return m.complete && (m.live == 0 || (m.stopped == 0 && peer_died));
}

// ---------------------------------------------------------------------------
// The rescuer (docs/provider-facts.md, "shm and dead peers"). The endpoint
// tries its own region lock before every provider call that takes it, but
// between that try and the provider's own pthread_spin_lock a peer that
// streams operations into us can take the lock and be killed holding it.
// The call then spins inside libfabric for ever, holding the endpoint's
// mutex, so no check of the endpoint can run again (measured: 1 run in 8 to
// 16 of tools-perf-kill-shm under ASan). A rescuer is one sleeping thread
// per shm endpoint that can act while the polling thread is stuck:
//  - the endpoint marks each provider call that may take one of its own
//    region locks (a counter per region, odd while such a call runs: two
//    relaxed stores around the call, nothing else on the hot path);
//  - the rescuer wakes every patience / 8 and samples, per region, the
//    counter and the lock word (plain reads);
//  - when one call has lasted at least `patience` and the lock was held at
//    every sample meanwhile, it looks for the holder with the rule of
//    FabricEndpoint::shm_try_recover: no other live process maps the
//    region, or a peer process we were told about (peer_added) is gone,
//    died or was removed at most `patience` before the call was first seen,
//    and no process that maps the region is stopped or traced. Then the
//    holder was the dead process: the lock is released and the call goes
//    on. Otherwise it looks again after another `patience`.
// A live holder keeps the lock for one provider operation (at most a CMA
// copy); nothing of the provider's waits for anything else while holding
// it (a peer's lock is only tried under it), so a call that stays inside
// for `patience` with the lock held at every look is behind a holder that
// is stopped or gone.
//
// Thread-safety: watch, peer_added and peer_removed may be called from any
// thread (under the rescuer's own mutex, which progress never takes). The
// watched locks and counters must outlive the rescuer or a watch() that
// replaces them. The destructor stops and joins the thread (bounded: one
// look at /proc at most).
class LockRescuer {
 public:
  static constexpr std::size_t kRegions = 2;  // data, control
  // Starts the thread; throws std::system_error when it cannot.
  explicit LockRescuer(std::chrono::milliseconds patience);
  LockRescuer(const LockRescuer&) = delete;
  LockRescuer& operator=(const LockRescuer&) = delete;
  ~LockRescuer();

  // Watches `lock` (null: stops watching `slot`), whose calls are marked on
  // `calls`.
  void watch(std::size_t slot, RegionLock* lock, const std::atomic<std::uint64_t>* calls) noexcept;
  // The process behind an inserted peer, and its removal: evidence for the
  // rule above. peer_added allocates (setup path); false when it could not.
  // peer_removed must be called before the peer's RegionLock is unmapped
  // (it takes the rescuer's mutex, under which alone a post's target lock
  // is read: see post_begin).
  bool peer_added(std::int64_t pid) noexcept;
  void peer_removed(std::int64_t pid) noexcept;

  // Posts. The same window exists on a peer's lock: a post tries it, and
  // the peer takes it in its own progress and dies before the provider's
  // spin. The endpoint names the lock a post is about to take
  // (post_begin, after its try) and ends the mark after the provider call
  // (post_end; a no-op without a begin). A post stuck behind that lock for
  // the patience, held at every look, whose region's owner process is gone,
  // has the lock released: the region is a dead process's, and a write
  // into it harms nobody (the pid check then fails the peer's operations).
  // A live owner recovers its own lock itself. Both are called under the
  // endpoint's mutex, on the post path: relaxed stores, no locked
  // instruction. `target` must stay mapped until post_end and then until
  // peer_removed has returned.
  void post_begin(RegionLock* target) noexcept {
    post_target_.store(target, std::memory_order_relaxed);
    post_calls_.store(post_calls_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    post_marked_ = true;
  }
  void post_end() noexcept {
    if (!post_marked_) return;
    post_marked_ = false;
    post_calls_.store(post_calls_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    post_target_.store(nullptr, std::memory_order_relaxed);
  }

  // Locks released under a stuck call (own region or a post's target).
  std::uint64_t rescues() const noexcept { return rescues_.load(std::memory_order_relaxed); }

 private:
  struct Watch {
    RegionLock* lock = nullptr;
    const std::atomic<std::uint64_t>* calls = nullptr;
    bool tracking = false;
    std::uint64_t call = 0;
    const RegionLock* seen = nullptr;  // the lock the tracked call waits on
    std::chrono::steady_clock::time_point since{};  // call first seen stuck
    std::chrono::steady_clock::time_point next_look{};
  };
  struct Peer {
    std::int64_t pid = 0;
    std::chrono::steady_clock::time_point removed{};  // epoch: still inserted
  };
  void run() noexcept;
  void look(Watch& w, std::chrono::steady_clock::time_point now) noexcept;
  void look_post(std::chrono::steady_clock::time_point now) noexcept;
  // Tracks the call `call` seen behind `lock`: true when the same call has
  // been seen so for the patience, at most once per patience.
  bool stuck_for_patience(Watch& w, std::uint64_t call, const RegionLock* lock,
                          std::chrono::steady_clock::time_point now) noexcept;
  void release(Watch& w, RegionLock& lock) noexcept;
  bool peer_died_since(std::chrono::steady_clock::time_point since) const noexcept;

  std::chrono::milliseconds patience_;
  std::chrono::milliseconds period_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool started_ = false;  // run() has begun (the constructor waits for it)
  std::array<Watch, kRegions> watches_{};
  // The post in progress (post_begin) and what the thread saw of it.
  std::atomic<std::uint64_t> post_calls_{0};
  std::atomic<RegionLock*> post_target_{nullptr};
  bool post_marked_ = false;  // the endpoint's, under its mutex
  Watch post_watch_{};
  std::vector<Peer> peers_;
  std::atomic<std::uint64_t> rescues_{0};
  std::thread thread_;  // last: started once everything above exists
};

// ---------------------------------------------------------------------------
// The doorbell (docs/progress.md, "How shm sleeps"). libfabric 1.17 shm has
// no wait object, so a sleeping endpoint could only nap. A sleeping shm
// endpoint therefore creates a small file of its own,
// /dev/shm/regpool-bell.<region name> (mode 0600), holding a futex word
// `seq` and a count `sleepers` of its threads about to sleep or asleep.
// A sender that has mapped the file rings it after every post: when
// sleepers is non-zero it bumps seq and wakes the futex. The owner's
// protocol (Endpoint::idle): sleepers++, read seq, poll the provider once
// more, then futex-wait on the value read, bounded as every sleep is.
//
// The file of a peer is untrusted: its path is derived only from the
// peer's address already checked by fabric_wire; it is opened without
// following links, and used only when it is a regular file of our euid of
// exactly kBellBytes whose first line holds kBellMagic. A peer writing into
// its own bell causes at most spurious or missed wake-ups of itself.

inline constexpr std::size_t kBellBytes = 4096;
inline constexpr std::string_view kBellPrefix = "regpool-bell.";
// "RPBELL01", little-endian, at offset 0.
inline constexpr std::uint64_t kBellMagic = 0x31304c4c45424052ULL;
inline constexpr std::size_t kBellSeqOffset = 64;
inline constexpr std::size_t kBellSleepersOffset = 128;

// The bell's file name under /dev/shm for a region name (region_name());
// empty when there is none (no region name, or too long for a file name).
std::string bell_name(std::string_view region);

// Whether the first bytes of a mapped bell (at least kBellSeqOffset) carry
// the layout's magic. A pure check, fuzzed with the address parsers.
bool bell_layout_ok(std::span<const std::byte> head) noexcept;

// Removes the bells under `dir` (/dev/shm) that processes killed before
// closing their endpoints left behind: files named kBellPrefix<pid>:...
// whose pid no longer exists, owned by our euid, regular files. Returns how
// many it removed. Bell::create calls it, so a machine whose tests kill
// peers does not collect them. A peer still mapping such a file keeps its
// mapping (unlink leaves it valid) and rings nobody.
std::size_t sweep_dead_bells(const char* dir) noexcept;
// The same for any file named <prefix><pid>:... (the message rings' files,
// transport/shm_rings.hpp, use it too).
std::size_t sweep_dead_files(const char* dir, std::string_view prefix) noexcept;

// The files regpool shares between shm peers (bells, message rings):
// create_user_file makes `path` anew (a file of that name removed first:
// our pid is in every such name, so it is a dead process's), mode 0600,
// `bytes` long (sparse) and maps it read-write: 0, or the errno.
// map_user_file maps a peer's: a regular file of our euid of exactly
// `bytes` (opened O_NOFOLLOW | O_NONBLOCK, so neither a link nor a planted
// FIFO is followed or waited on); MAP_FAILED otherwise.
int create_user_file(const char* path, std::uint64_t bytes, std::byte*& base) noexcept;
void* map_user_file(const char* path, std::uint64_t bytes, bool writable) noexcept;

// One mapped bell: this endpoint's own (create) or a peer's (open). Not
// thread-safe for open/close; ring() may race with anything (atomics).
class Bell {
 public:
  Bell() = default;
  Bell(const Bell&) = delete;
  Bell& operator=(const Bell&) = delete;
  ~Bell();

  // Our own bell for the region `region` (our pid is in its name, so an
  // existing file of that name is a dead process's: removed first). false
  // when it cannot be made (then the endpoint naps as before).
  bool create(std::string_view region) noexcept;
  // A peer's bell, checked as above; false (nothing mapped) when absent or
  // not acceptable.
  bool open(std::string_view region) noexcept;
  bool valid() const noexcept { return base_ != nullptr; }
  // The words, for Endpoint::idle (own bell).
  WaitBell words() const noexcept;
  // A sender's ring, after a post that gives the owner work: true when a
  // sleeper was there and was woken.
  bool ring() noexcept;
  // Unmaps; an own bell's file is also removed.
  void close() noexcept;

 private:
  std::byte* base_ = nullptr;
  std::string path_;  // own bell: the file to remove at close
};

// Deaths of peer processes, watched through pidfds in one epoll set. Asking
// one pid (process_alive) costs kill() and an open/read/close of
// /proc/<pid>/stat; a server that sends to many peers, each less often
// than the post path's 1 ms rate limit, paid that on nearly every post (at
// 64 shm peers those system calls were over half of the server's CPU).
// Here one epoll_wait(0) tells which of any number of watched peers have
// exited. A pidfd becomes readable when the whole thread group has exited,
// zombie or reaped: the same "dead for us" as process_alive. Where no
// pidfd can be had (kernel before 5.3, the descriptor limit) the caller
// falls back to process_alive for that peer. Not thread-safe (used under
// the endpoint's mutex); tokens are the caller's peer handles.
class DeathWatch {
 public:
  enum class Watch : std::uint8_t { watching, exited, unavailable };
  DeathWatch() = default;
  DeathWatch(const DeathWatch&) = delete;
  DeathWatch& operator=(const DeathWatch&) = delete;
  ~DeathWatch();

  // Starts watching `pid` under `token` (below 2^32; replacing any watch
  // of that token). exited: the pid no longer exists (ESRCH), or has already exited.
  Watch watch(std::uint64_t token, std::int64_t pid) noexcept;
  bool watching(std::uint64_t token) const noexcept { return token < fds_.size() && fds_[token] >= 0; }
  // Stops watching `token` (closing its pidfd takes it out of the set).
  void forget(std::uint64_t token) noexcept;
  // The tokens of watched processes that have exited since the last call,
  // at most out.size() of them (the rest come next time); each is
  // forgotten. One system call, whatever the number of watched peers.
  std::size_t collect(std::span<std::uint64_t> out) noexcept;

 private:
  static std::uint64_t event_data(std::uint64_t token, int fd) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(fd)) << 32) | (token & 0xffffffffu);
  }
  int epoll_ = -1;
  std::vector<int> fds_;  // pidfd per token, -1 = not watched
};

}  // namespace regpool::fabric_shm
