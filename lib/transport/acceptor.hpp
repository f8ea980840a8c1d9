#pragma once
// The accepting side shared by rank 0 of the TCP bootstrap and the
// membership Listener: a listening socket whose new connections must finish
// a handshake within a bound before they count. One table of pending
// connections, each with its deadline and its queued bytes; at most
// `max_pending` of them (a new one evicts the oldest, so a flood of idle
// connections must outpace a real peer's round trip to push it out); out of
// descriptors (EMFILE/ENFILE), the oldest handshake is evicted to make room.
// Every new connection is sent the bootstrap challenge (bootwire::Challenge)
// at once. What a handshake says and what becomes of it is the caller's:
// `State` holds its protocol state. Internal (never installed).
//
// Ownership: the Acceptor borrows the listening socket (its creator closes
// it, after the Acceptor) and owns the pending connections' descriptors
// until they are closed, dropped or released (handed over to the caller).
// Thread-safety: none; one thread drives an Acceptor.

#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "transport/bootstrap_wire.hpp"
#include "transport/tcp_socket.hpp"

namespace regpool::tcp {

// One accept4(2) on a non-blocking listening socket, retried on EINTR and
// ECONNABORTED. fd >= 0: a new non-blocking, close-on-exec connection with
// TCP_NODELAY, from `from`. fd < 0: err is 0 when the backlog is empty,
// else the errno.
struct Accepted {
  int fd = -1;
  int err = 0;
  sockaddr_in from{};
};
Accepted accept_one(int listen_fd) noexcept;

// True when a connection waits in the listening socket's backlog (needs no
// descriptor, unlike accept4).
bool backlog_waiting(int listen_fd) noexcept;

// Out of descriptors or kernel memory: a long-running server keeps its
// established connections and leaves new ones in the backlog.
bool out_of_resources(int err) noexcept;

void close_fd(int fd) noexcept;

template <class State>
class Acceptor {
 public:
  // A connection accepted but not yet admitted (or refused and closed).
  struct Pending {
    int fd = -1;
    std::string addr;
    Clock::time_point deadline{};
    bootwire::Nonce server_nonce{};  // of the challenge sent to it
    std::vector<std::byte> out;      // bytes queued for it
    std::size_t out_off = 0;
    bool pinned = false;  // never evicted (e.g. admitted, its verdict on the way)
    bool gone = false;    // closed, dropped or released: removed by sweep()
    State state;

    bool sending() const noexcept { return out_off < out.size(); }
    // Sends what the socket takes; false when the connection failed.
    bool flush() noexcept { return send_some(fd, out, out_off); }
    void queue(std::span<const std::byte> bytes) {
      out.assign(bytes.begin(), bytes.end());
      out_off = 0;
    }
  };
  // Told about every connection the Acceptor gives up on (evicted, expired,
  // failed, or dropped by the caller), with the reason, before it is closed.
  using DropHook = std::function<void(const Pending&, const std::string& why)>;

  Acceptor(const char* component, int listen_fd, std::size_t max_pending, std::chrono::milliseconds handshake_timeout,
           bool key_required, State initial, DropHook on_drop)
      : component_(component),
        listen_fd_(listen_fd),
        max_pending_(std::max<std::size_t>(1, max_pending)),
        timeout_(handshake_timeout),
        key_required_(key_required),
        initial_(std::move(initial)),
        on_drop_(std::move(on_drop)) {}
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;
  // Closes the pending connections still held (without telling the hook).
  ~Acceptor() {
    for (Pending& p : pending_) {
      if (!p.gone) close_fd(p.fd);
    }
  }

  std::vector<Pending>& pending() noexcept { return pending_; }
  std::size_t live() const noexcept {
    return static_cast<std::size_t>(std::count_if(pending_.begin(), pending_.end(), [](const Pending& p) { return !p.gone; }));
  }

