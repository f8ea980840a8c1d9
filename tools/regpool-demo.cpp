// regpool-demo: two processes on loopback, each with a pool on a libfabric
// domain; the target exposes an LDO, the initiator puts into it, gets it
// back and sends a message, verifying every byte; both print telemetry.
// Step by step, with its output: docs/walkthrough.md.
//
//   regpool-demo [--provider shm|tcp] [--rounds N]

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "regpool/bootstrap.hpp"
#include "regpool/fabric_domain.hpp"
#include "regpool/fabric_endpoint.hpp"
#include "regpool/pool.hpp"
#include "regpool/slice.hpp"
#include "regpool/telemetry.hpp"

namespace {

using namespace std::chrono_literals;
using regpool::Slice;
using regpool::Status;

constexpr std::uint64_t kObjectSize = 1 << 20;

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: regpool-demo [--provider shm|tcp] [--rounds N]\n"
               "  --provider NAME  libfabric provider (default shm; tcp runs libfabric's net on 127.0.0.1)\n"
               "  --rounds N       put/get/send rounds in the data phase (default 100)\n");
}

struct Process {
  std::shared_ptr<regpool::FabricDomain> domain;
  std::unique_ptr<regpool::Pool> pool;
  std::unique_ptr<regpool::FabricEndpoint> ep;

  Process(const std::string& provider, bool target) {
    regpool::FabricConfig fc;
    fc.provider = provider;
    if (provider == "tcp") fc.node = "127.0.0.1";
    domain = regpool::FabricDomain::open(fc);
    regpool::PoolConfig pc;
    pc.name = target ? "demo-target" : "demo-initiator";
    pc.arena_size = 16 << 20;
    pool = std::make_unique<regpool::Pool>(std::vector<std::shared_ptr<regpool::Domain>>{domain}, pc);
    regpool::EndpointConfig ec;
    // Manual progress: shm and tcp;ofi_rxm complete an operation only while
    // its target progresses, and the target waits in the bootstrap.
    ec.progress_thread = target;
    ep = regpool::FabricEndpoint::open(domain, ec);
  }
  ~Process() {
    ep.reset();
    pool.reset();
  }
  regpool::Ldo alloc(std::uint64_t n) {
    auto r = pool->allocate(n);
    if (!r) throw regpool::Error(r.status(), 0, std::string("allocate: ") + regpool::to_string(r.status()));
    return std::move(*r);
  }
};

regpool::Slice must(regpool::Result<regpool::Slice> r) {
  if (!r) throw regpool::Error(r.status(), 0, "slice");
  return std::move(*r);
}

void fill(std::span<std::byte> s, unsigned seed) {
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<std::byte>((i * 131 + seed * 7) & 0xff);
}

void print_phase(const char* who, const regpool::PoolStats& warm, const regpool::PoolStats& end) {
  std::uint64_t dom_warm = 0, dom_end = 0;
  for (const auto& d : warm.domains) dom_warm += d.registrations;
  for (const auto& d : end.domains) dom_end += d.registrations;
  std::cout << who << ": allocations in data phase: " << end.allocations - warm.allocations
            << ", pool registrations after warm-up: " << end.registrations - warm.registrations
            << ", domain registrations after warm-up: " << dom_end - dom_warm << "\n";
  regpool::print(std::cout, end);
  std::cout.flush();
}

