// MPI adapter for Bootstrap: compiled only with -Dmpi=enabled (see
// lib/meson.build), which also defines REGPOOL_HAVE_MPI=1 for bootstrap.cpp.
// Only the C API is used: keep Open MPI's and MPICH's deprecated C++
// bindings (which do not compile warning-free) out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <climits>
#include <string>

#include "regpool/bootstrap.hpp"

namespace regpool {
namespace {

[[noreturn]] void mpi_fail(int rc, const char* what) {
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(Status::transport_error, rc, std::string("bootstrap (MPI): ") + what + ": " + std::string(msg, len));
}

// Thread-safety: as Bootstrap. The communicator is MPI_COMM_WORLD, duplicated
// so our collectives never match the application's.
class MpiBootstrap final : public Bootstrap {
 public:
  MpiBootstrap() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      if (rc != MPI_SUCCESS) mpi_fail(rc, "MPI_Init_thread");
    }
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    if (rc != MPI_SUCCESS) mpi_fail(rc, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiBootstrap() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }

  // MPI collectives have no timeout: `timeout` is not enforceable here (the
  // MPI runtime aborts the job when a rank dies, which is the MPI contract).
  std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> mine,
                                                std::chrono::milliseconds /*timeout*/) override {
    if (mine.size() > static_cast<std::size_t>(INT_MAX)) throw Error(Status::invalid_argument, 0, "bootstrap (MPI): blob too large");
    const int len = static_cast<int>(mine.size());
    std::vector<int> lens(static_cast<std::size_t>(size_));
    int rc = MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_);
    if (rc != MPI_SUCCESS) mpi_fail(rc, "MPI_Allgather (sizes)");
    std::vector<int> displs(lens.size());
    long long total = 0;
    for (std::size_t r = 0; r < lens.size(); ++r) {
      displs[r] = static_cast<int>(total);
      total += lens[r];
      if (total > INT_MAX) throw Error(Status::invalid_argument, 0, "bootstrap (MPI): blobs too large in total");
    }
    std::vector<std::byte> all(static_cast<std::size_t>(total));
    rc = MPI_Allgatherv(mine.data(), len, MPI_BYTE, all.data(), lens.data(), displs.data(), MPI_BYTE, comm_);
    if (rc != MPI_SUCCESS) mpi_fail(rc, "MPI_Allgatherv");
    std::vector<std::vector<std::byte>> out(lens.size());
    for (std::size_t r = 0; r < lens.size(); ++r) {
      out[r].assign(all.begin() + displs[r], all.begin() + displs[r] + lens[r]);
    }
    return out;
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

bool mpi_bootstrap_available() noexcept { return true; }
std::unique_ptr<Bootstrap> mpi_bootstrap() { return std::make_unique<MpiBootstrap>(); }

}  // namespace regpool
