#include "regpool/bootstrap.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "transport/acceptor.hpp"
#include "transport/bootstrap_wire.hpp"
#include "transport/hmac.hpp"
#include "transport/tcp_socket.hpp"
#include "transport/wire_le.hpp"

namespace regpool {
namespace {

using Clock = std::chrono::steady_clock;
namespace bw = bootwire;

// Rank 0 keeps at most this many handshakes in flight; a new connection
// beyond it evicts the oldest (a real rank answers within a round trip, so a
// flood of idle connections must outpace that to push one out).
constexpr std::size_t kMaxPendingHandshakes = 64;
// Other ranks: connections that rank 0 closed before its verdict (dropped
// as too slow, evicted under a flood) are retried this many times.
constexpr int kMaxHandshakeAttempts = 5;
constexpr std::size_t kReadChunk = 64 * 1024;

const tcp::Io io{"bootstrap"};

[[noreturn]] void fail(Status st, int err, const std::string& what) { io.fail(st, err, what); }

// A refusal by rank 0 (or of rank 0): the message says it all; errno's text
// ("Permission denied", "Address already in use") would only mislead.
[[noreturn]] void refuse(Status st, int code, const std::string& what) { throw Error(st, code, "bootstrap: " + what); }

using tcp::remaining_ms;
using tcp::key_bytes;

std::string ms_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

void write_all(int fd, std::span<const std::byte> data, Clock::time_point deadline, const std::string& what) {
  io.write_all(fd, data, deadline, what);
}
void read_all(int fd, std::span<std::byte> data, Clock::time_point deadline, const std::string& what) {
  io.read_all(fd, data, deadline, what);
}
void read_frame(int fd, bw::FrameReader& reader, Clock::time_point deadline, const std::string& who) {
  io.read_frame(fd, reader, deadline, who);
}
void send_frame(int fd, std::uint32_t seq, std::span<const std::byte> blob, Clock::time_point deadline,
                const std::string& who) {
  io.send_frame(fd, seq, blob, deadline, who);
}
sockaddr_in resolve(const std::string& host, std::uint16_t port) { return tcp::resolve(host, port, "bootstrap"); }
int make_socket() { return tcp::make_socket("bootstrap"); }
bw::Nonce fresh_nonce() { return tcp::fresh_nonce("bootstrap"); }

// Rank 0 closed the connection before its verdict: worth another attempt.
struct Retry {
  std::string why;
};

}  // namespace

TcpBootstrap::TcpBootstrap(const TcpBootstrapConfig& config) : config_(config) {
  if (config_.size < 1 || config_.rank < 0 || config_.rank >= config_.size) {
    fail(Status::invalid_argument, 0,
         "rank " + std::to_string(config_.rank) + " is not within size " + std::to_string(config_.size));
  }
  if (config_.handshake_timeout.count() <= 0) fail(Status::invalid_argument, 0, "handshake_timeout must be positive");
  key_ = config_.key;
  if (key_.empty() && config_.key_from_environment) {
    if (const char* env = std::getenv("REGPOOL_BOOTSTRAP_KEY")) key_ = env;
  }
  // The copy in config_ is not needed any more; keep one copy to wipe.
  detail::secure_wipe(config_.key.data(), config_.key.size());
  config_.key.clear();
  const sockaddr_in addr = resolve(config_.host, config_.port);
  if (config_.rank == 0) {
    peers_.assign(static_cast<std::size_t>(config_.size), -1);
    peer_addr_.assign(static_cast<std::size_t>(config_.size), std::string());
    if (config_.size == 1) {
      accepted_ = true;
      return;
    }
    listen_fd_ = tcp::listen_on(addr, port_, "bootstrap",
                                "rank 0 cannot listen on " + config_.host + ":" + std::to_string(config_.port));
    return;
  }
  if (config_.port == 0) fail(Status::invalid_argument, 0, "ranks other than 0 need rank 0's port");
  port_ = config_.port;
  connect_to_root();
}

TcpBootstrap::~TcpBootstrap() {
  for (int fd : peers_) {
    if (fd >= 0) ::close(fd);
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  detail::secure_wipe(key_.data(), key_.size());
}

std::string TcpBootstrap::lost_peer() const {
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i] < 0) continue;
    pollfd p{peers_[i], POLLRDHUP, 0};
    if (::poll(&p, 1, 0) != 1) continue;
    const int rank = config_.rank == 0 ? static_cast<int>(i) : 0;
    const std::string who = "rank " + std::to_string(rank) + " (" + peer_addr_[i] + ")";
    int err = 0;
    socklen_t len = sizeof err;
    if ((p.revents & POLLERR) && ::getsockopt(peers_[i], SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) {
      return who + ": connection lost: " + std::strerror(err);
    }
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return who + ": closed its connection (the process exited or was killed)";
  }
  return {};
}

