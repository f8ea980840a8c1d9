#include "regpool/membership.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <unordered_map>

#include "membership/membership_wire.hpp"
#include "transport/acceptor.hpp"
#include "transport/bootstrap_wire.hpp"
#include "transport/hmac.hpp"
#include "transport/tcp_socket.hpp"

namespace regpool {
namespace {

using Clock = std::chrono::steady_clock;
namespace bw = bootwire;
namespace mw = memwire;

constexpr const char* kComponent = "membership";
const tcp::Io io{kComponent};
constexpr std::size_t kReadChunk = 4096;
// connect(): connections the server closed before its welcome (evicted
// under a flood, dropped as too slow) are retried this many times.
constexpr int kMaxJoinAttempts = 5;

std::string ms_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

std::string key_from(const std::string& configured, bool from_env) {
  if (!configured.empty() || !from_env) return configured;
  const char* env = std::getenv("REGPOOL_BOOTSTRAP_KEY");
  return env ? std::string(env) : std::string();
}

std::vector<std::byte> frame(std::uint32_t kind, std::span<const std::byte> payload) {
  std::vector<std::byte> out(bw::kFrameHeaderSize + payload.size());
  const auto head = bw::encode(bw::FrameHeader{kind, payload.size()});
  std::copy(head.begin(), head.end(), out.begin());
  std::copy(payload.begin(), payload.end(), out.begin() + bw::kFrameHeaderSize);
  return out;
}

// Reads what the socket has into `reader` (never past its frame). Returns 0
// when it would block or the frame is complete, -1 on end of stream, else
// the errno of a failed receive.
int pump(int fd, bw::FrameReader& reader) {
  std::array<std::byte, kReadChunk> buf;
  while (reader.wanted() > 0 && reader.state() != bw::FrameReader::State::failed) {
    const ssize_t r = ::recv(fd, buf.data(), std::min(buf.size(), reader.wanted()), MSG_DONTWAIT);
    if (r > 0) {
      (void)reader.feed({buf.data(), static_cast<std::size_t>(r)});
    } else if (r == 0) {
      return -1;
    } else if (errno == EINTR) {
      continue;
    } else {
      return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : errno;
    }
  }
  return 0;
}

}  // namespace

const char* to_string(PeerEventKind k) noexcept {
  switch (k) {
    case PeerEventKind::joined: return "joined";
    case PeerEventKind::left: return "left";
    case PeerEventKind::died: return "died";
  }
  return "unknown";
}

// ---------------------------------------------------------------- Listener

struct Listener::Impl {
  // The server's state of a handshake (the acceptor holds the connection).
  struct Handshake {
    bw::FrameReader reader{0, 0};
    bool close_after_flush = false;  // a refusal: close once it is out
  };
  using Acceptor = tcp::Acceptor<Handshake>;
  using Pending = Acceptor::Pending;
  // An admitted client.
  struct Member {
    int fd = -1;
    std::string addr;
    bool gone = false;
    std::vector<std::byte> out;  // its welcome
    std::size_t out_off = 0;
    bw::FrameReader reader{mw::kBye, mw::kByeSize};  // the only frame a member may send
    PeerId peer = kAnyPeer;
    std::uint64_t epoch = 0;
    std::uint64_t client_id = 0;
    std::vector<std::byte> name;
  };

  Impl(Endpoint& e, const ListenerConfig& c) : ep(e), cfg(c) {}
  ~Impl() { detail::secure_wipe(key.data(), key.size()); }

  Endpoint& ep;
  ListenerConfig cfg;
  std::string key;
  std::vector<std::byte> own_name;
  int listen_fd = -1;
  std::uint16_t port = 0;
  std::uint64_t next_epoch = 1;
  std::optional<Acceptor> acc;  // set once listening
  std::vector<Member> members;
  std::size_t member_count = 0;
  std::unordered_map<PeerId, std::uint64_t> epochs;  // current members
  std::unordered_map<PeerId, std::vector<Exposure>> attached;
  std::vector<PeerId> to_remove;  // left/died: removed from ep at the next poll
  std::deque<PeerEvent> queue;
  std::size_t produced = 0;

