// bench-shm-floor: the half round trip of a ping-pong between two processes
// through nothing but shared memory, on this machine: the floor under every
// shm transport's send latency (regpool's, fi_pingpong's, UCX's), which
// bench/compare-peers prints beside them (its --floor) and also runs, at
// 8 B, as a probe of the machine's state around every other tool.
//
// What it measures: a parent and a forked child share two rings per
// message size (one per direction, MAP_SHARED anonymous memory). A message
// is a record on a cache-line boundary: a 16-byte header (sequence word,
// length) and the payload, padded to whole lines. The sender copies it in
// from its own buffer and publishes it with one release store of the
// sequence word; the receiver spins on that word (acquire), copies the
// payload out into its own buffer, frees the room (tail, read by the
// sender only when its last reading leaves no room) and answers with a
// message of the same size. So each message costs two copies and the
// cache-line transfers they need (an 8-byte message is one line), as a
// bounce-buffer transport's do (shm's inject, UCX's mm FIFO), and nothing
// else: no matching, no completion queue, no locks, no checks of what the
// peer wrote. It is a reference, not a transport: both sides trust each
// other (one program, forked).
//
// Each round trip is timed with the time-stamp counter (calibrated against
// steady_clock over the run), after 8 untimed ones, as regpool-perf does;
// the report is the median and mean of the halves, and the whole loop's
// time / iterations / 2 (loop_mean: fi_pingpong's definition, no clock read
// inside the loop, from a second untimed pass).
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kLine = 64;
constexpr std::uint64_t kHeader = 16;  // seq, then length
constexpr std::uint64_t kMaxMessage = std::uint64_t{2} << 20;
constexpr int kWarmup = 8;

std::uint64_t record_size(std::uint64_t n) { return (kHeader + n + kLine - 1) / kLine * kLine; }

// The ring of one direction for one message size: at least 64 KiB and four
// of its records, so small messages reuse a few warm cache lines, as a
// transport's FIFO does, and a large one always fits.
std::uint64_t ring_capacity(std::uint64_t size) {
  std::uint64_t cap = 64 * 1024;
  while (cap < 4 * record_size(size)) cap *= 2;
  return cap;
}

// One direction. A record starts on a cache line with its header: seq, the
// record's position in the stream + 1, stored last (release) by the sender,
// so a receiver that finds the seq it expects finds the length and payload
// written; then the length and the payload (which may run across the
// ring's end: copied in two parts). Records are padded to whole lines, so
// a header never runs across the end. An 8-byte message is one line: one
// cache-line transfer carries it. `tail` (on its own line) is where the
// receiver has freed up to; the sender reads it only when its last reading
// leaves no room.
struct Ring {
  alignas(kLine) std::atomic<std::uint64_t> tail{0};
  unsigned char* data = nullptr;
  std::uint64_t cap = 0;
};

std::atomic_ref<std::uint64_t> seq_at(Ring& r, std::uint64_t pos) {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(r.data + pos % r.cap));
}

void copy_in(Ring& r, std::uint64_t pos, const void* src, std::uint64_t n) {
  const std::uint64_t off = pos % r.cap;
  const std::uint64_t first = std::min(n, r.cap - off);
  std::memcpy(r.data + off, src, first);
  if (first < n) std::memcpy(r.data, static_cast<const unsigned char*>(src) + first, n - first);
}
void copy_out(const Ring& r, std::uint64_t pos, void* dst, std::uint64_t n) {
  const std::uint64_t off = pos % r.cap;
  const std::uint64_t first = std::min(n, r.cap - off);
  std::memcpy(dst, r.data + off, first);
  if (first < n) std::memcpy(static_cast<unsigned char*>(dst) + first, r.data, n - first);
}

// Every 2^16 rounds of a spin (far longer than any message takes when the
// two run on two CPUs), the spinning side yields its CPU, so that on one
// CPU the other side gets to run within a time slice instead of at its end;
// and the parent looks whether the child has ended (without reaping it):
// true when it has, and the caller then looks at the ring once more before
// giving up (the child's last message may be there). The child dies with
// its parent (PR_SET_PDEATHSIG).
bool spin_round(pid_t child, std::uint64_t& spins) {
  if ((++spins & 0xffff) != 0) return false;
  ::sched_yield();
  if (child == 0) return false;
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == child;
}

