#pragma once
// Two-process harness for the transport tests: fork a child with a hard time
// bound (alarm), reap it with a bound (SIGKILL on expiry), and never leave a
// child behind (ChildGuard). Blobs are exchanged through TcpBootstrap on
// loopback, so every two-process test also exercises the bootstrap.
//
// The child must not use Catch2 assertions (its results would die with it):
// it returns an exit code and prints what went wrong to stderr.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "regpool/bootstrap.hpp"
#include "regpool/endpoint.hpp"
#include "regpool/pool.hpp"
#include "regpool/slice.hpp"
#include "regpool_config.h"
#if REGPOOL_HAVE_FABRIC
#include "regpool/fabric_domain.hpp"
#include "regpool/fabric_endpoint.hpp"
#endif
#if REGPOOL_HAVE_VERBS
#include "regpool/verbs_domain.hpp"
#include "regpool/verbs_endpoint.hpp"
#endif

// One test source, several backends: the conformance tests GENERATE over
// rpt::backends(). The same sources are built twice (test/meson.build):
// transport-endpoint/-negative on libfabric (shm, tcp; suite fabric), and
// verbs-endpoint/-negative with RPT_BACKEND_VERBS defined (rxe inside the
// Soft-RoCE guest; suite verbs).

namespace rpt {

using namespace std::chrono_literals;

// Kills and reaps on scope exit unless reaped already.
struct ChildGuard {
  pid_t pid = -1;
  ChildGuard() = default;
  ChildGuard(ChildGuard&& o) noexcept : pid(o.pid) { o.pid = -1; }
  ChildGuard& operator=(ChildGuard&& o) noexcept {
    std::swap(pid, o.pid);
    return *this;
  }
  ChildGuard(const ChildGuard&) = delete;
  ChildGuard& operator=(const ChildGuard&) = delete;
  ~ChildGuard() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
  }
};

// A child past its bound is stuck somewhere: its threads' stacks, printed
// to stderr before it is killed, say where (gdb, when installed; the
// suite's logs keep stderr). Bounded: gdb itself gets 60 s.
inline void dump_stacks(pid_t pid) {
  if (::access("/usr/bin/gdb", X_OK) != 0) {
    std::fprintf(stderr, "child %d is past its bound (no /usr/bin/gdb for its stacks)\n", static_cast<int>(pid));
    return;
  }
  std::fprintf(stderr, "child %d is past its bound; its stacks:\n", static_cast<int>(pid));
  std::fflush(stderr);
  const std::string cmd = "timeout 60 /usr/bin/gdb -nx -batch -p " + std::to_string(pid) +
                          " -ex 'thread apply all bt' 1>&2 2>/dev/null";
  (void)std::system(cmd.c_str());
}

// Exit code of the child, 128+signal when killed, -1 when it had to be
// killed for exceeding the bound.
inline int reap(ChildGuard& g, std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(g.pid, &st, WNOHANG);
    if (r == g.pid) {
      g.pid = -1;
      if (WIFEXITED(st)) return WEXITSTATUS(st);
      if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
      return -2;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      dump_stacks(g.pid);
      ::kill(g.pid, SIGKILL);
      ::waitpid(g.pid, &st, 0);
      g.pid = -1;
      return -1;
    }
    std::this_thread::sleep_for(5ms);
  }
}

// Fork; the child runs fn under alarm(alarm_s) and _exits with its result
// (no atexit handlers, no Catch2 teardown in the child).
inline ChildGuard spawn(const std::function<int()>& fn, unsigned alarm_s) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    std::abort();
  }
  if (pid == 0) {
    ::alarm(alarm_s);
    int rc = 1;
    try {
      rc = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: exception: %s\n", e.what());
      rc = 3;
    } catch (...) {
      std::fprintf(stderr, "child: unknown exception\n");
      rc = 3;
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  ChildGuard g;
  g.pid = pid;
  return g;
}

// Child-side check: print and bail out with a distinct code.
#define RPT_CHECK(cond)                                                                \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "child check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      return 10 + (__LINE__ % 100);                                                    \
    }                                                                                  \
  } while (0)

// The backends this executable tests. REGPOOL_TEST_BACKENDS (a comma
// list, e.g. "shm,tcp,net") overrides the default, so a provider that is
// not in the default list (libfabric's net) runs the same suite on demand.
inline std::vector<std::string> backends_from_env(std::vector<std::string> fallback) {
  const char* env = std::getenv("REGPOOL_TEST_BACKENDS");
  if (env == nullptr || *env == '\0') return fallback;
  std::vector<std::string> out;
  std::string_view rest(env);
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out.empty() ? fallback : out;
}