  void log(const std::string& line) const { tcp::log_line(cfg.log, kComponent, line); }

  void emit(PeerEvent ev) {
    ++produced;
    if (cfg.on_event) {
      cfg.on_event(ev);
    } else {
      queue.push_back(std::move(ev));
    }
  }

  void start(int fd) {
    listen_fd = fd;
    Handshake initial;
    initial.reader = bw::FrameReader(mw::kJoin, mw::max_join_payload(cfg.max_name));
    acc.emplace(kComponent, fd, cfg.max_pending, cfg.handshake_timeout, !key.empty(), std::move(initial),
                [this](const Pending& p, const std::string& why) {
                  log("dropped the connection from " + p.addr + ": " + why);
                });
  }

  // A member's connection ended: tell the endpoint and the application.
  void member_gone(Member& c, PeerEventKind kind, const std::string& reason) {
    ::close(c.fd);
    c.gone = true;
    --member_count;
    epochs.erase(c.peer);
    ep.fail_peer(c.peer, Status::peer_unreachable);
    to_remove.push_back(c.peer);
    attached.erase(c.peer);  // revokes the exposures attached to it
    if (kind == PeerEventKind::died) log("client " + c.addr + " (epoch " + std::to_string(c.epoch) + ") died: " + reason);
    emit(PeerEvent{kind, c.peer, c.epoch, c.client_id, c.addr, reason});
  }

  void remove_pending() noexcept {
    for (PeerId p : to_remove) ep.remove_peer(p);
    to_remove.clear();
  }

  std::vector<std::byte> welcome(const Pending& c, const mw::Join& j, mw::Welcome w) const {
    w.has_mac = !key.empty();
    w.mac = mw::welcome_mac(tcp::key_bytes(key), c.server_nonce, j.nonce, w);
    return frame(mw::kWelcome, mw::encode(w));
  }

  void refuse(Pending& c, const mw::Join& j, mw::WelcomeCode code, std::uint32_t detail, const std::string& why) {
    log("refused a join from " + c.addr + ": " + why);
    mw::Welcome w;
    w.code = code;
    w.detail = detail;
    w.name.assign(1, std::byte{0});  // the server's name goes to admitted clients only
    c.queue(welcome(c, j, std::move(w)));
    c.state.close_after_flush = true;
  }

