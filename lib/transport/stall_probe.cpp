#include "transport/stall_probe.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace regpool::tcp {

StallProbe::~StallProbe() { close_fd(); }

bool StallProbe::set_address(std::span<const std::byte> addr) noexcept {
  addr_len_ = 0;
  sa_family_t family = 0;
  if (addr.size() < sizeof family) return false;
  std::memcpy(&family, addr.data(), sizeof family);
  if (family == AF_INET && addr.size() == sizeof(sockaddr_in)) {
    sockaddr_in a{};
    std::memcpy(&a, addr.data(), sizeof a);
    if (a.sin_port == 0 || a.sin_addr.s_addr == htonl(INADDR_ANY)) return false;
  } else if (family == AF_INET6 && addr.size() == sizeof(sockaddr_in6)) {
    sockaddr_in6 a{};
    std::memcpy(&a, addr.data(), sizeof a);
    if (a.sin6_port == 0 || std::memcmp(&a.sin6_addr, &in6addr_any, sizeof a.sin6_addr) == 0) return false;
  } else {
    return false;
  }
  static_assert(sizeof addr_ >= sizeof(sockaddr_in6));
  std::memcpy(addr_, addr.data(), addr.size());
  addr_len_ = static_cast<std::uint32_t>(addr.size());
  return true;
}

void StallProbe::close_fd() noexcept {
  if (fd_ < 0) return;
  // Reset rather than close politely: an accepted probe then costs the
  // peer one failed accept, and leaves no TIME_WAIT here.
  const linger l{1, 0};
  (void)::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd_);
  fd_ = -1;
}

void StallProbe::end_stall() noexcept {
  since_ = {};
  close_fd();
}

StallProbe::Verdict StallProbe::finish(int err) noexcept {
  Verdict v = Verdict::unknown;
  if (err == ECONNREFUSED) {
    v = Verdict::refused;
  } else if (err == 0) {
    // Connected. To a listener, unless the kernel joined the socket to
    // itself: a TCP self-connect happens only when nothing is bound to the
    // port (our ephemeral port came out equal to it).
    sockaddr_storage self{}, peer{};
    socklen_t sl = sizeof self, pl = sizeof peer;
    v = Verdict::listening;
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&self), &sl) == 0 &&
        ::getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &pl) == 0 && sl == pl &&
        std::memcmp(&self, &peer, sl) == 0) {
      v = Verdict::refused;
    }
  }
  close_fd();
  return v;
}

StallProbe::Verdict StallProbe::start() noexcept {
  close_fd();
  ++probes_;
  const auto* sa = reinterpret_cast<const sockaddr*>(addr_);
  fd_ = ::socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return Verdict::unknown;
  if (::connect(fd_, sa, addr_len_) == 0) return finish(0);
  if (errno == EINPROGRESS || errno == EINTR) return Verdict::pending;
  return finish(errno);
}

StallProbe::Verdict StallProbe::check() noexcept {
  pollfd p{fd_, POLLOUT, 0};
  const int n = ::poll(&p, 1, 0);
  if (n == 0) return Verdict::pending;
  if (n < 0) return errno == EINTR ? Verdict::pending : finish(errno);
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  return finish(err);
}

StallProbe::Verdict StallProbe::poll_or_start(Clock::time_point now) noexcept {
  if (fd_ < 0) {
    started_ = now;
    return start();
  }
  const Verdict v = check();
  if (v != Verdict::pending || now - started_ < policy_.answer_within) return v;
  close_fd();
  return Verdict::unknown;
}

StallProbe::Look StallProbe::look(Clock::time_point now) noexcept {
  if (gone_) return Look::gone;
  if (addr_len_ == 0) return Look::alive;
  switch (poll_or_start(now)) {
    case Verdict::pending: return Look::pending;
    case Verdict::refused: gone_ = true; return Look::gone;
    case Verdict::listening:
    case Verdict::unknown: break;
  }
  return Look::alive;
}

bool StallProbe::stalled(Clock::time_point now) noexcept {
  if (gone_) return true;
  if (addr_len_ == 0) return false;
  // A wait long after the last one starts a new stall (the old one ended
  // with no post going through, e.g. the caller gave up).
  if (since_ == Clock::time_point{} || now - last_ > policy_.patience) {
    end_stall();
    since_ = now;
    next_ = now + policy_.patience;
    gap_ = policy_.first_gap;
  }
  last_ = now;
  if (fd_ < 0 && now < next_) return false;
  switch (poll_or_start(now)) {
    case Verdict::pending: return false;
    case Verdict::refused: gone_ = true; return true;
    case Verdict::listening:
    case Verdict::unknown: break;
  }
  // Alive, or no verdict: look again later, less often while it lasts.
  next_ = now + gap_;
  gap_ = std::min(gap_ * 2, policy_.max_gap);
  return false;
}

}  // namespace regpool::tcp
