#include "transport/fabric_shm.hpp"

#include "platform/futex.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <strings.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <new>

namespace regpool::fabric_shm {
namespace {

// The header of a libfabric 1.17 shm region (struct smr_region, measured
// with gdb on a live region: docs/provider-facts.md):
//   0x00 u8 version (4), u8 resv, u16 flags
//   0x04 i32 pid of the owner
//   0x18 pthread_spinlock_t lock
//   0x1c int signal (set by a peer's post, cleared by our fi_cq_read)
//   0x28 size_t total_size (the file's size)
constexpr std::uint8_t kRegionVersion = 4;
constexpr std::size_t kPidOffset = 0x04;
constexpr std::size_t kLockOffset = 0x18;
constexpr std::size_t kSignalOffset = 0x1c;
constexpr std::size_t kTotalSizeOffset = 0x28;
constexpr std::size_t kHeaderBytes = 4096;

pthread_spinlock_t* lock_word(void* header) noexcept {
  return reinterpret_cast<pthread_spinlock_t*>(static_cast<std::byte*>(header) + kLockOffset);
}

}  // namespace

std::string region_name(std::span<const std::byte> addr, std::string_view scheme) {
  if (addr.size() <= scheme.size()) return {};
  std::size_t end = addr.size();
  if (addr[end - 1] == std::byte{0}) --end;
  std::string out;
  out.reserve(end - scheme.size());
  for (std::size_t i = scheme.size(); i < end; ++i) {
    const char c = static_cast<char>(addr[i]);
    if (c == '\0' || c == '/') return {};
    out.push_back(c);
  }
  return out;
}

bool process_alive(std::int64_t pid) noexcept {
  if (pid <= 0) return true;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  // A zombie still answers kill(); its state letter says it is gone.
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/stat", static_cast<long long>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT;
  char buf[256];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (paren == nullptr || paren[1] != ' ') return true;
  return paren[2] != 'Z' && paren[2] != 'X';
}

bool process_finished(std::int64_t pid) noexcept {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/status", static_cast<long long>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* state = std::strstr(buf, "\nState:");
  const char* threads = std::strstr(buf, "\nThreads:");
  if (state == nullptr || threads == nullptr) return false;
  state += 7;
  while (*state == ' ' || *state == '\t') ++state;
  if (*state != 'Z' && *state != 'X') return false;
  return std::strtol(threads + 9, nullptr, 10) == 1;
}

int cross_memory_probe(std::int64_t pid) noexcept {
  if (pid <= 0) return ESRCH;
  char byte = 0;
  iovec local{&byte, 1};
  iovec remote{nullptr, 1};
  const ssize_t n = ::process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
  if (n >= 0) return 0;  // address 0 mapped in the peer: let in all the same
  return errno == EFAULT ? 0 : errno;
}

int cross_memory_copy(std::int64_t pid, bool write, std::byte* local, std::uint64_t remote,
                      std::uint64_t length) noexcept {
  std::uint64_t done = 0;
  while (done < length) {
    iovec here{local + done, static_cast<std::size_t>(length - done)};
    iovec there{reinterpret_cast<void*>(static_cast<std::uintptr_t>(remote + done)),
                static_cast<std::size_t>(length - done)};
    const ssize_t n = write ? ::process_vm_writev(static_cast<pid_t>(pid), &here, 1, &there, 1, 0)
                            : ::process_vm_readv(static_cast<pid_t>(pid), &here, 1, &there, 1, 0);
    if (n > 0) {
      done += static_cast<std::uint64_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // n == 0 with bytes left: the kernel moved nothing, as for a fault.
    return n < 0 ? errno : EFAULT;
  }
  return 0;
}

bool env_flag_true(const char* value) noexcept {
  if (value == nullptr) return false;
  for (const char* yes : {"1", "on", "true", "yes"}) {
    if (::strcasecmp(value, yes) == 0) return true;
  }
  return false;
}

std::string cma_refusal(const char* disable_cma, std::int64_t pid, int probe_errno) {
  // What shm does without CMA, measured on libfabric 1.17 (the fabric
  // tests run with FI_SHM_DISABLE_CMA=1, 2026-11-29): it copies large
  // messages and RMA through bounce buffers from the target's progress,
  // so a put completes before its bytes are at the target, an access the
  // target refuses never completes, and removing or reconnecting a peer
  // with such transfers in flight crashes the next progress call (SIGSEGV
  // inside fi_cq_readfrom).
  static constexpr const char* kWhy =
      "; without it shm moves large messages and RMA through its own bounce buffers, where puts complete before "
      "their bytes land, refused accesses never complete and removing a peer with transfers in flight crashes "
      "libfabric 1.17, so regpool does not run shm that way (docs/provider-facts.md, \"shm without cross-memory "
      "attach\"); use provider tcp otherwise";
  if (env_flag_true(disable_cma)) {
    return std::string("FI_SHM_DISABLE_CMA=") + disable_cma + " turns off shm's cross-memory attach (unset it)" + kWhy;
  }
  if (probe_errno == 0 || probe_errno == ESRCH) return {};
  return "this process may not read the memory of peer process " + std::to_string(pid) +
         " (process_vm_readv: " + std::strerror(probe_errno) +
         "), which shm's cross-memory attach needs: run both as the same user with kernel.yama.ptrace_scope "
         "at 0, or give this process CAP_SYS_PTRACE, and keep both dumpable" +
         kWhy;
}

RegionLock::~RegionLock() {
  if (header_) ::munmap(header_, mapped_);
}

bool RegionLock::open(const std::string& name, std::int64_t pid) noexcept {
  if (name.empty() || name.find('/') != std::string::npos) return false;
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return false;
  struct stat st {};
  void* p = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= kHeaderBytes) {
    p = ::mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (p == MAP_FAILED) return false;
  const auto* h = static_cast<const std::byte*>(p);
  std::int32_t owner = 0;
  std::uint64_t total = 0;
  std::memcpy(&owner, h + kPidOffset, sizeof owner);
  std::memcpy(&total, h + kTotalSizeOffset, sizeof total);
  if (static_cast<std::uint8_t>(h[0]) != kRegionVersion || owner != pid || total != static_cast<std::uint64_t>(st.st_size)) {
    ::munmap(p, kHeaderBytes);
    return false;
  }
  try {
    name_ = name;
  } catch (...) {
    ::munmap(p, kHeaderBytes);
    return false;
  }
  header_ = p;
  mapped_ = kHeaderBytes;
  owner_ = pid;
  return true;
}

bool RegionLock::signalled() const noexcept {
  if (!header_) return true;
  const auto* w = reinterpret_cast<const int*>(static_cast<const std::byte*>(header_) + kSignalOffset);
  return __atomic_load_n(w, __ATOMIC_ACQUIRE) != 0;
}

bool RegionLock::held() noexcept {
  if (!header_) return false;
  pthread_spinlock_t* w = lock_word(header_);
#if defined(__x86_64__) && defined(__GLIBC__)
  // glibc's x86-64 lock word is positive exactly when the lock is free
  // (force_release): a plain read answers what a try and an unlock would.
  // The try was two locked writes on the line the holder and the region's
  // owner spin on, on every post and poll, and while it held the lock for
  // that instant the owner's own fi_cq_read (or another peer's post) spun
  // behind it.
  return __atomic_load_n(w, __ATOMIC_ACQUIRE) <= 0;
#else
  if (pthread_spin_trylock(w) != 0) return true;
  pthread_spin_unlock(w);
  return false;
#endif
}

bool RegionLock::held_for(std::chrono::nanoseconds patience) noexcept {
  if (!held()) return false;
  if (patience <= std::chrono::nanoseconds::zero()) return true;
  const auto until = std::chrono::steady_clock::now() + patience;
  for (std::uint32_t i = 1;; ++i) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
#if defined(__x86_64__) && defined(__GLIBC__)
    // held() is a plain read here: ask it every round, as
    // pthread_spin_lock's own wait reads the word.
    if (!held()) return false;
#else
    // held() is a try: take the holder's cache line every 16th round only.
    if (i % 16 == 0 && !held()) return false;
#endif
    // The clock (about 0.1 us here) every 64 rounds: a small part of a spin.
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return true;
  }
}

void RegionLock::force_release() noexcept {
  if (!header_) return;
#if defined(__x86_64__) && defined(__GLIBC__)
  // The holder is dead, so no thread of ours locked it: write what glibc's
  // x86-64 pthread_spin_unlock writes (1 = free) rather than call it, which
  // would be an unlock by a thread that never locked (ThreadSanitizer
  // reports exactly that).
  static_assert(sizeof(pthread_spinlock_t) == sizeof(int));
  __atomic_store_n(lock_word(header_), 1, __ATOMIC_RELEASE);
#else
  pthread_spin_unlock(lock_word(header_));
#endif
}

bool RegionLock::try_take() noexcept { return header_ != nullptr && pthread_spin_trylock(lock_word(header_)) == 0; }

bool RegionLock::waited_on() noexcept {
#if defined(__x86_64__) && defined(__GLIBC__)
  return header_ != nullptr && __atomic_load_n(lock_word(header_), __ATOMIC_ACQUIRE) < 0;
#else
  return false;
#endif
}

namespace {

// Whether the maps file open on `fd` has a line ending in `needle` (a
// mapped path): read in blocks, lines split across blocks joined.
bool maps_path(int fd, const char* needle, std::size_t needle_len) noexcept {
  char buf[8192];
  std::size_t have = 0;
  bool maps = false;
  for (;;) {
    const ssize_t n = ::read(fd, buf + have, sizeof buf - 1 - have);
    if (n <= 0) break;
    have += static_cast<std::size_t>(n);
    buf[have] = '\0';
    char* line_end = nullptr;
    char* start = buf;
    while ((line_end = std::strchr(start, '\n')) != nullptr) {
      const std::size_t len = static_cast<std::size_t>(line_end - start);
      if (len >= needle_len && std::memcmp(line_end - needle_len, needle, needle_len) == 0) maps = true;
      start = line_end + 1;
    }
    have = static_cast<std::size_t>(buf + have - start);
    std::memmove(buf, start, have);
    if (have == sizeof buf - 1) have = 0;  // an absurdly long line: drop it
    if (maps) break;
  }
  return maps;
}

}  // namespace

MapsRegion process_maps_region(std::int64_t pid, std::string_view region) noexcept {
  if (pid <= 0 || region.empty() || region.size() > 255) return MapsRegion::no;
  char needle[300];
  std::snprintf(needle, sizeof needle, "/dev/shm/%.*s", static_cast<int>(region.size()), region.data());
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/maps", static_cast<long long>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH ? MapsRegion::gone : MapsRegion::unreadable;
  const bool maps = maps_path(fd, needle, std::strlen(needle));
  ::close(fd);
  if (maps) return MapsRegion::yes;
  return process_alive(pid) ? MapsRegion::no : MapsRegion::gone;
}

Mappers region_mappers(const std::string& name) noexcept {
  Mappers m;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) {
    m.complete = false;
    return m;
  }
  const pid_t self = ::getpid();
  char needle[300];
  std::snprintf(needle, sizeof needle, "/dev/shm/%s", name.c_str());
  const std::size_t needle_len = std::strlen(needle);
  while (const dirent* d = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(d->d_name, &end, 10);
    if (pid <= 0 || *end != '\0' || pid == self) continue;
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%ld/maps", pid);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      // Gone, or a process we may not look into (another user's, or a
      // sandbox's init): it cannot open a region that is mode 0600 and
      // ours unless it is privileged, and is not counted.
      if (errno != ENOENT) ++m.unreadable;
      continue;
    }
    const bool maps = maps_path(fd, needle, needle_len);
    ::close(fd);
    if (!maps || !process_alive(pid)) continue;
    ++m.live;
    std::snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    const int sfd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (sfd < 0) continue;
    char st[256];
    const ssize_t n = ::read(sfd, st, sizeof st - 1);
    ::close(sfd);
    if (n <= 0) continue;
    st[n] = '\0';
    const char* paren = std::strrchr(st, ')');
    if (paren != nullptr && paren[1] == ' ' && (paren[2] == 'T' || paren[2] == 't')) ++m.stopped;
  }
  ::closedir(proc);
  return m;
}