inline const std::vector<std::string>& backends() {
#ifdef RPT_BACKEND_VERBS
  static const std::vector<std::string> b = {"verbs"};
#else
  // tcp is libfabric's net (FabricConfig::provider); tcp;ofi_rxm stays a
  // supported explicit choice and is tested by default too.
  static const std::vector<std::string> b = backends_from_env({"shm", "tcp", "tcp;ofi_rxm"});
#endif
  return b;
}

// What differs between backends, as properties the tests ask for (never
// "if backend == ...": a new backend states its properties here).
// The provider checks keys and rights itself (a forged reference fails
// remotely): tcp, net and verbs do; shm checks nothing
// (docs/provider-facts.md).
inline bool checks_remote_keys(const std::string& backend) { return backend != "shm"; }
// Backend names: "tcp" and "net" are both libfabric's net (regpool's tcp),
// "tcp;ofi_rxm" the rxm layer over libfabric's tcp.
inline bool is_net(const std::string& backend) { return backend == "tcp" || backend == "net"; }
inline bool is_rxm(const std::string& backend) { return backend == "tcp;ofi_rxm"; }
// A libfabric provider over TCP sockets: the per-connection failure modes
// (oversized messages, refused keys) apply.
inline bool over_sockets(const std::string& backend) { return is_net(backend) || is_rxm(backend); }
// The first operation to a peer waits for the peer's progress to take the
// connection (tcp;ofi_rxm, net: -FI_EAGAIN until then; verbs: RC setup).
inline bool connects_through_target_progress(const std::string& backend) {
  return over_sockets(backend) || backend == "verbs";
}
// Peers refuse sends longer than an endpoint's advertised limit only where
// a longer message would harm the receiver (docs/provider-facts.md): net
// (FabricEndpointOptions::max_incoming_message; a longer message stalls the
// connection) and tcp;ofi_rxm (rxm's eager limit; a longer one left behind
// by a sender that died crashes the next receive).
inline bool advertises_message_limit(const std::string& backend) { return is_net(backend) || is_rxm(backend); }
// That limit for an endpoint opened with max_incoming_message `requested`
// (net); tcp;ofi_rxm ignores it and advertises 16 KiB (the tests leave
// FI_OFI_RXM_* unset); no limit elsewhere.
inline std::uint64_t incoming_limit(const std::string& backend, std::uint64_t requested = std::uint64_t{16} << 20) {
  if (is_net(backend)) return requested;
  if (is_rxm(backend)) return std::uint64_t{16} << 10;
  return ~std::uint64_t{0};
}
// The longest send up to `wanted` bytes that a peer opened with the
// default limit accepts on this backend.
inline std::uint64_t accepted_send_size(const std::string& backend, std::uint64_t wanted) {
  return std::min(wanted, incoming_limit(backend));
}
// A 1 MiB send stays in flight until the receiver takes it (shm: CMA, the
// receiver copies; verbs); net completes it once the bytes are queued on
// the socket (membership-kill, measured), and tcp;ofi_rxm refuses sends
// above its 16 KiB eager limit (incoming_limit), which complete once queued.
inline bool large_sends_wait_for_receiver(const std::string& backend) { return !is_net(backend) && !is_rxm(backend); }
// A refused RMA key closes the connection (tcp;ofi_rxm: the peer is broken
// until reconnect); net fails that op alone (docs/provider-facts.md).
inline bool key_refusal_breaks_connection(const std::string& backend) { return is_rxm(backend); }
// fetch_add/compare_swap run on the NIC/provider rather than emulated
// (net's atomics are its own software: regpool emulates, as on tcp).
inline bool expects_native_atomics(const std::string& backend) { return backend == "shm" || backend == "verbs"; }
// The endpoint finds a dead peer by itself and fails posts and operations
// to it with peer_unreachable (instead of a post or op timeout): shm by the
// peer's pid, net by its endpoint's listening socket refusing a connect
// while posts to it wait (docs/provider-facts.md). tcp;ofi_rxm and verbs
// know only what the connection reports.
inline bool finds_dead_peers(const std::string& backend) { return backend == "shm" || is_net(backend); }
// A Messenger sends longer eager payloads gathered (its header and the
// caller's bytes in one two-piece send, MessengerConfig::eager_gather):
// every libfabric provider here takes two-entry iovecs, and verbs two
// scatter-gather entries; shm with regpool's message rings sends through
// them instead.
inline bool gathers_sends(const std::string& backend, bool shm_rings) { return backend != "shm" || !shm_rings; }
// The longest message (header included) the backend sends gathered by
// default (TransferTraits::gather_limit): on libfabric tcp (net) 64 KiB
// less 128 bytes, measured (a longer gathered message cost 20-30% more
// than a copied one); elsewhere no limit.
inline std::uint64_t default_gather_limit(const std::string& backend) {
  return backend == "tcp" ? (std::uint64_t{64} << 10) - 128 : ~std::uint64_t{0};
}
// A live peer removed and inserted again needs nothing from that peer
// (connectionless libfabric endpoints); on verbs the re-insert is a new RC
// connection that the peer must take up while it progresses.
inline bool reinsert_is_transparent(const std::string& backend) { return backend != "verbs"; }