  // A complete join frame from a connection in its handshake. Returns the
  // new member when it is admitted (the connection moved to `members`).
  Member* judge(Pending& c, std::span<const std::byte> payload) {
    mw::Join j;
    const auto version = mw::payload_version(payload);
    if (version && *version != mw::kVersion) {
      refuse(c, j, mw::WelcomeCode::bad_version, mw::kVersion,
             "join of protocol version " + std::to_string(*version) + " (this server speaks " +
                 std::to_string(mw::kVersion) + ")");
      return nullptr;
    }
    std::string why;
    auto parsed = mw::parse_join(payload, cfg.max_name, why);
    if (!parsed) {
      acc->drop(c, "malformed " + why);
      return nullptr;
    }
    j = std::move(*parsed);
    const std::string claim = "join of client id " + std::to_string(j.client_id);
    if (!key.empty() && !j.has_mac) {
      refuse(c, j, mw::WelcomeCode::missing_key, 0, claim + " without proof of the job key");
      return nullptr;
    }
    if (!key.empty() && !detail::equal_constant_time(j.mac, mw::join_mac(tcp::key_bytes(key), c.server_nonce, j))) {
      refuse(c, j, mw::WelcomeCode::bad_key, 0, claim + " with a wrong proof of the job key (forged, or the key differs)");
      return nullptr;
    }
    if (key.empty() && j.has_mac) {
      refuse(c, j, mw::WelcomeCode::unexpected_key, 0, claim + " from a client that has a job key (this server has none)");
      return nullptr;
    }
    // A new incarnation of a connected client supersedes the old one.
    const std::uint64_t epoch = next_epoch++;
    for (Member& o : members) {
      if (o.gone) continue;
      if ((j.client_id != 0 && o.client_id == j.client_id) || o.name == j.name) {
        member_gone(o, PeerEventKind::died, "superseded by a new incarnation (epoch " + std::to_string(epoch) + ")");
      }
    }
    if (member_count >= cfg.max_members) {
      refuse(c, j, mw::WelcomeCode::full, static_cast<std::uint32_t>(std::min<std::size_t>(cfg.max_members, UINT32_MAX)),
             claim + ": " + std::to_string(member_count) + " members already (ListenerConfig::max_members)");
      return nullptr;
    }
    // A peer that left or died is still in the endpoint until the next
    // poll; inserting its name again now would return its broken PeerId.
    remove_pending();
    PeerId peer = kAnyPeer;
    try {
      peer = ep.insert_peer(j.name);
    } catch (const Error& e) {
      refuse(c, j, mw::WelcomeCode::bad_name, 0, claim + ": its endpoint name was refused: " + e.what());
      return nullptr;
    }
    mw::Welcome w;
    w.peer = peer;
    w.epoch = epoch;
    w.liveness_ms = static_cast<std::uint32_t>(std::min<long long>(cfg.liveness_timeout.count(), UINT32_MAX));
    w.name = own_name;
    Member m;
    m.out = welcome(c, j, std::move(w));
    m.addr = c.addr;
    m.fd = acc->release(c);
    m.peer = peer;
    m.epoch = epoch;
    m.client_id = j.client_id;
    m.name = j.name;
    ++member_count;
    epochs[peer] = epoch;
    tcp::set_liveness(m.fd, cfg.liveness_timeout);
    members.push_back(std::move(m));
    Member& added = members.back();
    emit(PeerEvent{PeerEventKind::joined, peer, epoch, j.client_id, added.addr, {}});
    return &added;
  }

  // Something to read (or an error/hang-up) on a connection in its handshake.
  // Returns the new member when its join was admitted.
  Member* on_readable(Pending& c) {
    bw::FrameReader& reader = c.state.reader;
    const int rc = pump(c.fd, reader);
    const auto st = reader.state();
    if (st == bw::FrameReader::State::failed) {
      acc->drop(c, "sent bytes that are not a regpool membership join (" + reader.error() + ")");
    } else if (st == bw::FrameReader::State::done) {
      const std::vector<std::byte> payload = reader.take();
      reader = bw::FrameReader(0, 0);  // nothing more is read before the welcome is out
      return judge(c, payload);
    } else if (rc == -1) {
      acc->drop(c, "closed the connection during its handshake");
    } else if (rc > 0) {
      acc->drop(c, std::string("receive failed: ") + std::strerror(rc));
    }
    return nullptr;
  }

  // Something to read (or an error/hang-up) on a member's connection.
  void on_readable(Member& c) {
    const int rc = pump(c.fd, c.reader);
    const auto st = c.reader.state();
    if (st == bw::FrameReader::State::failed) {
      member_gone(c, PeerEventKind::died, "protocol violation: it sent a " + c.reader.error());
    } else if (st == bw::FrameReader::State::done) {
      std::string why;
      const std::vector<std::byte> payload = c.reader.take();
      const auto epoch = mw::parse_bye(payload, why);
      if (!epoch) {
        member_gone(c, PeerEventKind::died, "protocol violation: malformed " + why);
      } else if (*epoch != c.epoch) {
        member_gone(c, PeerEventKind::died,
                    "protocol violation: a bye for epoch " + std::to_string(*epoch) + " on the connection of epoch " +
                        std::to_string(c.epoch));
      } else {
        member_gone(c, PeerEventKind::left, "clean bye");
      }
    } else if (rc == -1) {
      member_gone(c, PeerEventKind::died, "connection closed without a bye");
    } else if (rc > 0) {
      member_gone(c, PeerEventKind::died, std::string("connection lost: ") + std::strerror(rc));
    }
  }

