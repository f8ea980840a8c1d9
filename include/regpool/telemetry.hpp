#pragma once
// Layer 9: printing the counters. The structs themselves live with their
// owners (PoolStats in pool.hpp, DomainStats in domain.hpp, EndpointStats and
// ExposureStats in endpoint.hpp); what each field means, and how the occupancy and
// fragmentation figures are computed, is in docs/telemetry.md.
//
// All functions are pure formatting of a snapshot the caller already took
// (Pool::stats(), Domain::stats(), Endpoint::stats()): thread-safe, they
// allocate only the returned string, and they never throw except
// std::bad_alloc.

#include <iosfwd>
#include <string>

#include "regpool/domain.hpp"
#include "regpool/endpoint.hpp"
#include "regpool/pool.hpp"

namespace regpool {

// Human-readable, multi-line; size classes with no allocations are omitted.
REGPOOL_API void print(std::ostream& out, const PoolStats& stats);
// One line, indented (it is also printed under its pool).
REGPOOL_API void print(std::ostream& out, const DomainStats& stats);
// One line.
REGPOOL_API void print(std::ostream& out, const EndpointStats& stats);
// One line (Endpoint::exposure_stats()).
REGPOOL_API void print(std::ostream& out, const ExposureStats& stats);
REGPOOL_API std::string to_string(const PoolStats& stats);
REGPOOL_API std::string to_string(const DomainStats& stats);
REGPOOL_API std::string to_string(const EndpointStats& stats);
REGPOOL_API std::string to_string(const ExposureStats& stats);
// One JSON object each, for tools and scripts: every field of the struct,
// under its own name.
REGPOOL_API std::string to_json(const PoolStats& stats);
REGPOOL_API std::string to_json(const DomainStats& stats);
REGPOOL_API std::string to_json(const EndpointStats& stats);
REGPOOL_API std::string to_json(const ExposureStats& stats);

}  // namespace regpool