#if REGPOOL_HAVE_FABRIC
inline regpool::FabricConfig fabric_config(const std::string& provider) {
  ::setenv("FI_TCP_IFACE", "lo", 0);
  regpool::FabricConfig c;
  c.provider = provider;
  // Socket providers bind to the loopback address (net, like tcp, would
  // otherwise pick the first interface).
  if (over_sockets(provider)) c.node = "127.0.0.1";
  return c;
}
#endif

// An endpoint of `backend` on `domain` (the domain's own kind). Tests direct
// atomics at either side: it serves them (on tcp this opens the control
// endpoint of emulated atomics).
// max_incoming: FabricEndpointOptions::max_incoming_message (0: its default).
inline std::unique_ptr<regpool::Endpoint> open_endpoint(const std::shared_ptr<regpool::Domain>& domain,
                                                        const std::string& backend,
                                                        const regpool::EndpointConfig& ec,
                                                        std::uint64_t max_incoming = 0, bool inject_sends = true,
                                                        bool shm_rings = true, bool shm_direct_rma = true,
                                                        std::uint64_t shm_ring_copy_max = 65 * 1024) {
#if REGPOOL_HAVE_VERBS
  if (backend == "verbs") {
    regpool::VerbsEndpointOptions vo;
    vo.inject_sends = inject_sends;
    return regpool::VerbsEndpoint::open(std::static_pointer_cast<regpool::VerbsDomain>(domain), ec, vo);
  }
#endif
#if REGPOOL_HAVE_FABRIC
  if (backend != "verbs") {
    regpool::FabricEndpointOptions fo;
    fo.emulated_atomics = regpool::FabricEndpointOptions::EmulatedAtomics::serve;
    if (max_incoming != 0) fo.max_incoming_message = max_incoming;
    fo.inject_sends = inject_sends;
    fo.shm_rings = shm_rings;
    fo.shm_direct_rma = shm_direct_rma;
    fo.shm_ring_copy_max = shm_ring_copy_max;
    return regpool::FabricEndpoint::open(std::static_pointer_cast<regpool::FabricDomain>(domain), ec, fo);
  }
#endif
  (void)domain;
  (void)ec;
  (void)max_incoming;
  (void)inject_sends;
  (void)shm_rings;
  (void)shm_direct_rma;
  (void)shm_ring_copy_max;
  throw regpool::Error(regpool::Status::unsupported, 0, "test: backend " + backend + " not built");
}

// A process's transport stack for one test.
struct Stack {
  std::shared_ptr<regpool::Domain> domain;
  std::unique_ptr<regpool::Pool> pool;
  std::unique_ptr<regpool::Endpoint> ep;

  explicit Stack(const std::string& backend, regpool::EndpointConfig ec = {},
                 std::size_t arena = std::size_t{16} << 20, std::uint64_t max_incoming = 0,
                 bool inject_sends = true, bool shm_rings = true, bool shm_direct_rma = true,
                 std::uint64_t shm_ring_copy_max = 65 * 1024) {
#if REGPOOL_HAVE_VERBS
    if (backend == "verbs") domain = regpool::VerbsDomain::open();
#endif
#if REGPOOL_HAVE_FABRIC
    if (backend != "verbs") domain = regpool::FabricDomain::open(fabric_config(backend));
#endif
    if (domain) {
      ep = open_endpoint(domain, backend, ec, max_incoming, inject_sends, shm_rings, shm_direct_rma,
                         shm_ring_copy_max);
    }
    if (!ep) throw regpool::Error(regpool::Status::unsupported, 0, "test: backend " + backend + " not built");
    regpool::PoolConfig pc;
    pc.arena_size = arena;
    pool = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain}, pc);
  }
  ~Stack() {
    ep.reset();  // in-flight LDO references go before the pool
    pool.reset();
  }
  regpool::Ldo alloc(std::uint64_t n) {
    auto r = pool->allocate(n);
    if (!r) throw regpool::Error(r.status(), 0, "test: allocate failed");
    return std::move(*r);
  }
};

