#pragma once
// regpool-perf's run configuration: what the client asks for, sent to the
// server over the bootstrap as "key=value\n" lines. The server is told its
// provider, sizes, iterations and modes by another process, so the decoder
// here checks every byte before use and test/fuzz/perf_config_fuzz.cpp
// reaches it (pure functions; no endpoint, no I/O).
//
// The encoding is canonical: every key exactly once, in encode()'s order;
// numbers in plain decimal (no sign, no leading zero, no overflow); each
// value within the bounds the client's command line enforces. So
// decode(encode(c)) == c for every configuration the command line can
// make, and encode(decode(b)) == b for every b that decodes.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "regpool/endpoint.hpp"

namespace regpool_tools::perf {

inline constexpr std::uint64_t kMaxWindow = 512;
// Bound on --batch (a batch is posted with one Endpoint::post_batch call).
inline constexpr std::uint64_t kMaxBatch = 64;
inline constexpr std::uint64_t kMaxIters = 100000000;
// Bandwidth runs move at most this many bytes per op and size, so a 1 GiB
// size does not run --iters (1000) times.
inline constexpr std::uint64_t kMaxBandwidthBytes = std::uint64_t{1} << 30;
// Bound on --cold-bytes (each side allocates and prefaults that much, the
// client twice with --ops memcpy).
inline constexpr std::uint64_t kMaxColdBytes = std::uint64_t{2} << 30;
// Bound on --verbs-inline (rxe grants up to 240 bytes; hardware up to ~1 KiB).
inline constexpr std::int64_t kMaxVerbsInline = 4096;
// Bound on --shm-ring-copy-max: the largest record a ring carries
// (FabricEndpointOptions::shm_ring_copy_max).
inline constexpr std::uint64_t kMaxShmRingCopy = 65 * 1024;
// --sizes: each from 1 byte to 4 GiB, at most this many.
inline constexpr std::uint64_t kMaxSize = std::uint64_t{1} << 32;
inline constexpr std::size_t kMaxSizes = 64;
// --tagged-threshold's range.
inline constexpr std::uint64_t kMinTaggedThreshold = 64;
inline constexpr std::uint64_t kMaxTaggedThreshold = std::uint64_t{1} << 30;
// A provider name: "shm", "tcp", "tcp;ofi_rxm", "verbs:rxe0", ...
inline constexpr std::size_t kMaxProviderName = 64;
// The whole encoded configuration (every key at its longest is under 2 KiB).
inline constexpr std::size_t kMaxEncoded = 4096;

inline std::optional<regpool::WaitMode> parse_wait(std::string_view v) {
  for (auto m : {regpool::WaitMode::spin, regpool::WaitMode::sleep, regpool::WaitMode::adaptive}) {
    if (v == regpool::to_string(m)) return m;
  }
  return std::nullopt;
}

// The characters of a provider name (libfabric's names and regpool's
// "verbs[:DEVICE]"): letters, digits and _ ; : . + -
inline bool provider_name_ok(std::string_view name) noexcept {
  if (name.empty() || name.size() > kMaxProviderName) return false;
  return std::all_of(name.begin(), name.end(), [](char ch) {
    const bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
    return alnum || ch == '_' || ch == ';' || ch == ':' || ch == '.' || ch == '+' || ch == '-';
  });
}

struct Config {
  std::string provider;
  std::vector<std::uint64_t> sizes{8, 4096, 65536, std::uint64_t{1} << 20};  // ascending, distinct
  std::uint64_t iters = 1000;
  std::uint64_t window = 16;
  // --batch: put and get bandwidth post their operations this many at a
  // time with Endpoint::post_batch (1: one put()/get() call each). Client
  // only: not encoded.
  std::uint64_t batch = 1;
  bool put = true, get = true, send = true, atomic = true, expose = true;
  // Messenger tagged send/receive (regpool/messaging.hpp); only when asked.
  bool tagged = false;
  // A plain memcpy of each size in the client (the reference for shm).
  bool memcpy = false;
  // --cold: the span bandwidth tests rotate over on each side (0: hot).
  std::uint64_t cold_bytes = 0;
  std::uint64_t tagged_threshold = 0;  // MessengerConfig::eager_threshold (0 = provider default)
  // MessengerConfig::rendezvous_split (0 = the backend's default;
  // UINT64_MAX = never; anything else: split every rendezvous of at least
  // that many bytes). The receiver decides, so the server needs it too.
  std::uint64_t tagged_split = 0;
  // MessengerConfig::eager_split (0 = the backend's default; UINT64_MAX =
  // never). The sender decides; both sides take it.
  std::uint64_t tagged_eager_split = 0;
  // MessengerConfig::eager_gather (0 = the default; UINT64_MAX = never).
  // The sender decides; both sides take it.
  std::uint64_t tagged_gather = 0;
  // MessengerConfig::eager_gather_max (0 = the backend's; UINT64_MAX = no
  // limit). The sender decides; both sides take it.
  std::uint64_t tagged_gather_max = 0;
  // MessengerConfig::eager_copy (0 = the default; UINT64_MAX = never). The
  // sender decides; both sides take it.
  std::uint64_t tagged_copy = 0;
  // MessengerConfig::rendezvous_choice (0 = the default; UINT64_MAX =
  // never). The sender decides; both sides take it.
  std::uint64_t tagged_choice = 0;
  // --tagged-recv: the tagged phase's receives, both sides: into the
  // caller's buffer (false: Messenger::recv, a copy) or handed over where
  // they arrived (true: Messenger::recv_ldo).
  bool tagged_recv_ldo = false;
  regpool::ExposureMode expose_mode = regpool::ExposureMode::standard;
  // How both sides wait for completions (EndpointConfig::wait_mode).
  regpool::WaitMode wait = regpool::WaitMode::spin;
  // --perftest: latency only, with perftest's definitions (tools/README.md).
  bool perftest = false;
  // Verbs only (VerbsEndpointOptions): max_inline (-1: the default),
  // selective signalling and injected inline sends, so each can be compared
  // on and off in one boot.
  std::int64_t verbs_inline = -1;
  bool verbs_signal_all = false;
  bool verbs_inject = true;
  // --loop-mean: the send and tagged ping-pongs run --iters more iterations
  // without per-iteration clock reads, timed as a whole (fi_pingpong's
  // usec/xfer).
  bool loop_mean = false;
  // --recv: the send ping-pong's receives are one kept receive reposted
  // (Endpoint::post_recv_kept) or a new post_recv per message.
  bool recv_kept = true;
  // --sends: the send ping-pong's sends are one kept send reposted
  // (Endpoint::send_kept) or a new send per message.
  bool send_kept = true;
  // --ahead: the send and tagged ping-pongs post each receive one message
  // ahead (the client after its ping, the server after its pong, each into
  // the second of two receives over the same bytes) or, off, right before
  // the message it is for.
  bool recv_ahead = true;
  // --pingpong: in the send and tagged ping-pongs each side replies from
  // the bytes it has just received into (echo, the default: every message
  // carries bytes the reader has not seen, and on shm they come from the
  // writer's cache) or sends from one buffer and receives into another,
  // neither written by the program (separate: fi_pingpong's and
  // ucx_perftest's definition, under which a shm reader of more than a few
  // KiB may find a never-changing source in its own cache).
  bool pingpong_echo = true;
  // Whether the ping-pongs that run echo: --perftest's have separate
  // buffers whatever --pingpong says, as perftest's own do.
  bool pingpongs_echo() const { return pingpong_echo && !perftest; }
  // --rma: the --perftest put and get loops post one kept put or get
  // reposted for each operation (Endpoint::put_kept, get_kept) or a new
  // put()/get() each.
  bool rma_kept = true;
  // --shm-rings: shm messages through regpool's own rings
  // (FabricEndpointOptions::shm_rings, the default) or the provider's path.
  bool shm_rings = true;
  // --shm-ring-copy-max: the longest shm send copied through a ring; longer
  // ones the receiver reads from the sender (FabricEndpointOptions::
  // shm_ring_copy_max).
  std::uint64_t shm_ring_copy_max = kMaxShmRingCopy;
  // --shm-ring-adaptive: shm sends over 16 KiB up to that limit take the
  // path each pair measured cheaper, or are always copied
  // (FabricEndpointOptions::shm_ring_adaptive).
  bool shm_ring_adaptive = true;
  // --messenger: the tagged phase's Messengers take their own mutex
  // (locked, the default) or none (MessengerConfig::serialized).
  bool messenger_serialized = false;

