#include "regpool/verbs_domain.hpp"

#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "platform/mapping.hpp"

namespace regpool {
namespace {

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

struct DeviceList {
  ibv_device** list = nullptr;
  int count = 0;
  DeviceList() { list = ibv_get_device_list(&count); }
  ~DeviceList() {
    if (list) ibv_free_device_list(list);
  }
  DeviceList(const DeviceList&) = delete;
  DeviceList& operator=(const DeviceList&) = delete;
};

// First ACTIVE port of an open device, or 0.
int first_active_port(ibv_context* ctx, int nports) {
  for (int p = 1; p <= nports; ++p) {
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, static_cast<std::uint8_t>(p), &pa) == 0 && pa.state == IBV_PORT_ACTIVE) return p;
  }
  return 0;
}

bool gid_is_zero(const ibv_gid& g) {
  static const std::uint8_t zero[16] = {};
  return std::memcmp(g.raw, zero, 16) == 0;
}

}  // namespace

int verbs_access_flags(Access access, bool memory_windows) noexcept {
  // Local write always: receives, RDMA READ results and atomic results land in
  // local memory, and a window that grants remote write or atomics requires
  // LOCAL_WRITE on the MR underneath it (IB spec o10-36.2.1).
  int a = IBV_ACCESS_LOCAL_WRITE;
  if (grants(access, Access::remote_read)) a |= IBV_ACCESS_REMOTE_READ;
  if (grants(access, Access::remote_write)) a |= IBV_ACCESS_REMOTE_WRITE;
  if (grants(access, Access::remote_atomic)) a |= IBV_ACCESS_REMOTE_ATOMIC;
  if (memory_windows) a |= IBV_ACCESS_MW_BIND;
  return a;
}

