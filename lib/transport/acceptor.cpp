#include "transport/acceptor.hpp"

#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace regpool::tcp {

Accepted accept_one(int listen_fd) noexcept {
  for (;;) {
    Accepted a;
    socklen_t len = sizeof a.from;
    a.fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&a.from), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (a.fd >= 0) {
      // Handshake replies are small and answered at once: no Nagle delay.
      const int one = 1;
      (void)::setsockopt(a.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return a;
    }
    // A client that gave up while in the backlog is no reason to stop.
    if (errno == EINTR || errno == ECONNABORTED) continue;
    a.err = (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : errno;
    return a;
  }
}

bool backlog_waiting(int listen_fd) noexcept {
  pollfd p{listen_fd, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, 0);
  } while (rc < 0 && errno == EINTR);
  return rc == 1 && (p.revents & POLLIN) != 0;
}

bool out_of_resources(int err) noexcept { return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM; }

void close_fd(int fd) noexcept {
  if (fd >= 0) ::close(fd);
}

}  // namespace regpool::tcp