  // Sends what a member's socket takes of its welcome.
  void flush(Member& c, const char* what) {
    if (c.out_off < c.out.size() && !tcp::send_some(c.fd, c.out, c.out_off)) member_gone(c, PeerEventKind::died, what);
  }

  // Sends what a handshake's socket takes of its refusal; closes it once out.
  void flush(Pending& c, const char* what) {
    if (!c.flush()) {
      acc->drop(c, what);
    } else if (!c.sending() && c.state.close_after_flush) {
      acc->close(c);
    }
  }

  std::size_t poll(std::chrono::milliseconds wait) {
    produced = 0;
    remove_pending();
    acc->expire(Clock::now(), [&](const Pending& c) {
      return c.state.close_after_flush ? "did not read its refusal within " + ms_text(cfg.handshake_timeout)
                                       : "no complete join within " + ms_text(cfg.handshake_timeout) + " (" +
                                             std::to_string(c.state.reader.received()) + " payload bytes received)";
    });

    std::vector<pollfd> fds;
    auto wake = Clock::now() + wait;
    const std::size_t lfd = acc->poll_fds(fds, wake);
    const std::size_t first_member = fds.size();
    for (const Member& c : members) {
      // A member is always read: its end of stream is the news.
      fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out_off < c.out.size() ? POLLOUT : 0)), 0});
    }
    const int rc = ::poll(fds.data(), fds.size(), wait.count() <= 0 ? 0 : tcp::remaining_ms(wake));
    if (rc < 0) {
      if (errno == EINTR) return produced;
      io.fail(Status::transport_error, errno, "poll");
    }
    // members grows while judging: handle the existing ones first.
    const std::size_t n = members.size();
    for (std::size_t i = 0; i < n; ++i) {
      Member& c = members[i];
      const short re = fds[first_member + i].revents;
      if (c.gone || re == 0) continue;
      flush(c, "connection lost while sending to it");
      if (!c.gone && (re & (POLLIN | POLLHUP | POLLERR)) != 0) on_readable(c);
    }
    auto& pend = acc->pending();
    for (std::size_t i = 0; i < pend.size(); ++i) {
      Pending& c = pend[i];
      const short re = fds[lfd + 1 + i].revents;
      if (c.gone || re == 0) continue;
      if (c.sending()) flush(c, "connection failed while sending to it");
      // A handshake reads only once its challenge is out.
      if (c.gone || c.sending() || (re & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      // The welcome (or refusal) queued by judge() goes out at once.
      if (Member* m = on_readable(c)) {
        flush(*m, "connection lost while sending its welcome");
      } else if (!c.gone && c.sending()) {
        flush(c, "connection failed while sending its refusal");
      }
    }
    if ((fds[lfd].revents & POLLIN) != 0) {
      if (const int err = acc->accept_all(); err != 0) {
        // Members keep their descriptors; new clients wait in the backlog.
        if (!tcp::out_of_resources(err)) io.fail(Status::transport_error, err, "accept on port " + std::to_string(port));
        log(std::string("cannot accept: ") + std::strerror(err));
      }
    }
    acc->sweep();
    std::erase_if(members, [](const Member& c) { return c.gone; });
    return produced;
  }
};

Listener::Listener(Endpoint& endpoint, const ListenerConfig& config) : impl_(std::make_unique<Impl>(endpoint, config)) {
  Impl& m = *impl_;
  if (m.cfg.handshake_timeout.count() <= 0) io.fail(Status::invalid_argument, 0, "handshake_timeout must be positive");
  if (m.cfg.liveness_timeout.count() <= 0) io.fail(Status::invalid_argument, 0, "liveness_timeout must be positive");
  if (m.cfg.max_name == 0 || m.cfg.max_name > mw::kMaxName) {
    io.fail(Status::invalid_argument, 0, "max_name must be within 1.." + std::to_string(mw::kMaxName));
  }
  m.key = key_from(m.cfg.key, m.cfg.key_from_environment);
  detail::secure_wipe(m.cfg.key.data(), m.cfg.key.size());
  m.cfg.key.clear();
  m.own_name = endpoint.name();
  if (m.own_name.empty() || m.own_name.size() > mw::kMaxName) {
    io.fail(Status::invalid_argument, 0, "the endpoint's name does not fit a welcome");
  }
  const sockaddr_in addr = tcp::resolve(m.cfg.host, m.cfg.port, kComponent);
  m.start(tcp::listen_on(addr, m.port, kComponent,
                         "cannot listen on " + m.cfg.host + ":" + std::to_string(m.cfg.port)));
}