// ------------------------------------------------------------ the rescuer

LockRescuer::LockRescuer(std::chrono::milliseconds patience)
    : patience_(std::max(patience, std::chrono::milliseconds(1))),
      // Eight looks per patience: a call is rescued between the patience
      // and the patience plus two looks (1.25 patience) after it got stuck,
      // and the sleeping thread wakes a few times a second at most.
      period_(std::clamp(patience_ / 8, std::chrono::milliseconds(1), std::chrono::milliseconds(250))),
      thread_([this] { run(); }) {
  // Returns with the thread inside run(), past its start-up. Starting, a
  // thread allocates (its stack bounds, under a sanitizer its own state);
  // a fork() of this process at that moment hands the child the allocator's
  // lock held, where no fork handler releases it (GCC 12's ASan has none:
  // a membership-listener client forked right after the server's endpoint
  // opened hung for ever joining its own rescuer, whose start-up waited on
  // that lock, 2026-11-30). Once in run() the thread allocates nothing
  // while nothing is stuck. Bounded: a thread that never starts is not
  // waited for beyond 10 s (it is joined, as always, at destruction).
  std::unique_lock<std::mutex> g(mutex_);
  wake_.wait_for(g, std::chrono::seconds(10), [this] { return started_; });
}

LockRescuer::~LockRescuer() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LockRescuer::watch(std::size_t slot, RegionLock* lock, const std::atomic<std::uint64_t>* calls) noexcept {
  if (slot >= kRegions) return;
  std::lock_guard<std::mutex> g(mutex_);
  watches_[slot] = Watch{};
  if (lock && calls) {
    watches_[slot].lock = lock;
    watches_[slot].calls = calls;
  }
}

