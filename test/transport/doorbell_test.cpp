// The shm doorbell (docs/progress.md, "How shm sleeps"): libfabric 1.17 shm
// has no wait object, so a sleeping shm endpoint sleeps on a futex word in
// /dev/shm/regpool-bell.<region> that its peers ring after posting to it.
//  - a receiver in WaitMode::sleep in another process is woken by the
//    sender's ring (counted on both sides: EndpointStats::bell_wakes,
//    FabricShmStats::bell_rings); without the doorbell both stay 0;
//  - the file exists while the endpoint lives and goes with it; spinning
//    endpoints and tcp make none;
//  - a planted bell file (symlink, wrong size, wrong owner, FIFO, wrong
//    magic) is refused and the peer is reached as before; one with the
//    right layout and garbage words is used, and at worst rings in vain;
//  - bells left by killed processes are swept (only those: dead pid, our
//    euid, regular file).
// Counters only: no timing targets.

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>

#include "regpool/fabric_endpoint.hpp"
#include "transport/fabric_shm.hpp"
#include "transport/harness.hpp"

using namespace std::chrono_literals;
using regpool::Completion;
using regpool::PeerId;
using regpool::Slice;
using regpool::Status;
using regpool::WaitMode;

namespace {

constexpr std::uint64_t kMsg = 64;

regpool::FabricEndpoint& fabric(rpt::Stack& s) { return dynamic_cast<regpool::FabricEndpoint&>(*s.ep); }

// The shm region name inside an endpoint's name blob: the NUL-terminated
// string after "://".
std::string region_of(const std::vector<std::byte>& name) {
  const std::string blob(reinterpret_cast<const char*>(name.data()), name.size());
  const std::size_t at = blob.find("://");
  REQUIRE(at != std::string::npos);
  const std::size_t end = blob.find('\0', at);
  REQUIRE(end != std::string::npos);
  return blob.substr(at + 3, end - at - 3);
}

// Files /dev/shm/regpool-bell.<our pid>:* now.
std::size_t own_bells() {
  const std::string prefix = "regpool-bell." + std::to_string(::getpid()) + ":";
  std::size_t n = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) ++n;
    }
    ::closedir(d);
  }
  return n;
}

}  // namespace

TEST_CASE("a sleeping shm endpoint is woken by its peer's doorbell", "[fabric][wait][doorbell]") {
  const std::string prov = GENERATE(from_range(rpt::backends()));
  INFO("backend " << prov);
  constexpr int kLate = 20;
  auto boot = rpt::root_bootstrap();
  const auto port = boot->port();
  auto kid = rpt::spawn(
      [&]() -> int {
        auto b = rpt::child_bootstrap(port);
        regpool::EndpointConfig c;
        c.wait_mode = WaitMode::adaptive;
        rpt::Stack s(prov, c);
        auto all = b->allgather(s.ep->name(), 30s);
        const PeerId receiver = s.ep->insert_peer(all[0]);
        // The receiver sleeps on a bell, and we mapped it (shm only).
        RPT_CHECK(fabric(s).shm_stats().bell_peers == (prov == "shm" ? 1u : 0u));
        auto buf = s.alloc(kMsg);
        auto m = rpt::slice_or_die(Slice::data(buf, 0, kMsg));
        b->barrier(60s);
        for (int i = 0; i < kLate; ++i) {
          // Long enough for the receiver to be asleep (its naps are 1 ms
          // at most); the ring is what ends its sleep early.
          std::this_thread::sleep_for(20ms);
          RPT_CHECK(rpt::wait_ok(*s.ep, s.ep->send(receiver, m)).status == Status::ok);
        }
        b->barrier(60s);
        // A ring counts only when it found the receiver asleep.
        if (prov == "shm") RPT_CHECK(fabric(s).shm_stats().bell_rings >= 1);
        return 0;
      },
      120);
  regpool::EndpointConfig ec;
  ec.wait_mode = WaitMode::sleep;
  rpt::Stack s(prov, ec);
  CHECK(fabric(s).shm_stats().doorbell == (prov == "shm"));
  (void)boot->allgather(s.ep->name(), 30s);
  auto buf = s.alloc(kLate * kMsg);
  std::vector<regpool::Token> tokens;
  for (int i = 0; i < kLate; ++i) {
    auto t = s.ep->post_recv(rpt::slice_or_die(Slice::data(buf, static_cast<std::uint64_t>(i) * kMsg, kMsg)));
    REQUIRE(t.ok());
    tokens.push_back(*t);
  }
  boot->barrier(60s);
  for (const auto& t : tokens) REQUIRE(s.ep->wait(t, 60s).status == Status::ok);
  const auto st = s.ep->stats();
  INFO(st.sleeps << " sleeps, " << st.bell_wakes << " ended by the doorbell");
  CHECK(st.sleeps > 0);
  if (prov == "shm") {
    CHECK(st.bell_wakes >= 1);
  } else {
    CHECK(st.bell_wakes == 0);  // tcp sleeps on the CQ's wait fd
  }
  boot->barrier(60s);
  CHECK(rpt::reap(kid, 30s) == 0);
}

