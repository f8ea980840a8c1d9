// regpool-perf: two-process latency and bandwidth for put, get, send and
// atomics between LDOs, in the manner of ib_write_bw / fi_rma_bw, and the
// cost of exposing and revoking an object.
//
//   regpool-perf --server [--port P] [--bind ADDR]      (target, rank 0)
//   regpool-perf --client HOST[:PORT] [options]         (initiator, rank 1)
//   regpool-perf --loopback [options]                   (forks both)
//   regpool-perf --peers 2,8,32,64 [options]            (one server, N clients)
//
// The client decides what runs (provider, sizes, iterations, ops, window)
// and sends its configuration to the server through the TCP bootstrap, so
// the server needs no options beyond where to listen. The server allocates a
// target LDO from its pool, exposes it read-write, and serves every phase by
// waiting (Endpoint::wait(), spinning or sleeping as --wait says) for the
// client's end-of-phase message: manual-progress providers (tcp;ofi_rxm, shm) complete
// operations aimed at a process only while it progresses, and emulated
// atomics are applied by the target's progress().
//
// What is measured (initiator side, clock: steady_clock):
//   latency   one operation in flight; median/min/max/p99/mean over --iters
//             ops; send: half the round trip of a ping-pong of that size,
//             each iteration (post the pong's receive, send, the pong)
//             timed back to back, as fi_pingpong and ucx_perftest do;
//             atomics: fetch_add and compare_swap on one 8-byte word.
//   bandwidth --window operations in flight; bytes moved / elapsed time;
//             send: a stream of messages closed by an ack from the server,
//             so every byte has arrived; atomics: fetch_add rate.
//   expose    Endpoint::expose + Exposure::revoke of a slice of the server's
//             object (--expose-mode standard|scoped), timed by the server,
//             which owns the object; median/min/max/p99 over --iters pairs.
//             The row also carries domain_registrations: registrations made
//             by both processes' domains while the server's loop ran (the
//             server sends its count and its summary to the client over the
//             TCP bootstrap; the client adds its own).
// Buffers (perf_buffers.hpp): by default (hot) every operation of a
// bandwidth test moves the same bytes, as fi_rma_bw and ib_write_bw do, so
// the copy runs from cache to cache; --cold rotates put, get and send over
// slots of a span of --cold-bytes (default 4x the last-level cache) on both
// sides, so every operation reads and writes uncached memory.
// Payload: put, get and send bandwidth tests move a pattern written before
// timing and check it afterwards, outside the timed region (put: the client
// gets every slot back; get: the client checks what landed; send: the server
// checks its receive slots and answers in the ack); a mismatch fails the row
// (exit 1) naming the op, size and slot. A failed completion status is
// reported per op and size.

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "platform/mapping.hpp"
#include "platform/ticks.hpp"
#include "regpool/bootstrap.hpp"
#include "regpool/endpoint.hpp"
#include "regpool/messaging.hpp"
#include "regpool/pool.hpp"
#include "regpool/slice.hpp"
#include "regpool_config.h"
#include "perf_buffers.hpp"
#include "perf_config.hpp"
#include "perf_wire.hpp"
#include "tool_common.hpp"

#if REGPOOL_HAVE_FABRIC
#include "regpool/fabric_domain.hpp"
#include "regpool/fabric_endpoint.hpp"
#endif
// regpool's verbs transport (RC queue pairs), when this build has it.
#if REGPOOL_HAVE_VERBS && __has_include("regpool/verbs_endpoint.hpp")
#include "regpool/verbs_domain.hpp"
#include "regpool/verbs_endpoint.hpp"
#define PERF_HAVE_VERBS 1
#else
#define PERF_HAVE_VERBS 0
#endif