bool LockRescuer::peer_added(std::int64_t pid) noexcept {
  if (pid <= 0) return true;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> g(mutex_);
  // Removed peers are evidence for a call stuck up to `patience` after
  // their removal only: the list stays as long as the inserted peers.
  std::erase_if(peers_, [&](const Peer& p) {
    return p.removed != std::chrono::steady_clock::time_point{} && p.removed + 4 * patience_ < now;
  });
  try {
    peers_.push_back(Peer{pid, {}});
  } catch (...) {
    return false;
  }
  return true;
}

void LockRescuer::peer_removed(std::int64_t pid) noexcept {
  const auto now = std::chrono::steady_clock::now();
  // Taken whatever the pid: the peer's lock may be unmapped once this
  // returns, and a post's target is read only under this mutex.
  std::lock_guard<std::mutex> g(mutex_);
  if (pid <= 0) return;
  for (Peer& p : peers_) {
    if (p.pid == pid && p.removed == std::chrono::steady_clock::time_point{}) {
      p.removed = now;
      return;
    }
  }
}

void LockRescuer::run() noexcept {
  std::unique_lock<std::mutex> g(mutex_);
  started_ = true;
  wake_.notify_all();
  while (!stop_) {
    wake_.wait_for(g, period_, [this] { return stop_; });
    if (stop_) break;
    const auto now = std::chrono::steady_clock::now();
    for (Watch& w : watches_) look(w, now);
    look_post(now);
  }
}

