#pragma once
// rdma-core verbs registration domain: one device context, one port, one
// protection domain. Registers memory with ibv_reg_mr and hands out the lkey
// (Registration::local_key) and rkey (Registration::remote_key); peers
// address by virtual address (verbs has no offset mode without
// IBV_ACCESS_ZERO_BASED, which rxe does not implement).
//
// Choices:
//  - Device: the one named in VerbsConfig::device, else the first device
//    with an ACTIVE port. Port: VerbsConfig::port, else the first ACTIVE one.
//  - GID (RoCE): VerbsConfig::gid_index, else the first RoCEv2 entry of the
//    port's table, else the first non-zero entry. InfiniBand ports address by
//    LID and need no GID.
//  - Access: IBV_ACCESS_LOCAL_WRITE always (receives, reads and atomic
//    results write into local memory; and a memory window granting remote
//    write needs it on the underlying MR); remote read/write/atomic as asked.
//    IBV_ACCESS_MW_BIND is added when memory windows are enabled, so every
//    arena can have type-2 windows bound over its objects (scoped exports).
//  - Errors: ibv_reg_mr failing with ENOMEM/EPERM/EAGAIN while the request is
//    above RLIMIT_MEMLOCK (and the process lacks CAP_IPC_LOCK) throws
//    Status::memlock_limit with the limit and the fix; other failures throw
//    Status::registration_failed with errno as the provider code.
//  - No usable device (no rdma-core devices, or none with an active port)
//    throws Error(Status::unsupported, ENODEV, ...): tests use that to SKIP.
//
// Ownership: the domain owns the ibv_context and ibv_pd; Registrations keep
// the domain alive (shared_ptr), and so do VerbsEndpoints.
// Thread-safety: as Domain (libibverbs' registration calls are thread-safe);
// accessors are immutable after construction.

#include <cstdint>
#include <memory>
#include <string>

#include "regpool/domain.hpp"

struct ibv_context;
struct ibv_pd;
struct ibv_mr;

namespace regpool {

struct VerbsConfig {
  // rdma-core device name ("rxe0", "mlx5_0"); empty = first with an active port.
  std::string device;
  // 1-based port number; 0 = first ACTIVE port of the device.
  int port = 0;
  // GID table index for RoCE; -1 = first RoCEv2 entry (then any non-zero).
  int gid_index = -1;
  enum class MemoryWindows : std::uint8_t {
    automatic,  // on when the device reports type-2 windows (max_mw > 0)
    on,         // fail at construction when the device has none
    off,
  };
  MemoryWindows memory_windows = MemoryWindows::automatic;
};

// What a peer needs to reach this domain's port (copied into endpoint names).
struct VerbsPortInfo {
  std::uint8_t port = 0;
  bool ethernet = false;   // RoCE: address by GID (GRH); else by LID
  std::uint16_t lid = 0;
  int gid_index = -1;
  std::uint8_t gid[16] = {};
  int active_mtu = 0;      // enum ibv_mtu value
  std::uint64_t max_msg_size = 0;
};

class REGPOOL_API VerbsDomain final : public Domain {
 public:
  explicit VerbsDomain(const VerbsConfig& config = {});  // throws Error
  ~VerbsDomain() override;
  static std::shared_ptr<VerbsDomain> open(const VerbsConfig& config = {}) {
    return std::make_shared<VerbsDomain>(config);
  }

  std::string name() const override { return "verbs:" + device_; }
  const std::string& device_name() const noexcept { return device_; }
  AddressMode address_mode() const noexcept override { return AddressMode::virtual_address; }
  bool memory_windows() const noexcept { return memory_windows_; }
  const VerbsPortInfo& port_info() const noexcept { return port_; }

  // Device limits the endpoint sizes its queues by.
  std::uint32_t max_qp_wr() const noexcept { return max_qp_wr_; }
  std::uint32_t max_srq_wr() const noexcept { return max_srq_wr_; }
  std::uint32_t max_cqe() const noexcept { return max_cqe_; }
  std::uint32_t max_qp_rd_atom() const noexcept { return max_qp_rd_atom_; }
  bool has_atomics() const noexcept { return has_atomics_; }

  // --- Native handles: an escape hatch for code that calls rdma-core
  // directly (benchmarks, tests of device behaviour); not needed for
  // regpool's own API. Owned by the domain, valid for its lifetime: do not
  // close or deallocate them.
  ibv_context* native_context() const noexcept { return ctx_; }
  ibv_pd* native_pd() const noexcept { return pd_; }

 protected:
  Native do_register(void* addr, std::size_t length, Access access) override;
  void do_deregister(const Native& native, void* addr, std::size_t length) noexcept override;

 private:
  void close_all() noexcept;

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  std::string device_;
  VerbsPortInfo port_;
  bool memory_windows_ = false;
  bool has_atomics_ = false;
  std::uint32_t max_qp_wr_ = 0;
  std::uint32_t max_srq_wr_ = 0;
  std::uint32_t max_cqe_ = 0;
  std::uint32_t max_qp_rd_atom_ = 0;
};

// Access flags ibv_reg_mr gets for `access`: part of the native escape hatch
// above, for code registering with ibv_reg_mr on native_pd() itself.
REGPOOL_API int verbs_access_flags(Access access, bool memory_windows) noexcept;

}  // namespace regpool
