#pragma once
// Layer 8: bootstrap. Before two processes can use each other's endpoints
// they must swap endpoint names and encoded remote references. Bootstrap is
// the one collective needed for that: an allgather of byte blobs.
//
//  - TcpBootstrap: a small TCP rendezvous for tools and tests. Rank 0
//    listens; ranks 1..N-1 connect to it; each allgather sends every blob to
//    rank 0, which returns all of them to everyone (a star: N is small).
//  - mpi_bootstrap(): the same over MPI_Iallgatherv, for jobs that MPI
//    already started across nodes. Built whenever Meson finds an MPI
//    (option -Dmpi=auto|enabled|disabled; see docs/install.md).
//
// Everything here is setup: failures throw regpool::Error (Status::timeout,
// peer_unreachable, malformed, access_denied, invalid_argument, unsupported)
// with errno as the provider code, and a message naming the rank, the
// address and what was wrong. docs/bootstrap.md has the protocol, the threat
// model and the job key.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "regpool/error.hpp"

namespace regpool {

// Thread-safety: one collective at a time per object (like an MPI
// communicator); different objects are independent.
class REGPOOL_API Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // Every rank contributes `mine` (sizes may differ between ranks); every
  // rank gets all contributions, indexed by rank. Every rank must call it
  // the same number of times. Throws Error on timeout or a lost peer.
  virtual std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> mine,
                                                        std::chrono::milliseconds timeout) = 0;
  // All ranks have arrived.
  void barrier(std::chrono::milliseconds timeout) { (void)allgather({}, timeout); }
};

// Several blobs in one allgather contribution (an endpoint name plus a few
// encoded remote references, say): (u32 little-endian length, bytes)*.
REGPOOL_API std::vector<std::byte> pack_blobs(const std::vector<std::vector<std::byte>>& parts);
// The inverse. Throws Error(Status::malformed) on truncated input, since
// the bytes came from another process.
REGPOOL_API std::vector<std::vector<std::byte>> unpack_blobs(std::span<const std::byte> packed);

struct TcpBootstrapConfig {
  int rank = 0;
  int size = 1;
  // Where rank 0 listens (IPv4 literal or host name). Loopback by default so
  // tests never leave the machine.
  std::string host = "127.0.0.1";
  // Rank 0: port to listen on, 0 = any free port (read it back with port()
  // and hand it to the other ranks, e.g. through fork or the environment).
  // Other ranks: rank 0's port.
  std::uint16_t port = 0;
  // Other ranks: bound on the constructor (connecting, retrying until rank 0
  // listens, and being admitted, which happens in rank 0's first
  // collective). Rank 0: bound on waiting for everyone in the first
  // collective (or that collective's timeout, if longer); when it expires
  // with ranks missing, that call throws Status::timeout, consumes no
  // collective, and may be repeated (admitted ranks keep their places).
  std::chrono::milliseconds connect_timeout{30000};
  // Rank 0: bound on each connection's handshake, from accept to admission.
  // Connections are served concurrently, so a silent or slow one costs a
  // slot for this long and never delays the real ranks; it is then dropped
  // (and logged). Real ranks answer within a round trip.
  std::chrono::milliseconds handshake_timeout{5000};
  // Largest blob accepted from a peer (guards against garbage on the port).
  // Memory for a frame grows with the bytes that actually arrive, so a
  // header announcing this much costs nothing until the bytes come.
  std::size_t max_blob = std::size_t{64} << 20;
  // Job key (any bytes; use 16 or more random ones). When set, rank 0 admits
  // only hellos that prove knowledge of it (HMAC-SHA256 over a fresh nonce),
  // and every other rank checks that rank 0 proves it too before sending it
  // anything. Empty: taken from the environment variable
  // REGPOOL_BOOTSTRAP_KEY when key_from_environment is true and the variable
  // is set and non-empty; otherwise no key (first valid hello per rank wins).
  // Every rank must have the same key, or none.
  std::string key;
  bool key_from_environment = true;
  // Rank 0 reports each connection it drops or refuses (silent, too slow,
  // garbage, forged, duplicate rank, ...) with its address here, one line per
  // event, from the thread that is in the collective. Empty: the line goes to
  // stderr, prefixed "regpool bootstrap: ".
  std::function<void(const std::string&)> log;
};

// Owns its sockets (closed by the destructor, which never blocks).
class REGPOOL_API TcpBootstrap final : public Bootstrap {
 public:
  // Rank 0 binds and listens here (so the port is known at once, before
  // fork); it admits the other ranks in its first collective. Other ranks
  // connect and do the handshake here, so a wrong key, a taken rank or a
  // size mismatch is reported by the constructor; it returns once rank 0
  // has admitted this rank (so it waits for rank 0's first collective,
  // bounded by connect_timeout: do not construct rank 0 and another rank in
  // one thread).
  explicit TcpBootstrap(const TcpBootstrapConfig& config);
  ~TcpBootstrap() override;
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  int rank() const noexcept override { return config_.rank; }
  int size() const noexcept override { return config_.size; }
  std::uint16_t port() const noexcept { return port_; }
  // Whether this object authenticates with a job key (from the config or
  // the environment).
  bool uses_key() const noexcept { return !key_.empty(); }
  std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> mine,
                                                std::chrono::milliseconds timeout) override;
  // Liveness between collectives, without blocking and without reading:
  // the first rank whose connection has ended (its process exited or was
  // killed, so its kernel closed the socket; or the connection failed),
  // described as "rank R (address:port): <what happened>"; empty while
  // every connection is up. Bytes a rank sent before it went count as an
  // end too. Rank 0 watches every rank, the others rank 0. Lets a process
  // that waits on its transport (a server progressing while its client
  // puts) notice a dead peer that the transport does not report
  // (tcp;ofi_rxm with nothing of ours in flight). Same thread rule as the
  // collectives.
  std::string lost_peer() const;

 private:
  void accept_all(std::chrono::steady_clock::time_point deadline);
  void connect_to_root();
  void log(const std::string& line) const;
  std::vector<std::vector<std::byte>> gather_at_root(std::span<const std::byte> mine, std::uint32_t seq,
                                                     std::chrono::steady_clock::time_point deadline);

  TcpBootstrapConfig config_;
  std::string key_;
  std::uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::vector<int> peers_;  // rank 0: fd per rank (index 0 unused); others: [fd to rank 0]
  std::vector<std::string> peer_addr_;  // "address:port" per entry of peers_, for messages
  bool accepted_ = false;
  std::uint32_t sequence_ = 0;
};

// True when the library was built with the MPI adapter.
REGPOOL_API bool mpi_bootstrap_available() noexcept;
// A Bootstrap over a duplicate of MPI_COMM_WORLD. If MPI is not initialized
// yet, this initializes it (MPI_THREAD_SERIALIZED) and registers an atexit
// handler that calls MPI_Finalize unless the application already has (a rank
// that exits without it fails the whole mpirun job); an application that
// initialized MPI itself also finalizes it itself. allgather honours its
// timeout (Status::timeout when a rank does not join; that bootstrap is then
// unusable). Throws Error with Status::unsupported when built without MPI.
REGPOOL_API std::unique_ptr<Bootstrap> mpi_bootstrap();

}  // namespace regpool