void LockRescuer::look_post(std::chrono::steady_clock::time_point now) noexcept {
  // Under mutex_: the target stays mapped while we hold it (peer_removed).
  // A non-null target was named by a post still in progress when it was
  // read (post_end clears it before the endpoint can remove that peer).
  Watch& w = post_watch_;
  const std::uint64_t call = post_calls_.load(std::memory_order_acquire);
  RegionLock* target = post_target_.load(std::memory_order_relaxed);
  if ((call & 1) == 0 || target == nullptr || !target->held()) {
    w.tracking = false;
    return;
  }
  if (!stuck_for_patience(w, call, target, now)) return;
  if (process_alive(target->owner())) return;
  if (post_calls_.load(std::memory_order_relaxed) != call || post_target_.load(std::memory_order_relaxed) != target ||
      !target->held()) {
    w.tracking = false;
    return;
  }
  release(w, *target);
}

bool LockRescuer::stuck_for_patience(Watch& w, std::uint64_t call, const RegionLock* lock,
                                     std::chrono::steady_clock::time_point now) noexcept {
  if (!w.tracking || w.call != call || w.seen != lock) {
    w.tracking = true;
    w.call = call;
    w.seen = lock;
    w.since = now;
    w.next_look = now + patience_;
    return false;
  }
  if (now < w.next_look) return false;
  w.next_look = now + patience_;
  return true;
}

void LockRescuer::release(Watch& w, RegionLock& lock) noexcept {
  lock.force_release();
  rescues_.fetch_add(1, std::memory_order_relaxed);
  w.tracking = false;
}

