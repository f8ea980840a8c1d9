// Fuzzes regpool-perf's run configuration (tools/perf_config.hpp), which
// the server decodes from its client. Properties checked on every input,
// not just "no crash":
//  - whatever decodes is within the command line's bounds (provider name,
//    iterations, window, sizes ascending and in range, ...) and re-encodes
//    to exactly the same bytes (one encoding per configuration);
//  - a configuration built from the input's bytes (within those bounds)
//    encodes to something that decodes back to it;
//  - what does not decode says why.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "../../tools/perf_config.hpp"

namespace perf = regpool_tools::perf;

namespace {

// Reads the input as a stream of values for the encoder side.
struct Bytes {
  const std::uint8_t* p;
  std::size_t n;
  std::uint64_t take(unsigned bytes) {
    std::uint64_t v = 0;
    for (unsigned i = 0; i < bytes; ++i) {
      v = (v << 8) | (n > 0 ? *p : 0);
      if (n > 0) {
        ++p;
        --n;
      }
    }
    return v;
  }
  std::uint64_t in(std::uint64_t lo, std::uint64_t hi, unsigned bytes) { return lo + take(bytes) % (hi - lo + 1); }
};

void check_bounds(const perf::Config& c) {
  if (!perf::provider_name_ok(c.provider)) std::abort();
  if (c.iters < 1 || c.iters > perf::kMaxIters || c.window < 1 || c.window > perf::kMaxWindow) std::abort();
  if (c.sizes.empty() || c.sizes.size() > perf::kMaxSizes) std::abort();
  for (std::size_t i = 0; i < c.sizes.size(); ++i) {
    if (c.sizes[i] < 1 || c.sizes[i] > perf::kMaxSize || (i > 0 && c.sizes[i] <= c.sizes[i - 1])) std::abort();
  }
  if (c.cold_bytes > perf::kMaxColdBytes) std::abort();
  if (c.shm_ring_copy_max > perf::kMaxShmRingCopy) std::abort();
  if (c.verbs_inline < -1 || c.verbs_inline > perf::kMaxVerbsInline) std::abort();
  if (c.tagged_threshold != 0 &&
      (c.tagged_threshold < perf::kMinTaggedThreshold || c.tagged_threshold > perf::kMaxTaggedThreshold)) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string why;
  if (auto c = perf::Config::decode(text, why)) {
    check_bounds(*c);
    if (c->encode() != text) std::abort();
  } else if (why.empty()) {
    std::abort();
  }

  // Encoder side: a configuration from the input's bytes.
  Bytes b{data, size};
  perf::Config f;
  static const char kProviderChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_;:.+-";
  f.provider.clear();
  const std::uint64_t plen = b.in(1, perf::kMaxProviderName, 1);
  for (std::uint64_t i = 0; i < plen; ++i) f.provider.push_back(kProviderChars[b.take(1) % (sizeof kProviderChars - 1)]);
  f.wait = static_cast<regpool::WaitMode>(b.take(1) % 3);
  f.iters = b.in(1, perf::kMaxIters, 4);
  f.window = b.in(1, perf::kMaxWindow, 2);
  const std::uint64_t ops = b.take(1);
  f.put = ops & 1;
  f.get = ops & 2;
  f.send = ops & 4;
  f.atomic = ops & 8;
  f.expose = ops & 16;
  f.tagged = ops & 32;
  f.memcpy = ops & 64;
  f.cold_bytes = b.take(1) % 2 ? b.in(1, perf::kMaxColdBytes, 4) : 0;
  f.tagged_threshold = b.take(1) % 2 ? b.in(perf::kMinTaggedThreshold, perf::kMaxTaggedThreshold, 4) : 0;
  f.tagged_split = b.take(8);
  f.tagged_eager_split = b.take(8);
  f.tagged_gather = b.take(8);
  f.tagged_gather_max = b.take(8);
  f.tagged_copy = b.take(8);
  f.tagged_choice = b.take(8);
  f.expose_mode = b.take(1) % 2 ? regpool::ExposureMode::scoped : regpool::ExposureMode::standard;
  const std::uint64_t bits = b.take(1);
  f.perftest = bits & 1;
  f.verbs_signal_all = bits & 2;
  f.loop_mean = bits & 4;
  f.recv_kept = bits & 8;
  f.send_kept = bits & 16;
  f.recv_ahead = bits & 32;
  f.rma_kept = bits & 64;
  f.shm_rings = bits & 128;
  const std::uint64_t more = b.take(1);
  f.messenger_serialized = more & 1;
  f.shm_ring_adaptive = more & 2;
  f.tagged_recv_ldo = more & 4;
  f.verbs_inject = more & 8;
  f.shm_ring_copy_max = b.in(0, perf::kMaxShmRingCopy, 3);
  f.verbs_inline = static_cast<std::int64_t>(b.in(0, perf::kMaxVerbsInline + 1, 2)) - 1;
  f.sizes.clear();
  const std::uint64_t nsizes = b.in(1, perf::kMaxSizes, 1);
  std::uint64_t next = 1;
  for (std::uint64_t i = 0; i < nsizes && next <= perf::kMaxSize; ++i) {
    f.sizes.push_back(next);
    next += 1 + b.take(3);
  }
  const std::string enc = f.encode();
  auto back = perf::Config::decode(enc, why);
  if (!back || !(*back == f)) std::abort();
  return 0;
}
