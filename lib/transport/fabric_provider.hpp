#pragma once
// What regpool knows about a libfabric provider's behaviour, as properties
// (docs/provider-facts.md). The fabric endpoint asks these instead of
// comparing provider names where it needs them; a provider not listed here
// gets the cautious defaults (nothing claimed that was not measured).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace regpool::fabric_provider {

struct Facts {
  // A plain write/send completes once its bytes are queued on a socket,
  // before the target applied them: ask for FI_DELIVERY_COMPLETE unless the
  // user says otherwise (tcp;ofi_rxm, net).
  bool completes_before_delivery = false;
  // The target checks every RMA against its key table (key, range, rights);
  // a forged key fails remotely (tcp;ofi_rxm, net).
  bool target_checks_keys = false;
  // ... including read rights: a get through a registration made with
  // FI_REMOTE_WRITE only is refused (net; tcp;ofi_rxm serves it).
  bool target_checks_read_rights = false;
  // The provider's atomics are a software emulation of its own: regpool
  // emulates atomics itself by default, so the tested path and its
  // guarantees are the same on every provider without NIC atomics.
  bool software_atomics = false;
  // A refused key cancels the RMA (FI_ECANCELED) with the target's verdict
  // in prov_errno, and the target closes the connection (tcp;ofi_rxm).
  bool key_refusal_closes_connection = false;
  // A refused RMA (unknown key, range outside the registration) or a
  // message the receiver's buffer cannot hold fails only that operation:
  // FI_ECANCELED with a prov_errno that is not a connection error (measured
  // on net: EINVAL for a forged key and for truncation), and the connection
  // carries on (net; for a send only under delivery-complete, which
  // regpool's sends do not ask for: see truncation_breaks_connection).
  bool refusal_keeps_connection = false;
  // A connection's liveness can be probed with a 1-byte read under
  // FI_KEY_NOTAVAIL, and only then may abandoned ops be given back
  // (tcp;ofi_rxm; see FabricEndpoint::do_abandon).
  bool probe_connections = false;
  // A message longer than its receive breaks the connection (tcp;ofi_rxm:
  // an eager one stays half-read in the stream and wedges it; net: the
  // connection is closed unless the send asked for delivery-complete):
  // receives carry an overflow area behind the slice.
  bool truncation_breaks_connection = false;
  // ... and a message longer than the whole receive (slice + overflow area)
  // stalls the connection while its sender is told ok (net, measured with
  // transport-hostile: 70000 bytes into 64 + 64 KiB): the overflow area is
  // as large as the limit the endpoint advertises in its name, and peers
  // refuse longer sends (FabricEndpointOptions::max_incoming_message).
  bool oversize_stalls_connection = false;
  // The CQ's FI_WAIT_FD descriptor reports readable with nothing to read,
  // so a sleeping wait on it spins (net: transport-source-wait measured
  // 35000 wake-ups in 0.4 s, 70 % of a core): open CQs without a wait
  // object there, and the base naps instead, as on shm.
  bool cq_wait_fd_spins = false;
  // A post to a peer whose process is gone answers -FI_EAGAIN for ever,
  // exactly as to a live peer that has not taken the connection yet (net:
  // every post opens a new connection, whose refusal the provider drops),
  // and the peer's address is the TCP socket its endpoint listens on: a
  // peer that keeps posts waiting is probed there (transport/stall_probe.hpp)
  // and, when the connect is refused, failed as gone.
  bool dead_peer_answers_eagain = false;
  // A message above the rxm layer's eager limit that arrives before its
  // receive is kept as a rendezvous request. When its sender dies, rxm
  // (libfabric 1.17) closes the connection but keeps the request, and the
  // next receive it matches reads through the closed connection: SIGSEGV
  // in fi_recv (measured: 16384 bytes safe, 16385 crashed, every run;
  // docs/provider-facts.md). The endpoint therefore tells peers to send
  // nothing longer than the eager limit (name(); a longer send() returns
  // message_too_large), and larger payloads go by the Messenger's own
  // rendezvous, which a dead peer cannot turn into a crash (tcp;ofi_rxm and
  // any other ofi_rxm stack).
  bool unexpected_rendezvous_crashes = false;
  // Shared-memory provider: CMA, /dev/shm regions, pid-based dead peers.
  bool shared_memory = false;
  // A put or get is one copy made by the initiator inside the post (shm:
  // CMA, process_vm_readv/writev in fi_read/fi_write); TransferTraits.
  bool initiator_copies = false;
  // Copy-versus-rendezvous crossover, the default eager threshold, measured
  // with regpool-perf --ops tagged --tagged-threshold (all eager, then all
  // rendezvous) over 4 KiB .. 256 KiB (docs/messaging.md): shm, eager
  // ahead up to 64 KiB, even at 128 KiB, behind at 256 KiB; tcp;ofi_rxm,
  // even from 16 to 64 KiB, rendezvous ahead above; net (2026-11-29, 16 KiB
  // .. 1 MiB), eager ahead up to 128 KiB in latency and bandwidth, even at
  // 256 KiB, behind at 1 MiB. Other providers: tcp;ofi_rxm's figure until
  // measured.
  std::uint64_t copy_crossover = std::uint64_t{32} << 10;
  // Messages past the provider's inject size take a slower path (shm: CMA,
  // a process_vm_readv in the receiver's progress, whatever the size): an
  // eager message the Messenger's 64-byte header pushes past it is sent as
  // several within it, up to this many payload bytes (TransferTraits::
  // split_crossover; measured, docs/messaging.md). 0 = never.
  std::uint64_t split_crossover = 0;
  // The longest message (header included) sent gathered, two pieces with
  // the second uncopied (TransferTraits::gather_limit). net: from a second
  // TCP segment on (loopback MSS 65483, the provider's 16-byte header
  // included), gathered messages cost 20-30% more than copied ones with the
  // processes on cores apart (measured 2026-12-02, docs/messaging.md); 64
  // KiB less 128 bytes stays clear of it. UINT64_MAX = no limit.
  std::uint64_t gather_limit = ~std::uint64_t{0};
};