void LockRescuer::look(Watch& w, std::chrono::steady_clock::time_point now) noexcept {
  if (!w.lock) return;
  const std::uint64_t call = w.calls->load(std::memory_order_relaxed);
  if ((call & 1) == 0 || !w.lock->held()) {
    // No call inside, or the lock free at this look: whatever is running
    // is not stuck behind it.
    w.tracking = false;
    return;
  }
  if (!stuck_for_patience(w, call, w.lock, now)) return;
  const Mappers m = region_mappers(w.lock->name());
  if (!holder_proven_dead(m, peer_died_since(w.since - patience_))) return;
  // The look at /proc took a while: still the same call behind a held lock?
  if (w.calls->load(std::memory_order_relaxed) != call || !w.lock->held()) {
    w.tracking = false;
    return;
  }
  release(w, *w.lock);
}

bool LockRescuer::peer_died_since(std::chrono::steady_clock::time_point since) const noexcept {
  for (const Peer& p : peers_) {
    if (p.removed != std::chrono::steady_clock::time_point{} && p.removed < since) continue;
    if (!process_alive(p.pid)) return true;
  }
  return false;
}

namespace {

// This process's start, in CLOCK_REALTIME nanoseconds, rounded down (the
// boot time in /proc/stat has whole seconds): a region created by this
// process has a ctime at or after it. 0 when it cannot be read.
std::int64_t own_start_ns() noexcept {
  std::int64_t btime = 0;
  if (std::FILE* f = std::fopen("/proc/stat", "re")) {
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
      long long v = 0;
      if (std::sscanf(line, "btime %lld", &v) == 1) {
        btime = v;
        break;
      }
    }
    std::fclose(f);
  }
  if (btime <= 0) return 0;
  char buf[1024];
  const int fd = ::open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // The command name may hold spaces and parentheses: fields start after
  // the last ')'. starttime is field 22, i.e. the 20th after it.
  const char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  unsigned long long start_ticks = 0;
  int field = 2;
  for (const char* q = p + 1; *q; ++q) {
    if (*q != ' ') continue;
    ++field;
    if (field == 22) {
      if (std::sscanf(q + 1, "%llu", &start_ticks) != 1) return 0;
      break;
    }
  }
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (start_ticks == 0 || hz <= 0) return 0;
  return btime * 1'000'000'000LL + static_cast<std::int64_t>(start_ticks / static_cast<unsigned long long>(hz)) * 1'000'000'000LL;
}

}  // namespace

std::int64_t region_file_pid(std::string_view name) noexcept {
  std::int64_t pid = 0;
  int field = 0;
  bool digits = false;
  for (const char c : name) {
    if (c == ':') {
      if (!digits || ++field > 2) return 0;
      digits = false;
    } else if (c >= '0' && c <= '9') {
      if (field == 0) {
        pid = pid * 10 + (c - '0');
        if (pid > 0x7fffffff) return 0;  // pids are positive ints
      }
      digits = true;
    } else {
      return 0;
    }
  }
  return field == 2 && digits ? pid : 0;
}