  std::uint64_t max_size() const { return sizes.empty() ? 8 : std::max<std::uint64_t>(sizes.back(), 8); }
  // Distinct buffers a bandwidth test of `size` rotates over (1: hot).
  std::uint64_t slots(std::uint64_t size) const { return std::max<std::uint64_t>(cold_bytes / size, 1); }
  // Slots a bandwidth test of `size` touches.
  std::uint64_t used_slots(std::uint64_t size) const { return std::min(slots(size), bw_ops(size)); }
  // Bytes of each side's buffer: the largest size, or the cold span.
  std::uint64_t span() const { return std::max(max_size(), cold_bytes); }
  // Operations in a bandwidth test of `size` bytes (both sides compute it).
  // --cold: at least one per slot, so the test covers the whole span and
  // the pattern written before it (first slot first) has left the cache by
  // the time an operation reaches its slot.
  std::uint64_t bw_ops(std::uint64_t size) const {
    const std::uint64_t cap = std::max<std::uint64_t>(kMaxBandwidthBytes / std::max<std::uint64_t>(size, 1), window);
    const std::uint64_t n = std::max<std::uint64_t>(std::min(iters, cap), 1);
    return cold_bytes != 0 ? std::max(n, slots(size)) : n;
  }

  friend bool operator==(const Config&, const Config&) = default;

