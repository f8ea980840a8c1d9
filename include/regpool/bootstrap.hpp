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
// peer_unreachable, malformed, unsupported) with errno as the provider code.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "regpool/error.hpp"

namespace regpool {

// Thread-safety: one collective at a time per object (like an MPI
// communicator); different objects are independent.
class Bootstrap {
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
std::vector<std::byte> pack_blobs(const std::vector<std::vector<std::byte>>& parts);
// The inverse. Throws Error(Status::malformed) on truncated input, since
// the bytes came from another process.
std::vector<std::vector<std::byte>> unpack_blobs(std::span<const std::byte> packed);

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
  // Bound on connecting (other ranks retry until rank 0 listens) and on rank
  // 0 waiting for everyone in the first collective.
  std::chrono::milliseconds connect_timeout{30000};
  // Largest blob accepted from a peer (guards against garbage on the port).
  std::size_t max_blob = std::size_t{64} << 20;
};

// Owns its sockets (closed by the destructor, which never blocks).
class TcpBootstrap final : public Bootstrap {
 public:
  // Rank 0 binds and listens here (so the port is known at once, before
  // fork); it accepts the other ranks lazily in the first collective. Other
  // ranks connect here, retrying until connect_timeout.
  explicit TcpBootstrap(const TcpBootstrapConfig& config);
  ~TcpBootstrap() override;
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  int rank() const noexcept override { return config_.rank; }
  int size() const noexcept override { return config_.size; }
  std::uint16_t port() const noexcept { return port_; }
  std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> mine,
                                                std::chrono::milliseconds timeout) override;

 private:
  void accept_all(std::chrono::steady_clock::time_point deadline);

  TcpBootstrapConfig config_;
  std::uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::vector<int> peers_;  // rank 0: fd per rank (index 0 unused); others: [fd to rank 0]
  bool accepted_ = false;
  std::uint32_t sequence_ = 0;
};

// True when the library was built with the MPI adapter.
bool mpi_bootstrap_available() noexcept;
// A Bootstrap over a duplicate of MPI_COMM_WORLD. If MPI is not initialized
// yet, this initializes it (MPI_THREAD_SERIALIZED) and registers an atexit
// handler that calls MPI_Finalize unless the application already has (a rank
// that exits without it fails the whole mpirun job); an application that
// initialized MPI itself also finalizes it itself. allgather honours its
// timeout (Status::timeout when a rank does not join; that bootstrap is then
// unusable). Throws Error with Status::unsupported when built without MPI.
std::unique_ptr<Bootstrap> mpi_bootstrap();

}  // namespace regpool