std::size_t sweep_dead_regions(const char* dir) noexcept {
  DIR* d = ::opendir(dir);
  if (!d) return 0;
  const int dfd = ::dirfd(d);
  std::size_t removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::int64_t pid = region_file_pid(e->d_name);
    if (pid <= 0 || pid == ::getpid() || process_alive(pid)) continue;
    const int fd = ::openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    std::uint8_t head[8] = {};
    const bool ours = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
                      ::pread(fd, head, sizeof head, 0) == static_cast<ssize_t>(sizeof head);
    ::close(fd);
    if (!ours || head[0] != kRegionVersion) continue;
    std::int32_t owner = 0;
    std::memcpy(&owner, head + kPidOffset, sizeof owner);
    // Asked again just before the unlink: a process given the recycled pid
    // since the first look would own a new region by that name.
    if (owner != pid || process_alive(pid)) continue;
    if (::unlinkat(dfd, e->d_name, 0) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

std::size_t remove_stale_own_regions() noexcept {
  const std::int64_t start = own_start_ns();
  if (start == 0) return 0;
  return remove_stale_regions(static_cast<long>(::getpid()), start);
}

std::size_t remove_stale_regions(long pid, std::int64_t start) noexcept {
  char prefix[32];
  const int plen = std::snprintf(prefix, sizeof prefix, "%ld:", pid);
  if (plen <= 0) return 0;
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return 0;
  std::size_t removed = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (std::strncmp(e->d_name, prefix, static_cast<std::size_t>(plen)) != 0) continue;
    struct stat st {};
    if (::fstatat(::dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    const std::int64_t ctime_ns = static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1'000'000'000LL + st.st_ctim.tv_nsec;
    if (ctime_ns >= start) continue;  // possibly ours: made since we started
    if (::unlinkat(::dirfd(dir), e->d_name, 0) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

}  // namespace regpool::fabric_shm

namespace regpool::fabric_shm {

std::string bell_name(std::string_view region) {
  // NAME_MAX: a longer name cannot be a file (open would fail anyway).
  if (region.empty() || region.find('/') != std::string_view::npos || region.find('\0') != std::string_view::npos ||
      kBellPrefix.size() + region.size() > 255) {
    return {};
  }
  std::string out(kBellPrefix);
  out.append(region);
  return out;
}

bool bell_layout_ok(std::span<const std::byte> head) noexcept {
  if (head.size() < sizeof kBellMagic) return false;
  std::uint64_t magic = 0;
  std::memcpy(&magic, head.data(), sizeof magic);
  return magic == kBellMagic;
}

namespace {

std::atomic<std::uint32_t>* bell_word(std::byte* base, std::size_t offset) noexcept {
  // The mapping is page-aligned and the offsets are multiples of 64.
  return std::launder(reinterpret_cast<std::atomic<std::uint32_t>*>(base + offset));
}

}  // namespace

Bell::~Bell() { close(); }

int create_user_file(const char* path, std::uint64_t bytes, std::byte*& base) noexcept {
  (void)::unlink(path);
  const int fd = ::open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return errno;
  // Sparse: tmpfs gives a page only when it is first written.
  void* p = MAP_FAILED;
  int e = 0;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    e = errno;
  } else {
    p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) e = errno;
  }
  ::close(fd);
  if (p == MAP_FAILED) {
    (void)::unlink(path);
    return e;
  }
  base = static_cast<std::byte*>(p);
  return 0;
}

void* map_user_file(const char* path, std::uint64_t bytes, bool writable) noexcept {
  // O_NONBLOCK: a FIFO planted under the name must not block the open.
  const int fd = ::open(path, (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return MAP_FAILED;
  struct stat st {};
  void* p = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
      static_cast<std::uint64_t>(st.st_size) == bytes) {
    p = ::mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  return p;
}

std::size_t sweep_dead_files(const char* dir, std::string_view prefix) noexcept {
  DIR* d = ::opendir(dir);
  if (!d) return 0;
  const int dfd = ::dirfd(d);
  std::size_t removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name(e->d_name);
    if (name.substr(0, prefix.size()) != prefix) continue;
    const std::int64_t pid =
        pid_from_address(std::as_bytes(std::span<const char>(name.data(), name.size())), prefix);
    if (pid <= 0 || pid == ::getpid() || process_alive(pid)) continue;
    struct stat st {};
    if (::fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    if (::unlinkat(dfd, e->d_name, 0) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

std::size_t sweep_dead_bells(const char* dir) noexcept { return sweep_dead_files(dir, kBellPrefix); }

bool Bell::create(std::string_view region) noexcept {
  close();
  (void)sweep_dead_bells("/dev/shm");
  std::string path;
  try {
    const std::string name = bell_name(region);
    if (name.empty()) return false;
    path = "/dev/shm/" + name;
  } catch (...) {
    return false;
  }
  // Our pid is in the region's name: a file of this name was left by a
  // dead process that had our pid (or by someone pretending): replaced.
  if (create_user_file(path.c_str(), kBellBytes, base_) != 0) return false;
  // A fresh file is zero: seq 0, nobody asleep. The magic goes last, so a
  // peer that opens the file early sees no bell rather than half of one.
  new (base_ + kBellSeqOffset) std::atomic<std::uint32_t>(0);
  new (base_ + kBellSleepersOffset) std::atomic<std::uint32_t>(0);
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(base_)).store(kBellMagic, std::memory_order_release);
  path_ = std::move(path);
  return true;
}

bool Bell::open(std::string_view region) noexcept {
  close();
  char path[300];
  try {
    const std::string name = bell_name(region);
    if (name.empty()) return false;
    std::snprintf(path, sizeof path, "/dev/shm/%s", name.c_str());
  } catch (...) {
    return false;
  }
  void* p = map_user_file(path, kBellBytes, true);
  if (p == MAP_FAILED) return false;
  auto* base = static_cast<std::byte*>(p);
  std::byte head[sizeof kBellMagic];
  const std::uint64_t magic =
      std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(base)).load(std::memory_order_acquire);
  std::memcpy(head, &magic, sizeof magic);
  if (!bell_layout_ok(head)) {
    ::munmap(p, kBellBytes);
    return false;
  }
  base_ = base;
  return true;
}

WaitBell Bell::words() const noexcept {
  if (!base_) return {};
  return WaitBell{bell_word(base_, kBellSeqOffset), bell_word(base_, kBellSleepersOffset)};
}

bool Bell::ring() noexcept {
  if (!base_) return false;
  // The look at sleepers is a read-modify-write (adding 0), not a fence and
  // a load: both it and the owner's increment before its last poll are
  // RMWs of the same word, so one comes first in that word's order. Ours
  // first: the owner's increment reads from it and acquires our post, and
  // its last poll sees the message. Its first: we read a sleeper and ring.
  // (A fence would do the same; thread sanitizer cannot check fences.)
  if (bell_word(base_, kBellSleepersOffset)->fetch_add(0, std::memory_order_seq_cst) == 0) return false;
  bell_word(base_, kBellSeqOffset)->fetch_add(1, std::memory_order_seq_cst);
  platform::futex_wake_all(*bell_word(base_, kBellSeqOffset));
  return true;
}

void Bell::close() noexcept {
  if (base_) ::munmap(base_, kBellBytes);
  base_ = nullptr;
  if (!path_.empty()) (void)::unlink(path_.c_str());
  path_.clear();
}

DeathWatch::~DeathWatch() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
  if (epoll_ >= 0) ::close(epoll_);
}

DeathWatch::Watch DeathWatch::watch(std::uint64_t token, std::int64_t pid) noexcept {
  forget(token);
  if (pid <= 0 || pid > INT32_MAX || token > 0xffffffffu) return Watch::unavailable;
#ifdef SYS_pidfd_open
  if (epoll_ < 0) {
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_ < 0) return Watch::unavailable;
  }
  if (token >= fds_.size()) {
    try {
      fds_.resize(token + 1, -1);
    } catch (...) {
      return Watch::unavailable;
    }
  }
  const long fd = ::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0u);
  if (fd < 0) return errno == ESRCH ? Watch::exited : Watch::unavailable;
  const int pfd = static_cast<int>(fd);
  // Exited between the peer's name and now (pidfd_open succeeds on a zombie).
  pollfd one{pfd, POLLIN, 0};
  if (::poll(&one, 1, 0) > 0) {
    ::close(pfd);
    return Watch::exited;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = event_data(token, pfd);
  if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, pfd, &ev) != 0) {
    ::close(pfd);
    return Watch::unavailable;
  }
  fds_[token] = pfd;
  return Watch::watching;
#else
  (void)token;
  return Watch::unavailable;
#endif
}

void DeathWatch::forget(std::uint64_t token) noexcept {
  if (token >= fds_.size() || fds_[token] < 0) return;
  // Taken out of the set explicitly: close() alone would leave it there
  // while a forked child still holds the pidfd (the set keys on the open
  // file, not on our descriptor), and its exit would later be reported
  // under a token reused for another peer.
  (void)::epoll_ctl(epoll_, EPOLL_CTL_DEL, fds_[token], nullptr);
  ::close(fds_[token]);
  fds_[token] = -1;
}

std::size_t DeathWatch::collect(std::span<std::uint64_t> out) noexcept {
  if (epoll_ < 0 || out.empty()) return 0;
  constexpr int kBatch = 16;
  epoll_event ev[kBatch];
  const int want = static_cast<int>(std::min<std::size_t>(out.size(), kBatch));
  const int n = ::epoll_wait(epoll_, ev, want, 0);
  std::size_t got = 0;
  for (int i = 0; i < n; ++i) {
    // Token and descriptor both: an event of a watch since replaced is not
    // the current watch's.
    const std::uint64_t token = ev[i].data.u64 & 0xffffffffu;
    const int fd = static_cast<int>(ev[i].data.u64 >> 32);
    if (!watching(token) || fds_[token] != fd) continue;
    out[got++] = token;
    forget(token);  // level-triggered: a dead pid would be reported for ever
  }
  return got;
}

}  // namespace regpool::fabric_shm
