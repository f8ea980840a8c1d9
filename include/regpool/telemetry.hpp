#pragma once
// Layer 9: printing the counters. The structs themselves live with their
// owners (PoolStats in pool.hpp, DomainStats in domain.hpp).

#include <iosfwd>
#include <string>

#include "regpool/domain.hpp"
#include "regpool/pool.hpp"

namespace regpool {

// Human-readable, multi-line; size classes with no allocations are omitted.
void print(std::ostream& out, const PoolStats& stats);
void print(std::ostream& out, const DomainStats& stats);
std::string to_string(const PoolStats& stats);
// One JSON object, for tools and scripts.
std::string to_json(const PoolStats& stats);

}  // namespace regpool
