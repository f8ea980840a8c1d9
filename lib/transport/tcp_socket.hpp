#pragma once
// Blocking-with-a-deadline socket helpers shared by the TCP bootstrap and
// the membership listener/connector, so both bound every wait the same way
// and report failures with the same Statuses. Internal.
//
// Every helper throws regpool::Error (setup path): Status::timeout when the
// deadline passes, peer_unreachable when the peer closes or resets,
// transport_error for local failures, malformed for a bad frame. Messages
// start with "<component>: " (e.g. "bootstrap: ", "membership: ").
//
// Thread-safety: stateless; an Io value may be shared.

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "regpool/error.hpp"
#include "transport/bootstrap_wire.hpp"

namespace regpool::tcp {

using Clock = std::chrono::steady_clock;

// Milliseconds left until `deadline`, for poll(2) (0 when passed).
int remaining_ms(Clock::time_point deadline) noexcept;

// The IPv4 address of host:port (literal or name). Throws invalid_argument.
sockaddr_in resolve(const std::string& host, std::uint16_t port, const char* component);
std::string addr_text(const sockaddr_in& a);
// A non-blocking, close-on-exec TCP socket with TCP_NODELAY.
int make_socket(const char* component);
// A listening socket bound to `addr` (SO_REUSEADDR, backlog SOMAXCONN);
// returns the fd and sets `port` to the bound port.
int listen_on(const sockaddr_in& addr, std::uint16_t& port, const char* component, const std::string& what);
// Non-blocking connect bounded by the deadline; refuses a TCP self-connect
// (retrying against a local port nobody listens on can produce one).
void connect_to(int fd, const sockaddr_in& addr, Clock::time_point deadline, const char* component,
                const std::string& what);
// TCP keep-alive so that a dead or unreachable peer is noticed within about
// `bound` (whole seconds, at least 2) even when nothing is sent, plus
// TCP_USER_TIMEOUT for unacknowledged data. Best effort (never throws).
void set_liveness(int fd, std::chrono::milliseconds bound) noexcept;
// Non-blocking send of data[off..] until the socket would block; advances
// `off`. False when the connection failed.
bool send_some(int fd, std::span<const std::byte> data, std::size_t& off) noexcept;
// 32 fresh random bytes (throws transport_error without a CSPRNG).
bootwire::Nonce fresh_nonce(const char* component);

// A line for the operator: to `sink` when set (an exception from it is
// swallowed: a logger must not stop a rendezvous or a server), else to
// stderr as "regpool <component>: <line>".
void log_line(const std::function<void(const std::string&)>& sink, const char* component, const std::string& line) noexcept;

inline std::span<const std::byte> key_bytes(const std::string& k) noexcept {
  return {reinterpret_cast<const std::byte*>(k.data()), k.size()};
}

// Deadline-bounded I/O on a non-blocking socket.
struct Io {
  const char* component;
  [[noreturn]] void fail(Status st, int err, const std::string& what) const;
  void wait_fd(int fd, short events, Clock::time_point deadline, const std::string& what) const;
  void write_all(int fd, std::span<const std::byte> data, Clock::time_point deadline, const std::string& what) const;
  void read_all(int fd, std::span<std::byte> data, Clock::time_point deadline, const std::string& what) const;
  // One frame into `reader` (never reads past it).
  void read_frame(int fd, bootwire::FrameReader& reader, Clock::time_point deadline, const std::string& who) const;
  void send_frame(int fd, std::uint32_t seq, std::span<const std::byte> blob, Clock::time_point deadline,
                  const std::string& who) const;
};

}  // namespace regpool::tcp