void TcpBootstrap::log(const std::string& line) const { tcp::log_line(config_.log, "bootstrap", line); }

void TcpBootstrap::connect_to_root() {
  const sockaddr_in addr = resolve(config_.host, config_.port);
  const std::string root = "rank 0 at " + config_.host + ":" + std::to_string(config_.port);
  const std::string me = "rank " + std::to_string(config_.rank);
  const auto deadline = Clock::now() + config_.connect_timeout;
  const auto rank = static_cast<std::uint32_t>(config_.rank);
  const auto size = static_cast<std::uint32_t>(config_.size);
  int attempts = 0;
  std::string last;
  bool refused = false;
  for (;;) {
    const int fd = make_socket();
    try {
      // Non-blocking connect, so an unreachable host cannot outlast the
      // bound; a TCP self-connect counts as "refused", not rank 0.
      tcp::connect_to(fd, addr, deadline, "bootstrap", me + " connecting to " + root);
      // Handshake. Rank 0 sends its challenge when it accepts, in its
      // first collective: wait for it up to the bound.
      std::array<std::byte, bw::kChallengeSize> cb;
      try {
        read_all(fd, cb, deadline, me + " waiting for the challenge of " + root);
      } catch (const Error& e) {
        if (e.status() == Status::peer_unreachable) throw Retry{root + " closed the connection before its challenge"};
        throw;
      }
      std::string why;
      const auto challenge = bw::parse_challenge(cb, why);
      if (!challenge) fail(Status::malformed, EPROTO, root + " sent a malformed " + why);
      if (!key_.empty() && !challenge->key_required) {
        refuse(Status::access_denied, EACCES,
               root + " does not require a job key but " + me +
                 " has one; not sending anything to an unauthenticated rank 0 (set REGPOOL_BOOTSTRAP_KEY or "
                 "TcpBootstrapConfig::key on every rank, or on none)");
      }
      bw::Hello hello;
      hello.has_mac = !key_.empty();
      hello.rank = rank;
      hello.size = size;
      hello.nonce = fresh_nonce();
      hello.mac = bw::hello_mac(key_bytes(key_), challenge->nonce, hello.nonce, rank, size);
      std::array<std::byte, bw::kVerdictSize> vb;
      try {
        write_all(fd, bw::encode(hello), deadline, me + " sending its hello to " + root);
        read_all(fd, vb, deadline, me + " waiting for the verdict of " + root);
      } catch (const Error& e) {
        if (e.status() == Status::peer_unreachable) throw Retry{root + " closed the connection before its verdict"};
        throw;
      }
      const auto verdict = bw::parse_verdict(vb, why);
      if (!verdict) fail(Status::malformed, EPROTO, root + " sent a malformed " + why);
      const std::string refusal = root + " refused " + me + ": ";
      const std::string d = std::to_string(verdict->detail);
      switch (verdict->code) {
        case bw::VerdictCode::accepted:
          if (!key_.empty()) {
            const auto expect = bw::verdict_mac(key_bytes(key_), challenge->nonce, hello.nonce, rank, size,
                                                bw::VerdictCode::accepted);
            if (!detail::equal_constant_time(expect, verdict->mac)) {
              refuse(Status::access_denied, EACCES,
                   root + " admitted " + me + " without proving the job key: it is not the real rank 0 (or its key "
                   "differs); nothing was sent to it");
            }
          }
          peers_.push_back(fd);
          peer_addr_.push_back(config_.host + ":" + std::to_string(config_.port));
          return;
        case bw::VerdictCode::bad_key:
          refuse(Status::access_denied, EACCES,
               refusal + "the job key does not match (REGPOOL_BOOTSTRAP_KEY / TcpBootstrapConfig::key differ)");
        case bw::VerdictCode::missing_key:
          refuse(Status::access_denied, EACCES,
               refusal + "rank 0 requires the job key and this rank has none (set REGPOOL_BOOTSTRAP_KEY or "
                         "TcpBootstrapConfig::key)");
        case bw::VerdictCode::unexpected_key:
          refuse(Status::access_denied, EACCES, refusal + "this rank has a job key and rank 0 has none");
        case bw::VerdictCode::duplicate_rank:
          refuse(Status::invalid_argument, EADDRINUSE,
               refusal + "rank " + d +
                   " is already taken (two processes started with the same rank, or another process claimed it "
                   "first; a job key prevents the latter)");
        case bw::VerdictCode::rank_out_of_range:
          refuse(Status::invalid_argument, EINVAL, refusal + "rank out of range for rank 0's job size " + d);
        case bw::VerdictCode::size_mismatch:
          refuse(Status::invalid_argument, EINVAL,
               refusal + "this rank says the job has " + std::to_string(size) + " ranks, rank 0 says " + d);
        case bw::VerdictCode::bad_version:
          refuse(Status::unsupported, EPROTO,
               refusal + "rank 0 speaks bootstrap protocol version " + d + ", this rank " +
                   std::to_string(bw::kVersion) + " (mixed regpool versions)");
      }
      fail(Status::malformed, EPROTO, root + " sent an unknown verdict");
    } catch (const Retry& r) {
      ::close(fd);
      last = r.why;
      ++attempts;
    } catch (const Error& e) {
      ::close(fd);
      // Refused connections and resets before rank 0 listens: retry until
      // the bound; every other error is final.
      if (e.status() != Status::peer_unreachable) throw;
      last = e.what();
      refused = e.provider_code() == ECONNREFUSED;
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (attempts >= kMaxHandshakeAttempts) {
      fail(Status::peer_unreachable, ECONNRESET,
           me + ": " + root + " dropped " + std::to_string(attempts) + " handshakes in a row (last: " + last +
               "); it may be overloaded by stray connections or drop this rank as too slow (handshake_timeout)");
    }
    if (Clock::now() >= deadline) {
      fail(Status::timeout, ETIMEDOUT,
           me + " could not reach " + root + " within " + ms_text(config_.connect_timeout) + " (last: " + last +
               (refused ? "; rank 0 stops listening once every rank is admitted: is it not started yet, or did "
                          "another process take this rank's place?)"
                        : ")"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 << std::min(attempts, 4)));
  }
}

namespace {

// Rank 0's state of a handshake (the acceptor holds the connection).
struct Handshake {
  std::array<std::byte, bw::kHelloSize> in{};
  std::size_t in_len = 0;
  bool hello_done = false;
  int admit_rank = -1;  // slot reserved; admitted once the verdict is out
};
using Acceptor = tcp::Acceptor<Handshake>;
using Pending = Acceptor::Pending;

}  // namespace

void TcpBootstrap::accept_all(Clock::time_point deadline) {
  const auto size = static_cast<std::uint32_t>(config_.size);
  // Ranks admitted in an earlier, failed attempt keep their places.
  int missing = static_cast<int>(std::count(peers_.begin() + 1, peers_.end(), -1));
  std::size_t dropped = 0;
  std::string last_drop;
  auto unreserve = [&](const Pending& p) {
    if (p.state.admit_rank > 0) {
      peers_[static_cast<std::size_t>(p.state.admit_rank)] = -1;
      peer_addr_[static_cast<std::size_t>(p.state.admit_rank)].clear();
    }
  };
  Acceptor acc("bootstrap", listen_fd_, kMaxPendingHandshakes, config_.handshake_timeout, !key_.empty(), Handshake{},
               [&](const Pending& p, const std::string& why) {
                 log("rank 0 dropped the connection from " + p.addr + ": " + why);
                 ++dropped;
                 last_drop = p.addr + ": " + why;
                 unreserve(p);
               });

  // Judges a complete hello and queues the verdict.
  auto judge = [&](Pending& p) {
    Handshake& hs = p.state;
    hs.hello_done = true;
    const std::uint16_t version = le::get_u16(hs.in.data() + 4);
    bw::Verdict v;
    std::string reason;
    std::string why;
    std::optional<bw::Hello> h;
    if (version != bw::kVersion) {
      v.code = bw::VerdictCode::bad_version;
      v.detail = bw::kVersion;
      reason = "hello of protocol version " + std::to_string(version);
    } else {
      h = bw::parse_hello(hs.in, why);
      if (!h) {
        acc.drop(p, "malformed " + why);
        return;
      }
      const std::string claim = "hello for rank " + std::to_string(h->rank) + " of " + std::to_string(h->size);
      if (!key_.empty() && !h->has_mac) {
        v.code = bw::VerdictCode::missing_key;
        reason = claim + " without proof of the job key";
      } else if (!key_.empty() &&
                 !detail::equal_constant_time(
                     h->mac, bw::hello_mac(key_bytes(key_), p.server_nonce, h->nonce, h->rank, h->size))) {
        v.code = bw::VerdictCode::bad_key;
        reason = claim + " with a wrong proof of the job key (forged, or the key differs)";
      } else if (key_.empty() && h->has_mac) {
        v.code = bw::VerdictCode::unexpected_key;
        reason = claim + " from a rank that has a job key (rank 0 has none)";
      } else if (h->size != size) {
        v.code = bw::VerdictCode::size_mismatch;
        v.detail = size;
        reason = claim + ": the job has " + std::to_string(size) + " ranks";
      } else if (h->rank == 0 || h->rank >= size) {
        v.code = bw::VerdictCode::rank_out_of_range;
        v.detail = size;
        reason = claim + ": rank out of range 1.." + std::to_string(size - 1);
      } else if (peers_[h->rank] >= 0) {
        v.code = bw::VerdictCode::duplicate_rank;
        v.detail = h->rank;
        reason = claim + ": rank " + std::to_string(h->rank) + " is already taken by " + peer_addr_[h->rank];
      } else {
        v.code = bw::VerdictCode::accepted;
        hs.admit_rank = static_cast<int>(h->rank);
        p.pinned = true;  // a rank's place: never evicted for a stranger
        peers_[h->rank] = p.fd;
        peer_addr_[h->rank] = p.addr;
      }
      v.mac = bw::verdict_mac(key_bytes(key_), p.server_nonce, h->nonce, h->rank, h->size, v.code);
    }
    if (v.code != bw::VerdictCode::accepted) {
      log("rank 0 refused a " + reason + " from " + p.addr);
      ++dropped;
      last_drop = p.addr + ": refused " + reason;
    }
    p.queue(bw::encode(v));
  };

  // The verdict is out (or failed): admit or close.
  auto settle = [&](Pending& p) {
    if (p.state.admit_rank > 0) {
      (void)acc.release(p);  // peers_ holds it
      --missing;
    } else {
      acc.close(p);
    }
  };

  try {
    while (missing > 0) {
      const auto now = Clock::now();
      if (now >= deadline) {
        std::string which;
        for (std::size_t r = 1; r < peers_.size(); ++r) {
          if (peers_[r] < 0) which += (which.empty() ? "" : ",") + std::to_string(r);
        }
        fail(Status::timeout, ETIMEDOUT,
             "rank 0 timed out waiting for rank(s) " + which + " to connect and be admitted; " +
                 std::to_string(dropped) + " connection(s) dropped or refused" +
                 (last_drop.empty() ? std::string() : " (last: " + last_drop + ")"));
      }
      acc.expire(now, [&](const Pending& p) {
        return p.state.hello_done ? "did not read its verdict within " + ms_text(config_.handshake_timeout)
                                  : "no complete hello within " + ms_text(config_.handshake_timeout) + " (" +
                                        std::to_string(p.state.in_len) + " of " + std::to_string(bw::kHelloSize) +
                                        " bytes received)";
      });

      std::vector<pollfd> fds;
      auto wake = deadline;
      const std::size_t lfd = acc.poll_fds(fds, wake);
      const int rc = ::poll(fds.data(), fds.size(), remaining_ms(wake));
      if (rc < 0) {
        if (errno == EINTR) continue;
        fail(Status::transport_error, errno, "rank 0: poll");
      }
      if (rc == 0) continue;

      auto& pend = acc.pending();
      for (std::size_t i = 0; i < pend.size(); ++i) {
        Pending& p = pend[i];
        Handshake& hs = p.state;
        const short re = fds[lfd + 1 + i].revents;
        if (re == 0) continue;
        if (p.sending()) {
          if (!p.flush()) {
            acc.drop(p, "connection failed while rank 0 sent to it");
            continue;
          }
          if (!p.sending() && hs.hello_done) settle(p);
          continue;
        }
        // Read what is there (and an end of stream right behind it), never
        // past the hello.
        bool closed = false;
        int failed = 0;
        while (hs.in_len < hs.in.size()) {
          const ssize_t r = ::recv(p.fd, hs.in.data() + hs.in_len, hs.in.size() - hs.in_len, MSG_DONTWAIT);
          if (r > 0) {
            hs.in_len += static_cast<std::size_t>(r);
            continue;
          }
          if (r < 0 && errno == EINTR) continue;
          closed = r == 0;
          if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) failed = errno;
          break;
        }
        if (!bw::plausible_prefix({hs.in.data(), std::min<std::size_t>(hs.in_len, 4)}, bw::kHelloMagic)) {
          acc.drop(p, "sent bytes that are not a regpool bootstrap hello (bad magic)");
          continue;
        }
        if (closed) {
          acc.drop(p, "closed the connection after " + std::to_string(hs.in_len) + " bytes of its hello");
          continue;
        }
        if (failed != 0) {
          acc.drop(p, std::string("receive failed: ") + std::strerror(failed));
          continue;
        }
        if (hs.in_len < hs.in.size()) continue;
        judge(p);
        if (p.gone) continue;
        if (!p.flush()) {
          acc.drop(p, "connection failed while rank 0 sent its verdict");
          continue;
        }
        if (!p.sending()) settle(p);
      }

      if ((fds[lfd].revents & POLLIN) != 0) {
        if (const int err = acc.accept_all(); err != 0) fail(Status::transport_error, err, "rank 0: accept");
      }
      acc.sweep();
    }
  } catch (...) {
    // Verdicts not out: those ranks are not admitted (the acceptor closes
    // their connections).
    for (const Pending& p : acc.pending()) {
      if (!p.gone) unreserve(p);
    }
    throw;
  }
  for (Pending& p : acc.pending()) {
    if (p.gone) continue;
    log("rank 0 closed the connection from " + p.addr + ": every rank is already admitted");
    acc.close(p);
  }
  ::close(listen_fd_);
  listen_fd_ = -1;
  accepted_ = true;
}

std::vector<std::vector<std::byte>> TcpBootstrap::gather_at_root(std::span<const std::byte> mine, std::uint32_t seq,
                                                                 Clock::time_point deadline) {
  const std::size_t n = static_cast<std::size_t>(config_.size);
  std::vector<std::vector<std::byte>> all(n);
  all[0].assign(mine.begin(), mine.end());
  // Every rank's frame at once (poll), so one slow rank does not hold the
  // others' bytes in their socket buffers.
  std::vector<bw::FrameReader> readers;
  readers.reserve(n);
  for (std::size_t r = 0; r < n; ++r) readers.emplace_back(seq, config_.max_blob);
  auto who = [&](std::size_t r) { return "rank " + std::to_string(r) + " (" + peer_addr_[r] + ")"; };
  std::vector<std::byte> buf(kReadChunk);
  std::size_t left = n - 1;
  while (left > 0) {
    std::vector<pollfd> fds;
    std::vector<std::size_t> rank_of;
    for (std::size_t r = 1; r < n; ++r) {
      if (readers[r].wanted() > 0 && readers[r].state() != bw::FrameReader::State::failed) {
        fds.push_back({peers_[r], POLLIN, 0});
        rank_of.push_back(r);
      }
    }
    const int rc = ::poll(fds.data(), fds.size(), remaining_ms(deadline));
    if (rc < 0) {
      if (errno == EINTR) continue;
      fail(Status::transport_error, errno, "rank 0: poll");
    }
    if (rc == 0) {
      std::string which;
      for (std::size_t k = 0; k < rank_of.size(); ++k) {
        const auto r = rank_of[k];
        which += (which.empty() ? "" : ", ") + who(r) + " (" + std::to_string(readers[r].received()) + " bytes)";
      }
      fail(Status::timeout, ETIMEDOUT, "rank 0 timed out in collective #" + std::to_string(seq) + " waiting for " + which);
    }
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const std::size_t r = rank_of[k];
      auto& rd = readers[r];
      const ssize_t got = ::recv(peers_[r], buf.data(), std::min(buf.size(), rd.wanted()), MSG_DONTWAIT);
      if (got == 0) {
        fail(Status::peer_unreachable, ECONNRESET,
             who(r) + " closed its connection in collective #" + std::to_string(seq));
      }
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        fail(Status::peer_unreachable, errno, "receive from " + who(r) + " failed");
      }
      (void)rd.feed({buf.data(), static_cast<std::size_t>(got)});
      if (rd.state() == bw::FrameReader::State::failed) fail(Status::malformed, EPROTO, who(r) + " sent a " + rd.error());
      if (rd.state() == bw::FrameReader::State::done) {
        all[r] = rd.take();
        --left;
      }
    }
  }
  const std::vector<std::byte> packed = bw::pack_gathered(all);
  for (std::size_t r = 1; r < n; ++r) send_frame(peers_[r], seq, packed, deadline, who(r));
  return all;
}

