#pragma once
// Command-line helpers shared by kv-server and kv-client.

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <regpool/regpool.hpp>
#include <string_view>

namespace kv {

// A whole decimal number, nothing else.
inline bool number(const char* s, unsigned long long* v) {
  char* end = nullptr;
  errno = 0;
  *v = std::strtoull(s, &end, 10);
  return errno == 0 && end && *end == '\0' && end != s;
}

// --wait spin|sleep|adaptive: how the process spends the time between a
// request and its answer (regpool::EndpointConfig::wait_mode,
// docs/progress.md). spin is right when every process has a core; sleep
// or adaptive when a server and its clients share fewer cores than they are.
inline std::optional<regpool::WaitMode> wait_mode(std::string_view s) {
  for (auto m : {regpool::WaitMode::spin, regpool::WaitMode::sleep, regpool::WaitMode::adaptive})
    if (s == regpool::to_string(m)) return m;
  return std::nullopt;
}

}  // namespace kv
