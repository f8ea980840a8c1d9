#include "transport/tcp_socket.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "transport/hmac.hpp"

namespace regpool::tcp {
namespace {

constexpr std::size_t kReadChunk = 64 * 1024;

std::string prefixed(const char* component, const std::string& what) { return std::string(component) + ": " + what; }

}  // namespace

int remaining_ms(Clock::time_point deadline) noexcept {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left + 1, 1 << 30));
}

void Io::fail(Status st, int err, const std::string& what) const {
  throw Error(st, err, prefixed(component, what) + (err ? std::string(": ") + std::strerror(err) : std::string()));
}

void Io::wait_fd(int fd, short events, Clock::time_point deadline, const std::string& what) const {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) {
      if ((p.revents & (POLLERR | POLLNVAL)) != 0 && (p.revents & events) == 0) {
        fail(Status::peer_unreachable, ECONNRESET, what + ": connection failed");
      }
      return;
    }
    if (rc == 0) fail(Status::timeout, ETIMEDOUT, what + ": timed out");
    if (errno != EINTR) fail(Status::transport_error, errno, what + ": poll");
  }
}

void Io::write_all(int fd, std::span<const std::byte> data, Clock::time_point deadline, const std::string& what) const {
  while (!data.empty()) {
    wait_fd(fd, POLLOUT, deadline, what);
    const ssize_t w = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      data = data.subspan(static_cast<std::size_t>(w));
    } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      fail(Status::peer_unreachable, errno, what + ": send failed");
    }
  }
}

void Io::read_all(int fd, std::span<std::byte> data, Clock::time_point deadline, const std::string& what) const {
  while (!data.empty()) {
    wait_fd(fd, POLLIN, deadline, what);
    const ssize_t r = ::recv(fd, data.data(), data.size(), MSG_DONTWAIT);
    if (r > 0) {
      data = data.subspan(static_cast<std::size_t>(r));
    } else if (r == 0) {
      fail(Status::peer_unreachable, ECONNRESET, what + ": the peer closed the connection");
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      fail(Status::peer_unreachable, errno, what + ": receive failed");
    }
  }
}

void Io::read_frame(int fd, bootwire::FrameReader& reader, Clock::time_point deadline, const std::string& who) const {
  using State = bootwire::FrameReader::State;
  std::vector<std::byte> buf(kReadChunk);
  while (reader.state() == State::header || reader.state() == State::payload) {
    wait_fd(fd, POLLIN, deadline,
            "waiting for " + who + " (" + std::to_string(reader.received()) + " payload bytes received so far)");
    const ssize_t r = ::recv(fd, buf.data(), std::min(buf.size(), reader.wanted()), MSG_DONTWAIT);
    if (r > 0) {
      (void)reader.feed({buf.data(), static_cast<std::size_t>(r)});
    } else if (r == 0) {
      fail(Status::peer_unreachable, ECONNRESET, who + " closed its connection");
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      fail(Status::peer_unreachable, errno, "receive from " + who + " failed");
    }
  }
  if (reader.state() == State::failed) fail(Status::malformed, EPROTO, who + " sent a " + reader.error());
}

void Io::send_frame(int fd, std::uint32_t seq, std::span<const std::byte> blob, Clock::time_point deadline,
                    const std::string& who) const {
  const auto head = bootwire::encode(bootwire::FrameHeader{seq, blob.size()});
  write_all(fd, head, deadline, "sending to " + who);
  write_all(fd, blob, deadline, "sending to " + who);
}

sockaddr_in resolve(const std::string& host, std::uint16_t port, const char* component) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) {
    throw Error(Status::invalid_argument, 0, prefixed(component, "cannot resolve '" + host + "': " + gai_strerror(rc)));
  }
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

std::string addr_text(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = "?";
  (void)::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

int make_socket(const char* component) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) Io{component}.fail(Status::transport_error, errno, "socket");
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int listen_on(const sockaddr_in& addr, std::uint16_t& port, const char* component, const std::string& what) {
  const int fd = make_socket(component);
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // A deep backlog: connections wait there while the owner is not polling,
  // and a flood of them must not push out the real peers.
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(fd);
    Io{component}.fail(Status::transport_error, err, what);
  }
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  (void)::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port = ntohs(bound.sin_port);
  return fd;
}

void connect_to(int fd, const sockaddr_in& addr, Clock::time_point deadline, const char* component,
                const std::string& what) {
  const Io io{component};
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno != EINPROGRESS) io.fail(Status::peer_unreachable, errno, "connect");
    io.wait_fd(fd, POLLOUT, deadline, what);
    int err = 0;
    socklen_t len = sizeof err;
    (void)::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) io.fail(Status::peer_unreachable, err, "connect");
  }
  sockaddr_in self{}, peer{};
  socklen_t sl = sizeof self, pl = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sl) == 0 &&
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) == 0 && self.sin_port == peer.sin_port &&
      self.sin_addr.s_addr == peer.sin_addr.s_addr) {
    io.fail(Status::peer_unreachable, ECONNREFUSED, "connect");
  }
}

void set_liveness(int fd, std::chrono::milliseconds bound) noexcept {
  // Probes start after `idle` seconds of silence and `count` unanswered
  // probes `interval` apart declare the connection dead: idle + count *
  // interval = the bound (whole seconds).
  const long b = std::max<long>(2, static_cast<long>((bound.count() + 999) / 1000));
  const int interval = static_cast<int>(std::max<long>(1, b / 5));
  const int count = static_cast<int>(std::clamp<long>((b - 1) / interval, 1, 3));
  const int idle = static_cast<int>(std::max<long>(1, b - count * interval));
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  const unsigned user_timeout = static_cast<unsigned>(b * 1000);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

bool send_some(int fd, std::span<const std::byte> data, std::size_t& off) noexcept {
  while (off < data.size()) {
    const ssize_t w = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      off += static_cast<std::size_t>(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return true;
    } else if (!(w < 0 && errno == EINTR)) {
      return false;
    }
  }
  return true;
}

void log_line(const std::function<void(const std::string&)>& sink, const char* component, const std::string& line) noexcept {
  if (sink) {
    try {
      sink(line);
    } catch (...) {
      // Swallowed: see the header.
    }
    return;
  }
  std::fprintf(stderr, "regpool %s: %s\n", component, line.c_str());
}

bootwire::Nonce fresh_nonce(const char* component) {
  bootwire::Nonce n;
  if (!detail::random_bytes(n)) {
    Io{component}.fail(Status::transport_error, errno, "no random bytes for a nonce (getrandom)");
  }
  return n;
}

}  // namespace regpool::tcp
