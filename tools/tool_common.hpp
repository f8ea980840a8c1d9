#pragma once
// Shared by the regpool command-line tools: argument parsing (sizes with
// binary suffixes, lists), the usage-error convention (message + exit code
// 2), JSON string escaping, size formatting and order statistics.
//
// Header-only on purpose: each tool is one translation unit plus this file,
// so a tool can be copied into a minimal guest image (the Soft-RoCE harness
// boots a busybox initramfs) with nothing but libc, libstdc++ and the
// libraries it links.

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace regpool_tools {

// Thrown for bad command lines; main() prints it and exits with kExitUsage.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kExitUsage = 2;

// "4096", "4K", "4KiB", "64k", "1M", "1MiB", "1G", "1GB" (binary multiples
// throughout: a registration cost table in powers of ten would put every
// size off a page boundary).
inline std::uint64_t parse_size(std::string_view text, std::string_view option) {
  const std::string s(text);
  if (s.empty() || s[0] == '-' || s[0] == '+') {
    throw UsageError(std::string(option) + ": expected a size, got '" + s + "'");
  }
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str() || errno == ERANGE) throw UsageError(std::string(option) + ": expected a size, got '" + s + "'");
  std::string suffix(end);
  for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  unsigned shift = 0;
  if (suffix.empty() || suffix == "B") {
    shift = 0;
  } else if (suffix == "K" || suffix == "KB" || suffix == "KIB") {
    shift = 10;
  } else if (suffix == "M" || suffix == "MB" || suffix == "MIB") {
    shift = 20;
  } else if (suffix == "G" || suffix == "GB" || suffix == "GIB") {
    shift = 30;
  } else if (suffix == "T" || suffix == "TB" || suffix == "TIB") {
    shift = 40;
  } else {
    throw UsageError(std::string(option) + ": unknown size suffix in '" + s + "' (use K, M, G)");
  }
  if (shift > 0 && v > (~0ULL >> shift)) throw UsageError(std::string(option) + ": size '" + s + "' is too large");
  return static_cast<std::uint64_t>(v) << shift;
}

inline std::uint64_t parse_uint(std::string_view text, std::string_view option, std::uint64_t min,
                                std::uint64_t max) {
  const std::string s(text);
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || s[0] == '+' || end == s.c_str() || *end != '\0' || errno == ERANGE || v < min ||
      v > max) {
    throw UsageError(std::string(option) + ": expected an integer in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "], got '" + s + "'");
  }
  return v;
}

inline std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t pos = text.find(sep, start);
    out.emplace_back(text.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

inline std::vector<std::uint64_t> parse_size_list(std::string_view text, std::string_view option) {
  std::vector<std::uint64_t> out;
  for (const auto& item : split(text, ',')) {
    if (item.empty()) throw UsageError(std::string(option) + ": empty entry in '" + std::string(text) + "'");
    out.push_back(parse_size(item, option));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The value after an option: "--x V" (advancing i) or "--x=V".
inline std::string option_value(int argc, char** argv, int& i, std::string_view option) {
  const std::string_view a = argv[i];
  if (a.size() > option.size() && a[option.size()] == '=') return std::string(a.substr(option.size() + 1));
  if (i + 1 >= argc) throw UsageError(std::string(option) + " needs a value");
  return argv[++i];
}

// True when argv[i] is `option` or `option=...`.
inline bool is_option(std::string_view arg, std::string_view option) {
  return arg == option || (arg.size() > option.size() && arg.substr(0, option.size()) == option &&
                           arg[option.size()] == '=');
}

// "4 KiB", "1 MiB", "1536 B": exact binary units when the size is a
// multiple, else bytes.
inline std::string format_size(std::uint64_t n) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && n >= 1024 && n % 1024 == 0) {
    n /= 1024;
    ++u;
  }
  return std::to_string(n) + " " + kUnits[u];
}

inline std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

// A JSON number; non-finite values (which JSON cannot hold) become null.
inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Order statistics of repeated measurements. Quartiles by linear
// interpolation between closest ranks (the common "type 7" definition).
struct Summary {
  double median = 0;
  double q1 = 0;
  double q3 = 0;
  double min = 0;
  double max = 0;
  std::size_t n = 0;
};

inline double quantile_sorted(const std::vector<double>& v, double q) {
  if (v.empty()) return std::nan("");
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const auto hi = static_cast<std::size_t>(std::ceil(pos));
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

inline Summary summarize(std::vector<double> v) {
  Summary s;
  s.n = v.size();
  if (v.empty()) {
    s.median = s.q1 = s.q3 = s.min = s.max = std::nan("");
    return s;
  }
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = quantile_sorted(v, 0.5);
  s.q1 = quantile_sorted(v, 0.25);
  s.q3 = quantile_sorted(v, 0.75);
  return s;
}

}  // namespace regpool_tools