std::vector<std::vector<std::byte>> TcpBootstrap::allgather(std::span<const std::byte> mine,
                                                             std::chrono::milliseconds timeout) {
  if (mine.size() > config_.max_blob) {
    fail(Status::invalid_argument, EMSGSIZE,
         "rank " + std::to_string(config_.rank) + " contributes " + std::to_string(mine.size()) +
             " bytes, more than max_blob (" + std::to_string(config_.max_blob) + ")");
  }
  const auto deadline = Clock::now() + timeout;
  const std::size_t n = static_cast<std::size_t>(config_.size);
  if (config_.rank == 0) {
    // A timeout while ranks are still joining consumes no collective, so
    // rank 0 may simply call again (admitted ranks keep their places).
    if (!accepted_) accept_all(std::max(deadline, Clock::now() + config_.connect_timeout));
    return gather_at_root(mine, ++sequence_, deadline);
  }
  const std::uint32_t seq = ++sequence_;
  const std::string root = "rank 0 (" + peer_addr_[0] + ")";
  send_frame(peers_[0], seq, mine, deadline, root);
  // Bound on the reply: every blob at most max_blob, plus lengths (saturating).
  const std::uint64_t per = std::uint64_t{config_.max_blob} + 8;
  const std::uint64_t max_reply = per > (UINT64_MAX - 4) / n ? UINT64_MAX : per * n + 4;
  bw::FrameReader reader(seq, max_reply);
  read_frame(peers_[0], reader, deadline, root + " in collective #" + std::to_string(seq));
  const std::vector<std::byte> packed = reader.take();
  std::string why;
  auto all = bw::unpack_gathered(packed, n, why);
  if (!all) fail(Status::malformed, EPROTO, root + " sent a malformed " + why);
  return std::move(*all);
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
    if (in.size() - pos < 4) {
      throw Error(Status::malformed, 0,
                  "unpack_blobs: truncated length of blob " + std::to_string(parts.size()) + " (" +
                      std::to_string(in.size() - pos) + " of 4 bytes at offset " + std::to_string(pos) + ")");
    }
    std::uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= std::uint32_t{std::to_integer<std::uint8_t>(in[pos + static_cast<std::size_t>(i)])} << (8 * i);
    pos += 4;
    if (in.size() - pos < n) {
      throw Error(Status::malformed, 0,
                  "unpack_blobs: blob " + std::to_string(parts.size()) + " announces " + std::to_string(n) +
                      " bytes but only " + std::to_string(in.size() - pos) + " follow");
    }
    parts.emplace_back(in.begin() + static_cast<std::ptrdiff_t>(pos), in.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
  }
  return parts;
}

}  // namespace regpool