namespace {

using namespace std::chrono_literals;
using regpool::Slice;
using regpool::Status;
using regpool_tools::format_size;
using regpool_tools::json_escape;
using regpool_tools::json_number;
using regpool_tools::UsageError;
using Clock = std::chrono::steady_clock;

constexpr std::uint16_t kDefaultPort = 18515;  // ib_write_bw's, for familiarity
// --peers: client processes per round (each a whole process with its own
// endpoint; 256 on 2 cores is already slow to start).
constexpr std::uint64_t kMaxPeers = 256;
constexpr std::uint64_t kControlBytes = 8;
// The smallest default cold span, for machines that do not report a cache.
constexpr std::uint64_t kMinColdBytes = std::uint64_t{256} << 20;
// Pattern seeds: one per op, mixed with the size, and one the put latency
// test leaves in slot 0, so a bandwidth test that moved nothing fails.
std::uint64_t seed_of(char op, std::uint64_t size) { return (static_cast<std::uint64_t>(op) << 40) ^ size; }
constexpr std::uint64_t kStaleSeed = 0x5757;
constexpr int kWarmupOps = 8;
constexpr auto kPhaseTimeout = 600s;  // bound on any one wait for the peer

void usage(std::FILE* to) {
  std::fprintf(
      to,
      "usage: regpool-perf --server [--port P] [--bind ADDR] [--json] [--[no-]progress]\n"
      "       regpool-perf --peers LIST [options]\n"
      "       regpool-perf --client HOST[:PORT] [options]\n"
      "       regpool-perf --loopback [options]\n"
      "Two-process latency and bandwidth of put, get, send and atomics between LDOs,\n"
      "and the cost of exposing and revoking an LDO slice.\n"
      "  --server         run the target side; it takes its configuration from the client\n"
      "  --port P         server: TCP port for the bootstrap (default 18515)\n"
      "  --bind ADDR      server: address to listen on (default 0.0.0.0)\n"
      "  --client HOST[:PORT]  run the initiator against a server (default port 18515)\n"
      "  --loopback       fork a server and a client on 127.0.0.1\n"
      "  --peers LIST     scale test: for each N in LIST (e.g. 2,8,32,64; 1..256) fork\n"
      "                   one server and N client processes on 127.0.0.1; each client\n"
      "                   streams --iters Messenger tagged messages of each size (default\n"
      "                   8 bytes) with --window in flight, the server receives from any\n"
      "                   peer; reports per N the aggregate message rate, the server's\n"
      "                   registered receive memory at its peak (receive_memory_bytes:\n"
      "                   bounce buffers plus held unexpected messages) and the growth\n"
      "                   of its resident memory over the round (endpoint_memory_bytes).\n"
      "                   Takes --provider (default shm), --sizes, --iters, --window,\n"
      "                   --wait, --tagged-threshold, --json\n"
      "Client and loopback options:\n"
      "  --provider NAME  libfabric provider: shm, tcp (libfabric's net), tcp;ofi_rxm, or any other\n"
      "                   name fi_getinfo knows (default shm with --loopback, else tcp);\n"
      "                   verbs[:DEV] uses regpool's own verbs transport (RC queue\n"
      "                   pairs) on device DEV (default: first with an active port)\n"
      "  --sizes LIST     message sizes, comma-separated, suffixes K/M/G\n"
      "                   (default 8,4K,64K,1M)\n"
      "  --iters N        operations per latency test and per bandwidth test (default\n"
      "                   1000; bandwidth tests move at most 1 GiB per size, and with\n"
      "                   --cold at least one operation per slot)\n"
      "  --window W       operations in flight in bandwidth tests (default 16, max 512)\n"
      "  --batch N        put and get bandwidth post N operations at a time with one\n"
      "                   Endpoint::post_batch call (verbs: one doorbell for N chained\n"
      "                   work requests; libfabric: FI_MORE); 1 (default): one put()\n"
      "                   or get() call each. At most 64 and at most --window\n"
      "  --cold           put, get, send and memcpy bandwidth rotate over distinct\n"
      "                   slots of --cold-bytes on each side, so no operation finds its\n"
      "                   bytes in cache (default: hot, the same bytes every operation,\n"
      "                   as fi_rma_bw does; on shm hot figures are cache-to-cache copies)\n"
      "  --cold-bytes N   the span --cold rotates over (default 4x the last-level\n"
      "                   cache, at least 256M, at most 2G; implies --cold)\n"
      "  --ops LIST       put,get,send,atomic,expose,tagged,memcpy or a subset (default\n"
      "                   all but tagged and memcpy: tagged is Messenger tagged\n"
      "                   send/receive, eager below the threshold and rendezvous above,\n"
      "                   docs/messaging.md; memcpy is a plain memcpy in the client of\n"
      "                   each size, hot or cold as the rest, the reference for shm)\n"

      "  --tagged-threshold N  the Messenger's eager threshold for --ops tagged\n"
      "                   (default: the provider's measured default)\n"
      "  --tagged-split S the Messenger's split rendezvous for --ops tagged: SIZE\n"
      "                   (split every rendezvous receive of at least SIZE bytes),\n"
      "                   off (never), or default (the backend's: from 512 KiB on shm,\n"
      "                   never elsewhere)\n"
      "  --tagged-eager-split S the Messenger's split eager for --ops tagged: SIZE\n"
      "                   (eager payloads up to SIZE that the header pushes past the\n"
      "                   backend's fast message limit leave as several messages),\n"
      "                   off, or default (the backend's: 16 KiB on shm, never elsewhere)\n"
      "  --tagged-gather S the Messenger's gathered eager for --ops tagged: SIZE\n"
      "                   (eager payloads of at least SIZE leave as the header and\n"
      "                   the caller's bytes, uncopied, where the backend can send\n"
      "                   a message of two pieces), off, or default (4 KiB)\n"
      "  --tagged-gather-max S the longest eager payload sent gathered: SIZE, off\n"
      "                   (no limit) or default (the backend's: 65344 bytes on\n"
      "                   libfabric tcp, no limit elsewhere); longer ones are copied\n"
      "  --tagged-copy S  the Messenger's copied eager for --ops tagged, shm with\n"
      "                   rings: SIZE (send() copies eager payloads of up to SIZE\n"
      "                   straight into the peer's ring), off (built in a message\n"
      "                   and posted), or default (all the ring takes)\n"
      "  --tagged-choice S the Messenger's eager or rendezvous by measured cost for\n"
      "                   --ops tagged, shm with rings: SIZE (copied payloads longer\n"
      "                   than SIZE go by rendezvous while the pair measured the\n"
      "                   receiver's read cheaper), off (never) or default (the\n"
      "                   Messenger's: every copied payload over 16 KiB)\n"
      "  --tagged-recv R  the tagged phase's receives, both sides: copy (default:\n"
      "                   Messenger::recv into the caller's buffer) or ldo\n"
      "                   (Messenger::recv_ldo: the message handed over where it\n"
      "                   arrived, no copy)\n"
      "  --expose-mode M  standard or scoped: the ExposureMode the expose test uses\n"
      "                   (default standard)\n"
      "  --perftest       latency only, with perftest's definitions (tools/README.md):\n"
      "                   put: half round trip of a write ping-pong, each side polling\n"
      "                   its own memory for the peer's write (ib_write_lat); get: one\n"
      "                   read and its completion (ib_read_lat); send: half round trip\n"
      "                   of a send ping-pong (ib_send_lat); medians of --iters samples\n"
      "  --recv R         the send ping-pong's receives, both sides: kept (default:\n"
      "                   one kept receive reposted before each message,\n"
      "                   Endpoint::post_recv_kept) or fresh (a post_recv each)\n"
      "  --sends S        the send ping-pong's sends, both sides: kept (default: one\n"
      "                   kept send reposted for each message, Endpoint::send_kept)\n"
      "                   or fresh (a send each)\n"
      "  --shm-rings R    shm only, both sides: on (default: messages through regpool's\n"
      "                   own rings, FabricEndpointOptions::shm_rings) or off (through\n"
      "                   the provider's fi_inject/fi_send/fi_recv)\n"
      "  --shm-ring-copy-max B  shm with rings, both sides: the longest send copied\n"
      "                   through a ring (default and at most 65K); a longer one the\n"
      "                   receiver reads from the sender's buffer\n"
      "  --shm-ring-adaptive A  shm with rings, both sides: on (default: a send over\n"
      "                   16K up to that limit takes the path the pair measured\n"
      "                   cheaper, FabricEndpointOptions::shm_ring_adaptive) or off\n"
      "                   (always copied)\n"
      "  --messenger M    the tagged phase, both sides: locked (default: the\n"
      "                   Messenger's own mutex, any thread may call) or serialized\n"
      "                   (MessengerConfig::serialized: calls never overlap, no lock)\n"
      "  --ahead A        the send and tagged ping-pongs' receives, both sides: on\n"
      "                   (default: each posted one message ahead, the client's\n"
      "                   after its ping, the server's after its pong, into the\n"
      "                   second of two receives) or off (each posted right before\n"
      "                   the message it is for, on the path from one message to\n"
      "                   the next)\n"
      "  --pingpong P     the send and tagged ping-pongs, both sides: echo (default:\n"
      "                   each side replies from the bytes it received into, so\n"
      "                   every message carries bytes new to its reader) or separate\n"
      "                   (each sends from one buffer and receives into another, as\n"
      "                   fi_pingpong and ucx_perftest do; on shm a reader may then\n"
      "                   find a large message's unchanged source in its own cache);\n"
      "                   --perftest's ping-pongs are always separate, as perftest's are\n"
      "  --rma R          --perftest's put and get loops: kept (default: one kept put\n"
      "                   or get reposted for each operation, Endpoint::put_kept and\n"
      "                   get_kept, as perftest posts one work request over and\n"
      "                   over) or fresh (a put or get each)\n"
      "  --loop-mean      the send and tagged ping-pongs also run --iters iterations\n"
      "                   with no clock read inside the loop, timed as a whole: JSON\n"
      "                   latency_us loop_mean, half a round trip (fi_pingpong's\n"
      "                   usec/xfer; the per-iteration samples carry one time-stamp\n"
      "                   read each)\n"
      "  --verbs-inline N verbs: inline puts/sends up to N bytes (0: never; default 64,\n"
      "                   the device may grant less)\n"
      "  --verbs-signal S verbs: selective (default: only every 16th small inline op\n"
      "                   behind others in flight is signalled) or all\n"
      "  --verbs-inject S verbs: on (default: sends up to the inline size complete at\n"
      "                   their post, their WRs unsignalled, as ib_send_lat's are) or\n"
      "                   off (every send completes from its own work completion)\n"
      "  --wait MODE      how both sides wait for completions: spin (default), sleep\n"
      "                   (block on the provider's wait object) or adaptive (spin\n"
      "                   briefly, then sleep); see docs/progress.md\n"
      "Output:\n"
      "  --json           one JSON object on stdout instead of the table\n"
      "  --progress       progress line on stderr even when it is not a terminal\n"
      "                   (it is shown by default when stderr is a terminal)\n"
      "  --no-progress    no progress line, even on a terminal\n"
      "  -h, --help       this text\n"
      "tcp on loopback: FI_TCP_IFACE defaults to lo in --loopback mode; across hosts\n"
      "set FI_TCP_IFACE to the interface to use.\n"
      "Bootstrap: with REGPOOL_BOOTSTRAP_KEY set (the same on server and client), the\n"
      "server admits only a client that proves the key, and the client checks that\n"
      "the server proves it too (docs/bootstrap.md).\n"
      "Put, get, send and memcpy bandwidth tests check the bytes moved after timing\n"
      "(a pattern written before timing); a mismatch fails the run naming op and size.\n"
      "Exit codes: 0 ok, 1 failure (setup error, peer lost, operation failed), 2 bad\n"
      "arguments.\n");
}

enum class Mode { none, server, client, loopback, peers };

using regpool_tools::perf::Config;
using regpool_tools::perf::kMaxBandwidthBytes;
using regpool_tools::perf::kMaxBatch;
using regpool_tools::perf::kMaxColdBytes;
using regpool_tools::perf::kMaxVerbsInline;
using regpool_tools::perf::kMaxWindow;
using regpool_tools::perf::parse_wait;

struct Options {
  Mode mode = Mode::none;
  std::string host = "127.0.0.1";
  std::string bind = "0.0.0.0";
  std::uint16_t port = kDefaultPort;
  bool json = false;
  bool progress = false;
  bool no_progress = false;
  bool provider_given = false;
  // --peers: the client counts, one round (a server and that many client
  // processes) each.
  std::vector<std::uint64_t> peers;
  Config config;
};

// --tagged-split, --tagged-eager-split, --tagged-gather, --tagged-gather-max
// --tagged-copy and --tagged-choice: a size above 0, off (UINT64_MAX: never, or for
// --tagged-gather-max no limit) or default (0, the backend's), as the
// MessengerConfig fields take it.
std::uint64_t split_value(const std::string& v, const char* option) {
  if (v == "off") return ~std::uint64_t{0};
  if (v == "default") return 0;
  const std::uint64_t n = regpool_tools::parse_size(v, option);
  if (n == 0) throw UsageError(std::string(option) + ": a size above 0, off or default");
  return n;
}

// --recv, --sends, --ahead, --rma: the option's value, one of two words;
// true for `yes`.
bool one_of_two(int argc, char** argv, int& i, const char* option, const char* yes, const char* no) {
  const std::string v = regpool_tools::option_value(argc, argv, i, option);
  if (v != yes && v != no) {
    throw UsageError(std::string(option) + " takes " + yes + " or " + no + " (got '" + v + "')");
  }
  return v == yes;
}

Options parse_args(int argc, char** argv, bool& help) {
  Options o;
  bool client_only_option = false;
  bool cold = false;
  bool sizes_given = false;
  std::string not_for_peers;  // an option --peers has no use for
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    using regpool_tools::is_option;
    using regpool_tools::option_value;
    auto set_mode = [&](Mode m) {
      if (o.mode != Mode::none) throw UsageError("give exactly one of --server, --client, --loopback, --peers");
      o.mode = m;
    };
    if (a == "--help" || a == "-h") {
      help = true;
      return o;
    } else if (a == "--server") {
      set_mode(Mode::server);
    } else if (a == "--loopback") {
      set_mode(Mode::loopback);
    } else if (is_option(a, "--peers")) {
      set_mode(Mode::peers);
      for (const auto& v : regpool_tools::split(option_value(argc, argv, i, "--peers"), ',')) {
        o.peers.push_back(regpool_tools::parse_uint(v, "--peers", 1, kMaxPeers));
      }
      if (o.peers.empty()) throw UsageError("--peers needs a list of client counts");
    } else if (is_option(a, "--client")) {
      set_mode(Mode::client);
      std::string v = option_value(argc, argv, i, "--client");
      const auto colon = v.rfind(':');
      if (colon != std::string::npos) {
        o.port = static_cast<std::uint16_t>(regpool_tools::parse_uint(v.substr(colon + 1), "--client port", 1, 65535));
        v = v.substr(0, colon);
      }
      if (v.empty()) throw UsageError("--client needs a host name or address");
      o.host = v;
    } else if (is_option(a, "--port")) {
      not_for_peers = a;
      o.port = static_cast<std::uint16_t>(
          regpool_tools::parse_uint(option_value(argc, argv, i, "--port"), "--port", 1, 65535));
    } else if (is_option(a, "--bind")) {
      not_for_peers = a;
      o.bind = option_value(argc, argv, i, "--bind");
    } else if (is_option(a, "--provider")) {
      o.config.provider = option_value(argc, argv, i, "--provider");
      if (!regpool_tools::perf::provider_name_ok(o.config.provider)) {
        throw UsageError("--provider: 1 to " + std::to_string(regpool_tools::perf::kMaxProviderName) +
                         " letters, digits or _;:.+- (got '" + o.config.provider + "')");
      }
      if (o.config.provider.empty()) throw UsageError("--provider needs a name");
      o.provider_given = true;
      client_only_option = true;
    } else if (is_option(a, "--sizes")) {
      sizes_given = true;
      o.config.sizes = regpool_tools::parse_size_list(option_value(argc, argv, i, "--sizes"), "--sizes");
      if (o.config.sizes.front() == 0) throw UsageError("--sizes: sizes must be at least 1 byte");
      if (o.config.sizes.back() > regpool_tools::perf::kMaxSize) throw UsageError("--sizes: at most 4 GiB");
      if (o.config.sizes.size() > regpool_tools::perf::kMaxSizes) {
        throw UsageError("--sizes: at most " + std::to_string(regpool_tools::perf::kMaxSizes) + " sizes");
      }
      client_only_option = true;
    } else if (is_option(a, "--iters")) {
      o.config.iters = regpool_tools::parse_uint(option_value(argc, argv, i, "--iters"), "--iters", 1, regpool_tools::perf::kMaxIters);
      client_only_option = true;
    } else if (is_option(a, "--wait")) {
      const std::string v = option_value(argc, argv, i, "--wait");
      const auto m = parse_wait(v);
      if (!m) throw UsageError("--wait takes spin, sleep or adaptive (got '" + v + "')");
      o.config.wait = *m;
      client_only_option = true;
    } else if (is_option(a, "--batch")) {
      o.config.batch = regpool_tools::parse_uint(option_value(argc, argv, i, "--batch"), "--batch", 1, kMaxBatch);
      not_for_peers = a;
      client_only_option = true;
    } else if (is_option(a, "--window")) {
      o.config.window = regpool_tools::parse_uint(option_value(argc, argv, i, "--window"), "--window", 1, kMaxWindow);
      client_only_option = true;
    } else if (is_option(a, "--ops")) {
      not_for_peers = a;
      o.config.put = o.config.get = o.config.send = o.config.atomic = o.config.expose = o.config.tagged = false;
      o.config.memcpy = false;
      for (const auto& op : regpool_tools::split(option_value(argc, argv, i, "--ops"), ',')) {
        if (op == "put") {
          o.config.put = true;
        } else if (op == "get") {
          o.config.get = true;
        } else if (op == "send") {
          o.config.send = true;
        } else if (op == "atomic" || op == "atomics") {
          o.config.atomic = true;
        } else if (op == "expose") {
          o.config.expose = true;
        } else if (op == "tagged") {
          o.config.tagged = true;
        } else if (op == "memcpy") {
          o.config.memcpy = true;
        } else {
          throw UsageError("--ops: unknown operation '" + op + "' (put, get, send, atomic, expose, tagged, memcpy)");
        }
      }
      client_only_option = true;
    } else if (is_option(a, "--tagged-threshold")) {
      o.config.tagged_threshold = regpool_tools::parse_uint(option_value(argc, argv, i, "--tagged-threshold"),
                                                            "--tagged-threshold", regpool_tools::perf::kMinTaggedThreshold,
                                                            regpool_tools::perf::kMaxTaggedThreshold);
      client_only_option = true;
    } else if (is_option(a, "--tagged-split")) {
      o.config.tagged_split = split_value(option_value(argc, argv, i, "--tagged-split"), "--tagged-split");
      client_only_option = true;
    } else if (is_option(a, "--tagged-eager-split")) {
      o.config.tagged_eager_split =
          split_value(option_value(argc, argv, i, "--tagged-eager-split"), "--tagged-eager-split");
      client_only_option = true;
    } else if (is_option(a, "--tagged-gather")) {
      o.config.tagged_gather = split_value(option_value(argc, argv, i, "--tagged-gather"), "--tagged-gather");
      client_only_option = true;
    } else if (is_option(a, "--tagged-gather-max")) {
      o.config.tagged_gather_max =
          split_value(option_value(argc, argv, i, "--tagged-gather-max"), "--tagged-gather-max");
      client_only_option = true;
    } else if (is_option(a, "--tagged-copy")) {
      o.config.tagged_copy = split_value(option_value(argc, argv, i, "--tagged-copy"), "--tagged-copy");
      client_only_option = true;
    } else if (is_option(a, "--tagged-choice")) {
      o.config.tagged_choice = split_value(option_value(argc, argv, i, "--tagged-choice"), "--tagged-choice");
      client_only_option = true;
    } else if (is_option(a, "--tagged-recv")) {
      o.config.tagged_recv_ldo = one_of_two(argc, argv, i, "--tagged-recv", "ldo", "copy");
      client_only_option = true;
    } else if (is_option(a, "--expose-mode")) {
      not_for_peers = a;
      const std::string m = option_value(argc, argv, i, "--expose-mode");
      if (m == "standard") {
        o.config.expose_mode = regpool::ExposureMode::standard;
      } else if (m == "scoped") {
        o.config.expose_mode = regpool::ExposureMode::scoped;
      } else {
        throw UsageError("--expose-mode: '" + m + "' is not standard or scoped");
      }
      client_only_option = true;
    } else if (a == "--cold") {
      not_for_peers = a;
      cold = true;
      client_only_option = true;
    } else if (is_option(a, "--cold-bytes")) {
      not_for_peers = a;
      o.config.cold_bytes = regpool_tools::parse_size(option_value(argc, argv, i, "--cold-bytes"), "--cold-bytes");
      if (o.config.cold_bytes == 0 || o.config.cold_bytes > kMaxColdBytes) {
        throw UsageError("--cold-bytes: between 1 byte and " + format_size(kMaxColdBytes));
      }
      client_only_option = true;
    } else if (a == "--loop-mean") {
      not_for_peers = a;
      o.config.loop_mean = true;
      client_only_option = true;
    } else if (is_option(a, "--recv")) {
      o.config.recv_kept = one_of_two(argc, argv, i, "--recv", "kept", "fresh");
      not_for_peers = a;
      client_only_option = true;
    } else if (is_option(a, "--sends")) {
      o.config.send_kept = one_of_two(argc, argv, i, "--sends", "kept", "fresh");
      not_for_peers = a;
      client_only_option = true;
    } else if (is_option(a, "--shm-rings")) {
      o.config.shm_rings = one_of_two(argc, argv, i, "--shm-rings", "on", "off");
      not_for_peers = a;
      client_only_option = true;
    } else if (is_option(a, "--shm-ring-copy-max")) {
      o.config.shm_ring_copy_max =
          regpool_tools::parse_size(option_value(argc, argv, i, "--shm-ring-copy-max"), "--shm-ring-copy-max");
      if (o.config.shm_ring_copy_max > regpool_tools::perf::kMaxShmRingCopy) {
        throw UsageError("--shm-ring-copy-max: at most " + format_size(regpool_tools::perf::kMaxShmRingCopy));
      }
      not_for_peers = a;
      client_only_option = true;
    } else if (is_option(a, "--shm-ring-adaptive")) {
      o.config.shm_ring_adaptive = one_of_two(argc, argv, i, "--shm-ring-adaptive", "on", "off");
      not_for_peers = a;
      client_only_option = true;
    } else if (is_option(a, "--messenger")) {
      o.config.messenger_serialized = one_of_two(argc, argv, i, "--messenger", "serialized", "locked");
      not_for_peers = a;
      client_only_option = true;
    } else if (is_option(a, "--ahead")) {
      o.config.recv_ahead = one_of_two(argc, argv, i, "--ahead", "on", "off");
      not_for_peers = a;
      client_only_option = true;
    } else if (is_option(a, "--pingpong")) {
      o.config.pingpong_echo = one_of_two(argc, argv, i, "--pingpong", "echo", "separate");
      not_for_peers = a;
      client_only_option = true;
    } else if (is_option(a, "--rma")) {
      o.config.rma_kept = one_of_two(argc, argv, i, "--rma", "kept", "fresh");
      not_for_peers = a;
      client_only_option = true;
    } else if (a == "--perftest") {
      not_for_peers = a;
      o.config.perftest = true;
      client_only_option = true;
    } else if (is_option(a, "--verbs-inline")) {
      o.config.verbs_inline = static_cast<std::int64_t>(regpool_tools::parse_uint(
          option_value(argc, argv, i, "--verbs-inline"), "--verbs-inline", 0, kMaxVerbsInline));
      client_only_option = true;
    } else if (is_option(a, "--verbs-signal")) {
      const std::string v = option_value(argc, argv, i, "--verbs-signal");
      if (v != "all" && v != "selective") throw UsageError("--verbs-signal takes all or selective (got '" + v + "')");
      o.config.verbs_signal_all = v == "all";
      client_only_option = true;
    } else if (is_option(a, "--verbs-inject")) {
      const std::string v = option_value(argc, argv, i, "--verbs-inject");
      if (v != "on" && v != "off") throw UsageError("--verbs-inject takes on or off (got '" + v + "')");
      o.config.verbs_inject = v == "on";
      client_only_option = true;
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--progress") {
      o.progress = true;
    } else if (a == "--no-progress") {
      o.no_progress = true;
    } else {
      throw UsageError("unknown argument '" + a + "'");
    }
  }
  if (o.mode == Mode::none) throw UsageError("give one of --server, --client HOST[:PORT], --loopback, --peers LIST");
  if (o.mode == Mode::peers && !not_for_peers.empty()) {
    throw UsageError("--peers runs its own server and clients streaming tagged messages; " + not_for_peers +
                     " does not apply");
  }
  if (o.mode == Mode::server && client_only_option) {
    throw UsageError(
        "the server takes provider, sizes, iterations, window, ops and expose mode from the client; give them there");
  }
  if (o.config.batch > o.config.window) throw UsageError("--batch may not exceed --window");
  // --perftest's send row is its own ping-pong (run_perftest_client), which
  // has no unmarked loop; and without send or tagged there is no ping-pong.
  if (o.config.loop_mean && (o.config.perftest || !(o.config.send || o.config.tagged))) {
    throw UsageError("--loop-mean applies to the send and tagged ping-pongs: give --ops with send or tagged, "
                     "without --perftest");
  }
  if (o.config.provider.empty()) o.config.provider = o.mode == Mode::loopback || o.mode == Mode::peers ? "shm" : "tcp";
  if (o.mode == Mode::peers && !sizes_given) o.config.sizes = {8};
  if (cold && o.config.cold_bytes == 0) {
    o.config.cold_bytes =
        std::clamp<std::uint64_t>(4 * regpool_tools::last_level_cache_bytes(), kMinColdBytes, kMaxColdBytes);
  }
  return o;
}

// ------------------------------------------------------------- the sides

// One process's resources: domain, pool, endpoint.
// "verbs" or "verbs:DEV" selects regpool's verbs transport; anything else
// is a libfabric provider name.
bool is_verbs(const std::string& provider) { return provider == "verbs" || provider.rfind("verbs:", 0) == 0; }

// --peers: bound on one wait of a round (no message for that long), and on
// one post (a client's first message connects on verbs).
constexpr auto kPeersTimeout = 60s;

struct Side {
  std::shared_ptr<regpool::Domain> domain;
  std::unique_ptr<regpool::Pool> pool;
  std::unique_ptr<regpool::Endpoint> ep;
  std::string provider;           // as the backend names itself
#if PERF_HAVE_VERBS
  regpool::VerbsEndpoint* verbs = nullptr;  // ep, when it is a verbs endpoint
  regpool::VerbsEndpointOptions verbs_options;
#endif
  // Verbs: inline and signalling in force (what the QP granted is known
  // once a connection exists); empty for libfabric.
  std::string transport_note() const {
#if PERF_HAVE_VERBS
    if (verbs) {
      return "inline up to " + std::to_string(verbs_options.max_inline) + " B (the QP grants " +
             std::to_string(verbs->max_inline_data()) + "), signalling " +
             (verbs_options.selective_signaling ? "selective" : "all") + ", inline sends " +
             (verbs_options.inject_sends ? "complete at post" : "complete from their work completions");
    }
#endif
    return {};
  }
  bool emulated_atomics = false;

