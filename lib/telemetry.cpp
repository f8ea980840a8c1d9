#include "regpool/telemetry.hpp"

#include <cstdio>
#include <ostream>
#include <sstream>

namespace regpool {
namespace {

std::string bytes(std::uint64_t b) {
  char buf[32];
  if (b >= (std::uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / static_cast<double>(1ULL << 30));
  else if (b >= (std::uint64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / static_cast<double>(1ULL << 20));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(b) / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

std::string micros(std::uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f us", static_cast<double>(ns) / 1000.0);
  return buf;
}

std::string percent(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", f * 100.0);
  return buf;
}

// Fixed notation with enough digits to round-trip a ratio; JSON has no NaN
// or infinity, and the ratios are always finite in [0, 1].
std::string ratio(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", f);
  return buf;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
      continue;
    }
    o += c;
  }
  return o;
}

}  // namespace

void print(std::ostream& out, const DomainStats& s) {
  out << "  domain " << s.name << ": " << s.registrations << " registrations, " << s.deregistrations
      << " deregistrations, " << s.failed_registrations << " failed, " << s.live_registrations << " live ("
      << bytes(s.bytes_registered_live) << "), " << bytes(s.bytes_registered_total) << " registered in total, "
      << micros(s.register_ns) << " registering, " << micros(s.deregister_ns) << " deregistering\n";
}

void print(std::ostream& out, const EndpointStats& s) {
  out << "endpoint: " << s.posted << " posted, " << s.completed << " completed, " << s.failed << " failed, "
      << s.rejected << " rejected before the wire, " << s.timeouts << " timed out, " << s.in_flight
      << " in flight, " << s.post_retries << " post retries, " << s.reconnects << " reconnects, "
      << s.unknown_source << " receives from unknown senders, " << s.sleeps << " sleeps\n";
}

void print(std::ostream& out, const ExposureStats& s) {
  out << "exposures: " << s.created << " created (" << s.scoped << " scoped), " << s.live << " live, " << s.revoked
      << " revoked, " << s.quarantined << " quarantined now (" << bytes(s.quarantined_bytes) << "; "
      << s.quarantine_total << " ever, " << s.quarantine_released << " released), " << s.registrations
      << " registrations\n";
}

void print(std::ostream& out, const PoolStats& s) {
  out << "pool " << s.name << ":\n"
      << "  objects: " << s.allocations << " allocations, " << s.releases << " releases, " << s.live_objects
      << " live, " << s.failed_allocations << " failed\n"
      << "  memory: " << bytes(s.bytes_in_use) << " in use of " << bytes(s.bytes_mapped) << " mapped in " << s.arenas
      << " arenas (" << s.dedicated_arenas << " dedicated; " << s.arenas_created << " created, " << s.arenas_released
      << " released)\n"
      << "  registrations by this pool: " << s.registrations << " (" << s.deregistrations << " undone), "
      << micros(s.register_ns) << " registering\n";
  if (s.zeroed_allocations) {
    out << "  zeroing: " << s.zeroed_allocations << " allocations zeroed, " << bytes(s.zero_memset_bytes)
        << " by memset, " << bytes(s.zero_madvise_bytes) << " by madvise, " << bytes(s.zero_fresh_bytes)
        << " fresh (no work)\n";
  }
  out << "  occupancy: " << bytes(s.arena_bytes_in_use) << " in use of " << bytes(s.arena_capacity)
      << " in regular arenas (" << percent(s.arena_occupancy) << "); free spans " << bytes(s.free_span_bytes)
      << ", largest " << bytes(s.largest_free_span) << " (fragmentation " << percent(s.fragmentation)
      << "); free slab slots " << bytes(s.slab_free_bytes) << "\n";
  out << "  size classes:";
  bool any = false;
  for (const auto& c : s.size_classes) {
    if (!c.allocations) continue;
    out << " " << c.object_size << "B:" << c.allocations << "/" << c.live << "live";
    any = true;
  }
  if (s.large_allocations) {
    out << " large:" << s.large_allocations << "/" << s.large_live << "live";
    any = true;
  }
  out << (any ? "\n" : " none\n");
  // A pool with many dedicated arenas would drown the rest: the first few
  // here, all of them in to_json.
  constexpr std::size_t kArenaLines = 8;
  for (std::size_t i = 0; i < s.arena_detail.size(); ++i) {
    if (i == kArenaLines) {
      out << "  (" << s.arena_detail.size() - kArenaLines << " more arenas; see to_json)\n";
      break;
    }
    const auto& a = s.arena_detail[i];
    out << "  arena " << i << (a.dedicated ? " (dedicated)" : "") << ": " << bytes(a.bytes_in_use) << " in use of "
        << bytes(a.capacity) << ", " << bytes(a.bytes_free) << " free in " << a.free_spans << " spans (largest "
        << bytes(a.largest_free) << ")\n";
  }
  for (const auto& d : s.domains) print(out, d);
}

std::string to_string(const PoolStats& stats) {
  std::ostringstream o;
  print(o, stats);
  return o.str();
}

std::string to_string(const DomainStats& stats) {
  std::ostringstream o;
  print(o, stats);
  return o.str();
}

std::string to_string(const EndpointStats& stats) {
  std::ostringstream o;
  print(o, stats);
  return o.str();
}

std::string to_string(const ExposureStats& stats) {
  std::ostringstream o;
  print(o, stats);
  return o.str();
}

std::string to_json(const ExposureStats& s) {
  std::ostringstream o;
  o << "{\"created\":" << s.created << ",\"scoped\":" << s.scoped << ",\"live\":" << s.live
    << ",\"revoked\":" << s.revoked << ",\"quarantined\":" << s.quarantined << ",\"quarantined_bytes\":"
    << s.quarantined_bytes << ",\"quarantine_total\":" << s.quarantine_total << ",\"quarantine_released\":"
    << s.quarantine_released << ",\"registrations\":" << s.registrations << "}";
  return o.str();
}

std::string to_json(const DomainStats& d) {
  std::ostringstream o;
  o << "{\"name\":\"" << json_escape(d.name) << "\",\"registrations\":" << d.registrations
    << ",\"deregistrations\":" << d.deregistrations << ",\"failed_registrations\":" << d.failed_registrations
    << ",\"live_registrations\":" << d.live_registrations << ",\"bytes_registered_total\":"
    << d.bytes_registered_total << ",\"bytes_registered_live\":" << d.bytes_registered_live
    << ",\"register_ns\":" << d.register_ns << ",\"deregister_ns\":" << d.deregister_ns << "}";
  return o.str();
}

std::string to_json(const EndpointStats& s) {
  std::ostringstream o;
  o << "{\"posted\":" << s.posted << ",\"completed\":" << s.completed << ",\"failed\":" << s.failed
    << ",\"rejected\":" << s.rejected << ",\"timeouts\":" << s.timeouts << ",\"post_retries\":" << s.post_retries
    << ",\"in_flight\":" << s.in_flight << ",\"reconnects\":" << s.reconnects
    << ",\"unknown_source\":" << s.unknown_source << ",\"sleeps\":" << s.sleeps << "}";
  return o.str();
}

std::string to_json(const PoolStats& s) {
  std::ostringstream o;
  o << "{\"name\":\"" << json_escape(s.name) << "\",\"allocations\":" << s.allocations << ",\"releases\":" << s.releases
    << ",\"failed_allocations\":" << s.failed_allocations << ",\"live_objects\":" << s.live_objects
    << ",\"bytes_in_use\":" << s.bytes_in_use << ",\"bytes_mapped\":" << s.bytes_mapped << ",\"arenas\":" << s.arenas
    << ",\"dedicated_arenas\":" << s.dedicated_arenas << ",\"arenas_created\":" << s.arenas_created
    << ",\"arenas_released\":" << s.arenas_released << ",\"registrations\":" << s.registrations
    << ",\"deregistrations\":" << s.deregistrations << ",\"register_ns\":" << s.register_ns
    << ",\"large_allocations\":" << s.large_allocations << ",\"large_live\":" << s.large_live
    << ",\"zeroed_allocations\":" << s.zeroed_allocations << ",\"zero_memset_bytes\":" << s.zero_memset_bytes
    << ",\"zero_madvise_bytes\":" << s.zero_madvise_bytes << ",\"zero_fresh_bytes\":" << s.zero_fresh_bytes
    << ",\"arena_capacity\":" << s.arena_capacity << ",\"arena_bytes_in_use\":" << s.arena_bytes_in_use
    << ",\"free_span_bytes\":" << s.free_span_bytes << ",\"largest_free_span\":" << s.largest_free_span
    << ",\"slab_free_bytes\":" << s.slab_free_bytes << ",\"arena_occupancy\":" << ratio(s.arena_occupancy)
    << ",\"fragmentation\":" << ratio(s.fragmentation) << ",\"arena_detail\":[";
  bool first_arena = true;
  for (const auto& a : s.arena_detail) {
    if (!first_arena) o << ",";
    first_arena = false;
    o << "{\"capacity\":" << a.capacity << ",\"bytes_in_use\":" << a.bytes_in_use << ",\"bytes_free\":"
      << a.bytes_free << ",\"largest_free\":" << a.largest_free << ",\"free_spans\":" << a.free_spans
      << ",\"dedicated\":" << (a.dedicated ? "true" : "false") << "}";
  }
  o << "],\"size_classes\":[";
  bool first = true;
  for (const auto& c : s.size_classes) {
    if (!first) o << ",";
    first = false;
    o << "{\"object_size\":" << c.object_size << ",\"allocations\":" << c.allocations << ",\"live\":" << c.live << "}";
  }
  o << "],\"domains\":[";
  first = true;
  for (const auto& d : s.domains) {
    if (!first) o << ",";
    first = false;
    o << to_json(d);
  }
  o << "]}";
  return o.str();
}

}  // namespace regpool
