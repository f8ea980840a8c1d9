#pragma once
// Completion flags shared by the ring channel and the aggregation buffer:
// the endpoint's callback (on whatever thread runs progress) stores an op's
// status, its owner reads it. 0 = in flight, else the Status + 1.

#include <atomic>
#include <cstdint>

#include "regpool/error.hpp"

namespace regpool::patterns {

using DoneFlag = std::atomic<std::uint8_t>;
constexpr std::uint8_t kPending = 0;

// An op the endpoint gave up on (timeout: no answer within
// EndpointConfig::op_timeout, and the endpoint marks the peer broken) breaks
// the channel as peer_unreachable: the pieces' own calls (push, drain)
// answer timeout only for their caller's deadline, so a caller can tell "no
// room yet" from "the peer is gone". On verbs (rxe) a write to a killed
// process's QP never completes at all, so the endpoint's expiry is the only
// report there.
inline std::uint8_t done_value(Status s) noexcept {
  if (s == Status::timeout) s = Status::peer_unreachable;
  return static_cast<std::uint8_t>(static_cast<std::uint8_t>(s) + 1);
}
inline Status done_status(std::uint8_t v) noexcept { return static_cast<Status>(v - 1); }

}  // namespace regpool::patterns