  // peers: a --peers side (longer post bound, below). Only a run with
  // atomic ops opens the control endpoint that serves emulated atomics
  // (tcp): its CQ is polled every few progress() calls, and on net and
  // tcp;ofi_rxm each CQ read is an epoll_wait (about 2.6 us), a cost a
  // send or put run should not carry (nor --peers: about 1 s per open).
  Side(const Config& c, bool loopback, const char* name, bool peers = false) {
    const bool serve_atomics = c.atomic && !peers;
    regpool::EndpointConfig ec;
    // Plus the Messenger's posted receives and rendezvous gets (--ops tagged).
    ec.max_in_flight = 2 * kMaxWindow + 16 + 256;
    ec.op_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(kPhaseTimeout);
    // A post is retried while the provider answers "again"; tcp;ofi_rxm
    // answers that for ever to a dead peer, so this bounds how long a post
    // to a killed peer can hold the run before the liveness checks run.
    ec.post_timeout = 5s;
    // --peers (no atomics served): on verbs a client's first message makes
    // its queue pair (made on first use), answered by a server that shares
    // the cores with every other client: under emulation (Soft-RoCE guest,
    // 33 processes on 2 vCPUs) that took longer than 5 s. Liveness is still
    // checked between posts (peers_wait).
    if (peers) ec.post_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(kPeersTimeout);
    ec.wait_mode = c.wait;
    if (is_verbs(c.provider)) {
#if PERF_HAVE_VERBS
      regpool::VerbsConfig vc;
      if (c.provider.size() > 6) vc.device = c.provider.substr(6);
      auto vd = regpool::VerbsDomain::open(vc);
      provider = vd->name();
      domain = vd;
      make_pool(c, name);
      regpool::VerbsEndpointOptions vo;
      if (c.verbs_inline >= 0) vo.max_inline = static_cast<std::uint32_t>(c.verbs_inline);
      vo.selective_signaling = !c.verbs_signal_all;
      vo.inject_sends = c.verbs_inject;
      auto vep = regpool::VerbsEndpoint::open(vd, ec, vo);
      verbs = vep.get();
      verbs_options = vo;
      ep = std::move(vep);
      return;
#else
      throw regpool::Error(Status::unsupported, 0, "this regpool is built without the verbs transport");
#endif
    }
#if REGPOOL_HAVE_FABRIC
    regpool::FabricConfig fc;
    fc.provider = c.provider;
    if ((c.provider == "tcp" || c.provider == "net" || c.provider == "tcp;ofi_rxm") && loopback) fc.node = "127.0.0.1";
    auto fd = regpool::FabricDomain::open(fc);
    provider = fd->provider_name();
    domain = fd;
    make_pool(c, name);
    // Runs with atomic ops may direct them at either side (emulated on tcp): serve them.
    regpool::FabricEndpointOptions fo;
    if (serve_atomics) fo.emulated_atomics = regpool::FabricEndpointOptions::EmulatedAtomics::serve;
    fo.shm_rings = c.shm_rings;
    fo.shm_ring_copy_max = c.shm_ring_copy_max;
    fo.shm_ring_adaptive = c.shm_ring_adaptive;
    auto fep = regpool::FabricEndpoint::open(fd, ec, fo);
    emulated_atomics = fep->emulates_atomics();
    ep = std::move(fep);
#else
    (void)loopback;
    throw regpool::Error(Status::unsupported, 0, "this regpool is built without libfabric");
#endif
  }
  // --ops tagged: the Messenger's receive memory comes from this pool too,
  // so it is in the first arena: its bounces (receive_buffers of the eager
  // threshold plus headers) and what it may hold of unexpected messages
  // (unexpected_budget plus one credit window). Without it a stream whose
  // receiver fell behind grew the pool mid-measurement: an arena mapped,
  // registered and first touched on the receive path (0.4-10 ms for 6 MiB
  // on an AMD EPYC guest), which kept the receiver behind for the rest of
  // the stream (bench/RESULTS.md, "the tagged bandwidth collapse"). A
  // threshold past 1 MiB is not covered: the pool grows for it instead of
  // prefaulting a large arena.
  static std::uint64_t tagged_room(const Config& c) {
    if (!c.tagged) return 0;
    const regpool::MessengerConfig mc;
    // 0: the provider's default, at most tcp's 128 KiB (messaging.hpp).
    const std::uint64_t threshold = c.tagged_threshold != 0 ? c.tagged_threshold : std::uint64_t{128} << 10;
    if (threshold > (std::uint64_t{1} << 20)) return 0;
    const std::uint64_t message = threshold + 256;  // the payload behind wire header, meta and message header
    return (mc.receive_buffers + mc.peer_credits) * message + mc.unexpected_budget;
  }
  void make_pool(const Config& c, const char* name) {
    regpool::PoolConfig pc;
    pc.name = name;
    // Room for the largest object (or a window of receive slots) in one
    // arena, so nothing registers during the measurement; --cold: the span
    // and a largest-size buffer (put's read-back, the server's unused rx)
    // share it, so a second span-sized arena is not prefaulted for them.
    const std::uint64_t extra = c.cold_bytes != 0 ? c.max_size() : 0;
    pc.arena_size = regpool::platform::round_up(c.span() + extra + (std::uint64_t{4} << 20) + tagged_room(c),
                                                regpool::platform::kHugePageSize);
    pc.prefault = true;
    pool = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain}, pc);
  }
  ~Side() {
    ep.reset();
    pool.reset();
  }
  regpool::Ldo alloc(std::uint64_t n) {
    auto r = pool->allocate(n);
    if (!r) throw regpool::Error(r.status(), 0, std::string("pool allocate: ") + regpool::to_string(r.status()));
    return std::move(*r);
  }
};

Slice must(regpool::Result<Slice> r, const char* what) {
  if (!r) throw regpool::Error(r.status(), 0, std::string(what) + ": " + regpool::to_string(r.status()));
  return std::move(*r);
}