inline std::unique_ptr<regpool::TcpBootstrap> root_bootstrap(int size = 2) {
  regpool::TcpBootstrapConfig c;
  c.rank = 0;
  c.size = size;
  c.connect_timeout = 20s;
  return std::make_unique<regpool::TcpBootstrap>(c);
}

inline std::unique_ptr<regpool::TcpBootstrap> child_bootstrap(std::uint16_t port, int rank = 1, int size = 2) {
  regpool::TcpBootstrapConfig c;
  c.rank = rank;
  c.size = size;
  c.port = port;
  c.connect_timeout = 20s;
  return std::make_unique<regpool::TcpBootstrap>(c);
}

inline std::vector<std::byte> bytes_of(std::span<const std::byte> s) { return {s.begin(), s.end()}; }

template <class T>
std::vector<std::byte> pod_bytes(const T& v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  return {p, p + sizeof v};
}
template <class T>
T from_bytes(const std::vector<std::byte>& b) {
  T v{};
  if (b.size() == sizeof v) std::memcpy(&v, b.data(), sizeof v);
  return v;
}

// Content hash for integrity checks: FNV-1a over 64-bit words, then the
// tail bytes. A word at a time through raw pointers, because these run over
// 64 MiB buffers in the -O0 sanitizer build inside the emulated Soft-RoCE
// guest, where a byte loop through span's operator[] took over a minute and
// outran the tests' bootstrap timeouts. The value depends only on the bytes,
// never on the buffer's alignment.
inline std::uint64_t hash(std::span<const std::byte> s) {
  constexpr std::uint64_t kPrime = 1099511628211ull;
  std::uint64_t h = 1469598103934665603ull;
  const std::byte* p = s.data();
  const std::size_t words = s.size() / 8;
  for (std::size_t i = 0; i < words; ++i, p += 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * kPrime;
    h ^= h >> 32;  // fold the high bits down, or a word's top byte barely mixes
  }
  for (const std::byte* end = s.data() + s.size(); p != end; ++p) h = (h ^ static_cast<std::uint8_t>(*p)) * kPrime;
  return h;
}

// Deterministic pattern, distinct per seed: byte i is byte (i % 8) of the
// (i / 8 + 1)-th xorshift step, so a prefix filled with the same seed holds
// the same bytes. Written a word at a time for the reason given at hash().
inline void fill(std::span<std::byte> s, std::uint64_t seed) {
  static_assert(std::endian::native == std::endian::little, "the pattern is defined little-endian");
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::byte* p = s.data();
  for (std::size_t left = s.size(); left != 0;) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const std::size_t n = left < 8 ? left : 8;
    std::memcpy(p, &x, n);
    p += n;
    left -= n;
  }
}

inline regpool::Slice slice_or_die(regpool::Result<regpool::Slice> r) {
  if (!r) throw regpool::Error(r.status(), 0, "test: slice");
  return std::move(*r);
}

// Wait for a token; returns the completion.
inline regpool::Completion wait_ok(regpool::Endpoint& ep, regpool::Result<regpool::Token> t,
                                   std::chrono::milliseconds bound = 30s) {
  if (!t) return regpool::Completion{regpool::Token{}, regpool::OpKind::put, t.status(), regpool::kAnyPeer, 0, 0};
  return ep.wait(*t, bound);
}

// An allgather during which `ep` keeps progressing (on a helper thread).
// Backends that connect on first use (verbs) need the peer's progress to
// answer a connection request: a peer that exposes a window to us while we
// wait here for its setup bytes connects through our progress.
inline std::vector<std::vector<std::byte>> allgather_progressing(regpool::Bootstrap& b, regpool::Endpoint& ep,
                                                                 std::span<const std::byte> mine,
                                                                 std::chrono::milliseconds bound) {
  std::atomic<bool> done{false};
  std::thread helper([&] {
    while (!done.load(std::memory_order_acquire)) ep.progress_for(std::chrono::milliseconds(2));
  });
  struct Join {
    std::atomic<bool>& done;
    std::thread& t;
    ~Join() {
      done.store(true, std::memory_order_release);
      t.join();
    }
  } join{done, helper};
  return b.allgather(mine, bound);
}

// An exposure's remote reference as the bytes a peer receives.
inline std::vector<std::byte> encoded(const regpool::Exposure& e) {
  auto a = e.encode();
  return {a.begin(), a.end()};
}
// Decoding bytes this test itself produced: failure is a test bug.
inline regpool::RemoteRef decode_or_die(std::span<const std::byte> b) {
  auto r = regpool::RemoteRef::decode(b);
  if (!r) throw regpool::Error(r.status(), 0, "test: decode");
  return *r;
}

}  // namespace rpt