  std::string encode() const {
    std::string o;
    auto line = [&o](std::string_view k, std::string_view v) {
      o.append(k);
      o.push_back('=');
      o.append(v);
      o.push_back('\n');
    };
    auto num = [&line](std::string_view k, std::uint64_t v) { line(k, std::to_string(v)); };
    std::string ops;
    for (const auto& [on, name] : op_names()) {
      if (this->*on) ops.append(name).push_back(',');
    }
    line("provider", provider);
    line("wait", regpool::to_string(wait));
    num("iters", iters);
    num("window", window);
    line("ops", ops);
    num("cold_bytes", cold_bytes);
    num("tagged_threshold", tagged_threshold);
    num("tagged_split", tagged_split);
    num("tagged_eager_split", tagged_eager_split);
    num("tagged_gather", tagged_gather);
    num("tagged_gather_max", tagged_gather_max);
    num("tagged_copy", tagged_copy);
    num("tagged_choice", tagged_choice);
    line("tagged_recv", tagged_recv_ldo ? "ldo" : "copy");
    line("expose_mode", regpool::to_string(expose_mode));
    line("perftest", perftest ? "1" : "0");
    line("verbs_inline", std::to_string(verbs_inline));
    line("verbs_signal", verbs_signal_all ? "all" : "selective");
    line("verbs_inject", verbs_inject ? "on" : "off");
    line("loop_mean", loop_mean ? "1" : "0");
    line("recv", recv_kept ? "kept" : "fresh");
    line("sends", send_kept ? "kept" : "fresh");
    line("ahead", recv_ahead ? "on" : "off");
    line("pingpong", pingpong_echo ? "echo" : "separate");
    line("rma", rma_kept ? "kept" : "fresh");
    line("shm_rings", shm_rings ? "on" : "off");
    num("shm_ring_copy_max", shm_ring_copy_max);
    line("shm_ring_adaptive", shm_ring_adaptive ? "on" : "off");
    line("messenger", messenger_serialized ? "serialized" : "locked");
    std::string sz;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (i) sz.push_back(',');
      sz.append(std::to_string(sizes[i]));
    }
    line("sizes", sz);
    return o;
  }