std::vector<std::byte> to_bytes(const std::string& s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}
std::string to_string(const std::vector<std::byte>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

// An operation a loop repeats: one kept operation reposted each time
// (kept) or a new one each time (fresh): the ping-pongs' sends (--sends),
// --perftest's puts and gets (--rma). post() answers as the operation's
// call does; a kept one still parked at the end ends with this object (one
// that failed has ended already).
class RepeatedOp {
 public:
  RepeatedOp(Side& s, bool kept) : s_(s), kept_(kept) {}
  RepeatedOp(const RepeatedOp&) = delete;
  RepeatedOp& operator=(const RepeatedOp&) = delete;
  ~RepeatedOp() {
    if (token_) (void)s_.ep->end_kept(token_);
  }
  // `fresh` posts a new operation, `keep` the kept one (first time only).
  template <class Fresh, class Keep>
  regpool::Result<regpool::Token> post(Fresh fresh, Keep keep) {
    if (!kept_) return fresh();
    if (!token_) {
      auto t = keep();
      if (t) token_ = *t;
      return t;
    }
    if (const Status st = s_.ep->repost(token_); st != Status::ok) return st;
    return token_;
  }

 private:
  Side& s_;
  bool kept_;
  regpool::Token token_{};
};

// A receive of a send ping-pong into `in`: one kept receive reposted for
// each message (--recv kept) or a new one each time (--recv fresh). A kept
// one still posted when the ping-pong ends (it failed) ends at its next
// completion or with the endpoint.
class PingReceive {
 public:
  PingReceive(Side& s, const Slice& in, bool kept) : s_(s), in_(in), op_(s, kept) {}
  regpool::Token post();

 private:
  Side& s_;
  const Slice& in_;
  RepeatedOp op_;
};

regpool::Token post_recv_or_throw(Side& s, const Slice& slice) {
  auto t = s.ep->post_recv(slice);
  if (!t) throw regpool::Error(t.status(), 0, std::string("post_recv: ") + regpool::to_string(t.status()));
  return *t;
}

regpool::Token PingReceive::post() {
  auto t = op_.post([&] { return s_.ep->post_recv(in_); }, [&] { return s_.ep->post_recv_kept(in_); });
  if (!t) throw regpool::Error(t.status(), 0, std::string("ping-pong receive: ") + regpool::to_string(t.status()));
  return *t;
}

// The send of a send ping-pong: one kept send of `out` to `peer` reposted
// for each message (--sends kept) or a new send each time (--sends fresh).
// post() answers the send's status (the caller waits for it with its own
// label); the token comes through `token`.
class PingSend {
 public:
  PingSend(Side& s, regpool::PeerId peer, const Slice& out, bool kept) : s_(s), peer_(peer), out_(out), op_(s, kept) {}
  regpool::Result<regpool::Token> post() {
    return op_.post([&] { return s_.ep->send(peer_, out_); }, [&] { return s_.ep->send_kept(peer_, out_); });
  }

 private:
  Side& s_;
  regpool::PeerId peer_;
  const Slice& out_;
  RepeatedOp op_;
};

// The client's side of a send ping-pong of `rounds` round trips (warm-up,
// samples and --loop-mean's together, as many as the server serves). A
// round: the ping, its completion, the pong. With --ahead on, the receive
// for the next pong is posted right after this round's ping, while ping
// and pong travel, into the second of two receives over the same bytes
// (receives from one peer complete in posting order: pong k lands in
// receive k mod 2); the last round posts none, so no receive outlives the
// ping-pong to catch a later phase's message. With --ahead off, each round
// posts its own pong's receive before its ping: on the path from the last
// pong to this ping.
class ClientPingPong {
 public:
  ClientPingPong(Side& s, regpool::PeerId peer, const Slice& in, const Slice& out, const Config& c,
                 std::uint64_t rounds)
      : s_(s),
        rx_{PingReceive(s, in, c.recv_kept), PingReceive(s, in, c.recv_kept)},
        tx_(s, peer, out, c.send_kept),
        ahead_(c.recv_ahead),
        rounds_(rounds) {}
  void round();

 private:
  Side& s_;
  PingReceive rx_[2];
  PingSend tx_;
  bool ahead_;
  std::uint64_t rounds_;
  std::uint64_t done_ = 0;
  regpool::Token next_{};  // --ahead: the receive of the coming round's pong
};

// Loopback: the forked client, watched while the server progresses so a
// client that died does not leave the server waiting for kPhaseTimeout.
pid_t g_child = -1;
int g_child_status = 0;
bool g_child_reaped = false;

// The other side, for messages when an operation fails: the server names
// its client, the client its server. In loopback mode each can also tell
// whether the other process still exists, which is then the cause to
// report, whatever status the transport gave (a dead peer on shm shows up
// as would_block or timeout after post/op timeouts).
std::string g_peer_label = "peer";
pid_t g_server_pid = -1;  // loopback client: the parent
// The server's PeerId for its client: its loops watch Endpoint::usable(peer),
// which the transport clears when it finds the client gone (shm: its
// process died; tcp: its connection failed), so a dead client ends the run
// at once instead of after kPhaseTimeout.
regpool::PeerId g_peer = regpool::kAnyPeer;
// The endpoint talking to g_peer, so a failed operation can ask it whether
// the peer is gone (the shm pid check, a broken tcp connection).
regpool::Endpoint* g_ep = nullptr;
// Sets g_peer/g_ep for the lifetime of one side's run.
struct PeerWatch {
  PeerWatch(regpool::Endpoint& ep, regpool::PeerId peer) {
    g_ep = &ep;
    g_peer = peer;
  }
  ~PeerWatch() {
    g_ep = nullptr;
    g_peer = regpool::kAnyPeer;
  }
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;
};

bool peer_gone() {
  if (g_child > 0) {
    if (!g_child_reaped && ::waitpid(g_child, &g_child_status, WNOHANG) == g_child) g_child_reaped = true;
    return g_child_reaped;
  }
  return g_server_pid > 0 && ::getppid() != g_server_pid;
}

// The transport's verdict on the peer, given a moment to form (the shm
// backend checks peers' processes every 50 ms): an operation that failed
// because the peer died may complete before the check has run.
bool peer_unreachable_now() {
  if (!g_ep || g_peer == regpool::kAnyPeer) return false;
  const auto until = Clock::now() + 300ms;
  while (g_ep->usable(g_peer)) {
    if (Clock::now() >= until) return false;
    (void)g_ep->progress();
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

const regpool::TcpBootstrap* g_boot = nullptr;
// The bootstrap connection's verdict on the peer (empty: still there).
std::string peer_lost() { return g_boot ? g_boot->lost_peer() : std::string(); }

[[noreturn]] void op_failed(Status st, const std::string& what) {
  if (const std::string lost = peer_lost(); !lost.empty()) {
    throw regpool::Error(Status::peer_unreachable, 0,
                         what + ": " + g_peer_label + " is gone (bootstrap " + lost + "; the transport reported: " +
                             regpool::to_string(st) + ")");
  }
  if (st != Status::ok && st != Status::peer_unreachable && !peer_gone() && peer_unreachable_now()) {
    throw regpool::Error(Status::peer_unreachable, 0,
                         what + ": " + g_peer_label + " is unreachable (the transport reported: " +
                             regpool::to_string(st) + ")");
  }
  if (peer_gone()) {
    throw regpool::Error(Status::peer_unreachable, 0,
                         what + ": " + g_peer_label + " exited (the transport reported: " + regpool::to_string(st) + ")");
  }
  throw regpool::Error(st, 0, what + ": " + regpool::to_string(st) + " (with " + g_peer_label + ")");
}

void check_child(const char* what) {
  if (g_child <= 0 || g_child_reaped) return;
  if (::waitpid(g_child, &g_child_status, WNOHANG) == g_child) {
    g_child_reaped = true;
    throw regpool::Error(Status::peer_unreachable, 0, std::string(what) + ": the client process exited");
  }
}

// The bootstrap connection to the other side, kept open for the whole run:
// it is the liveness channel. A killed peer's kernel closes it, which
// TcpBootstrap::lost_peer() sees at once, whether or not the transport
// reports anything (tcp;ofi_rxm fails nothing when no operation of ours is
// in flight: a server progressing while its client puts, a client waiting
// for a pong with only an unbound receive posted).
struct BootWatch {
  explicit BootWatch(const regpool::TcpBootstrap& b) { g_boot = &b; }
  ~BootWatch() { g_boot = nullptr; }
  BootWatch(const BootWatch&) = delete;
  BootWatch& operator=(const BootWatch&) = delete;
};

void check_peer_alive(const std::string& what) {
  check_child(what.c_str());
  if (g_peer != regpool::kAnyPeer && g_ep && !g_ep->usable(g_peer)) op_failed(Status::peer_unreachable, what);
  if (const std::string lost = peer_lost(); !lost.empty()) {
    throw regpool::Error(Status::peer_unreachable, 0, what + ": " + g_peer_label + " is gone (bootstrap " + lost + ")");
  }
}

// Every wait for the peer: wait() (spinning or sleeping as --wait says, so
// the process keeps progressing) in slices of 1 s, between which the
// peer's liveness is checked; bounded by kPhaseTimeout.
// Slices of 1 s: Endpoint::wait starts a wait of 1 s or more from the
// coarse clock, a shorter one reads the precise clock, which in the
// Soft-RoCE guest (clocksource hpet) is a system call of about 1.5 us per
// operation. The phase deadline is read only once a slice has run out.
// `what` is a C string: the latency loops call this once per operation,
// and a std::string built there (a heap allocation past 15 characters)
// would be inside every sample, which perftest's loops do not pay.
regpool::Completion wait_watching(Side& s, regpool::Token t, const char* what) {
  Clock::time_point deadline{};
  for (;;) {
    const auto c = s.ep->wait(t, 1s);
    if (c.status != Status::in_progress) return c;
    check_peer_alive(what);
    const auto now = Clock::now();
    if (deadline == Clock::time_point{}) deadline = now + kPhaseTimeout;
    if (now > deadline) throw regpool::Error(Status::timeout, 0, std::string(what) + ": " + g_peer_label + " silent");
  }
}

// The server's phase loops wait for the client's messages.
void wait_serving(Side& s, regpool::Token t, const char* what) {
  const auto c = wait_watching(s, t, what);
  if (c.status != Status::ok) op_failed(c.status, what);
}

regpool::Completion wait_ok(Side& s, regpool::Result<regpool::Token> t, const char* what) {
  if (!t) op_failed(t.status(), what);
  auto c = wait_watching(s, *t, what);
  if (c.status != Status::ok) op_failed(c.status, what);
  return c;
}

constexpr auto kBootTimeout = std::chrono::duration_cast<std::chrono::milliseconds>(kPhaseTimeout);

// ------------------------------------------------------- the expose test
// The server owns the object, so it times expose + revoke and sends the
// client its summary and its domain's registration count over the bootstrap
// (tools/perf_wire.hpp: the layout and its checks).
using regpool_tools::perf_wire::decode_expose;
using regpool_tools::perf_wire::encode_expose;
using regpool_tools::perf_wire::ExposeResult;

// Expose + revoke of `slice`, `iters` times after a warm-up (which grows the
// endpoint's exposure table, and on libfabric's scoped path its slot list,
// to their steady state).
ExposeResult measure_expose(Side& s, const Slice& slice, regpool::ExposureMode mode, std::uint64_t iters) {
  ExposeResult r;
  try {
    auto once = [&]() {
      auto e = s.ep->expose(slice, regpool::RemoteAccess::read_write, mode);
      if (!e) op_failed(e.status(), std::string("expose (") + regpool::to_string(mode) + ")");
      e->revoke();
    };
    for (int w = 0; w < kWarmupOps; ++w) once();
    std::vector<double> ns;
    ns.reserve(iters);
    const std::uint64_t regs = s.domain->stats().registrations;
    for (std::uint64_t i = 0; i < iters; ++i) {
      const auto t0 = Clock::now();
      once();
      ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
    }
    r.registrations = s.domain->stats().registrations - regs;
    std::sort(ns.begin(), ns.end());
    auto q = [&](double p) { return static_cast<std::uint64_t>(std::llround(regpool_tools::quantile_sorted(ns, p))); };
    r.iters = ns.size();
    r.median_ns = q(0.5);
    r.min_ns = static_cast<std::uint64_t>(std::llround(ns.front()));
    r.max_ns = static_cast<std::uint64_t>(std::llround(ns.back()));
    r.p99_ns = std::min(q(0.99), r.max_ns);
  } catch (const std::exception& e) {
    r.ok = false;
    r.error = e.what();
  }
  return r;
}

// ------------------------------------------------------------ tagged
// Messenger phase (last: the Messenger takes the endpoint's receive side).
// Tags: 1 ping / stream, 2 pong, 3 the stream's ack.
regpool::MessengerConfig tagged_config(const Config& c) {
  regpool::MessengerConfig mc;
  mc.eager_threshold = c.tagged_threshold;
  mc.rendezvous_split = c.tagged_split;
  mc.eager_split = c.tagged_eager_split;
  mc.eager_gather = c.tagged_gather;
  mc.eager_gather_max = c.tagged_gather_max;
  mc.eager_copy = c.tagged_copy;
  mc.rendezvous_choice = c.tagged_choice;
  mc.receive_buffers = 64;
  mc.serialized = c.messenger_serialized;
  return mc;
}

// A tagged phase's receive as --tagged-recv says: into `buf` (copy) or
// handed over where it arrived (ldo).
regpool::Result<regpool::MessageToken> tagged_recv(regpool::Messenger& m, const Config& c, regpool::PeerId peer,
                                                   std::uint64_t tag, const Slice& buf) noexcept {
  return c.tagged_recv_ldo ? m.recv_ldo(peer, tag, 0) : m.recv(peer, tag, 0, buf);
}

regpool::MessageCompletion mwait(regpool::Messenger& m, regpool::MessageToken t, const char* what) {
  auto c = m.wait(t, std::chrono::duration_cast<std::chrono::milliseconds>(kPhaseTimeout));
  if (c.status != Status::ok) op_failed(c.status, what);
  return c;
}
regpool::MessageCompletion mwait(regpool::Messenger& m, const regpool::Result<regpool::MessageToken>& t,
                                 const char* what) {
  if (!t) op_failed(t.status(), what);
  return mwait(m, t.value(), what);
}

// The ping-pong buffer that --pingpong decides for one size: `echoed` (the
// bytes the same side sends from or receives into) when the ping-pongs
// echo, else the first `size` bytes of `own_all`, a buffer of their own.
Slice pingpong_slice(const Config& c, const Slice& echoed, const Slice& own_all, std::uint64_t size) {
  return c.pingpongs_echo() ? echoed : must(own_all.select(0, size), "ping-pong slice");
}

void serve_tagged(Side& s, regpool::TcpBootstrap& boot, const Config& c, regpool::PeerId peer, const Slice& rx_all,
                  const Slice& pong_all, const Slice& ctrl_slice) {
  regpool::Messenger m(*s.ep, *s.pool, tagged_config(c));
  boot.barrier(kBootTimeout);  // both Messengers have their receives posted
  for (const auto size : c.sizes) {
    const Slice in = must(rx_all.select(0, size), "receive slice");
    const Slice reply = pingpong_slice(c, in, pong_all, size);
    boot.barrier(kBootTimeout);
    // The receive for the next ping is posted before the pong goes out (a
    // round before with --ahead), as in the send ping-pong
    // (serve_send_pingpong): a ping that arrived before its receive would
    // be an unexpected message (held, then copied out when the receive
    // comes), which the send row never measures.
    const std::uint64_t pings = c.iters + kWarmupOps + (c.loop_mean ? c.iters : 0);
    auto post_ping = [&]() {
      auto t = tagged_recv(m, c, peer, 1, in);
      if (!t) op_failed(t.status(), "tagged latency receive");
      return *t;
    };
    if (!c.recv_ahead) {
      regpool::MessageToken next = post_ping();
      for (std::uint64_t i = 0; i < pings; ++i) {
        (void)mwait(m, next, "tagged latency");
        if (i + 1 < pings) next = post_ping();
        (void)mwait(m, m.send(peer, 2, reply), "tagged pong");
      }
    } else {
      // --ahead, as serve_send_pingpong: receives for two pings posted
      // (same tag and peer: matched in posting order), the one just used
      // posted again once the pong has left.
      regpool::MessageToken got[2]{};
      got[0] = post_ping();
      if (pings > 1) got[1] = post_ping();
      for (std::uint64_t i = 0; i < pings; ++i) {
        (void)mwait(m, got[i % 2], "tagged latency");
        const auto pong = m.send(peer, 2, reply);
        if (!pong) op_failed(pong.status(), "tagged pong");
        if (i + 2 < pings) got[i % 2] = post_ping();
        (void)mwait(m, pong, "tagged pong");
      }
    }
    boot.barrier(kBootTimeout);
    const std::uint64_t n = c.bw_ops(size);
    std::vector<regpool::MessageToken> ring(c.window);
    std::uint64_t posted = 0, received = 0;
    auto post = [&]() {
      auto t = tagged_recv(m, c, peer, 1, in);
      if (!t) op_failed(t.status(), "tagged stream receive");
      ring[posted % c.window] = *t;
      ++posted;
    };
    while (posted < std::min(n, c.window)) post();
    while (received < n) {
      (void)mwait(m, ring[received % c.window], "tagged stream receive");
      ++received;
      if (posted < n) post();
    }
    (void)mwait(m, m.send(peer, 3, ctrl_slice), "tagged ack");
  }
}

// ------------------------------------------------------ buffers, payload
// The first `count` slots of `size` bytes of `all` (one per bandwidth
// operation in turn; perf_buffers.hpp).
std::vector<Slice> slot_slices(const Slice& all, std::uint64_t size, std::uint64_t count) {
  std::vector<Slice> v;
  v.reserve(count);
  for (std::uint64_t j = 0; j < count; ++j) v.push_back(must(all.select(j * size, size), "slot slice"));
  return v;
}

// Fills the first `count` slots of `all` with the pattern of `seed`.
void fill_slots(const Slice& all, std::uint64_t size, std::uint64_t count, std::uint64_t seed) {
  regpool_tools::pattern_fill(all.bytes().data(), 0, count * size, seed);
}

// 0 when the first `count` slots of `all` hold the pattern of `seed`, else
// the first bad slot + 1.
std::uint64_t first_bad_slot(const Slice& all, std::uint64_t size, std::uint64_t count, std::uint64_t seed) {
  for (std::uint64_t j = 0; j < count; ++j) {
    if (!regpool_tools::pattern_matches(all.bytes().data() + j * size, j * size, size, seed)) return j + 1;
  }
  return 0;
}

std::string bad_payload(const std::string& op, std::uint64_t size, std::uint64_t bad_slot, const char* where) {
  return op + " " + format_size(size) + ": payload check failed: slot " + std::to_string(bad_slot - 1) + " of " +
         where + " does not hold the bytes sent";
}

// The server's half of the send ping-pong: `n` pings answered with pongs.
// The client's next ping never finds the receive queue empty (on RC that is
// an RNR NAK and a retry after the RNR timer: on rxe one or more 4 ms ticks;
// the median of a run that raced it was 8 ms): with --ahead its receive was
// posted a round before, with --ahead off right before the pong goes out.
// ib_send_lat keeps receives posted ahead too.
void serve_send_pingpong(Side& s, regpool::PeerId peer, const Slice& in, const Slice& out, std::uint64_t n,
                         const Config& c) {
  PingReceive rx[2] = {PingReceive(s, in, c.recv_kept), PingReceive(s, in, c.recv_kept)};
  PingSend tx(s, peer, out, c.send_kept);
  if (!c.recv_ahead) {
    regpool::Token got = rx[0].post();
    for (std::uint64_t i = 0; i < n; ++i) {
      wait_serving(s, got, "send latency");
      if (i + 1 < n) got = rx[0].post();
      (void)wait_ok(s, tx.post(), "send reply");
    }
    return;
  }
  // --ahead: receives for two pings stay posted; ping i lands in receive
  // i mod 2, which is posted again (for ping i + 2) once pong i has left,
  // while it travels. Ping i + 1 always finds its receive posted a round
  // before.
  regpool::Token got[2]{};
  got[0] = rx[0].post();
  if (n > 1) got[1] = rx[1].post();
  for (std::uint64_t i = 0; i < n; ++i) {
    wait_serving(s, got[i % 2], "send latency");
    auto pong = tx.post();
    if (!pong) op_failed(pong.status(), "send reply");
    if (i + 2 < n) got[i % 2] = rx[i % 2].post();
    (void)wait_ok(s, *pong, "send reply");
  }
}

int serve_perftest(Side& s, regpool::TcpBootstrap& boot, const Config& c, regpool::PeerId peer, const Slice& target,
                   const Slice& rx_all, const Slice& ctrl_slice);

// Serves one client run, then returns.
int run_server(regpool::TcpBootstrap& boot, bool loopback, bool json) {
  // Step 1: the client's configuration. A standalone server waits up to an
  // hour for its client to show up (like ib_write_bw, it is started first).
  auto cfg_blobs = boot.allgather({}, loopback ? kBootTimeout : std::chrono::milliseconds(3600 * 1000));
  const BootWatch boot_watch(boot);
  std::string why;
  const auto decoded = Config::decode(to_string(cfg_blobs[1]), why);
  if (!decoded) throw regpool::Error(Status::malformed, 0, "the client's configuration: " + why);
  const Config& c = *decoded;
  Side s(c, loopback, "perf-server");
  auto target = s.alloc(c.span());
  auto exposure = s.ep->expose(must(Slice::data(target), "target slice"), regpool::RemoteAccess::read_write);
  if (!exposure) throw regpool::Error(exposure.status(), 0, "expose");
  const std::uint64_t window = c.window;
  auto rx = s.alloc(c.max_size());
  auto ctrl = s.alloc(kControlBytes);
  const Slice ctrl_slice = must(Slice::data(ctrl), "control slice");
  // --cold: receives rotate over the target's span (phases do not overlap,
  // and a second span would double the server's memory).
  const Slice rx_all = must(Slice::data(c.cold_bytes != 0 ? target : rx), "receive slice");
  // --pingpong separate: the pongs leave from bytes of their own, which
  // nothing writes after they are filled here.
  auto pong_src = s.alloc(c.pingpongs_echo() ? 1 : c.max_size());
  const Slice pong_all = must(Slice::data(pong_src), "pong slice");
  std::memset(pong_all.bytes().data(), 0x5a, pong_all.bytes().size());

  // Step 2: names and the reference.
  auto ref = exposure->encode();
  std::vector<std::byte> blob(ref.begin(), ref.end());
  const auto name = s.ep->name();
  blob.insert(blob.end(), name.begin(), name.end());
  auto names = boot.allgather(blob, kBootTimeout);
  const auto peer = s.ep->insert_peer(names[1]);
  const PeerWatch watch(*s.ep, peer);
  if (!json) std::fprintf(stderr, "regpool-perf server: provider %s, serving a client\n", s.provider.c_str());
  if (c.perftest) return serve_perftest(s, boot, c, peer, must(Slice::data(target), "target slice"), rx_all, ctrl_slice);

  // One-sided phases: progress until the client's end-of-phase message.
  auto serve_one_sided = [&]() {
    const regpool::Token done = post_recv_or_throw(s, ctrl_slice);
    boot.barrier(kBootTimeout);
    wait_serving(s, done, "one-sided phase");
    boot.barrier(kBootTimeout);
  };
  if (c.put) serve_one_sided();
  if (c.get) serve_one_sided();
  if (c.atomic) serve_one_sided();
  if (c.expose) {
    // The client waits in the bootstrap meanwhile: nothing is aimed at
    // either endpoint, so neither needs to progress.
    const Slice target_all = must(Slice::data(target), "target slice");
    for (const auto size : c.sizes) {
      boot.barrier(kBootTimeout);
      const Slice slice = must(target_all.select(0, size), "expose slice");
      (void)boot.allgather(encode_expose(measure_expose(s, slice, c.expose_mode, c.iters)), kBootTimeout);
    }
  }
  if (c.send) {
    for (const auto size : c.sizes) {
      const Slice in = must(rx_all.select(0, size), "receive slice");
      const Slice out = pingpong_slice(c, in, pong_all, size);
      // Latency: ping-pong, warm-up included.
      boot.barrier(kBootTimeout);
      serve_send_pingpong(s, peer, in, out, c.iters + kWarmupOps + (c.loop_mean ? c.iters : 0), c);
      // Bandwidth: keep `window` receives posted (hot: into the same bytes;
      // --cold: rotating over the slots), acknowledge the whole stream, then
      // check what landed and send the verdict.
      const auto slots = slot_slices(rx_all, size, c.used_slots(size));
      std::memset(rx_all.bytes().data(), 0, slots.size() * size);  // what a stream that moved nothing leaves
      boot.barrier(kBootTimeout);
      const std::uint64_t n = c.bw_ops(size);
      // Receives from one peer complete in posting order.
      std::vector<regpool::Token> ring(window);
      std::uint64_t posted = 0, received = 0;
      for (; posted < std::min(n, window); ++posted) {
        ring[posted % window] = post_recv_or_throw(s, slots[posted % slots.size()]);
      }
      while (received < n) {
        wait_serving(s, ring[received % window], "send stream receive");
        ++received;
        if (posted < n) {
          ring[posted % window] = post_recv_or_throw(s, slots[posted % slots.size()]);
          ++posted;
        }
      }
      // The ack ends the client's timing; the check and its verdict follow.
      (void)wait_ok(s, s.ep->send(peer, ctrl_slice), "send ack");
      const std::uint64_t verdict = first_bad_slot(rx_all, size, slots.size(), seed_of('s', size));
      std::memcpy(ctrl_slice.bytes().data(), &verdict, sizeof verdict);
      (void)wait_ok(s, s.ep->send(peer, ctrl_slice), "send verdict");
    }
  }
  if (c.tagged) serve_tagged(s, boot, c, peer, rx_all, pong_all, ctrl_slice);
  boot.barrier(kBootTimeout);
  return 0;
}

// ------------------------------------------------------------- initiator

struct Row {
  std::string op;
  std::uint64_t size = 0;
  bool has_latency = false, has_bandwidth = false;
  regpool_tools::Summary lat;
  double p99 = 0;
  // Mean of the latency samples (fi_pingpong reports means); NaN (JSON
  // null) where the samples are not here (expose: the server's summary).
  double mean = std::nan("");
  // --loop-mean (send, tagged): half the round trip of an unmarked loop,
  // timed as a whole; NaN (JSON null) otherwise.
  double loop_mean = std::nan("");
  std::uint64_t lat_iters = 0;
  double mbps = 0;    // 10^6 bytes per second
  double mops = 0;    // million operations per second
  std::uint64_t bw_ops = 0;
  bool has_registrations = false;  // expose rows
  std::uint64_t domain_registrations = 0;
  std::string error;
};

class ProgressLine {
 public:
  explicit ProgressLine(bool on) : on_(on) {}
  void show(const std::string& op, std::uint64_t size, const char* what, std::uint64_t done, std::uint64_t total) {
    if (!on_) return;
    const auto now = Clock::now();
    if (done != 0 && done != total && now - last_ < 100ms) return;
    last_ = now;
    std::fprintf(stderr, "\r\033[Kregpool-perf: %s %s %s %llu/%llu", op.c_str(), format_size(size).c_str(), what,
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total));
    std::fflush(stderr);
  }
  void done() {
    if (on_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool on_;
  Clock::time_point last_{};
};

// Back-to-back latency samples (each the time since the previous mark), as
// perftest takes them. A mark reads the CPU's counter (platform::ticks: on
// x86-64 the time-stamp counter, about 12 ns even in the Soft-RoCE guest,
// where steady_clock::now() is a system call reading an emulated HPET,
// about 1.5 us, which would be inside every sample), and the counts are
// converted with the counter's rate measured against steady_clock over the
// whole test.
// The counter's rate of the last test (reported in the JSON: perftest
// converts its counts with /proc/cpuinfo's MHz instead, which under qemu TCG
// need not be the counter's rate).
double g_ticks_per_us = 0;

class SampleTimer {
 public:
  explicit SampleTimer(std::uint64_t n) { raw_.reserve(n); }
  // The start of the first sample (and of the rate's calibration).
  void start() noexcept {
    c0_ = Clock::now();
    t0_ = prev_ = regpool::platform::ticks();
  }
  void mark() {
    const std::uint64_t t = regpool::platform::ticks();
    raw_.push_back(t - prev_);
    prev_ = t;
  }
  // The samples in microseconds, each divided by `div` (2: half round trips).
  std::vector<double> samples_us(double div) const {
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - c0_).count();
    const double per_us = us > 0 ? static_cast<double>(regpool::platform::ticks() - t0_) / us : 1.0;
    g_ticks_per_us = per_us;
    std::vector<double> v;
    v.reserve(raw_.size());
    for (const auto r : raw_) v.push_back(static_cast<double>(r) / per_us / div);
    return v;
  }

 private:
  Clock::time_point c0_{};
  std::uint64_t t0_ = 0, prev_ = 0;
  std::vector<std::uint64_t> raw_;
};

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

void set_latency(Row& r, std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  r.has_latency = true;
  r.lat_iters = samples.size();
  r.p99 = regpool_tools::quantile_sorted(samples, 0.99);
  double sum = 0;
  for (const double v : samples) sum += v;
  r.mean = samples.empty() ? std::nan("") : sum / static_cast<double>(samples.size());
  r.lat = regpool_tools::summarize(std::move(samples));
}

// Runs `post` with `window` ops in flight, `n` ops in all; returns seconds.
template <class Post>
double windowed(Side& s, std::uint64_t n, std::uint64_t window, Post post, ProgressLine& pl, const std::string& op,
                std::uint64_t size) {
  std::vector<regpool::Token> ring(window);
  const std::string what = op + " bandwidth";  // built once, not per op
  const auto t0 = Clock::now();
  std::uint64_t posted = 0, done = 0;
  for (; posted < std::min(n, window); ++posted) ring[posted % window] = post();
  while (done < n) {
    auto c = wait_watching(s, ring[done % window], what.c_str());
    if (c.status != Status::ok) op_failed(c.status, what);
    ++done;
    if (posted < n) {
      ring[posted % window] = post();
      ++posted;
    }
    pl.show(op, size, "bw", done, n);
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// windowed() with the ops posted `batch` at a time through post_batch:
// `fill(op)` describes the next operation in `op`. A new batch goes out once
// a whole batch fits in the window again (or the last, shorter one), so at
// batch 1 this is windowed() with post_batch in place of put()/get().
template <class Fill>
double windowed_batches(Side& s, std::uint64_t n, std::uint64_t window, std::uint64_t batch, Fill fill,
                        ProgressLine& pl, const std::string& op, std::uint64_t size) {
  std::vector<regpool::Token> ring(window);
  std::vector<regpool::BatchOp> ops(batch);
  const std::string what = op + " bandwidth";  // built once, not per op
  std::uint64_t posted = 0, done = 0;
  auto post = [&](std::uint64_t count) {
    for (std::uint64_t i = 0; i < count; ++i) fill(ops[i]);
    const auto part = std::span(ops).first(count);
    const std::size_t got = s.ep->post_batch(part);
    if (got != count) op_failed(part[got].status, op + " batch");
    for (std::uint64_t i = 0; i < count; ++i) ring[(posted + i) % window] = ops[i].token;
    posted += count;
  };
  const auto t0 = Clock::now();
  while (posted < std::min(n, window)) post(std::min({batch, n - posted, window - posted}));
  while (done < n) {
    auto c = wait_watching(s, ring[done % window], what.c_str());
    if (c.status != Status::ok) op_failed(c.status, what);
    ++done;
    const std::uint64_t room = window - (posted - done);
    const std::uint64_t next = std::min(batch, n - posted);
    if (next > 0 && room >= next) post(next);
    pl.show(op, size, "bw", done, n);
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Unwraps a posted token or throws (so `windowed` stores only good ones).
regpool::Token token_or_throw(regpool::Result<regpool::Token> t, const char* what) {
  if (!t) op_failed(t.status(), what);
  return *t;
}

// One iteration of the client's half of the send ping-pong: send the ping,
// post the receive for the next pong (--ahead; off: this pong's, before the
// ping), wait for the ping's completion, wait for the pong.
void ClientPingPong::round() {
  if (done_ >= rounds_) throw std::logic_error("send ping-pong: more rounds than the server serves");
  const std::uint64_t k = done_++;
  regpool::Token pong{};
  if (ahead_) {
    pong = k == 0 ? rx_[0].post() : next_;
  } else {
    pong = rx_[0].post();
  }
  auto ping = tx_.post();
  if (!ping) op_failed(ping.status(), "send");
  if (ahead_ && k + 1 < rounds_) next_ = rx_[(k + 1) % 2].post();
  (void)wait_ok(s_, *ping, "send");
  auto back = wait_watching(s_, pong, "send pong");
  if (back.status != Status::ok) op_failed(back.status, "send pong");
}

// A ping-pong's client loop (send or tagged): kWarmupOps + iters calls of
// `round`; returns the last `iters` rounds' times, halved, taken back to
// back.
template <class Round>
std::vector<double> pingpong_samples(std::uint64_t iters, Round round, ProgressLine& pl, const char* op,
                                     std::uint64_t size) {
  SampleTimer timer(iters);
  for (std::uint64_t i = 0; i < iters + kWarmupOps; ++i) {
    if (i == static_cast<std::uint64_t>(kWarmupOps)) timer.start();
    round();
    if (i >= static_cast<std::uint64_t>(kWarmupOps)) timer.mark();
    pl.show(op, size, "lat", i + 1, iters + kWarmupOps);
  }
  return timer.samples_us(2);
}

// --loop-mean: `iters` more rounds after pingpong_samples' (the server
// serves them right after the marked ones, so no warm-up), with no clock
// read inside, timed as a whole: half the mean round trip in microseconds,
// as fi_pingpong computes usec/xfer. The difference from the marked
// samples' mean is what reading the time-stamp counter each round adds.
template <class Round>
double pingpong_loop_mean(std::uint64_t iters, Round round) {
  const auto t0 = Clock::now();
  for (std::uint64_t i = 0; i < iters; ++i) round();
  return us_since(t0) / static_cast<double>(iters) / 2;
}

std::vector<double> send_pingpong(ClientPingPong& pp, std::uint64_t iters, ProgressLine& pl, std::uint64_t size) {
  return pingpong_samples(iters, [&] { pp.round(); }, pl, "send", size);
}

std::vector<Row> run_perftest_client(Side& s, regpool::TcpBootstrap& boot, const Config& c, regpool::PeerId peer,
                                     const regpool::RemoteRef& ref, ProgressLine& pl);

std::vector<Row> run_client(regpool::TcpBootstrap& boot, const Config& c, bool loopback, ProgressLine& pl,
                            std::string& provider_out, bool& emulated_atomics) {
  (void)boot.allgather(to_bytes(c.encode()), kBootTimeout);
  const BootWatch boot_watch(boot);
  Side s(c, loopback, "perf-client");
  provider_out = s.provider;
  emulated_atomics = s.emulated_atomics;
  auto names = boot.allgather(s.ep->name(), kBootTimeout);
  const auto& blob = names[0];
  if (blob.size() <= regpool::RemoteRef::kEncodedSize) {
    throw regpool::Error(Status::malformed, 0, "server blob too short");
  }
  auto ref = regpool::RemoteRef::decode({blob.data(), regpool::RemoteRef::kEncodedSize});
  if (!ref) throw regpool::Error(ref.status(), 0, std::string("server reference: ") + regpool::to_string(ref.status()));
  const auto peer = s.ep->insert_peer({blob.data() + regpool::RemoteRef::kEncodedSize,
                                       blob.size() - regpool::RemoteRef::kEncodedSize});
  const PeerWatch watch(*s.ep, peer);
  if (c.perftest) {
    auto rows = run_perftest_client(s, boot, c, peer, *ref, pl);
    provider_out += s.transport_note().empty() ? "" : " (" + s.transport_note() + ")";
    return rows;
  }
  auto buf = s.alloc(c.span());
  const Slice all = must(Slice::data(buf), "local slice");
  // Where put's check reads the target's slots back.
  auto check_buf = s.alloc(c.max_size());
  const Slice check_all = must(Slice::data(check_buf), "check slice");
  // --pingpong separate: the pongs land in bytes of their own, which the
  // program never reads, so the pings' source is never written.
  auto pong_dst = s.alloc(c.pingpongs_echo() ? 1 : c.max_size());
  const Slice pong_all = must(Slice::data(pong_dst), "pong slice");
  auto ctrl = s.alloc(kControlBytes);
  const Slice ctrl_slice = must(Slice::data(ctrl), "control slice");
  std::vector<Row> rows;

  // Runs one one-sided op over every size; a failure ends the op's sizes
  // (the endpoint may be unusable after it) but still closes the phase.
  auto one_sided = [&](const std::string& op, bool is_put) {
    boot.barrier(kBootTimeout);
    for (const auto size : c.sizes) {
      Row r;
      r.op = op;
      r.size = size;
      try {
        const Slice local = must(all.select(0, size), "local slice");
        const std::uint64_t seed = seed_of(is_put ? 'p' : 'g', size);
        const auto slots = slot_slices(all, size, c.used_slots(size));
        if (is_put) {
          // Slot 0 of the target keeps the latency test's stale pattern
          // unless the bandwidth test moves its bytes.
          fill_slots(all, size, 1, kStaleSeed);
        } else {
          // The target's slots get the pattern that the timed gets must
          // bring back (one put at a time, untimed).
          fill_slots(all, size, slots.size(), seed);
          for (std::uint64_t j = 0; j < slots.size(); ++j) {
            (void)wait_ok(s, s.ep->put(slots[j], peer, *ref, j * size), "get: pattern put");
          }
        }
        auto post = [&]() {
          return token_or_throw(is_put ? s.ep->put(local, peer, *ref, 0) : s.ep->get(peer, *ref, 0, local), op.c_str());
        };
        for (int w = 0; w < kWarmupOps; ++w) (void)wait_ok(s, post(), op.c_str());
        std::vector<double> lat;
        lat.reserve(c.iters);
        for (std::uint64_t i = 0; i < c.iters; ++i) {
          const auto t0 = Clock::now();
          (void)wait_ok(s, post(), op.c_str());
          lat.push_back(us_since(t0));
          pl.show(op, size, "lat", i + 1, c.iters);
        }
        set_latency(r, std::move(lat));
        const std::uint64_t n = c.bw_ops(size);
        // Untimed: put sends the pattern; get lands on zeros.
        if (is_put) {
          fill_slots(all, size, slots.size(), seed);
        } else {
          std::memset(all.bytes().data(), 0, slots.size() * size);
        }
        std::uint64_t k = 0;  // operation k uses slot k mod slots, local and remote alike
        auto post_slot = [&]() {
          const std::uint64_t j = k++ % slots.size();
          return token_or_throw(is_put ? s.ep->put(slots[j], peer, *ref, j * size)
                                       : s.ep->get(peer, *ref, j * size, slots[j]),
                                op.c_str());
        };
        auto fill_slot = [&](regpool::BatchOp& b) {
          const std::uint64_t j = k++ % slots.size();
          b = is_put ? regpool::BatchOp::put(slots[j], peer, *ref, j * size)
                     : regpool::BatchOp::get(peer, *ref, j * size, slots[j]);
        };
        const double secs = c.batch > 1 ? windowed_batches(s, n, c.window, c.batch, fill_slot, pl, op, size)
                                        : windowed(s, n, c.window, post_slot, pl, op, size);
        r.has_bandwidth = true;
        r.bw_ops = n;
        r.mbps = static_cast<double>(n * size) / secs / 1e6;
        r.mops = static_cast<double>(n) / secs / 1e6;
        // Untimed: put reads every target slot back; get checks its own.
        std::uint64_t bad = 0;
        if (is_put) {
          const Slice back = must(check_all.select(0, size), "check slice");
          for (std::uint64_t j = 0; j < slots.size() && bad == 0; ++j) {
            std::memset(back.bytes().data(), 0, size);
            (void)wait_ok(s, s.ep->get(peer, *ref, j * size, back), "put: read back");
            if (!regpool_tools::pattern_matches(back.bytes().data(), j * size, size, seed)) bad = j + 1;
          }
        } else {
          bad = first_bad_slot(all, size, slots.size(), seed);
        }
        if (bad != 0) r.error = bad_payload(op, size, bad, is_put ? "the server's target" : "the client's buffer");
      } catch (const std::exception& e) {
        if (!peer_lost().empty()) throw;  // the peer is gone: no later row can run
        r.error = e.what();
      }
      const bool failed = !r.error.empty();
      rows.push_back(std::move(r));
      if (failed) break;
    }
    (void)wait_ok(s, s.ep->send(peer, ctrl_slice), "end of phase");
    boot.barrier(kBootTimeout);
  };
  if (c.put) one_sided("put", true);
  if (c.get) one_sided("get", false);
  if (c.atomic) {
    boot.barrier(kBootTimeout);
    // Atomics work on one aligned 8-byte word (offset 0 of the exposed
    // data section, which the LDO layout keeps 8-byte aligned).
    auto atomic_row = [&](const std::string& op, auto post, bool bandwidth) {
      Row r;
      r.op = op;
      r.size = 8;
      try {
        for (int w = 0; w < kWarmupOps; ++w) (void)wait_ok(s, post(), op.c_str());
        std::vector<double> lat;
        for (std::uint64_t i = 0; i < c.iters; ++i) {
          const auto t0 = Clock::now();
          (void)wait_ok(s, post(), op.c_str());
          lat.push_back(us_since(t0));
          pl.show(op, 8, "lat", i + 1, c.iters);
        }
        set_latency(r, std::move(lat));
        if (bandwidth) {
          const double secs = windowed(s, c.iters, c.window, [&]() { return token_or_throw(post(), op.c_str()); }, pl, op, 8);
          r.has_bandwidth = true;
          r.bw_ops = c.iters;
          r.mbps = static_cast<double>(c.iters * 8) / secs / 1e6;
          r.mops = static_cast<double>(c.iters) / secs / 1e6;
        }
      } catch (const std::exception& e) {
        if (!peer_lost().empty()) throw;  // the peer is gone: no later row can run
        r.error = e.what();
      }
      rows.push_back(std::move(r));
    };
    atomic_row("fetch_add", [&]() { return s.ep->fetch_add(peer, *ref, 0, 1); }, true);
    std::uint64_t expected = 0;
    atomic_row("compare_swap", [&]() { return s.ep->compare_swap(peer, *ref, 0, expected, expected); }, false);
    (void)wait_ok(s, s.ep->send(peer, ctrl_slice), "end of phase");
    boot.barrier(kBootTimeout);
  }
  if (c.expose) {
    for (const auto size : c.sizes) {
      Row r;
      r.op = "expose";
      r.size = size;
      boot.barrier(kBootTimeout);
      pl.show("expose", size, "lat (server)", 0, c.iters);
      const std::uint64_t regs = s.domain->stats().registrations;
      auto got = boot.allgather({}, kBootTimeout);
      const std::uint64_t client_regs = s.domain->stats().registrations - regs;
      pl.show("expose", size, "lat (server)", c.iters, c.iters);
      auto res = decode_expose(got[0], c.iters);
      if (!res) {
        r.error = "malformed expose result from the server";
      } else if (!res->ok) {
        r.error = "server: " + res->error;
      } else {
        r.has_latency = true;
        r.lat_iters = res->iters;
        r.lat.n = res->iters;
        r.lat.median = static_cast<double>(res->median_ns) / 1e3;
        r.lat.min = static_cast<double>(res->min_ns) / 1e3;
        r.lat.max = static_cast<double>(res->max_ns) / 1e3;
        r.p99 = static_cast<double>(res->p99_ns) / 1e3;
        r.has_registrations = true;
        r.domain_registrations = res->registrations + client_regs;
      }
      rows.push_back(std::move(r));
    }
  }
  if (c.send) {
    for (const auto size : c.sizes) {
      Row r;
      r.op = "send";
      r.size = size;
      const Slice out = must(all.select(0, size), "send slice");
      const auto slots = slot_slices(all, size, c.used_slots(size));
      // Latency: ping-pong; the receive for a pong is posted before its ping
      // (with --ahead in the round before, after that round's ping) so it
      // is never unexpected. Each sample is one whole iteration (send, a
      // receive posted, the send's completion, the pong), halved, and the
      // samples are back to back, as in fi_pingpong and ucx_perftest
      // tag_lat: their mean is the loop's time / 2 / iterations
      // (fi_pingpong's usec/xfer), their median ucx_perftest's 50%ile.
      boot.barrier(kBootTimeout);
      {
        const Slice in = pingpong_slice(c, out, pong_all, size);
        ClientPingPong pp(s, peer, in, out, c, c.iters + kWarmupOps + (c.loop_mean ? c.iters : 0));
        set_latency(r, send_pingpong(pp, c.iters, pl, size));
        if (c.loop_mean) r.loop_mean = pingpong_loop_mean(c.iters, [&] { pp.round(); });
      }
      // Bandwidth: a stream of the pattern (message k from slot k mod
      // slots, received into the server's slot of that number) closed by
      // the server's ack; then, untimed, the server's verdict on what landed
      // (both receives posted first; receives from one peer complete in
      // posting order).
      fill_slots(all, size, slots.size(), seed_of('s', size));
      boot.barrier(kBootTimeout);
      const std::uint64_t n = c.bw_ops(size);
      auto ack = token_or_throw(s.ep->post_recv(ctrl_slice), "post_recv ack");
      const Slice verdict_slice = must(check_all.select(0, kControlBytes), "verdict slice");
      auto verdict = token_or_throw(s.ep->post_recv(verdict_slice), "post_recv verdict");
      std::uint64_t k = 0;
      const auto t0 = Clock::now();
      (void)windowed(
          s, n, c.window, [&]() { return token_or_throw(s.ep->send(peer, slots[k++ % slots.size()]), "send"); }, pl,
          "send", size);
      auto a = wait_watching(s, ack, "send ack");
      if (a.status != Status::ok) op_failed(a.status, "send ack");
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      auto v = wait_watching(s, verdict, "send verdict");
      if (v.status != Status::ok) op_failed(v.status, "send verdict");
      std::uint64_t bad = 0;
      std::memcpy(&bad, verdict_slice.bytes().data(), sizeof bad);
      if (bad != 0) r.error = bad_payload("send", size, bad, "the server's receive buffer");
      r.has_bandwidth = true;
      r.bw_ops = n;
      r.mbps = static_cast<double>(n * size) / secs / 1e6;
      r.mops = static_cast<double>(n) / secs / 1e6;
      rows.push_back(std::move(r));
    }
  }
  if (c.tagged) {
    regpool::Messenger m(*s.ep, *s.pool, tagged_config(c));
    boot.barrier(kBootTimeout);
    for (const auto size : c.sizes) {
      Row r;
      r.op = "tagged";
      r.size = size;
      const Slice out = must(all.select(0, size), "send slice");
      boot.barrier(kBootTimeout);
      // One iteration: the ping, a pong's receive (this pong's, before the
      // ping, with --ahead off), the ping's completion, the pong. A pong's
      // receive is always posted before its ping: never unexpected. Timed
      // back to back, receive included, as the send ping-pong and
      // ucx_perftest's tag_lat are.
      // --ahead: as the send ping-pong (ClientPingPong), the receive for
      // the next pong posted after this round's ping, none after the last.
      const std::uint64_t rounds = c.iters + kWarmupOps + (c.loop_mean ? c.iters : 0);
      std::uint64_t rounds_done = 0;
      regpool::MessageToken next{};
      const Slice in = pingpong_slice(c, out, pong_all, size);
      auto pong_receive = [&]() {
        auto t = tagged_recv(m, c, peer, 2, in);
        if (!t) op_failed(t.status(), "tagged pong receive");
        return *t;
      };
      auto round = [&]() {
        if (rounds_done >= rounds) throw std::logic_error("tagged ping-pong: more rounds than the server serves");
        const std::uint64_t k = rounds_done++;
        const regpool::MessageToken back = !c.recv_ahead || k == 0 ? pong_receive() : next;
        const auto sent = m.send(peer, 1, out);
        if (!sent) op_failed(sent.status(), "tagged send");
        if (c.recv_ahead && k + 1 < rounds) next = pong_receive();
        (void)mwait(m, sent, "tagged send");
        (void)mwait(m, back, "tagged pong");
      };
      set_latency(r, pingpong_samples(c.iters, round, pl, "tagged", size));
      if (c.loop_mean) r.loop_mean = pingpong_loop_mean(c.iters, round);
      boot.barrier(kBootTimeout);
      const std::uint64_t n = c.bw_ops(size);
      auto ack = m.recv(peer, 3, 0, ctrl_slice);
      std::vector<regpool::MessageToken> ring(c.window);
      const auto t0 = Clock::now();
      std::uint64_t posted = 0, done = 0;
      auto post = [&]() {
        auto t = m.send(peer, 1, out);
        if (!t) op_failed(t.status(), "tagged stream send");
        ring[posted % c.window] = *t;
        ++posted;
      };
      while (posted < std::min(n, c.window)) post();
      while (done < n) {
        (void)mwait(m, ring[done % c.window], "tagged stream send");
        ++done;
        if (posted < n) post();
        pl.show("tagged", size, "bw", done, n);
      }
      (void)mwait(m, ack, "tagged ack");
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      r.has_bandwidth = true;
      r.bw_ops = n;
      r.mbps = static_cast<double>(n * size) / secs / 1e6;
      r.mops = static_cast<double>(n) / secs / 1e6;
      rows.push_back(std::move(r));
    }
  }
  if (c.memcpy) {
    // The reference for shm, whose large transfers are one kernel copy
    // (process_vm_writev/readv) between the two processes' buffers: a plain
    // memcpy in this process over the same slots, hot or cold alike.
    auto dst_buf = s.alloc(c.span());
    const Slice dst_all = must(Slice::data(dst_buf), "memcpy slice");
    for (const auto size : c.sizes) {
      Row r;
      r.op = "memcpy";
      r.size = size;
      const std::uint64_t n = c.bw_ops(size), count = c.used_slots(size);
      const std::uint64_t seed = seed_of('m', size);
      fill_slots(all, size, count, seed);
      std::memset(dst_all.bytes().data(), 0, count * size);
      std::byte* const src = all.bytes().data();
      std::byte* const dst = dst_all.bytes().data();
      const auto t0 = Clock::now();
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint64_t off = (i % count) * size;
        std::memcpy(dst + off, src + off, size);
        if ((i & 63) == 63) pl.show("memcpy", size, "bw", i + 1, n);
      }
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      r.has_bandwidth = true;
      r.bw_ops = n;
      r.mbps = static_cast<double>(n * size) / secs / 1e6;
      r.mops = static_cast<double>(n) / secs / 1e6;
      if (const std::uint64_t bad = first_bad_slot(dst_all, size, count, seed); bad != 0) {
        r.error = bad_payload("memcpy", size, bad, "the destination");
      }
      rows.push_back(std::move(r));
    }
  }
  boot.barrier(kBootTimeout);
  provider_out += s.transport_note().empty() ? "" : " (" + s.transport_note() + ")";
  return rows;
}

// ----------------------------------------------------------- --perftest
// Latency with perftest's definitions (ib_write_lat, ib_read_lat,
// ib_send_lat; docs/tools.md), after a connection round (one put, which
// on verbs also runs the RC handshake while the server progresses):
//  put   a write ping-pong: the client writes `size` bytes into the server's
//        object and waits for the write's completion, the server sees the
//        last byte change in its own memory (polling memory, not a
//        completion queue), writes back into the client's object, and the
//        client sees its last byte change; a sample is half of one
//        iteration, iterations back to back.
//  get   one read and its completion, not halved (ib_read_lat).
//  send  a send ping-pong (send_pingpong / serve_send_pingpong), halved.
// Every test runs kWarmupOps untimed iterations, then --iters timed ones.
// A memory poll checks the peer's liveness every kMemPollCheck rounds; it
// progresses the endpoint only where the provider needs the target's
// progress for a write to land (libfabric); on verbs the device writes the
// memory by itself, as perftest relies on.
constexpr std::uint64_t kMemPollCheck = std::uint64_t{1} << 16;

// The value iteration i writes into the last byte (never 0, the initial
// value, and never the previous iteration's).
std::uint8_t pingpong_mark(std::uint64_t i) { return static_cast<std::uint8_t>(i % 255 + 1); }

void poll_memory(Side& s, const std::byte* at, std::uint8_t want, bool progress, const char* what) {
  Clock::time_point deadline{};  // read only on the slow path (see wait_watching)
  for (std::uint64_t n = 1;; ++n) {
    if (static_cast<std::uint8_t>(*static_cast<const volatile std::byte*>(at)) == want) break;
    if (progress) (void)s.ep->progress();
    if (n % kMemPollCheck == 0) {
      check_peer_alive(what);
      const auto now = Clock::now();
      if (deadline == Clock::time_point{}) deadline = now + kPhaseTimeout;
      if (now > deadline) throw regpool::Error(Status::timeout, 0, std::string(what) + ": " + g_peer_label + " silent");
    }
  }
  std::atomic_thread_fence(std::memory_order_acquire);  // the bytes before the last one
}

// One side of the write ping-pong. The client (first = true) writes first.
std::vector<double> write_pingpong(Side& s, regpool::PeerId peer, const regpool::RemoteRef& ref, const Slice& out,
                                   const Slice& in, bool first, std::uint64_t iters, bool progress, bool kept,
                                   ProgressLine* pl) {
  RepeatedOp op(s, kept);
  const std::uint64_t size = out.length();
  std::byte* const mark_out = out.bytes().data() + size - 1;
  const std::byte* const mark_in = in.bytes().data() + size - 1;
  SampleTimer timer(iters);
  for (std::uint64_t i = 0; i < iters + kWarmupOps; ++i) {
    if (!first) poll_memory(s, mark_in, pingpong_mark(i), progress, "write ping-pong");
    if (first && i == static_cast<std::uint64_t>(kWarmupOps)) timer.start();
    *mark_out = static_cast<std::byte>(pingpong_mark(i));
    (void)wait_ok(s,
                  op.post([&] { return s.ep->put(out, peer, ref, 0); },
                          [&] { return s.ep->put_kept(out, peer, ref, 0); }),
                  "write ping-pong put");
    if (!first) continue;
    poll_memory(s, mark_in, pingpong_mark(i), progress, "write ping-pong");
    if (i >= static_cast<std::uint64_t>(kWarmupOps)) timer.mark();
    if (pl) pl->show("put", size, "lat", i + 1, iters + kWarmupOps);
  }
  return timer.samples_us(2);
}

// Needs the target's progress for one-sided operations to land.
bool target_must_progress(const Config& c) { return !is_verbs(c.provider); }

// The server's side: the client's object for the write ping-pong comes
// over the bootstrap. `target` is the exposed object the client writes
// into and reads from; `rx_all` the object pongs and replies go from.
int serve_perftest(Side& s, regpool::TcpBootstrap& boot, const Config& c, regpool::PeerId peer, const Slice& target,
                   const Slice& rx_all, const Slice& ctrl_slice) {
  auto refs = boot.allgather({}, kBootTimeout);
  auto client_ref = regpool::RemoteRef::decode(refs[1]);
  if (!client_ref) throw regpool::Error(client_ref.status(), 0, "client reference");
  const bool progress = target_must_progress(c);
  // The connection round: progress until the client's end-of-phase send.
  {
    const regpool::Token done = post_recv_or_throw(s, ctrl_slice);
    boot.barrier(kBootTimeout);
    wait_serving(s, done, "connection round");
  }
  if (c.put) {
    for (const auto size : c.sizes) {
      const Slice in = must(target.select(0, size), "write ping-pong target");
      const Slice out = must(rx_all.select(0, size), "write ping-pong source");
      std::memset(in.bytes().data(), 0, size);
      boot.barrier(kBootTimeout);
      (void)write_pingpong(s, peer, *client_ref, out, in, false, c.iters, progress, c.rma_kept, nullptr);
      boot.barrier(kBootTimeout);
    }
  }
  if (c.get) {
    for (std::size_t k = 0; k < c.sizes.size(); ++k) {
      if (progress) {
        const regpool::Token done = post_recv_or_throw(s, ctrl_slice);
        boot.barrier(kBootTimeout);
        wait_serving(s, done, "read latency");
      } else {
        // Verbs: reads need nothing from the target's CPU; wait in the
        // bootstrap, as ib_read_lat's server waits on its socket.
        boot.barrier(kBootTimeout);
      }
      boot.barrier(kBootTimeout);
    }
  }
  if (c.send) {
    for (const auto size : c.sizes) {
      const Slice in = must(target.select(0, size), "receive slice");
      const Slice out = must(rx_all.select(0, size), "reply slice");
      boot.barrier(kBootTimeout);
      serve_send_pingpong(s, peer, in, out, c.iters + kWarmupOps, c);
      boot.barrier(kBootTimeout);
    }
  }
  boot.barrier(kBootTimeout);
  return 0;
}

std::vector<Row> run_perftest_client(Side& s, regpool::TcpBootstrap& boot, const Config& c, regpool::PeerId peer,
                                     const regpool::RemoteRef& ref, ProgressLine& pl) {
  auto out_buf = s.alloc(c.max_size());
  auto in_buf = s.alloc(c.max_size());
  const Slice out_all = must(Slice::data(out_buf), "source slice");
  const Slice in_all = must(Slice::data(in_buf), "pong slice");
  auto mine = s.ep->expose(in_all, regpool::RemoteAccess::read_write);
  if (!mine) throw regpool::Error(mine.status(), 0, "expose the pong object");
  const auto my_ref = mine->encode();
  (void)boot.allgather(std::vector<std::byte>(my_ref.begin(), my_ref.end()), kBootTimeout);
  const bool progress = target_must_progress(c);
  auto ctrl = s.alloc(kControlBytes);
  const Slice ctrl_slice = must(Slice::data(ctrl), "control slice");
  boot.barrier(kBootTimeout);
  (void)wait_ok(s, s.ep->put(must(out_all.select(0, 8), "connection put"), peer, ref, 0), "connection put");
  (void)wait_ok(s, s.ep->send(peer, ctrl_slice), "end of connection round");
  std::vector<Row> rows;
  auto row = [&](const char* op, std::uint64_t size, auto&& measure) {
    Row r;
    r.op = op;
    r.size = size;
    try {
      set_latency(r, measure());
    } catch (const std::exception& e) {
      if (!peer_lost().empty()) throw;
      r.error = e.what();
    }
    rows.push_back(std::move(r));
  };
  if (c.put) {
    for (const auto size : c.sizes) {
      const Slice out = must(out_all.select(0, size), "write ping-pong source");
      const Slice in = must(in_all.select(0, size), "write ping-pong target");
      std::memset(in.bytes().data(), 0, size);
      boot.barrier(kBootTimeout);
      row("put", size, [&] { return write_pingpong(s, peer, ref, out, in, true, c.iters, progress, c.rma_kept, &pl); });
      boot.barrier(kBootTimeout);
    }
  }
  if (c.get) {
    for (const auto size : c.sizes) {
      const Slice local = must(in_all.select(0, size), "read slice");
      boot.barrier(kBootTimeout);
      row("get", size, [&] {
        // Back to back: the read, its completion and the loop's own cost,
        // as ib_read_lat's samples (one counter read per iteration).
        SampleTimer timer(c.iters);
        RepeatedOp op(s, c.rma_kept);
        for (std::uint64_t i = 0; i < c.iters + kWarmupOps; ++i) {
          if (i == static_cast<std::uint64_t>(kWarmupOps)) timer.start();
          (void)wait_ok(s, op.post([&] { return s.ep->get(peer, ref, 0, local); },
                                   [&] { return s.ep->get_kept(peer, ref, 0, local); }),
                        "get");
          if (i >= static_cast<std::uint64_t>(kWarmupOps)) timer.mark();
          pl.show("get", size, "lat", i + 1, c.iters + kWarmupOps);
        }
        return timer.samples_us(1);
      });
      if (progress) (void)wait_ok(s, s.ep->send(peer, ctrl_slice), "end of read latency");
      boot.barrier(kBootTimeout);
    }
  }
  if (c.send) {
    for (const auto size : c.sizes) {
      const Slice out = must(out_all.select(0, size), "send slice");
      const Slice in = must(in_all.select(0, size), "pong slice");
      boot.barrier(kBootTimeout);
      row("send", size, [&] {
        ClientPingPong pp(s, peer, in, out, c, c.iters + kWarmupOps);
        return send_pingpong(pp, c.iters, pl, size);
      });
      boot.barrier(kBootTimeout);
    }
  }
  boot.barrier(kBootTimeout);
  return rows;
}

// ------------------------------------------------------------ --peers
// One server and N client processes per round (issue 14: memory per peer).
// Every client streams --iters Messenger tagged messages of each size to the
// server (--window in flight); the server keeps kPeersServerRecvs receives
// from any peer posted, and reports per size the aggregate message rate
// (all messages / its time from the start barrier to the last arrival),
// the registered memory it held for receiving at its peak (the Messenger's
// bounce LDOs plus unexpected messages, MessengerStats), and the growth of
// its resident memory from before the peers were inserted to the end of the
// round (the provider's per-peer state: connections, queues; plus any pool
// growth). The parent process only forks and collects: it never opens
// libfabric, so every round starts from fresh processes.
constexpr std::uint64_t kPeersServerRecvs = 64;

struct PeersRow {
  std::uint64_t peers = 0, size = 0, messages = 0;
  double seconds = 0;
  std::uint64_t receive_memory_bytes = 0;   // peak of bounces + unexpected
  std::uint64_t receive_buffer_bytes = 0;   // bounces alone (peak)
  std::uint64_t unexpected_peak_bytes = 0;  // unexpected alone (peak)
  std::int64_t endpoint_memory_bytes = 0;   // server RSS growth over the round
  bool has_endpoint_memory = false;
  double server_cpu_seconds = 0;            // the server's user + system time in the timed loop
  std::int64_t queue_pairs = -1;            // verbs: the server's RC queue pairs at the end (-1: not verbs)
  std::string error;
};

double cpu_seconds() {
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

std::int64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long total = 0, rss = 0;
  const int n = std::fscanf(f, "%lld %lld", &total, &rss);
  std::fclose(f);
  return n == 2 ? rss * ::sysconf(_SC_PAGESIZE) : -1;
}

// Waits for a Messenger operation in 100 ms slices, checking the bootstrap
// connections (a dead process ends the round at once).
// The Messenger's counters, for the message of a round that failed.
std::string messenger_state(const regpool::Messenger& m) {
  const auto st = m.stats();
  return "messenger: received " + std::to_string(st.received) + ", unexpected held " +
         std::to_string(st.unexpected_held) + ", rejected " + std::to_string(st.rejected) + ", credit stalls " +
         std::to_string(st.credit_stalls) + ", credits withheld " + std::to_string(st.credits_withheld);
}

regpool::MessageCompletion peers_wait(regpool::Messenger& m, const regpool::TcpBootstrap& boot,
                                      regpool::MessageToken t, const char* what) {
  const auto deadline = Clock::now() + kPeersTimeout;
  for (;;) {
    auto c = m.wait(t, 100ms);
    if (c.status == Status::ok) return c;
    if (c.status != Status::in_progress) op_failed(c.status, what + (" (" + messenger_state(m) + ")"));
    if (const std::string lost = boot.lost_peer(); !lost.empty()) {
      throw regpool::Error(Status::peer_unreachable, 0,
                           std::string(what) + ": a process is gone (bootstrap " + lost + "; " + messenger_state(m) + ")");
    }
    if (Clock::now() > deadline) {
      throw regpool::Error(Status::timeout, 0, std::string(what) + ": no progress (" + messenger_state(m) + ")");
    }
  }
}

constexpr auto kPeersBoot = std::chrono::duration_cast<std::chrono::milliseconds>(kPeersTimeout);
// Setup (bootstrap admission, opening N+1 endpoints, the name exchange)
// scales with the processes sharing the cores: a tcp endpoint takes about
// 0.35 s of CPU to open, and 64 of them on 2 loaded cores outlasted 60 s.
std::chrono::milliseconds peers_setup_timeout(std::uint64_t n) {
  return kPeersBoot + std::chrono::milliseconds(5000) * static_cast<std::int64_t>(n);
}

// Rank 0. Writes one line per size to `out`: "row SIZE MESSAGES NS RECVMEM
// BOUNCES UNEXPECTED RSSDELTA CPUNS QPS" (QPS: verbs RC queue pairs, else -1).
void peers_server(const Config& c, regpool::TcpBootstrap& boot, std::FILE* out) {
  const std::uint64_t n = static_cast<std::uint64_t>(boot.size() - 1);
  Side s(c, true, "perf-peers-server", true);
  regpool::MessengerConfig mc = tagged_config(c);
  mc.max_peers = std::max<std::size_t>(mc.max_peers, n + 1);
  regpool::Messenger m(*s.ep, *s.pool, mc);
  auto rx = s.alloc(c.max_size());
  const Slice rx_all = must(Slice::data(rx), "receive slice");
  const std::int64_t rss0 = resident_bytes();
  const auto name = s.ep->name();
  auto names = boot.allgather(std::vector<std::byte>(name.begin(), name.end()), peers_setup_timeout(n));
  for (std::uint64_t r = 1; r <= n; ++r) (void)s.ep->insert_peer(names[r]);
  boot.barrier(peers_setup_timeout(n));  // every Messenger has its receives posted, every peer is inserted
  for (const auto size : c.sizes) {
    const Slice in = must(rx_all.select(0, size), "receive slice");
    const std::uint64_t total = n * c.iters;
    const std::uint64_t depth = std::min(total, kPeersServerRecvs);
    std::vector<regpool::MessageToken> ring(depth);
    std::uint64_t posted = 0, received = 0;
    std::uint64_t peak = 0, peak_bounces = 0, peak_unexpected = 0;
    auto sample = [&]() {
      const auto st = m.stats();
      peak = std::max(peak, st.receive_buffer_bytes + st.unexpected_bytes);
      peak_bounces = std::max(peak_bounces, st.receive_buffer_bytes);
      peak_unexpected = std::max(peak_unexpected, st.unexpected_bytes);
    };
    auto post = [&]() {
      auto t = m.recv(regpool::kAnyPeer, 1, 0, in);
      if (!t) op_failed(t.status(), "peers receive");
      ring[posted % depth] = *t;
      ++posted;
    };
    while (posted < depth) post();
    boot.barrier(kPeersBoot);  // start
    const auto t0 = Clock::now();
    const double cpu0 = cpu_seconds();
    while (received < total) {
      (void)peers_wait(m, boot, ring[received % depth], "peers receive");
      ++received;
      if (posted < total) post();
      if ((received & 63) == 0) sample();
    }
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    const auto cpu_ns = static_cast<long long>((cpu_seconds() - cpu0) * 1e9);
    sample();
    boot.barrier(kPeersBoot);  // every client's sends completed
    const std::int64_t rss1 = resident_bytes();
    long long qps = -1;
#if PERF_HAVE_VERBS
    // Made on first use: one per client that sent, none per peer merely inserted.
    if (const auto* v = dynamic_cast<const regpool::VerbsEndpoint*>(s.ep.get())) {
      qps = static_cast<long long>(v->connection_stats().queue_pairs);
    }
#endif
    std::fprintf(out, "row %llu %llu %lld %llu %llu %llu %lld %lld %lld\n", static_cast<unsigned long long>(size),
                 static_cast<unsigned long long>(total), static_cast<long long>(ns),
                 static_cast<unsigned long long>(peak), static_cast<unsigned long long>(peak_bounces),
                 static_cast<unsigned long long>(peak_unexpected),
                 static_cast<long long>(rss0 >= 0 && rss1 >= 0 ? rss1 - rss0 : INT64_MIN), cpu_ns, qps);
    std::fflush(out);
  }
  boot.barrier(kPeersBoot);  // nobody tears down while another still sends
}

// Ranks 1..N.
void peers_client(const Config& c, regpool::TcpBootstrap& boot) {
  Side s(c, true, "perf-peers-client", true);
  regpool::Messenger m(*s.ep, *s.pool, tagged_config(c));
  auto tx = s.alloc(c.max_size());
  const Slice tx_all = must(Slice::data(tx), "send slice");
  const auto name = s.ep->name();
  auto names = boot.allgather(std::vector<std::byte>(name.begin(), name.end()),
                              peers_setup_timeout(static_cast<std::uint64_t>(boot.size() - 1)));
  const auto server = s.ep->insert_peer(names[0]);
  boot.barrier(peers_setup_timeout(static_cast<std::uint64_t>(boot.size() - 1)));
  for (const auto size : c.sizes) {
    const Slice out = must(tx_all.select(0, size), "send slice");
    std::vector<regpool::MessageToken> ring(c.window);
    std::uint64_t posted = 0, done = 0;
    auto post = [&]() {
      auto t = m.send(server, 1, out);
      if (!t) op_failed(t.status(), "peers send");
      ring[posted % c.window] = *t;
      ++posted;
    };
    boot.barrier(kPeersBoot);  // start
    while (posted < std::min(c.iters, c.window)) post();
    while (done < c.iters) {
      (void)peers_wait(m, boot, ring[done % c.window], "peers send");
      ++done;
      if (posted < c.iters) post();
    }
    boot.barrier(kPeersBoot);
  }
  boot.barrier(kPeersBoot);
}

// Runs `body` in a forked child with its exit code as the result: 0, or 1
// after printing what failed.
template <class F>
pid_t fork_child(const char* who, F&& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw regpool::Error(Status::transport_error, errno, "fork");
  if (pid > 0) return pid;
  ::alarm(3600);
  int rc = 1;
  try {
    body();
    rc = 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "regpool-perf %s (pid %d): %s\n", who, static_cast<int>(::getpid()), e.what());
  }
  std::fflush(nullptr);
  ::_exit(rc);
}

// One round: fork the server (rank 0, which picks a free port and says it
// through a pipe), then n clients; collect the server's rows.
std::vector<PeersRow> peers_round(const Config& c, std::uint64_t n) {
  int fds[2];
  if (::pipe(fds) != 0) throw regpool::Error(Status::transport_error, errno, "pipe");
  const int size = static_cast<int>(n + 1);
  const pid_t server = fork_child("peers server", [&]() {
    ::close(fds[0]);
    regpool::TcpBootstrapConfig bc;
    bc.rank = 0;
    bc.size = size;
    bc.connect_timeout = peers_setup_timeout(n);
    regpool::TcpBootstrap boot(bc);
    std::FILE* out = ::fdopen(fds[1], "w");
    if (!out) throw regpool::Error(Status::transport_error, errno, "fdopen");
    std::fprintf(out, "port %u\n", boot.port());
    std::fflush(out);
    g_peer_label = "a client";
    peers_server(c, boot, out);
    std::fclose(out);
  });
  ::close(fds[1]);
  std::FILE* in = ::fdopen(fds[0], "r");
  std::vector<pid_t> clients;
  std::vector<PeersRow> rows;
  std::string error;
  unsigned port = 0;
  char line[256];
  if (!in || !std::fgets(line, sizeof line, in) || std::sscanf(line, "port %u", &port) != 1 || port == 0) {
    error = "the server process did not start";
  } else {
    for (std::uint64_t r = 1; r <= n; ++r) {
      clients.push_back(fork_child("peers client", [&]() {
        if (in) std::fclose(in);
        regpool::TcpBootstrapConfig bc;
        bc.rank = static_cast<int>(r);
        bc.size = size;
        bc.port = static_cast<std::uint16_t>(port);
        bc.connect_timeout = peers_setup_timeout(n);
        regpool::TcpBootstrap boot(bc);
        g_peer_label = "the server";
        peers_client(c, boot);
      }));
    }
    while (std::fgets(line, sizeof line, in)) {
      unsigned long long sz = 0, msgs = 0, peak = 0, bounces = 0, unexp = 0;
      long long ns = 0, rss = 0, cpu_ns = 0, qps = -1;
      if (std::sscanf(line, "row %llu %llu %lld %llu %llu %llu %lld %lld %lld", &sz, &msgs, &ns, &peak, &bounces,
                      &unexp, &rss, &cpu_ns, &qps) != 9) {
        continue;
      }
      PeersRow row;
      row.peers = n;
      row.size = sz;
      row.messages = msgs;
      row.seconds = static_cast<double>(ns) / 1e9;
      row.receive_memory_bytes = peak;
      row.receive_buffer_bytes = bounces;
      row.unexpected_peak_bytes = unexp;
      row.has_endpoint_memory = rss != INT64_MIN;
      row.endpoint_memory_bytes = rss;
      row.server_cpu_seconds = static_cast<double>(cpu_ns) / 1e9;
      row.queue_pairs = qps;
      rows.push_back(row);
    }
  }
  if (in) std::fclose(in);
  // The server's verdict first: if it failed, clients waiting for it are
  // stopped (they would otherwise wait out their bootstrap timeout).
  int st = 0;
  ::waitpid(server, &st, 0);
  const bool server_ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  if (!server_ok) {
    for (const pid_t p : clients) ::kill(p, SIGKILL);
    if (error.empty()) error = "the server process failed";
  }
  std::uint64_t failed_clients = 0;
  std::string how;
  for (const pid_t p : clients) {
    int cs = 0;
    ::waitpid(p, &cs, 0);
    if (WIFEXITED(cs) && WEXITSTATUS(cs) == 0) continue;
    ++failed_clients;
    if (how.empty() && WIFSIGNALED(cs)) how = " (one killed by signal " + std::to_string(WTERMSIG(cs)) + ")";
  }
  if (!server_ok && WIFSIGNALED(st)) error += " (killed by signal " + std::to_string(WTERMSIG(st)) + ")";
  if (server_ok && failed_clients > 0) error = std::to_string(failed_clients) + " client process(es) failed" + how;
  if (!server_ok && !how.empty()) error += "; a client" + how.substr(5, how.size() - 6);
  if (rows.size() != c.sizes.size() && error.empty()) error = "the server reported no result";
  if (!error.empty()) {
    // Sizes without a row get one carrying the error.
    for (const auto size : c.sizes) {
      if (std::none_of(rows.begin(), rows.end(), [&](const PeersRow& r) { return r.size == size; })) {
        PeersRow row;
        row.peers = n;
        row.size = size;
        rows.push_back(row);
      }
    }
    for (auto& r : rows) r.error = error;
  }
  return rows;
}

int peers_main(const Options& o) {
  const Config& c = o.config;
  ::setenv("FI_TCP_IFACE", "lo", 0);
  std::vector<PeersRow> rows;
  std::string provider = c.provider;
  for (const auto n : o.peers) {
    if (!o.json) std::fprintf(stderr, "regpool-perf --peers: %llu clients...\n", static_cast<unsigned long long>(n));
    auto r = peers_round(c, n);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  const bool failed = std::any_of(rows.begin(), rows.end(), [](const PeersRow& r) { return !r.error.empty(); });
  auto rate = [](const PeersRow& r) { return r.seconds > 0 ? static_cast<double>(r.messages) / r.seconds / 1e6 : 0.0; };
  if (o.json) {
    std::string s = "{\"tool\":\"regpool-perf\",\"version\":" + json_escape(REGPOOL_VERSION);
    s += ",\"mode\":\"peers\",\"provider\":" + json_escape(provider);
    s += ",\"iters\":" + std::to_string(c.iters) + ",\"window\":" + std::to_string(c.window);
    s += ",\"wait\":" + json_escape(regpool::to_string(c.wait));
    s += ",\"server_receives\":" + std::to_string(kPeersServerRecvs);
    s += ",\"units\":{\"memory\":\"bytes\",\"rate\":\"Mops/s (messages received by the server)\"}";
    s += ",\"results\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const PeersRow& r = rows[i];
      if (i) s += ",";
      s += "{\"peers\":" + std::to_string(r.peers) + ",\"size\":" + std::to_string(r.size);
      s += ",\"messages\":" + std::to_string(r.messages) + ",\"seconds\":" + json_number(r.seconds);
      s += ",\"rate_Mops\":" + (r.error.empty() ? json_number(rate(r)) : std::string("null"));
      // The server's CPU time per message: flat with N means a falling rate
      // comes from sharing the cores, not from work per peer.
      s += ",\"server_cpu_us_per_message\":" +
           (r.error.empty() && r.messages ? json_number(r.server_cpu_seconds * 1e6 / static_cast<double>(r.messages))
                                          : std::string("null"));
      s += ",\"receive_memory_bytes\":" + std::to_string(r.receive_memory_bytes);
      s += ",\"receive_buffer_bytes\":" + std::to_string(r.receive_buffer_bytes);
      s += ",\"unexpected_peak_bytes\":" + std::to_string(r.unexpected_peak_bytes);
      s += ",\"endpoint_memory_bytes\":" +
           (r.has_endpoint_memory ? std::to_string(r.endpoint_memory_bytes) : std::string("null"));
      s += ",\"queue_pairs\":" + (r.queue_pairs >= 0 ? std::to_string(r.queue_pairs) : std::string("null"));
      s += ",\"error\":" + (r.error.empty() ? std::string("null") : json_escape(r.error)) + "}";
    }
    s += "]}\n";
    std::fputs(s.c_str(), stdout);
  } else {
    std::printf("regpool-perf --peers: provider %s, %llu messages per client and size, window %llu, wait %s\n",
                provider.c_str(), static_cast<unsigned long long>(c.iters),
                static_cast<unsigned long long>(c.window), regpool::to_string(c.wait));
    std::printf("%6s %10s %10s %12s %14s %14s %14s\n", "peers", "size", "messages", "rate Mops/s", "recv mem",
                "unexpected", "endpoint mem");
    for (const PeersRow& r : rows) {
      std::printf("%6llu %10s %10llu %12.4f %14s %14s %14s", static_cast<unsigned long long>(r.peers),
                  format_size(r.size).c_str(), static_cast<unsigned long long>(r.messages), rate(r),
                  format_size(r.receive_memory_bytes).c_str(), format_size(r.unexpected_peak_bytes).c_str(),
                  r.has_endpoint_memory
                      ? (r.endpoint_memory_bytes < 0 ? "-" + format_size(static_cast<std::uint64_t>(-r.endpoint_memory_bytes))
                                                     : format_size(static_cast<std::uint64_t>(r.endpoint_memory_bytes)))
                            .c_str()
                      : "-");
      if (!r.error.empty()) std::printf("  error: %s", r.error.c_str());
      std::printf("\n");
    }
  }
  std::fflush(stdout);
  return failed ? 1 : 0;
}

void print_rows(const Options& o, const std::string& provider, bool emulated_atomics, const std::vector<Row>& rows) {
  const Config& c = o.config;
  if (o.json) {
    std::string s = "{\"tool\":\"regpool-perf\",\"version\":" + json_escape(REGPOOL_VERSION);
    s += ",\"provider\":" + json_escape(provider);
    s += ",\"mode\":" + json_escape(o.mode == Mode::loopback ? "loopback" : "client");
    s += ",\"iters\":" + std::to_string(c.iters) + ",\"window\":" + std::to_string(c.window);
    s += ",\"batch\":" + std::to_string(c.batch);
    s += ",\"wait\":" + json_escape(regpool::to_string(c.wait));
    s += ",\"emulated_atomics\":" + std::string(emulated_atomics ? "true" : "false");
    s += ",\"latency_definitions\":" + json_escape(c.perftest ? "perftest" : "regpool");
    s += ",\"receives\":" + json_escape(c.recv_kept ? "kept" : "fresh");
    s += ",\"sends\":" + json_escape(c.send_kept ? "kept" : "fresh");
    s += ",\"receives_ahead\":" + std::string(c.recv_ahead ? "true" : "false");
    s += ",\"pingpong\":" + json_escape(c.pingpongs_echo() ? "echo" : "separate");
    s += ",\"rma\":" + json_escape(c.rma_kept ? "kept" : "fresh");
    s += ",\"shm_rings\":" + std::string(c.shm_rings ? "true" : "false");
    s += ",\"shm_ring_copy_max\":" + std::to_string(c.shm_ring_copy_max);
    s += ",\"shm_ring_adaptive\":" + std::string(c.shm_ring_adaptive ? "true" : "false");
    s += ",\"messenger\":" + json_escape(c.messenger_serialized ? "serialized" : "locked");
    s += ",\"tagged_recv\":" + json_escape(c.tagged_recv_ldo ? "ldo" : "copy");
    // MessengerConfig::eager_gather, eager_copy and rendezvous_choice as given: 0 the default,
    // null never.
    auto size_or_never = [](std::uint64_t v) {
      return v == ~std::uint64_t{0} ? std::string("null") : std::to_string(v);
    };
    s += ",\"tagged_gather\":" + size_or_never(c.tagged_gather);
    s += ",\"tagged_gather_max\":" + size_or_never(c.tagged_gather_max);
    s += ",\"tagged_copy\":" + size_or_never(c.tagged_copy);
    s += ",\"tagged_choice\":" + size_or_never(c.tagged_choice);
    s += ",\"sample_ticks_per_us\":" + (g_ticks_per_us > 0 ? json_number(g_ticks_per_us) : std::string("null"));
    s += ",\"expose_mode\":" + json_escape(regpool::to_string(c.expose_mode));
    s += ",\"buffers\":" + json_escape(c.cold_bytes != 0 ? "cold" : "hot") +
         ",\"cold_bytes\":" + (c.cold_bytes != 0 ? std::to_string(c.cold_bytes) : std::string("null"));
    s += ",\"units\":{\"latency\":\"microseconds\",\"bandwidth\":\"MB/s (10^6 bytes per second)\",\"rate\":\"Mops/s\"}";
    s += ",\"results\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      if (i) s += ",";
      s += "{\"op\":" + json_escape(r.op) + ",\"size\":" + std::to_string(r.size);
      if (r.has_latency) {
        s += ",\"latency_us\":{\"median\":" + json_number(r.lat.median) + ",\"min\":" + json_number(r.lat.min) +
             ",\"max\":" + json_number(r.lat.max) + ",\"p99\":" + json_number(r.p99) +
             ",\"mean\":" + json_number(r.mean) + ",\"loop_mean\":" + json_number(r.loop_mean) +
             ",\"iters\":" + std::to_string(r.lat_iters) + "}";
      } else {
        s += ",\"latency_us\":null";
      }
      if (r.has_bandwidth) {
        s += ",\"bandwidth_MBps\":" + json_number(r.mbps) + ",\"rate_Mops\":" + json_number(r.mops) +
             ",\"bandwidth_ops\":" + std::to_string(r.bw_ops);
      } else {
        s += ",\"bandwidth_MBps\":null,\"rate_Mops\":null";
      }
      s += ",\"domain_registrations\":" +
           (r.has_registrations ? std::to_string(r.domain_registrations) : std::string("null"));
      s += ",\"error\":" + (r.error.empty() ? std::string("null") : json_escape(r.error)) + "}";
    }
    s += "]}\n";
    std::fputs(s.c_str(), stdout);
    return;
  }
  const std::string buffers = c.cold_bytes != 0 ? "cold (rotating over " + format_size(c.cold_bytes) + " per side)"
                                                : "hot (the same bytes every operation)";
  if (c.perftest) {
    std::printf("latency with perftest's definitions: put = half round trip of a write ping-pong polling memory,\n"
                "get = one read and its completion, send = half round trip of a send ping-pong\n");
  }
  std::printf(
      "regpool-perf: provider %s%s, %s, %llu iterations, window %llu, batch %llu, wait %s, buffers %s, receives %s%s, sends %s, ping-pongs %s%s%s\n",
              provider.c_str(), provider == "shm" ? (c.shm_rings ? " (messages: regpool's rings)" : " (messages: the provider's)") : "",
              o.mode == Mode::loopback ? "two processes on this host (loopback)" : ("server " + o.host).c_str(),
              static_cast<unsigned long long>(c.iters), static_cast<unsigned long long>(c.window),
              static_cast<unsigned long long>(c.batch),
              regpool::to_string(c.wait), buffers.c_str(), c.recv_kept ? "kept" : "fresh",
              c.recv_ahead ? " (one message ahead)" : "", c.send_kept ? "kept" : "fresh",
              c.pingpongs_echo() ? "echo (replies from the bytes received)" : "from separate buffers",
              c.messenger_serialized ? ", Messengers serialized (no lock)" : "",
              emulated_atomics ? ", atomics emulated by the target's progress()" : "");
  std::printf("%-13s %10s %12s %12s %12s %12s %14s %12s\n", "op", "size", "lat med us", "lat min us", "lat p99 us",
              "lat max us", "bw MB/s", "rate Mops/s");
  for (const Row& r : rows) {
    std::printf("%-13s %10s", r.op.c_str(), format_size(r.size).c_str());
    if (r.has_latency) {
      std::printf(" %12.3f %12.3f %12.3f %12.3f", r.lat.median, r.lat.min, r.p99, r.lat.max);
    } else {
      std::printf(" %12s %12s %12s %12s", "-", "-", "-", "-");
    }
    if (r.has_bandwidth) {
      std::printf(" %14.1f %12.4f", r.mbps, r.mops);
    } else {
      std::printf(" %14s %12s", "-", "-");
    }
    if (r.has_registrations) {
      std::printf("  %s, domain registrations %llu", regpool::to_string(c.expose_mode),
                  static_cast<unsigned long long>(r.domain_registrations));
    }
    if (!r.error.empty()) std::printf("  error: %s", r.error.c_str());
    std::printf("\n");
  }
}

bool any_error(const std::vector<Row>& rows) {
  return std::any_of(rows.begin(), rows.end(), [](const Row& r) { return !r.error.empty(); });
}

int client_main(const Options& o, std::uint16_t port, const std::string& host) {
  g_peer_label = g_server_pid > 0 ? "the server process (pid " + std::to_string(g_server_pid) + ")"
                                  : "the server at " + host + ":" + std::to_string(port);
  regpool::TcpBootstrapConfig bc;
  bc.rank = 1;
  bc.size = 2;
  bc.host = host;
  bc.port = port;
  regpool::TcpBootstrap boot(bc);
  ProgressLine pl(!o.no_progress && (o.progress || ::isatty(2)));
  std::string provider;
  bool emulated = false;
  auto rows = run_client(boot, o.config, o.mode == Mode::loopback, pl, provider, emulated);
  pl.done();
  print_rows(o, provider, emulated, rows);
  std::fflush(stdout);
  return any_error(rows) ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    bool help = false;
    o = parse_args(argc, argv, help);
    if (help) {
      usage(stdout);
      return 0;
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "regpool-perf: %s\n", e.what());
    std::fprintf(stderr, "Try 'regpool-perf --help'.\n");
    return regpool_tools::kExitUsage;
  }
  try {
    if (o.mode == Mode::peers) return peers_main(o);
    if (o.mode == Mode::client) {
      if (o.host == "127.0.0.1" || o.host == "localhost") ::setenv("FI_TCP_IFACE", "lo", 0);
      return client_main(o, o.port, o.host);
    }
    regpool::TcpBootstrapConfig bc;
    bc.rank = 0;
    bc.size = 2;
    bc.host = o.mode == Mode::loopback ? "127.0.0.1" : o.bind;
    // Loopback: any free port (the child learns it through fork), so two
    // runs at once do not collide.
    bc.port = o.mode == Mode::loopback ? 0 : o.port;
    bc.connect_timeout = o.mode == Mode::loopback ? 30000ms : std::chrono::milliseconds(3600 * 1000);
    if (o.mode == Mode::loopback) ::setenv("FI_TCP_IFACE", "lo", 0);
    regpool::TcpBootstrap boot(bc);
    if (o.mode == Mode::server) {
      if (!o.json) {
        std::fprintf(stderr, "regpool-perf server: listening on %s:%u%s\n", o.bind.c_str(), boot.port(),
                     boot.uses_key() ? " (job key required: REGPOOL_BOOTSTRAP_KEY)" : "");
      }
      g_peer_label = "the client";
      return run_server(boot, false, o.json);
    }
    // Loopback: neither process touches libfabric before the fork.
    const std::uint16_t port = boot.port();
    std::fflush(nullptr);
    const pid_t server_pid = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      ::alarm(3600);
      g_server_pid = server_pid;
      int rc = 1;
      try {
        rc = client_main(o, port, "127.0.0.1");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "regpool-perf client: %s\n", e.what());
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    g_child = pid;
    g_peer_label = "the client process (pid " + std::to_string(pid) + ")";
    int rc = 1;
    try {
      rc = run_server(boot, true, true);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "regpool-perf server: %s\n", e.what());
      ::kill(pid, SIGKILL);
    }
    int st = g_child_status;
    if (!g_child_reaped) ::waitpid(pid, &st, 0);
    const bool child_ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    return rc == 0 && child_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "regpool-perf: %s\n", e.what());
    return 1;
  }
}
