#include "regpool/bootstrap.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

namespace regpool {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kHelloMagic = 0x4c454852;  // "RHEL"
constexpr std::uint32_t kFrameMagic = 0x4d524652;  // "RFRM"

[[noreturn]] void fail(Status st, int err, const std::string& what) {
  throw Error(st, err, "bootstrap: " + what + (err ? std::string(": ") + std::strerror(err) : std::string()));
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

// Wait until fd is ready for `events` or the deadline passes.
void wait_fd(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int ms = remaining_ms(deadline);
    const int rc = ::poll(&p, 1, ms);
    if (rc > 0) {
      if ((p.revents & (POLLERR | POLLNVAL)) != 0 && (p.revents & events) == 0) {
        fail(Status::peer_unreachable, ECONNRESET, std::string(what) + ": connection failed");
      }
      return;
    }
    if (rc == 0) fail(Status::timeout, ETIMEDOUT, std::string(what) + ": timed out");
    if (errno != EINTR) fail(Status::transport_error, errno, std::string(what) + ": poll");
  }
}

void write_all(int fd, const void* data, std::size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    wait_fd(fd, POLLOUT, deadline, "send");
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<std::size_t>(w);
    } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      fail(Status::peer_unreachable, errno, "send to a peer failed");
    }
  }
}

void read_all(int fd, void* data, std::size_t n, Clock::time_point deadline) {
  auto* p = static_cast<std::byte*>(data);
  while (n > 0) {
    wait_fd(fd, POLLIN, deadline, "receive");
    const ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<std::size_t>(r);
    } else if (r == 0) {
      fail(Status::peer_unreachable, ECONNRESET, "a peer closed its connection");
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      fail(Status::peer_unreachable, errno, "receive from a peer failed");
    }
  }
}