  // nullopt and `why` (naming the line and what is wrong with it) for
  // anything encode() could not have written for a configuration within
  // the command line's bounds.
  static std::optional<Config> decode(std::string_view text, std::string& why) {
    Config c;
    if (text.size() > kMaxEncoded) return fail(why, "longer than " + std::to_string(kMaxEncoded) + " bytes");
    static constexpr std::string_view kKeys[] = {
        "provider", "wait", "iters", "window", "ops",
        "cold_bytes", "tagged_threshold", "tagged_split", "tagged_eager_split", "tagged_gather",
        "tagged_gather_max", "tagged_copy", "tagged_choice", "tagged_recv", "expose_mode", "perftest",
        "verbs_inline", "verbs_signal", "verbs_inject", "loop_mean", "recv", "sends",
        "ahead", "pingpong", "rma", "shm_rings", "shm_ring_copy_max",
        "shm_ring_adaptive", "messenger", "sizes"};
    std::size_t at = 0;
    for (const std::string_view key : kKeys) {
      const std::size_t nl = text.find('\n', at);
      if (nl == std::string_view::npos) return fail(why, "line '" + std::string(key) + "' missing or unterminated");
      const std::string_view line = text.substr(at, nl - at);
      at = nl + 1;
      if (line.size() < key.size() + 1 || line.substr(0, key.size()) != key || line[key.size()] != '=') {
        return fail(why, "expected '" + std::string(key) + "=' in line '" + printable(line) + "'");
      }
      const std::string_view v = line.substr(key.size() + 1);
      if (!set(c, key, v)) return fail(why, std::string(key) + ": bad value '" + printable(v) + "'");
    }
    if (at != text.size()) return fail(why, "unexpected data after the last line");
    return c;
  }

 private:
  static std::optional<Config> fail(std::string& why, std::string what) {
    why = std::move(what);
    return std::nullopt;
  }

  // At most 40 bytes of a value, non-printable bytes as '?', for messages.
  static std::string printable(std::string_view v) {
    std::string s(v.substr(0, 40));
    for (char& ch : s) {
      if (ch < 0x20 || ch > 0x7e) ch = '?';
    }
    return v.size() > 40 ? s + "..." : s;
  }

  using OpNames = std::array<std::pair<bool Config::*, std::string_view>, 7>;
  // The ops' flags and wire names, in encode()'s order.
  static const OpNames& op_names() {
    static const OpNames kOps = {{{&Config::put, "put"},
                                  {&Config::get, "get"},
                                  {&Config::send, "send"},
                                  {&Config::atomic, "atomic"},
                                  {&Config::expose, "expose"},
                                  {&Config::tagged, "tagged"},
                                  {&Config::memcpy, "memcpy"}}};
    return kOps;
  }

  // Canonical decimal: digits only, no leading zero (but "0"), no overflow.
  static std::optional<std::uint64_t> number(std::string_view v) {
    if (v.empty() || v.size() > 20 || (v.size() > 1 && v[0] == '0')) return std::nullopt;
    std::uint64_t n = 0;
    for (const char ch : v) {
      if (ch < '0' || ch > '9') return std::nullopt;
      const std::uint64_t d = static_cast<std::uint64_t>(ch - '0');
      if (n > (~std::uint64_t{0} - d) / 10) return std::nullopt;
      n = n * 10 + d;
    }
    return n;
  }

  static bool in(std::optional<std::uint64_t> n, std::uint64_t lo, std::uint64_t hi, std::uint64_t& out) {
    if (!n || *n < lo || *n > hi) return false;
    out = *n;
    return true;
  }

  static bool flag(std::string_view v, std::string_view yes, std::string_view no, bool& out) {
    if (v != yes && v != no) return false;
    out = v == yes;
    return true;
  }

  // A split value as --tagged-split takes it: 0 (default), UINT64_MAX
  // (off) or a size from 1 byte.
  static bool split(std::string_view v, std::uint64_t& out) { return in(number(v), 0, ~std::uint64_t{0}, out); }

