#pragma once
// Plain TCP for joining the key-value service: the server listens, a client
// connects, both swap one framed message (protocol.hpp: Hello / Welcome)
// and close. Every call is bounded by a deadline (poll), so a silent or
// slow peer costs the server at most that long.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace kv::net {

using Clock = std::chrono::steady_clock;

inline int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left);
}

// Closes on scope exit.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

inline bool send_all(int fd, std::span<const std::byte> data, Clock::time_point deadline) {
  std::size_t done = 0;
  while (done < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, remaining_ms(deadline)) <= 0) return false;
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

inline bool recv_exact(int fd, std::span<std::byte> out, Clock::time_point deadline) {
  std::size_t done = 0;
  while (done < out.size()) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, remaining_ms(deadline)) <= 0) return false;
    const ssize_t n = ::recv(fd, out.data() + done, out.size() - done, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// One framed message: `header` bytes whose u32 at `length_at` (little
// endian) gives the length of the rest, which must not exceed `max_rest`.
inline std::optional<std::vector<std::byte>> recv_framed(int fd, std::size_t header, std::size_t length_at,
                                                        std::size_t max_rest, Clock::time_point deadline) {
  std::vector<std::byte> buf(header);
  if (!recv_exact(fd, buf, deadline)) return std::nullopt;
  std::uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= std::uint32_t{std::to_integer<std::uint8_t>(buf[length_at + i])} << (8 * i);
  if (n > max_rest) return std::nullopt;
  buf.resize(header + n);
  if (!recv_exact(fd, std::span(buf).subspan(header), deadline)) return std::nullopt;
  return buf;
}

// Non-blocking listening socket on host:port (port 0 = any); *bound gets
// the port. Returns -1 with errno set on failure.
inline int listen_on(const std::string& host, std::uint16_t port, std::uint16_t* bound) {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (s.fd < 0) return -1;
  int one = 1;
  ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    errno = EINVAL;
    return -1;
  }
  if (::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s.fd, 64) != 0) return -1;
  socklen_t len = sizeof a;
  if (::getsockname(s.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  *bound = ntohs(a.sin_port);
  const int fd = s.fd;
  s.fd = -1;
  return fd;
}

// Connects, retrying while the server is not listening yet, until deadline.
inline int connect_to(const std::string& host, std::uint16_t port, Clock::time_point deadline) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    errno = EINVAL;
    return -1;
  }
  for (;;) {
    Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (s.fd < 0) return -1;
    if (::connect(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      const int fd = s.fd;
      s.fd = -1;
      return fd;
    }
    if (errno != ECONNREFUSED || Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace kv::net