[[noreturn]] void child_gone() {
  std::fprintf(stderr, "bench-shm-floor: the child ended while the parent waited for it\n");
  std::exit(1);
}

// Each side's own view of a ring (no state shared but the ring).
struct Sender {
  Ring* r = nullptr;
  pid_t child = 0;  // the parent's: see spin_round
  std::uint64_t head = 0;
  std::uint64_t tail_seen = 0;
  void send(const unsigned char* src, std::uint64_t n) {
    const std::uint64_t need = record_size(n);
    std::uint64_t spins = 0;
    bool gone = false;
    while (head + need - (tail_seen = r->tail.load(std::memory_order_acquire)) > r->cap) {
      if (gone) child_gone();
      gone = spin_round(child, spins);
    }
    copy_in(*r, head + 8, &n, sizeof n);
    copy_in(*r, head + kHeader, src, n);
    seq_at(*r, head).store(head + 1, std::memory_order_release);
    head += need;
  }
};
struct Receiver {
  Ring* r = nullptr;
  pid_t child = 0;
  std::uint64_t tail = 0;
  std::uint64_t recv(unsigned char* dst) {
    std::uint64_t spins = 0;
    bool gone = false;
    while (seq_at(*r, tail).load(std::memory_order_acquire) != tail + 1) {
      if (gone) child_gone();
      gone = spin_round(child, spins);
    }
    std::uint64_t n = 0;
    copy_out(*r, tail + 8, &n, sizeof n);
    copy_out(*r, tail + kHeader, dst, n);
    tail += record_size(n);
    r->tail.store(tail, std::memory_order_release);
    return n;
  }
};

std::uint64_t ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
#endif
}

struct Options {
  std::vector<std::uint64_t> sizes{8, 4096, 65536, 1048576};
  int iters = 10000;
  bool json = false;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench-shm-floor: %s\n"
               "usage: bench-shm-floor [--sizes LIST] [--iters N] [--json]\n"
               "  --sizes LIST  message sizes, comma-separated, suffixes K/M (default 8,4K,64K,1M; 1 .. 2M)\n"
               "  --iters N     timed round trips per size (default 10000), after 8 untimed ones\n"
               "  --json        one JSON object on stdout instead of the table\n",
               why);
  std::exit(2);
}

std::uint64_t parse_size(const std::string& s) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  std::string suffix(end);
  std::uint64_t mult = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") {
    mult = 1024;
  } else if (suffix == "M" || suffix == "m" || suffix == "MiB") {
    mult = 1024 * 1024;
  } else if (!suffix.empty() || end == s.c_str()) {
    usage(("bad size '" + s + "'").c_str());
  }
  const std::uint64_t n = v * mult;
  if (n == 0 || n > kMaxMessage) usage(("size '" + s + "' outside 1 .. 2M").c_str());
  return n;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--sizes") {
      o.sizes.clear();
      std::string list = value();
      std::size_t pos = 0;
      while (pos <= list.size()) {
        const std::size_t comma = list.find(',', pos);
        o.sizes.push_back(parse_size(list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos)));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (a == "--iters") {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (*end != '\0' || n < 1 || n > 100000000) usage("--iters takes 1 .. 100000000");
      o.iters = static_cast<int>(n);
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--help" || a == "-h") {
      usage("the two-copy shared-memory ping-pong floor");
    } else {
      usage(("unknown argument '" + a + "'").c_str());
    }
  }
  return o;
}