  static bool set(Config& c, std::string_view key, std::string_view v) {
    if (key == "provider") {
      if (!provider_name_ok(v)) return false;
      c.provider = std::string(v);
      return true;
    }
    if (key == "wait") {
      const auto m = parse_wait(v);
      if (!m) return false;
      c.wait = *m;
      return true;
    }
    if (key == "iters") return in(number(v), 1, kMaxIters, c.iters);
    if (key == "window") return in(number(v), 1, kMaxWindow, c.window);
    if (key == "ops") {
      // Each known op followed by a comma, in op_names() order, at most once.
      for (const auto& [on, name] : op_names()) c.*on = false;
      std::size_t at = 0;
      for (const auto& [on, name] : op_names()) {
        if (v.substr(at, name.size() + 1) == std::string(name) + ",") {
          c.*on = true;
          at += name.size() + 1;
        }
      }
      return at == v.size();
    }
    if (key == "cold_bytes") return in(number(v), 0, kMaxColdBytes, c.cold_bytes);
    if (key == "tagged_threshold") {
      if (v == "0") {
        c.tagged_threshold = 0;
        return true;
      }
      return in(number(v), kMinTaggedThreshold, kMaxTaggedThreshold, c.tagged_threshold);
    }
    if (key == "tagged_split") return split(v, c.tagged_split);
    if (key == "tagged_eager_split") return split(v, c.tagged_eager_split);
    if (key == "tagged_gather") return split(v, c.tagged_gather);
    if (key == "tagged_gather_max") return split(v, c.tagged_gather_max);
    if (key == "tagged_copy") return split(v, c.tagged_copy);
    if (key == "tagged_choice") return split(v, c.tagged_choice);
    if (key == "tagged_recv") return flag(v, "ldo", "copy", c.tagged_recv_ldo);
    if (key == "expose_mode") {
      if (v == "standard") {
        c.expose_mode = regpool::ExposureMode::standard;
      } else if (v == "scoped") {
        c.expose_mode = regpool::ExposureMode::scoped;
      } else {
        return false;
      }
      return true;
    }
    if (key == "perftest") return flag(v, "1", "0", c.perftest);
    if (key == "verbs_inline") {
      if (v == "-1") {
        c.verbs_inline = -1;
        return true;
      }
      std::uint64_t n = 0;
      if (!in(number(v), 0, static_cast<std::uint64_t>(kMaxVerbsInline), n)) return false;
      c.verbs_inline = static_cast<std::int64_t>(n);
      return true;
    }
    if (key == "verbs_signal") return flag(v, "all", "selective", c.verbs_signal_all);
    if (key == "verbs_inject") return flag(v, "on", "off", c.verbs_inject);
    if (key == "loop_mean") return flag(v, "1", "0", c.loop_mean);
    if (key == "recv") return flag(v, "kept", "fresh", c.recv_kept);
    if (key == "sends") return flag(v, "kept", "fresh", c.send_kept);
    if (key == "ahead") return flag(v, "on", "off", c.recv_ahead);
    if (key == "pingpong") return flag(v, "echo", "separate", c.pingpong_echo);
    if (key == "rma") return flag(v, "kept", "fresh", c.rma_kept);
    if (key == "shm_rings") return flag(v, "on", "off", c.shm_rings);
    if (key == "shm_ring_copy_max") return in(number(v), 0, kMaxShmRingCopy, c.shm_ring_copy_max);
    if (key == "shm_ring_adaptive") return flag(v, "on", "off", c.shm_ring_adaptive);
    if (key == "messenger") return flag(v, "serialized", "locked", c.messenger_serialized);
    if (key == "sizes") {
      // Ascending and distinct, as the command line sorts them.
      c.sizes.clear();
      std::size_t at = 0;
      while (at <= v.size()) {
        const std::size_t comma = std::min(v.find(',', at), v.size());
        std::uint64_t n = 0;
        if (!in(number(v.substr(at, comma - at)), 1, kMaxSize, n)) return false;
        if (!c.sizes.empty() && n <= c.sizes.back()) return false;
        if (c.sizes.size() == kMaxSizes) return false;
        c.sizes.push_back(n);
        at = comma + 1;
      }
      return true;
    }
    return false;
  }
};

}  // namespace regpool_tools::perf
