// MPI adapter for Bootstrap: compiled when Meson finds an MPI (option 'mpi',
// default auto; see lib/meson.build), which also defines REGPOOL_HAVE_MPI=1
// for bootstrap.cpp. Tested under mpirun by test/mpi (suite 'mpi').
// Only the C API is used: keep Open MPI's and MPICH's deprecated C++
// bindings (which do not compile warning-free) out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "regpool/bootstrap.hpp"

namespace regpool {
namespace {

[[noreturn]] void mpi_fail(int rc, const char* what) {
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(Status::transport_error, rc, std::string("bootstrap (MPI): ") + what + ": " + std::string(msg, len));
}

// When regpool is the one that initialized MPI (the application never calls
// MPI itself), it also finalizes it, at exit: a process that leaves without
// MPI_Finalize makes mpirun report the whole job as failed. An application
// that initialized MPI itself finalizes it itself, as usual.
void finalize_at_exit() noexcept {
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void init_mpi_once() {
  static std::mutex mutex;  // two threads creating the first bootstraps at once
  std::lock_guard lock(mutex);
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) throw Error(Status::unsupported, 0, "bootstrap (MPI): MPI was already finalized in this process");
  // SERIALIZED: a Bootstrap may be used from any thread, one call at a time.
  int provided = 0;
  const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  if (rc != MPI_SUCCESS) mpi_fail(rc, "MPI_Init_thread");
  std::atexit(finalize_at_exit);
}

// Thread-safety: as Bootstrap. The communicator is MPI_COMM_WORLD, duplicated
// so our collectives never match the application's.
//
// Bounded waits: the collectives are non-blocking (MPI_Iallgather[v])
// polled with MPI_Test until the caller's timeout, so a rank that never
// joins the collective makes the others throw Status::timeout instead of
// hanging (a rank that dies is the MPI runtime's business: mpirun aborts
// the job). A collective cannot be cancelled in MPI, so after a timeout the
// pending request keeps its buffers until the process ends (MPI may still
// write into them) and this bootstrap refuses further collectives.
class MpiBootstrap final : public Bootstrap {
 public:
  MpiBootstrap() {
    init_mpi_once();
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    if (rc != MPI_SUCCESS) mpi_fail(rc, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiBootstrap() override {
    int finalized = 1;
    MPI_Finalized(&finalized);
    // MPI_Comm_free of an intra-communicator does not wait for the other
    // ranks; with a collective still pending on it, leave it alone.
    if (!finalized && !abandoned_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  MpiBootstrap(const MpiBootstrap&) = delete;
  MpiBootstrap& operator=(const MpiBootstrap&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }

  std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> mine,
                                                std::chrono::milliseconds timeout) override {
    if (abandoned_) {
      throw Error(Status::timeout, 0, "bootstrap (MPI): an earlier allgather timed out; this bootstrap is unusable");
    }
    if (mine.size() > static_cast<std::size_t>(INT_MAX)) {
      throw Error(Status::invalid_argument, 0, "bootstrap (MPI): blob too large");
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto op = std::make_unique<Pending>();
    op->len = static_cast<int>(mine.size());
    op->lens.resize(static_cast<std::size_t>(size_));
    int rc = MPI_Iallgather(&op->len, 1, MPI_INT, op->lens.data(), 1, MPI_INT, comm_, &op->req);
    if (rc != MPI_SUCCESS) mpi_fail(rc, "MPI_Iallgather (sizes)");
    wait(op, deadline, timeout, "sizes");

    op->displs.resize(op->lens.size());
    long long total = 0;
    for (std::size_t r = 0; r < op->lens.size(); ++r) {
      op->displs[r] = static_cast<int>(total);
      total += op->lens[r];
      if (total > INT_MAX) throw Error(Status::invalid_argument, 0, "bootstrap (MPI): blobs too large in total");
    }
    op->mine.assign(mine.begin(), mine.end());  // the caller's span may not outlive a timeout
    op->all.resize(static_cast<std::size_t>(total));
    rc = MPI_Iallgatherv(op->mine.data(), op->len, MPI_BYTE, op->all.data(), op->lens.data(), op->displs.data(),
                         MPI_BYTE, comm_, &op->req);
    if (rc != MPI_SUCCESS) mpi_fail(rc, "MPI_Iallgatherv");
    wait(op, deadline, timeout, "blobs");

    std::vector<std::vector<std::byte>> out(op->lens.size());
    for (std::size_t r = 0; r < op->lens.size(); ++r) {
      const auto first = op->all.begin() + op->displs[r];
      out[r].assign(first, first + op->lens[r]);
    }
    return out;
  }

 private:
  // One collective's buffers: MPI reads and writes them until the request
  // completes, so on a timeout they are parked in abandoned_ops_ for good.
  struct Pending {
    MPI_Request req = MPI_REQUEST_NULL;
    int len = 0;
    std::vector<int> lens;
    std::vector<int> displs;
    std::vector<std::byte> mine;
    std::vector<std::byte> all;
  };

  // Polls op->req until it completes, or throws Status::timeout at
  // `deadline` (the bootstrap is then abandoned). Yields between polls:
  // ranks are often oversubscribed on small machines.
  void wait(std::unique_ptr<Pending>& op, std::chrono::steady_clock::time_point deadline,
            std::chrono::milliseconds timeout, const char* what) {
    for (;;) {
      int done = 0;
      const int rc = MPI_Test(&op->req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        abandon(std::move(op));
        mpi_fail(rc, "MPI_Test");
      }
      if (done) return;
      if (std::chrono::steady_clock::now() >= deadline) {
        abandon(std::move(op));
        throw Error(Status::timeout, 0,
                    "bootstrap (MPI): rank " + std::to_string(rank_) + ": allgather (" + what + ") timed out after " +
                        std::to_string(timeout.count()) + " ms: a rank did not join");
      }
      std::this_thread::yield();
    }
  }
  // The collective may still complete and write into op's buffers, until
  // MPI_Finalize: they stay allocated for the life of the process, in a list
  // that is never destroyed (so static destructors cannot free them before
  // MPI_Finalize, and leak checkers see them as reachable). Only timed-out
  // collectives end up here.
  void abandon(std::unique_ptr<Pending> op) noexcept {
    abandoned_ = true;
    static std::mutex mutex;
    static auto* graveyard = new std::vector<std::unique_ptr<Pending>>;
    std::lock_guard lock(mutex);
    try {
      graveyard->push_back(std::move(op));
    } catch (...) {
      (void)op.release();  // no memory for the list: leak it rather than free it
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool abandoned_ = false;
};

}  // namespace

bool mpi_bootstrap_available() noexcept { return true; }
std::unique_ptr<Bootstrap> mpi_bootstrap() { return std::make_unique<MpiBootstrap>(); }

}  // namespace regpool