VerbsDomain::VerbsDomain(const VerbsConfig& config) {
  DeviceList devs;
  if (!devs.list) {
    const int err = errno;
    throw Error(Status::unsupported, err ? err : ENODEV,
                "verbs domain: ibv_get_device_list failed: " + errno_text(err ? err : ENODEV) +
                    " (no rdma-core kernel support? load ib_uverbs and a provider, e.g. rdma_rxe)");
  }
  if (devs.count == 0) {
    throw Error(Status::unsupported, ENODEV,
                "verbs domain: no RDMA devices (ibv_get_device_list returned none; for Soft-RoCE: "
                "'rdma link add rxe0 type rxe netdev <if>')");
  }
  std::string seen;
  for (int i = 0; i < devs.count && !ctx_; ++i) {
    const char* dn = ibv_get_device_name(devs.list[i]);
    const std::string name = dn ? dn : "?";
    seen += (seen.empty() ? "" : ", ") + name;
    if (!config.device.empty() && name != config.device) continue;
    ibv_context* ctx = ibv_open_device(devs.list[i]);
    if (!ctx) {
      if (!config.device.empty()) {
        const int err = errno;
        throw Error(Status::transport_error, err, "verbs domain: ibv_open_device(" + name + ") failed: " + errno_text(err));
      }
      continue;
    }
    ibv_device_attr da{};
    if (ibv_query_device(ctx, &da) != 0) {
      ibv_close_device(ctx);
      continue;
    }
    int port = config.port;
    if (port == 0) {
      port = first_active_port(ctx, da.phys_port_cnt);
    } else {
      ibv_port_attr pa{};
      if (port > da.phys_port_cnt || ibv_query_port(ctx, static_cast<std::uint8_t>(port), &pa) != 0 ||
          pa.state != IBV_PORT_ACTIVE) {
        port = 0;
      }
    }
    if (port == 0) {
      ibv_close_device(ctx);
      if (!config.device.empty()) {
        throw Error(Status::unsupported, ENODEV,
                    "verbs domain: device " + name + " has no ACTIVE port" +
                        (config.port ? " " + std::to_string(config.port) : std::string()));
      }
      continue;
    }
    ctx_ = ctx;
    device_ = name;
    port_.port = static_cast<std::uint8_t>(port);
    max_qp_wr_ = static_cast<std::uint32_t>(std::max(da.max_qp_wr, 1));
    max_srq_wr_ = static_cast<std::uint32_t>(std::max(da.max_srq_wr, 0));
    max_cqe_ = static_cast<std::uint32_t>(std::max(da.max_cqe, 1));
    max_qp_rd_atom_ = static_cast<std::uint32_t>(std::max(da.max_qp_rd_atom, 0));
    has_atomics_ = da.atomic_cap != IBV_ATOMIC_NONE;
    const bool mw_capable = da.max_mw > 0;
    switch (config.memory_windows) {
      case VerbsConfig::MemoryWindows::automatic: memory_windows_ = mw_capable; break;
      case VerbsConfig::MemoryWindows::off: memory_windows_ = false; break;
      case VerbsConfig::MemoryWindows::on:
        if (!mw_capable) {
          close_all();
          throw Error(Status::unsupported, EOPNOTSUPP, "verbs domain: device " + name + " has no memory windows");
        }
        memory_windows_ = true;
        break;
    }
  }
  if (!ctx_) {
    if (!config.device.empty()) {
      throw Error(Status::unsupported, ENODEV,
                  "verbs domain: device '" + config.device + "' not found (devices: " + seen + ")");
    }
    throw Error(Status::unsupported, ENODEV, "verbs domain: no device with an ACTIVE port (devices: " + seen + ")");
  }

  ibv_port_attr pa{};
  if (ibv_query_port(ctx_, port_.port, &pa) != 0) {
    const int err = errno;
    close_all();
    throw Error(Status::transport_error, err, "verbs domain: ibv_query_port failed: " + errno_text(err));
  }
  port_.ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
  port_.lid = pa.lid;
  port_.active_mtu = pa.active_mtu;
  port_.max_msg_size = pa.max_msg_sz;

  // RoCE needs a GID; prefer RoCEv2 (routable UDP encapsulation) as rxe and
  // most fabrics expect. IB also fills GID 0 (used only across subnets).
  int chosen = config.gid_index;
  ibv_gid gid{};
  if (chosen >= 0) {
    if (chosen >= pa.gid_tbl_len || ibv_query_gid(ctx_, port_.port, chosen, &gid) != 0 || gid_is_zero(gid)) {
      close_all();
      throw Error(Status::invalid_argument, EINVAL,
                  "verbs domain: GID index " + std::to_string(config.gid_index) + " of " + device_ + " port " +
                      std::to_string(port_.port) + " is empty or invalid");
    }
  } else {
    // Preference: RoCEv2 on an IPv4-mapped address (what rdma_cm and most
    // RoCE deployments use), then any RoCEv2 (e.g. IPv6 link-local), then
    // any non-zero entry (IB, RoCEv1).
    int any = -1, v2 = -1;
    for (int i = 0; i < pa.gid_tbl_len && chosen < 0; ++i) {
      ibv_gid_entry e{};
      if (ibv_query_gid_ex(ctx_, port_.port, static_cast<std::uint32_t>(i), &e, 0) != 0) continue;
      if (gid_is_zero(e.gid)) continue;
      if (any < 0) any = i;
      if (e.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
      if (v2 < 0) v2 = i;
      static const std::uint8_t v4_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
      if (std::memcmp(e.gid.raw, v4_prefix, 12) == 0) chosen = i;
    }
    if (chosen < 0) chosen = v2 >= 0 ? v2 : any;
    if (chosen >= 0) (void)ibv_query_gid(ctx_, port_.port, chosen, &gid);
  }
  if (port_.ethernet && chosen < 0) {
    close_all();
    throw Error(Status::unsupported, ENODEV,
                "verbs domain: RoCE port " + device_ + ":" + std::to_string(port_.port) +
                    " has no GID yet (is the netdev up with an address?)");
  }
  port_.gid_index = chosen;
  std::memcpy(port_.gid, gid.raw, 16);

  pd_ = ibv_alloc_pd(ctx_);
  if (!pd_) {
    const int err = errno;
    close_all();
    throw Error(Status::transport_error, err, "verbs domain: ibv_alloc_pd on " + device_ + " failed: " + errno_text(err));
  }
}

void VerbsDomain::close_all() noexcept {
  // Registrations and endpoints keep the domain alive, so nothing still uses
  // the PD here; a failing dealloc (EBUSY) would mean a leak elsewhere and
  // there is nothing better to do than carry on.
  if (pd_) (void)ibv_dealloc_pd(pd_);
  if (ctx_) (void)ibv_close_device(ctx_);
  pd_ = nullptr;
  ctx_ = nullptr;
}

VerbsDomain::~VerbsDomain() { close_all(); }

Domain::Native VerbsDomain::do_register(void* addr, std::size_t length, Access access) {
  if (length == 0) throw Error(Status::invalid_argument, 0, "verbs domain '" + device_ + "': cannot register 0 bytes");
  if (addr == nullptr) {
    throw Error(Status::invalid_argument, 0, "verbs domain '" + device_ + "': cannot register a null address");
  }
  ibv_mr* mr = ibv_reg_mr(pd_, addr, length, verbs_access_flags(access, memory_windows_));
  if (!mr) {
    const int err = errno ? errno : ENOMEM;
    // The kernel (ib_umem_get) refuses to pin beyond RLIMIT_MEMLOCK without
    // CAP_IPC_LOCK and says ENOMEM, which sends people looking at RAM.
    const bool limited = !platform::can_exceed_memlock() && platform::memlock_limit() != UINT64_MAX;
    if ((err == ENOMEM || err == EPERM || err == EAGAIN) && limited) {
      throw Error(Status::memlock_limit, err,
                  "verbs domain '" + device_ + "': ibv_reg_mr: " + platform::memlock_advice(length, err));
    }
    throw Error(err == ENOMEM ? Status::out_of_memory : Status::registration_failed, err,
                "verbs domain '" + device_ + "': ibv_reg_mr of " + std::to_string(length) +
                    " bytes failed: " + errno_text(err));
  }
  Native n;
  n.handle = mr;
  n.desc = nullptr;
  n.lkey = mr->lkey;
  n.rkey = mr->rkey;
  n.mode = AddressMode::virtual_address;
  return n;
}

void VerbsDomain::do_deregister(const Native& native, void* /*addr*/, std::size_t /*length*/) noexcept {
  auto* mr = static_cast<ibv_mr*>(native.handle);
  // EBUSY here means memory windows are still bound over the MR: the
  // endpoint revokes its windows before the objects (and arenas) go, so this
  // is a bug elsewhere; leaking the MR is safer than freeing pinned pages
  // that a window still exposes.
  if (mr) (void)ibv_dereg_mr(mr);
}

}  // namespace regpool