struct Row {
  std::uint64_t size = 0;
  double median = 0, mean = 0, min = 0, loop_mean = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  // A pair of rings per size (parent -> child, child -> parent), fresh for
  // each: headers are zero until written, and no stale seq can match.
  std::uint64_t bytes = 0;
  for (const std::uint64_t size : o.sizes) bytes += 2 * (kLine + ring_capacity(size));
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("bench-shm-floor: mmap");
    return 1;
  }
  std::vector<Ring*> down, up;  // per size
  auto* p = static_cast<unsigned char*>(mem);
  for (const std::uint64_t size : o.sizes) {
    for (auto* list : {&down, &up}) {
      auto* r = new (p) Ring;  // the tail's line, then the data
      r->cap = ring_capacity(size);
      r->data = p + kLine;
      p += kLine + r->cap;
      list->push_back(r);
    }
  }
  const std::uint64_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  std::vector<unsigned char> out(largest, 0x5a), in(largest, 0);

  // Per size: the warm-up and timed pass, then the untimed pass.
  const pid_t kid = ::fork();
  if (kid < 0) {
    std::perror("bench-shm-floor: fork");
    return 1;
  }
  if (kid == 0) {
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() == 1) ::_exit(1);
    // Echo every message: the warm-up, timed and untimed passes of each size.
    for (std::size_t k = 0; k < o.sizes.size(); ++k) {
      Receiver rx{down[k]};
      Sender tx{up[k]};
      for (long i = 0; i < kWarmup + 2L * o.iters; ++i) {
        const std::uint64_t n = rx.recv(in.data());
        tx.send(in.data(), n);
      }
    }
    ::_exit(0);
  }
  std::vector<Row> rows;
  std::vector<std::uint64_t> raw(static_cast<std::size_t>(o.iters));
  std::vector<std::pair<std::uint64_t, std::vector<std::uint64_t>>> samples;
  std::vector<double> loop_ns;
  bool bad = false;
  const auto c0 = Clock::now();
  const std::uint64_t t0 = ticks();
  for (std::size_t k = 0; k < o.sizes.size(); ++k) {
    const std::uint64_t size = o.sizes[k];
    Sender tx{down[k], kid};
    Receiver rx{up[k], kid};
    for (int i = 0; i < kWarmup; ++i) {
      tx.send(out.data(), size);
      bad |= rx.recv(in.data()) != size;
    }
    std::uint64_t prev = ticks();
    for (int i = 0; i < o.iters; ++i) {
      tx.send(out.data(), size);
      bad |= rx.recv(in.data()) != size;
      const std::uint64_t t = ticks();
      raw[static_cast<std::size_t>(i)] = t - prev;
      prev = t;
    }
    samples.emplace_back(size, raw);
    const auto l0 = Clock::now();
    for (int i = 0; i < o.iters; ++i) {
      tx.send(out.data(), size);
      bad |= rx.recv(in.data()) != size;
    }
    loop_ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - l0).count());
    bad |= std::memcmp(in.data(), out.data(), size) != 0;
  }
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - c0).count();
  const double per_us = static_cast<double>(ticks() - t0) / us;
  int status = 0;
  if (::waitpid(kid, &status, 0) != kid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "bench-shm-floor: the child failed\n");
    return 1;
  }
  if (bad) {
    std::fprintf(stderr, "bench-shm-floor: a message came back with the wrong length or bytes\n");
    return 1;
  }
  for (std::size_t k = 0; k < samples.size(); ++k) {
    std::vector<double> v;
    for (const auto r : samples[k].second) v.push_back(static_cast<double>(r) / per_us / 2);
    std::sort(v.begin(), v.end());
    Row row;
    row.size = samples[k].first;
    row.median = v[v.size() / 2];
    row.min = v.front();
    double sum = 0;
    for (const double x : v) sum += x;
    row.mean = sum / static_cast<double>(v.size());
    row.loop_mean = loop_ns[k] / 1000.0 / o.iters / 2;
    rows.push_back(row);
  }
  if (o.json) {
    std::printf("{\"tool\": \"bench-shm-floor\", \"iters\": %d, \"warmup\": %d, \"results\": [", o.iters, kWarmup);
    for (std::size_t k = 0; k < rows.size(); ++k) {
      const Row& r = rows[k];
      std::printf("%s{\"size\": %llu, \"latency_us\": {\"median\": %.4f, \"mean\": %.4f, \"min\": %.4f, "
                  "\"loop_mean\": %.4f}}",
                  k ? ", " : "", static_cast<unsigned long long>(r.size), r.median, r.mean, r.min, r.loop_mean);
    }
    std::printf("]}\n");
  } else {
    std::printf("bench-shm-floor: two processes, two copies through a shared ring, %d round trips per size\n",
                o.iters);
    std::printf("%10s %12s %12s %12s %14s\n", "size", "median us", "mean us", "min us", "loop mean us");
    for (const Row& r : rows) {
      std::printf("%10llu %12.3f %12.3f %12.3f %14.3f\n", static_cast<unsigned long long>(r.size), r.median, r.mean,
                  r.min, r.loop_mean);
    }
  }
  return 0;
}
