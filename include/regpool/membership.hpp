#pragma once
// Membership: a server that clients join and leave at any time.
//
//  - Listener (server): listens on host:port, admits clients at any time
//    with a challenge-response handshake authenticated by the job key (the
//    bootstrap's HMAC-SHA256 scheme, docs/bootstrap.md), inserts each
//    client's endpoint name into the server's Endpoint and reports
//    PeerEvents: joined, left (a clean bye), died (the connection ended
//    without one, or the client was superseded by a new incarnation).
//  - connect() (client): joins a Listener, inserts the server's endpoint
//    name into the client's Endpoint and returns a Connection, which is the
//    client's side of the liveness channel (the server leaving or dying is
//    reported as an event there too).
//
// Each admission is an incarnation: a (PeerId, epoch) pair. Epochs come
// from one counter per Listener, start at 1 and never repeat, so a client
// that restarts and joins again (same client id or same endpoint name) gets
// a new epoch, and anything addressed to or carrying the old pair can be
// told apart (Listener::current). A new incarnation of a client that is
// still connected supersedes the old one (reported died first).
//
// Liveness: the TCP connection is the liveness channel. End of stream or a
// reset without a bye = died; a bye = left. TCP keep-alive probes (and
// TCP_USER_TIMEOUT) bound how long a silent, vanished peer (host crash,
// cable) goes unnoticed: liveness_timeout, default 5 s, whole seconds, at
// least 2. A process killed on a live host is noticed at once (its kernel
// closes the connection). When a peer leaves or dies, every operation in
// flight to it on the Endpoint completes with Status::peer_unreachable
// (Endpoint::fail_peer), exposures attached to it (Listener::attach) are
// revoked, and posts to it answer peer_unreachable until the peer is
// removed from the Endpoint at the start of the next poll().
//
// No hidden threads: a Listener and a Connection do their work inside
// poll(), which never blocks longer than its `wait` argument and never
// waits for one client (every connection is a non-blocking state machine
// with a handshake deadline). Events go to the on_event callback when one
// is set (called from poll()), else to a queue read with next_event().
//
// Errors: constructors and connect() throw regpool::Error (setup: timeout,
// peer_unreachable, access_denied, malformed, invalid_argument,
// unsupported) with a message naming the address and the cause; poll()
// never throws for anything a peer does (a misbehaving client is dropped
// and logged) and throws only for local failures (poll(2), accept(2)
// running out of anything but descriptors).
//
// Thread-safety: a Listener or Connection is used by one thread at a time
// (poll, next_event, attach, ...); different objects are independent. The
// Endpoint given to them must outlive them; it may be used from other
// threads meanwhile (it is thread-safe).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "regpool/endpoint.hpp"
#include "regpool/error.hpp"