TEST_CASE("an shm bell file lives exactly as long as its sleeping endpoint", "[fabric][doorbell]") {
  const std::size_t before = own_bells();
  {
    regpool::EndpointConfig spin;
    rpt::Stack a("shm", spin);
    CHECK_FALSE(fabric(a).shm_stats().doorbell);
    CHECK(own_bells() == before);
    regpool::EndpointConfig sleep;
    sleep.wait_mode = WaitMode::sleep;
    rpt::Stack b("shm", sleep);
    CHECK(fabric(b).shm_stats().doorbell);
    CHECK(own_bells() == before + 1);
    const std::string path = "/dev/shm/regpool-bell." + region_of(b.ep->name());
    struct stat st {};
    REQUIRE(::lstat(path.c_str(), &st) == 0);
    CHECK(S_ISREG(st.st_mode));
    CHECK((st.st_mode & 0777) == 0600);
    CHECK(static_cast<std::size_t>(st.st_size) == regpool::fabric_shm::kBellBytes);
  }
  CHECK(own_bells() == before);
}

TEST_CASE("a planted or stale bell file of a peer is refused or harmless", "[fabric][doorbell][hostile]") {
  // The peer spins, so it makes no bell of its own: whatever sits at its
  // bell's path was put there by someone else.
  rpt::Stack peer("shm", regpool::EndpointConfig{});
  regpool::EndpointConfig ec;
  ec.wait_mode = WaitMode::adaptive;
  rpt::Stack self("shm", ec);
  const std::string path = "/dev/shm/regpool-bell." + region_of(peer.ep->name());
  const std::string decoy = path + ".decoy";
  auto rbuf = peer.alloc(kMsg);
  auto sbuf = self.alloc(kMsg);
  auto msg = rpt::slice_or_die(Slice::data(sbuf, 0, kMsg));

  auto write_bell = [](const std::string& p, std::size_t size, std::uint64_t magic, std::uint32_t fill) {
    const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    std::vector<unsigned char> bytes(size, static_cast<unsigned char>(fill));
    if (size >= 8) std::memcpy(bytes.data(), &magic, 8);
    REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  };
  // Insert the peer, send it one message it receives, remove it again.
  auto round = [&](std::uint64_t expect_bell) {
    auto r = peer.ep->post_recv(rpt::slice_or_die(Slice::data(rbuf, 0, kMsg)));
    REQUIRE(r.ok());
    const PeerId p = self.ep->insert_peer(peer.ep->name());
    CHECK(fabric(self).shm_stats().bell_peers == expect_bell);
    // The peer progresses on its own thread (shm's first send to a new
    // peer needs the target's progress).
    Status got = Status::in_progress;
    std::thread target([&] { got = peer.ep->wait(*r, 30s).status; });
    auto t = self.ep->send(p, msg);
    const Status sent = t.ok() ? self.ep->wait(*t, 30s).status : t.status();
    target.join();
    CHECK(sent == Status::ok);
    CHECK(got == Status::ok);
    self.ep->remove_peer(p);
    CHECK(fabric(self).shm_stats().bell_peers == 0);
    ::unlink(path.c_str());
    ::unlink(decoy.c_str());
  };
  const std::uint64_t magic = regpool::fabric_shm::kBellMagic;
  const std::size_t size = regpool::fabric_shm::kBellBytes;

  SECTION("no file: no bell") { round(0); }
  SECTION("a symlink to a well-formed bell") {
    write_bell(decoy, size, magic, 0);
    REQUIRE(::symlink(decoy.c_str(), path.c_str()) == 0);
    round(0);
  }
  SECTION("the wrong size") {
    write_bell(path, size / 2, magic, 0);
    round(0);
  }
  SECTION("empty") {
    write_bell(path, 0, magic, 0);
    round(0);
  }
  SECTION("the wrong magic") {
    write_bell(path, size, magic ^ 1, 0);
    round(0);
  }
  SECTION("a FIFO (opening must not block)") {
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    round(0);
  }
  SECTION("a directory") {
    REQUIRE(::mkdir(path.c_str(), 0700) == 0);
    round(0);
    ::rmdir(path.c_str());
  }
  SECTION("another user's file") {
    if (::geteuid() == 0) {
      write_bell(path, size, magic, 0);
      REQUIRE(::chown(path.c_str(), 65534, 65534) == 0);
      round(0);
    } else {
      WARN("not root: cannot give a file to another user; this section checks nothing");
    }
  }
  SECTION("the right layout with garbage words: used, rings in vain") {
    // sleepers = 0xffffffff: every post "finds a sleeper" and rings.
    write_bell(path, size, magic, 0xff);
    const auto rings = fabric(self).shm_stats().bell_rings;
    round(1);
    CHECK(fabric(self).shm_stats().bell_rings > rings);
  }
}