  // Gives up on `p`: the hook hears why, then it is closed.
  void drop(Pending& p, const std::string& why) {
    if (p.gone) return;
    if (on_drop_) on_drop_(p, why);
    close(p);
  }
  // Closes `p` without a word (its handshake ended as the caller wanted).
  void close(Pending& p) noexcept {
    if (p.gone) return;
    close_fd(p.fd);
    p.fd = -1;
    p.gone = true;
  }
  // Hands `p`'s connection over to the caller, who owns it from now on.
  int release(Pending& p) noexcept {
    const int fd = p.fd;
    p.fd = -1;
    p.gone = true;
    return fd;
  }

  // Drops the oldest handshake that is not pinned; false when there is none.
  bool evict_oldest(const std::string& why) {
    Pending* oldest = nullptr;
    for (Pending& p : pending_) {
      if (!p.gone && !p.pinned && (!oldest || p.deadline < oldest->deadline)) oldest = &p;
    }
    if (!oldest) return false;
    drop(*oldest, "evicted: " + why);
    return true;
  }

  // Drops every handshake whose deadline has passed; `why(p)` says what it
  // did not finish. Then forgets the ones that are gone.
  template <class Why>
  void expire(Clock::time_point now, Why&& why) {
    for (Pending& p : pending_) {
      if (!p.gone && now >= p.deadline) drop(p, why(static_cast<const Pending&>(p)));
    }
    sweep();
  }
  void sweep() {
    std::erase_if(pending_, [](const Pending& p) { return p.gone; });
  }

  // Appends the listening socket and then every pending connection (POLLOUT
  // while it has bytes queued, else POLLIN) to `fds`; returns the index of
  // the listening socket (pending()[i] is at that index + 1 + i). `wake` is
  // lowered to the earliest handshake deadline.
  std::size_t poll_fds(std::vector<pollfd>& fds, Clock::time_point& wake) const {
    const std::size_t first = fds.size();
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const Pending& p : pending_) {
      fds.push_back({p.fd, static_cast<short>(p.sending() ? POLLOUT : POLLIN), 0});
      wake = std::min(wake, p.deadline);
    }
    return first;
  }

  // Accepts every connection in the backlog: each gets a deadline, a fresh
  // nonce and its challenge (sent at once). Returns 0 once the backlog is
  // empty, else the errno that stopped it (out of descriptors with nothing
  // left to evict, out of memory, or a failure of the listening socket).
  // Throws (setup path) only when no random nonce can be had.
  int accept_all() {
    for (;;) {
      const Accepted a = accept_one(listen_fd_);
      if (a.fd < 0) {
        if (a.err == 0) return 0;
        if (a.err == EMFILE || a.err == ENFILE) {
          // accept4 takes a descriptor before it looks at the backlog: at
          // the limit it fails even when nobody waits, and evicting then
          // would throw out the handshake just accepted.
          if (!backlog_waiting(listen_fd_)) return 0;
          if (evict_oldest("out of file descriptors")) continue;
        }
        return a.err;
      }
      if (live() >= max_pending_) (void)evict_oldest(std::to_string(max_pending_) + " handshakes in flight");
      Pending p;
      p.fd = a.fd;
      p.addr = addr_text(a.from);
      p.deadline = Clock::now() + timeout_;
      p.state = initial_;
      try {
        p.server_nonce = fresh_nonce(component_);
      } catch (...) {
        close_fd(a.fd);
        throw;
      }
      p.queue(bootwire::encode(bootwire::Challenge{key_required_, p.server_nonce}));
      pending_.push_back(std::move(p));
      Pending& q = pending_.back();
      if (!q.flush()) drop(q, "connection failed before the challenge was sent");
    }
  }

 private:
  const char* component_;
  int listen_fd_;
  std::size_t max_pending_;
  std::chrono::milliseconds timeout_;
  bool key_required_;
  State initial_;
  DropHook on_drop_;
  std::vector<Pending> pending_;
};

}  // namespace regpool::tcp