void put_u32(std::byte* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
void put_u64(std::byte* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
std::uint32_t get_u32(const std::byte* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
std::uint64_t get_u64(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

// Frame: magic, sequence, u64 length, bytes.
void send_frame(int fd, std::uint32_t seq, std::span<const std::byte> blob, Clock::time_point deadline) {
  std::byte head[16];
  put_u32(head, kFrameMagic);
  put_u32(head + 4, seq);
  put_u64(head + 8, blob.size());
  write_all(fd, head, sizeof head, deadline);
  if (!blob.empty()) write_all(fd, blob.data(), blob.size(), deadline);
}

std::vector<std::byte> recv_frame(int fd, std::uint32_t seq, std::size_t max, Clock::time_point deadline) {
  std::byte head[16];
  read_all(fd, head, sizeof head, deadline);
  if (get_u32(head) != kFrameMagic || get_u32(head + 4) != seq) {
    fail(Status::malformed, EPROTO, "a peer sent an unexpected frame (mismatched collectives?)");
  }
  const std::uint64_t len = get_u64(head + 8);
  if (len > max) fail(Status::malformed, EMSGSIZE, "a peer sent a blob of " + std::to_string(len) + " bytes");
  std::vector<std::byte> blob(static_cast<std::size_t>(len));
  if (len) read_all(fd, blob.data(), blob.size(), deadline);
  return blob;
}

sockaddr_in resolve(const std::string& host, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) fail(Status::invalid_argument, 0, "cannot resolve '" + host + "': " + gai_strerror(rc));
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

int make_socket() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(Status::transport_error, errno, "socket");
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

TcpBootstrap::TcpBootstrap(const TcpBootstrapConfig& config) : config_(config) {
  if (config_.size < 1 || config_.rank < 0 || config_.rank >= config_.size) {
    fail(Status::invalid_argument, 0,
         "rank " + std::to_string(config_.rank) + " is not within size " + std::to_string(config_.size));
  }
  const sockaddr_in addr = resolve(config_.host, config_.port);
  if (config_.rank == 0) {
    peers_.assign(static_cast<std::size_t>(config_.size), -1);
    if (config_.size == 1) {
      accepted_ = true;
      return;
    }
    listen_fd_ = make_socket();
    const int one = 1;
    (void)::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, config_.size) != 0) {
      const int err = errno;
      ::close(listen_fd_);
      listen_fd_ = -1;
      fail(Status::transport_error, err, "rank 0 cannot listen on " + config_.host + ":" + std::to_string(config_.port));
    }
    sockaddr_in bound{};
    socklen_t len = sizeof bound;
    (void)::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    port_ = ntohs(bound.sin_port);
    return;
  }

  if (config_.port == 0) fail(Status::invalid_argument, 0, "ranks other than 0 need rank 0's port");
  port_ = config_.port;
  const auto deadline = Clock::now() + config_.connect_timeout;
  int fd = -1;
  for (;;) {
    fd = make_socket();
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) break;
    const int err = errno;
    ::close(fd);
    fd = -1;
    // Rank 0 may not be listening yet: retry until the bound.
    if (Clock::now() >= deadline) {
      fail(Status::timeout, err, "rank " + std::to_string(config_.rank) + " could not reach rank 0 at " + config_.host +
                                     ":" + std::to_string(config_.port));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  peers_.push_back(fd);
  try {
    std::byte hello[12];
    put_u32(hello, kHelloMagic);
    put_u32(hello + 4, static_cast<std::uint32_t>(config_.rank));
    put_u32(hello + 8, static_cast<std::uint32_t>(config_.size));
    write_all(fd, hello, sizeof hello, deadline);
  } catch (...) {
    ::close(fd);
    throw;
  }
}

TcpBootstrap::~TcpBootstrap() {
  for (int fd : peers_) {
    if (fd >= 0) ::close(fd);
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void TcpBootstrap::accept_all(Clock::time_point deadline) {
  int missing = config_.size - 1;
  while (missing > 0) {
    wait_fd(listen_fd_, POLLIN, deadline, "waiting for ranks to connect");
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      fail(Status::transport_error, errno, "accept");
    }
    std::byte hello[12];
    try {
      read_all(fd, hello, sizeof hello, deadline);
    } catch (...) {
      ::close(fd);
      continue;  // a stray connection that said nothing useful
    }
    const std::uint32_t r = get_u32(hello + 4);
    if (get_u32(hello) != kHelloMagic || get_u32(hello + 8) != static_cast<std::uint32_t>(config_.size) || r == 0 ||
        r >= static_cast<std::uint32_t>(config_.size) || peers_[r] >= 0) {
      ::close(fd);
      continue;
    }
    peers_[r] = fd;
    --missing;
  }
  ::close(listen_fd_);
  listen_fd_ = -1;
  accepted_ = true;
}

std::vector<std::vector<std::byte>> TcpBootstrap::allgather(std::span<const std::byte> mine,
                                                             std::chrono::milliseconds timeout) {
  const std::uint32_t seq = ++sequence_;
  const auto deadline = Clock::now() + timeout;
  const std::size_t n = static_cast<std::size_t>(config_.size);
  std::vector<std::vector<std::byte>> all(n);
  if (config_.rank == 0) {
    if (!accepted_) accept_all(std::max(deadline, Clock::now() + config_.connect_timeout));
    all[0].assign(mine.begin(), mine.end());
    for (std::size_t r = 1; r < n; ++r) all[r] = recv_frame(peers_[r], seq, config_.max_blob, deadline);
    // Everyone gets everything: count, then (length, bytes) per rank.
    std::vector<std::byte> packed(4);
    put_u32(packed.data(), static_cast<std::uint32_t>(n));
    for (const auto& b : all) {
      std::byte len[8];
      put_u64(len, b.size());
      packed.insert(packed.end(), len, len + 8);
      packed.insert(packed.end(), b.begin(), b.end());
    }
    for (std::size_t r = 1; r < n; ++r) send_frame(peers_[r], seq, packed, deadline);
    return all;
  }
  send_frame(peers_[0], seq, mine, deadline);
  const std::vector<std::byte> packed = recv_frame(peers_[0], seq, config_.max_blob * n + 16 * n, deadline);
  std::size_t pos = 0;
  auto need = [&](std::size_t k) {
    if (packed.size() - pos < k) fail(Status::malformed, EPROTO, "rank 0 sent a truncated allgather");
  };
  need(4);
  if (get_u32(packed.data()) != n) fail(Status::malformed, EPROTO, "rank 0 sent the wrong number of blobs");
  pos = 4;
  for (std::size_t r = 0; r < n; ++r) {
    need(8);
    const std::uint64_t len = get_u64(packed.data() + pos);
    pos += 8;
    need(static_cast<std::size_t>(len));
    all[r].assign(packed.begin() + static_cast<std::ptrdiff_t>(pos),
                  packed.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += static_cast<std::size_t>(len);
  }
  return all;
}

#if !REGPOOL_HAVE_MPI
bool mpi_bootstrap_available() noexcept { return false; }
std::unique_ptr<Bootstrap> mpi_bootstrap() {
  throw Error(Status::unsupported, 0,
              "bootstrap: regpool was built without MPI (install libopenmpi-dev and reconfigure; -Dmpi=enabled makes a missing MPI an error)");
}
#endif

std::vector<std::byte> pack_blobs(const std::vector<std::vector<std::byte>>& parts) {
  std::vector<std::byte> out;
  for (const auto& p : parts) {
    if (p.size() > UINT32_MAX) throw Error(Status::invalid_argument, 0, "pack_blobs: blob larger than 4 GiB");
    const auto n = static_cast<std::uint32_t>(p.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::byte>(n >> (8 * i)));
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

std::vector<std::vector<std::byte>> unpack_blobs(std::span<const std::byte> in) {
  std::vector<std::vector<std::byte>> parts;
  std::size_t pos = 0;
  while (pos < in.size()) {
    if (in.size() - pos < 4) throw Error(Status::malformed, 0, "unpack_blobs: truncated length");
    std::uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= std::uint32_t{std::to_integer<std::uint8_t>(in[pos + static_cast<std::size_t>(i)])} << (8 * i);
    pos += 4;
    if (in.size() - pos < n) throw Error(Status::malformed, 0, "unpack_blobs: truncated blob");
    parts.emplace_back(in.begin() + static_cast<std::ptrdiff_t>(pos), in.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
  }
  return parts;
}

}  // namespace regpool
