#include "regpool/error.hpp"

#include <string>

namespace regpool {

const char* to_string(Status s) noexcept {
  switch (s) {
    case Status::ok: return "ok";
    case Status::invalid_argument: return "invalid argument";
    case Status::out_of_bounds: return "out of bounds";
    case Status::access_denied: return "access denied";
    case Status::capacity_exceeded: return "capacity exceeded";
    case Status::pool_exhausted: return "pool exhausted (hard cap reached)";
    case Status::out_of_memory: return "out of memory";
    case Status::registration_failed: return "registration failed";
    case Status::memlock_limit: return "memlock limit (RLIMIT_MEMLOCK) reached";
    case Status::malformed: return "malformed input";
    case Status::bad_key: return "bad remote key";
    case Status::peer_unreachable: return "peer unreachable";
    case Status::timeout: return "timed out";
    case Status::canceled: return "canceled";
    case Status::would_block: return "would block";
    case Status::in_progress: return "in progress";
    case Status::unsupported: return "unsupported";
    case Status::closed: return "closed";
    case Status::transport_error: return "transport error";
    case Status::truncated: return "truncated";
    case Status::message_too_large: return "message too large for the peer";
  }
  return "unknown status";
}

Error::Error(Status status, int provider_code, const std::string& context)
    : std::runtime_error(context + " [" + to_string(status) + ", code " + std::to_string(provider_code) + "]"),
      status_(status),
      provider_code_(provider_code) {}

}  // namespace regpool