int run_initiator(const std::string& provider, std::uint16_t port, int rounds) {
  regpool::TcpBootstrapConfig bc;
  bc.rank = 1;
  bc.size = 2;
  bc.port = port;
  regpool::TcpBootstrap boot(bc);
  Process p(provider, false);
  auto all = boot.allgather(p.ep->name(), 30s);
  const std::vector<std::byte>& blob = all[0];
  // Target's blob: remote reference (64 bytes), then its endpoint name.
  auto ref = regpool::RemoteRef::decode({blob.data(), regpool::RemoteRef::kEncodedSize});
  if (!ref) {
    std::fprintf(stderr, "initiator: bad remote reference: %s\n", regpool::to_string(ref.status()));
    return 1;
  }
  const auto peer = p.ep->insert_peer({blob.data() + regpool::RemoteRef::kEncodedSize,
                                       blob.size() - regpool::RemoteRef::kEncodedSize});
  // Warm-up: one of each operation, so connections exist.
  auto warm_obj = p.alloc(64);
  (void)p.ep->wait(*p.ep->get(peer, *ref, 0, must(Slice::data(warm_obj))), 30s);
  const auto warm = p.pool->stats();

  int bad = 0;
  for (int r = 0; r < rounds; ++r) {
    // Fresh objects every round: allocation without registration.
    auto out = p.alloc(kObjectSize);
    auto back = p.alloc(kObjectSize);
    fill(out.data(), static_cast<unsigned>(r));
    auto c = p.ep->wait(*p.ep->put(must(Slice::data(out)), peer, *ref, 0), 30s);
    if (c.status != Status::ok) {
      std::fprintf(stderr, "put: %s\n", regpool::to_string(c.status));
      return 1;
    }
    c = p.ep->wait(*p.ep->get(peer, *ref, 0, must(Slice::data(back))), 30s);
    if (c.status != Status::ok) {
      std::fprintf(stderr, "get: %s\n", regpool::to_string(c.status));
      return 1;
    }
    if (std::memcmp(out.data().data(), back.data().data(), kObjectSize) != 0) ++bad;
  }
  auto msg = p.alloc(32);
  const std::string text = "hello through regpool";
  std::memcpy(msg.data().data(), text.data(), text.size());
  auto sent = p.ep->wait(*p.ep->send(peer, must(Slice::data(msg, 0, text.size()))), 30s);
  std::cout << "initiator: " << rounds << " rounds of put+get of " << kObjectSize << " bytes, "
            << (bad == 0 ? "all bytes verified" : "MISMATCHES") << "; send: " << regpool::to_string(sent.status)
            << "\n";
  print_phase("initiator", warm, p.pool->stats());
  boot.barrier(60s);
  return bad == 0 && sent.status == Status::ok ? 0 : 1;
}

int run_target(const std::string& provider, regpool::TcpBootstrap& boot) {
  Process p(provider, true);
  auto obj = p.alloc(kObjectSize);
  auto exposure = p.ep->expose(must(Slice::data(obj)), regpool::RemoteAccess::read_write);
  if (!exposure) throw regpool::Error(exposure.status(), 0, "expose");
  auto inbox = p.alloc(64);
  auto token = p.ep->post_recv(must(Slice::data(inbox)));
  const auto warm = p.pool->stats();
  auto ref = exposure->encode();
  std::vector<std::byte> blob(ref.begin(), ref.end());
  auto name = p.ep->name();
  blob.insert(blob.end(), name.begin(), name.end());
  (void)boot.allgather(blob, 30s);
  // The progress thread serves the initiator meanwhile.
  auto got = p.ep->wait(*token, 60s);
  std::cout << "target: received " << got.bytes << " bytes: \""
            << std::string(reinterpret_cast<const char*>(inbox.data().data()), got.bytes) << "\" ("
            << regpool::to_string(got.status) << ")\n";
  print_phase("target", warm, p.pool->stats());
  boot.barrier(60s);
  return got.status == Status::ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string provider = "shm";
  int rounds = 100;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    }
    if (a == "--provider" && i + 1 < argc) {
      provider = argv[++i];
    } else if (a == "--rounds" && i + 1 < argc) {
      char* end = nullptr;
      rounds = static_cast<int>(std::strtol(argv[++i], &end, 10));
      if (!end || *end || rounds < 1) {
        std::fprintf(stderr, "regpool-demo: --rounds needs a positive integer\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "regpool-demo: unknown argument '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  ::setenv("FI_TCP_IFACE", "lo", 0);
  try {
    // Rank 0 listens before the fork so the child knows the port; neither
    // process touches libfabric before fork.
    regpool::TcpBootstrapConfig bc;
    bc.rank = 0;
    bc.size = 2;
    regpool::TcpBootstrap boot(bc);
    const std::uint16_t port = boot.port();
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      ::alarm(120);
      int rc = 1;
      try {
        rc = run_initiator(provider, port, rounds);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "initiator: %s\n", e.what());
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    int rc = 1;
    try {
      rc = run_target(provider, boot);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "target: %s\n", e.what());
      ::kill(pid, SIGKILL);
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    const bool child_ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    std::cout << (rc == 0 && child_ok ? "demo: OK\n" : "demo: FAILED\n");
    return rc == 0 && child_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "regpool-demo: %s\n", e.what());
    return 1;
  }
}