Listener::~Listener() {
  Impl& m = *impl_;
  m.attached.clear();
  for (auto& c : m.members) {
    if (c.gone) continue;
    // Best effort: a client whose buffer is full learns it from the close.
    const auto bye = frame(mw::kBye, mw::encode_bye(c.epoch));
    std::size_t off = 0;
    (void)tcp::send_some(c.fd, bye, off);
    m.ep.fail_peer(c.peer, Status::peer_unreachable);
    m.to_remove.push_back(c.peer);
    ::close(c.fd);
  }
  m.acc.reset();  // closes the handshakes
  m.remove_pending();
  if (m.listen_fd >= 0) ::close(m.listen_fd);
}

std::uint16_t Listener::port() const noexcept { return impl_->port; }
bool Listener::uses_key() const noexcept { return !impl_->key.empty(); }
std::size_t Listener::poll(std::chrono::milliseconds wait) { return impl_->poll(wait); }
std::size_t Listener::members() const noexcept { return impl_->member_count; }

std::optional<PeerEvent> Listener::next_event() {
  if (impl_->queue.empty()) return std::nullopt;
  PeerEvent ev = std::move(impl_->queue.front());
  impl_->queue.pop_front();
  return ev;
}

bool Listener::current(PeerId peer, std::uint64_t epoch) const noexcept {
  const auto it = impl_->epochs.find(peer);
  return it != impl_->epochs.end() && it->second == epoch;
}

Status Listener::attach(PeerId peer, Exposure exposure) {
  if (!impl_->epochs.contains(peer)) return Status::invalid_argument;
  impl_->attached[peer].push_back(std::move(exposure));
  return Status::ok;
}

// -------------------------------------------------------------- Connection

struct Connection::Impl {
  Endpoint& ep;
  ConnectConfig cfg;
  int fd = -1;
  std::string addr;
  PeerId server = kAnyPeer;
  PeerId id_at_server = kAnyPeer;
  std::uint64_t epoch = 0;
  bool connected = false;
  bool remove_server = false;  // failed: removed from ep at the next poll or leave
  bw::FrameReader reader{mw::kBye, mw::kByeSize};
  std::deque<PeerEvent> queue;

  Impl(Endpoint& e, const ConnectConfig& c) : ep(e), cfg(c) {}

  void gone(PeerEventKind kind, const std::string& reason) {
    ::close(fd);
    fd = -1;
    connected = false;
    ep.fail_peer(server, Status::peer_unreachable);
    remove_server = true;
    PeerEvent ev{kind, server, epoch, cfg.client_id, addr, reason};
    if (cfg.on_event) {
      cfg.on_event(ev);
    } else {
      queue.push_back(std::move(ev));
    }
  }
};

