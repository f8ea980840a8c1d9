// The whole loop in one file: allocate, expose, put/get, wait, telemetry.
// README.md shows this file verbatim (a test keeps them identical).
#include <array>
#include <chrono>
#include <cstring>
#include <iostream>
#include <regpool/regpool.hpp>

int main() {
  using namespace std::chrono_literals;
  // One shm domain; the pool registers one 64 MiB arena with it, once.
  regpool::FabricConfig fabric;
  fabric.provider = "shm";  // "tcp" (with node "127.0.0.1") works the same way
  auto shm = regpool::FabricDomain::open(fabric);
  regpool::PoolConfig config;
  config.arena_size = 64 << 20;
  regpool::Pool pool({shm}, config);

  // Two endpoints stand for two processes: `server` exposes an object,
  // `client` writes and reads it. Its progress thread lets the server
  // serve operations aimed at it while it does something else.
  regpool::EndpointConfig serving;
  serving.progress_thread = true;
  auto server = regpool::FabricEndpoint::open(shm, serving);
  auto client = regpool::FabricEndpoint::open(shm);
  const regpool::PeerId peer = client->insert_peer(server->name());  // names travel as bytes

  // Allocate: no registration here, ever. (operator* aborts on a failed
  // Result; check .ok() or the status in real code.)
  regpool::Ldo target = *pool.allocate(4096);
  regpool::Ldo message = *pool.allocate(4096);
  std::memset(message.data().data(), 'x', message.data().size());

  // Expose: a 64-byte, checksummed reference granting read-write on exactly
  // this slice. Send the bytes to the peer; the peer decodes and validates.
  auto exposure = server->expose(*regpool::Slice::data(target), regpool::RemoteAccess::read_write);
  if (!exposure) return 1;
  const std::array<std::byte, 64> wire = exposure->encode();
  const regpool::RemoteRef ref = *regpool::RemoteRef::decode(wire);

  // Put, then get it back into a third object. Operations take LDO slices
  // only; wait() is bounded, and the status says what happened.
  auto put = client->put(*regpool::Slice::data(message), peer, ref, 0);
  if (!put || client->wait(*put, 5s).status != regpool::Status::ok) return 1;
  regpool::Ldo back = *pool.allocate(4096);
  auto get = client->get(peer, ref, 0, *regpool::Slice::data(back));
  if (!get || client->wait(*get, 5s).status != regpool::Status::ok) return 1;
  const bool same = std::memcmp(back.data().data(), message.data().data(), 4096) == 0 &&
                    std::memcmp(target.data().data(), message.data().data(), 4096) == 0;

  // Telemetry: three objects, and still one registration by the pool.
  const regpool::PoolStats stats = pool.stats();
  regpool::print(std::cout, stats);
  regpool::print(std::cout, client->stats());
  std::cout << (same && stats.registrations == 1 ? "quickstart: OK\n" : "quickstart: FAILED\n");
  return same && stats.registrations == 1 ? 0 : 1;
}
