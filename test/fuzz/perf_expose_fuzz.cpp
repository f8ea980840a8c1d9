// Fuzzes regpool-perf's expose-test result (tools/perf_wire.hpp), which the
// client decodes from the server. The first input byte is the iteration
// count the client expects; the rest is the message. Properties checked on
// every input, not just "no crash":
//  - whatever decodes re-encodes to exactly the same bytes (one encoding per
//    result);
//  - a successful result has the expected iterations and ordered figures
//    (min <= median <= max, min <= p99 <= max);
//  - a failed result has a non-empty printable message of at most
//    kMaxExposeError bytes;
//  - the same bytes read as a result's fields encode to something that
//    decodes back to those fields whenever they are in order.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "../../tools/perf_wire.hpp"

namespace pw = regpool_tools::perf_wire;

namespace {

std::uint64_t word(const std::uint8_t* p, std::size_t size, std::size_t i) {
  std::uint64_t v = 0;
  if (size >= 8 * (i + 1)) std::memcpy(&v, p + 8 * i, 8);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint64_t iters = data[0];
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  if (auto r = pw::decode_expose(in, iters)) {
    const auto again = pw::encode_expose(*r);
    if (again.size() != in.size() || std::memcmp(again.data(), in.data(), in.size()) != 0) std::abort();
    if (r->ok) {
      if (r->iters != iters || r->min_ns > r->median_ns || r->median_ns > r->max_ns || r->p99_ns < r->min_ns ||
          r->p99_ns > r->max_ns || !r->error.empty()) {
        std::abort();
      }
    } else {
      if (r->error.empty() || r->error.size() > pw::kMaxExposeError) std::abort();
      for (char c : r->error) {
        if (!pw::printable(static_cast<unsigned char>(c))) std::abort();
      }
    }
  }
  // Encoder side: fields from the input.
  pw::ExposeResult f;
  f.iters = iters;
  f.registrations = word(data + 1, size - 1, 0);
  f.min_ns = word(data + 1, size - 1, 1);
  f.median_ns = word(data + 1, size - 1, 2);
  f.p99_ns = word(data + 1, size - 1, 3);
  f.max_ns = word(data + 1, size - 1, 4);
  const auto enc = pw::encode_expose(f);
  const auto dec = pw::decode_expose(enc, iters);
  const bool ordered = f.min_ns <= f.median_ns && f.median_ns <= f.max_ns && f.min_ns <= f.p99_ns && f.p99_ns <= f.max_ns;
  if (ordered != dec.has_value()) std::abort();
  if (dec && (dec->registrations != f.registrations || dec->median_ns != f.median_ns || dec->p99_ns != f.p99_ns)) {
    std::abort();
  }
  // A failure with the input as its message always decodes, as printable.
  pw::ExposeResult bad;
  bad.ok = false;
  bad.error.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto benc = pw::encode_expose(bad);
  const auto bdec = pw::decode_expose(benc, iters);
  if (!bdec || bdec->ok || bdec->error.empty() || bdec->error.size() > pw::kMaxExposeError) std::abort();
  return 0;
}