Connection::Connection(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Connection::~Connection() { leave(); }
PeerId Connection::server() const noexcept { return impl_->server; }
PeerId Connection::id_at_server() const noexcept { return impl_->id_at_server; }
std::uint64_t Connection::epoch() const noexcept { return impl_->epoch; }
bool Connection::connected() const noexcept { return impl_->connected; }

std::optional<PeerEvent> Connection::next_event() {
  if (impl_->queue.empty()) return std::nullopt;
  PeerEvent ev = std::move(impl_->queue.front());
  impl_->queue.pop_front();
  return ev;
}

std::size_t Connection::poll(std::chrono::milliseconds wait) {
  Impl& m = *impl_;
  if (m.remove_server) {
    m.ep.remove_peer(m.server);
    m.remove_server = false;
  }
  if (!m.connected) return 0;
  pollfd p{m.fd, POLLIN, 0};
  const int rc = ::poll(&p, 1, static_cast<int>(std::clamp<long long>(wait.count(), 0, 1 << 30)));
  if (rc < 0) {
    if (errno == EINTR) return 0;
    io.fail(Status::transport_error, errno, "poll");
  }
  if (rc == 0) return 0;
  const int r = pump(m.fd, m.reader);
  const std::string server = "the server at " + m.addr;
  if (m.reader.state() == bw::FrameReader::State::failed) {
    m.gone(PeerEventKind::died, "protocol violation: " + server + " sent a " + m.reader.error());
  } else if (m.reader.state() == bw::FrameReader::State::done) {
    std::string why;
    const auto e = mw::parse_bye(m.reader.take(), why);
    if (e && *e == m.epoch) {
      m.gone(PeerEventKind::left, "clean bye");
    } else {
      m.gone(PeerEventKind::died, "protocol violation: " + server + " sent a bad bye" + (e ? "" : " (" + why + ")"));
    }
  } else if (r == -1) {
    m.gone(PeerEventKind::died, "connection closed without a bye");
  } else if (r > 0) {
    m.gone(PeerEventKind::died, std::string("connection lost: ") + std::strerror(r));
  } else {
    return 0;
  }
  return 1;
}

void Connection::leave() noexcept {
  Impl& m = *impl_;
  if (m.connected) {
    const auto bye = frame(mw::kBye, mw::encode_bye(m.epoch));
    std::size_t off = 0;
    (void)tcp::send_some(m.fd, bye, off);
    ::close(m.fd);
    m.fd = -1;
    m.connected = false;
    m.ep.fail_peer(m.server, Status::peer_unreachable);
    m.remove_server = true;
  }
  if (m.remove_server) {
    m.ep.remove_peer(m.server);
    m.remove_server = false;
  }
}

namespace {

// Rank 0 closed the connection before its welcome: worth another attempt.
struct Retry {
  std::string why;
};

}  // namespace

std::unique_ptr<Connection> connect(Endpoint& endpoint, const ConnectConfig& config) {
  auto m = std::make_unique<Connection::Impl>(endpoint, config);
  if (config.port == 0) io.fail(Status::invalid_argument, 0, "connect needs the server's port");
  if (config.max_name == 0 || config.max_name > mw::kMaxName) {
    io.fail(Status::invalid_argument, 0, "max_name must be within 1.." + std::to_string(mw::kMaxName));
  }
  std::string key = key_from(config.key, config.key_from_environment);
  m->cfg.key.clear();
  struct Wipe {
    std::string& k;
    ~Wipe() { detail::secure_wipe(k.data(), k.size()); }
  } wipe{key};
  const auto kb = tcp::key_bytes(key);
  const sockaddr_in addr = tcp::resolve(config.host, config.port, kComponent);
  m->addr = tcp::addr_text(addr);
  const std::string server = "the server at " + m->addr;
  const auto deadline = Clock::now() + config.timeout;
  const std::vector<std::byte> name = endpoint.name();
  if (name.empty() || name.size() > mw::kMaxName) io.fail(Status::invalid_argument, 0, "the endpoint's name does not fit a join");
  int attempts = 0;
  std::string last;
  for (;;) {
    const int fd = tcp::make_socket(kComponent);
    try {
      tcp::connect_to(fd, addr, deadline, kComponent, "connecting to " + server);
      std::array<std::byte, bw::kChallengeSize> cb;
      try {
        io.read_all(fd, cb, deadline, "waiting for the challenge of " + server);
      } catch (const Error& e) {
        if (e.status() == Status::peer_unreachable) throw Retry{server + " closed the connection before its challenge"};
        throw;
      }
      std::string why;
      const auto challenge = bw::parse_challenge(cb, why);
      if (!challenge) io.fail(Status::malformed, EPROTO, server + " sent a malformed " + why);
      if (!key.empty() && !challenge->key_required) {
        throw Error(Status::access_denied, EACCES,
                    "membership: " + server +
                        " does not require a job key but this client has one; not sending anything to an "
                        "unauthenticated server (set the key on both sides, or on neither)");
      }
      mw::Join j;
      j.has_mac = !key.empty();
      j.client_id = config.client_id;
      j.nonce = tcp::fresh_nonce(kComponent);
      j.name = name;
      j.mac = mw::join_mac(kb, challenge->nonce, j);
      bw::FrameReader reader(mw::kWelcome, mw::max_welcome_payload(config.max_name));
      try {
        io.send_frame(fd, mw::kJoin, mw::encode(j), deadline, server);
        io.read_frame(fd, reader, deadline, server + " (its welcome)");
      } catch (const Error& e) {
        if (e.status() == Status::peer_unreachable) throw Retry{server + " closed the connection before its welcome"};
        throw;
      }
      const std::vector<std::byte> payload = reader.take();
      const auto version = mw::payload_version(payload);
      if (version && *version != mw::kVersion) {
        io.fail(Status::unsupported, EPROTO,
                server + " speaks membership protocol version " + std::to_string(*version) + ", this client " +
                    std::to_string(mw::kVersion));
      }
      const auto w = mw::parse_welcome(payload, config.max_name, why);
      if (!w) io.fail(Status::malformed, EPROTO, server + " sent a malformed " + why);
      const std::string refusal = server + " refused this client: ";
      switch (w->code) {
        case mw::WelcomeCode::accepted:
          break;
        case mw::WelcomeCode::bad_key:
        case mw::WelcomeCode::missing_key:
        case mw::WelcomeCode::unexpected_key:
          throw Error(Status::access_denied, EACCES,
                      "membership: " + refusal + mw::to_string(w->code) +
                          " (REGPOOL_BOOTSTRAP_KEY / ListenerConfig::key / ConnectConfig::key)");
        case mw::WelcomeCode::bad_version:
          io.fail(Status::unsupported, EPROTO, refusal + "it speaks protocol version " + std::to_string(w->detail));
        case mw::WelcomeCode::full:
          throw Error(Status::invalid_argument, EBUSY,
                      "membership: " + refusal + "it has reached its limit of " + std::to_string(w->detail) + " members");
        case mw::WelcomeCode::bad_name:
          throw Error(Status::invalid_argument, EINVAL, "membership: " + refusal + mw::to_string(w->code));
      }
      if (!key.empty() && (!w->has_mac ||
                           !detail::equal_constant_time(w->mac, mw::welcome_mac(kb, challenge->nonce, j.nonce, *w)))) {
        throw Error(Status::access_denied, EACCES,
                    "membership: " + server + " admitted this client without proving the job key: it is not the "
                    "real server (or its key differs); its name is not used");
      }
      if (key.empty() && w->has_mac) {
        throw Error(Status::access_denied, EACCES, "membership: " + server + " has a job key and this client has none");
      }
      m->server = endpoint.insert_peer(w->name);
      m->fd = fd;
      m->id_at_server = w->peer;
      m->epoch = w->epoch;
      m->connected = true;
      tcp::set_liveness(fd, config.liveness_timeout);
      return std::unique_ptr<Connection>(new Connection(std::move(m)));
    } catch (const Retry& r) {
      ::close(fd);
      last = r.why;
      if (++attempts >= kMaxJoinAttempts) {
        io.fail(Status::peer_unreachable, ECONNRESET,
                server + " dropped " + std::to_string(attempts) + " joins in a row (last: " + last + ")");
      }
    } catch (const Error& e) {
      ::close(fd);
      // Nobody listening yet: retry until the bound; every other error is final.
      if (e.status() != Status::peer_unreachable) throw;
      last = e.what();
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (Clock::now() >= deadline) {
      io.fail(Status::timeout, ETIMEDOUT,
              "could not join " + server + " within " + ms_text(config.timeout) + " (last: " + last + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 << std::min(attempts, 4)));
  }
}

}  // namespace regpool