inline Facts facts(const std::string& provider) {
  Facts f;
  const std::string_view core = std::string_view(provider).substr(0, provider.find(';'));
  const bool layered = provider.find(';') != std::string::npos;
  if (provider == "shm") {
    f.shared_memory = true;
    f.initiator_copies = true;
    f.copy_crossover = std::uint64_t{64} << 10;
    f.split_crossover = std::uint64_t{16} << 10;
  } else if (provider == "tcp;ofi_rxm") {
    f.completes_before_delivery = true;
    f.target_checks_keys = true;
    f.software_atomics = true;
    f.key_refusal_closes_connection = true;
    f.probe_connections = true;
    f.truncation_breaks_connection = true;
    f.unexpected_rendezvous_crashes = true;
  } else if (provider == "net") {
    // libfabric 1.17's native RDM over TCP (no rxm), measured 2026-11-26.
    f.completes_before_delivery = true;
    f.target_checks_keys = true;
    f.target_checks_read_rights = true;
    f.software_atomics = true;
    f.refusal_keeps_connection = true;
    f.truncation_breaks_connection = true;
    f.oversize_stalls_connection = true;
    f.cq_wait_fd_spins = true;
    f.dead_peer_answers_eagain = true;
    f.copy_crossover = std::uint64_t{128} << 10;
    f.gather_limit = (std::uint64_t{64} << 10) - 128;
  } else if (layered) {
    // Any other rxm/rxd stack: treated like tcp;ofi_rxm where the layer is
    // the cause (atomics, completion, cancelled RMA), and like its core
    // provider otherwise.
    f.software_atomics = true;
    f.completes_before_delivery = true;
    f.key_refusal_closes_connection = true;
    f.target_checks_keys = core == "tcp";
    f.truncation_breaks_connection = core == "tcp";
    f.unexpected_rendezvous_crashes = provider.ends_with(";ofi_rxm");
  }
  return f;
}

// The largest message the rxm layer sends eagerly (no rendezvous): 16 KiB
// unless FI_OFI_RXM_BUFFER_SIZE or FI_OFI_RXM_EAGER_LIMIT say otherwise.
// rxm versions derive the limit from these two differently (one, the
// other, or the larger); the smaller of the two (the buffer size counting
// as 16 KiB when unset) is eager under every rule, and peers agree on it
// anyway (rxm refuses a connection between endpoints with different eager
// limits). 0 when a variable is set but is not a positive number.
inline std::uint64_t rxm_eager_limit() {
  // A set variable: its value; unset: `fallback`; not a positive number: 0.
  const auto env_size = [](const char* var, std::uint64_t fallback) -> std::uint64_t {
    const char* v = std::getenv(var);
    if (v == nullptr || *v == '\0') return fallback;
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 0);
    return *end == '\0' ? n : 0;
  };
  const std::uint64_t buffer = env_size("FI_OFI_RXM_BUFFER_SIZE", std::uint64_t{16} << 10);
  const std::uint64_t eager = env_size("FI_OFI_RXM_EAGER_LIMIT", buffer);
  return buffer < eager ? buffer : eager;
}

}  // namespace regpool::fabric_provider