TEST_CASE("bells of dead processes are swept, nothing else", "[fabric][doorbell]") {
  char tmpl[] = "/tmp/regpool-bells.XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  // A pid that existed and is gone: a reaped child.
  const pid_t dead = ::fork();
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(dead, &status, 0) == dead);
  const std::string d = std::to_string(dead);
  auto make = [&](const std::string& name) {
    const int fd = ::open((dir + "/" + name).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    ::close(fd);
  };
  make("regpool-bell." + d + ":0:1");                             // swept
  make("regpool-bell." + std::to_string(::getpid()) + ":0:1");    // ours: kept
  make("regpool-bell." + std::to_string(::getppid()) + ":0:1");   // alive: kept
  make("regpool-bell.0" + d + ":0:1");                            // not a pid: kept
  make("other." + d + ":0:1");                                    // not a bell: kept
  REQUIRE(::symlink("/etc/passwd", (dir + "/regpool-bell." + d + ":0:2").c_str()) == 0);  // kept
  REQUIRE(::mkdir((dir + "/regpool-bell." + d + ":0:3").c_str(), 0700) == 0);             // kept
  CHECK(regpool::fabric_shm::sweep_dead_bells(dir.c_str()) == 1);
  CHECK(regpool::fabric_shm::sweep_dead_bells(dir.c_str()) == 0);
  std::size_t left = 0;
  DIR* dd = ::opendir(dir.c_str());
  REQUIRE(dd != nullptr);
  while (const dirent* e = ::readdir(dd)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    CHECK(name != "regpool-bell." + d + ":0:1");
    ++left;
    if (name == "regpool-bell." + d + ":0:3") {
      (void)::rmdir((dir + "/" + name).c_str());
    } else {
      (void)::unlink((dir + "/" + name).c_str());
    }
  }
  ::closedir(dd);
  CHECK(left == 6);
  (void)::rmdir(dir.c_str());
}