namespace regpool {

enum class PeerEventKind : std::uint8_t { joined, left, died };
REGPOOL_API const char* to_string(PeerEventKind k) noexcept;

struct PeerEvent {
  PeerEventKind kind = PeerEventKind::joined;
  // The peer in this side's Endpoint (server: the client; client: the
  // server) and its incarnation.
  PeerId peer = kAnyPeer;
  std::uint64_t epoch = 0;
  // The client's id (ConnectConfig::client_id; 0 = anonymous).
  std::uint64_t client_id = 0;
  // The other side's TCP address ("ip:port").
  std::string address;
  // left/died: what happened ("clean bye", "connection closed without a
  // bye", "superseded by epoch 7", a socket error, ...).
  std::string reason;
};

struct ListenerConfig {
  // Where to listen (IPv4 literal or host name); port 0 = any free port
  // (read it back with Listener::port()).
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  // Job key, as for TcpBootstrapConfig: when set (here, or from the
  // environment variable REGPOOL_BOOTSTRAP_KEY when key_from_environment
  // is true), only clients that prove knowledge of it are admitted, and the
  // server proves it to them in its welcome.
  std::string key;
  bool key_from_environment = true;
  // Bound on each connection's handshake, from accept to admission. A
  // silent or slow connection costs a slot for this long and never delays
  // the others; it is then dropped (and logged).
  std::chrono::milliseconds handshake_timeout{5000};
  // Handshakes in flight at once; a new connection beyond it evicts the
  // oldest (a real client answers within a round trip).
  std::size_t max_pending = 64;
  // Members at once; clients beyond it are refused (WelcomeCode full).
  std::size_t max_members = 4096;
  // Death of a silent, vanished client is noticed within about this bound
  // (TCP keep-alive; whole seconds, at least 2 s).
  std::chrono::milliseconds liveness_timeout{5000};
  // Largest endpoint name accepted from a client.
  std::size_t max_name = 4096;
  // Events: called from poll() when set, else queued for next_event().
  std::function<void(const PeerEvent&)> on_event;
  // Each connection dropped or refused, one line per event. Empty: stderr,
  // prefixed "regpool membership: ".
  std::function<void(const std::string&)> log;
};

// Server side. Owns its sockets; the destructor says bye to every member
// (non-blocking, best effort), fails and removes their peers in the
// Endpoint, and never blocks.
class REGPOOL_API Listener {
 public:
  // Binds and listens at once (so the port is known before any client
  // starts). Throws Error.
  Listener(Endpoint& endpoint, const ListenerConfig& config);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  std::uint16_t port() const noexcept;
  bool uses_key() const noexcept;
  // Accept connections, advance handshakes, notice members that left or
  // died; waits up to `wait` for something to happen (0: just look).
  // Returns the number of events produced.
  std::size_t poll(std::chrono::milliseconds wait = std::chrono::milliseconds{0});
  // The oldest queued event (only when no on_event callback is set).
  std::optional<PeerEvent> next_event();
  std::size_t members() const noexcept;
  // Whether (peer, epoch) is a current member (false once it left, died or
  // was superseded: stale).
  bool current(PeerId peer, std::uint64_t epoch) const noexcept;
  // Keep `exposure` until `peer` leaves or dies, then revoke it (by
  // destroying it). invalid_argument when `peer` is not a current member.
  Status attach(PeerId peer, Exposure exposure);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ConnectConfig {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  // Job key, as ListenerConfig::key. With a key, nothing is sent to (and
  // no name accepted from) a server that does not prove it.
  std::string key;
  bool key_from_environment = true;
  // Names this client across restarts: a join with the id of a connected
  // member supersedes it. 0 = anonymous (only the same endpoint name then
  // identifies a returning client).
  std::uint64_t client_id = 0;
  // Bound on connect() (connecting, retrying while nobody listens yet,
  // the handshake).
  std::chrono::milliseconds timeout{10000};
  // As ListenerConfig::liveness_timeout, for noticing a vanished server.
  std::chrono::milliseconds liveness_timeout{5000};
  std::size_t max_name = 4096;
  std::function<void(const PeerEvent&)> on_event;
};

// Client side: the membership of one client in one server.
class REGPOOL_API Connection {
 public:
  ~Connection();  // leave() (noexcept, never blocks)
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // The server in the client's Endpoint.
  PeerId server() const noexcept;
  // This client's PeerId in the server's Endpoint, and its epoch (put
  // them into requests so the server can reject stale ones).
  PeerId id_at_server() const noexcept;
  std::uint64_t epoch() const noexcept;
  // True until the server left or died, or leave() was called.
  bool connected() const noexcept;
  // Notice the server leaving or dying (events left/died for server());
  // waits up to `wait`. Returns the number of events produced.
  std::size_t poll(std::chrono::milliseconds wait = std::chrono::milliseconds{0});
  std::optional<PeerEvent> next_event();
  // Leave cleanly: send bye (non-blocking), close, fail and remove the
  // server's peer in the Endpoint. Idempotent; produces no event.
  void leave() noexcept;

 private:
  friend std::unique_ptr<Connection> connect(Endpoint& endpoint, const ConnectConfig& config);
  struct Impl;
  explicit Connection(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Join the Listener at config.host:port. Throws Error: timeout,
// peer_unreachable, access_denied (key mismatch either way), malformed,
// unsupported (version), invalid_argument (full, name refused).
REGPOOL_API std::unique_ptr<Connection> connect(Endpoint& endpoint, const ConnectConfig& config);

}  // namespace regpool
