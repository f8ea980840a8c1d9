#pragma once
// Telling a dead peer from a slow one on a transport that only ever says
// "try again": libfabric 1.17's net answers -FI_EAGAIN for ever to a post
// aimed at a peer whose process is gone (each post opens a new connection,
// whose refusal the provider drops internally; docs/provider-facts.md),
// exactly as it answers a live peer that has not taken the connection yet.
//
// What does tell them apart: the peer's address (from its validated name)
// is the TCP socket its endpoint listens on, for as long as the endpoint is
// open. A connect there that is refused (RST; or a TCP self-connect, which
// the kernel makes only when nothing is bound to the port) proves that
// nothing listens any more: the peer's endpoint is closed, so its process
// is gone or done with it. Nothing else proves anything: an accepted
// connect (the peer lives, perhaps without progressing), no answer yet, an
// unreachable host or network all leave the peer to the post timeout. An
// accepted probe connection is reset at once (SO_LINGER 0): the peer's
// provider sees a connection that fails before its handshake and drops it.
//
// StallProbe is that check plus the policy a backend needs: posts to one
// peer keep being refused for now (or the peer owes us an answer); after
// `patience` of that, probe its listener, and again after a gap that
// doubles up to `max_gap` while the stall lasts, until a probe is refused.
// A probe that has no answer within `answer_within` counts as no verdict.
// A post that goes through ends the stall.
//
// Internal. Not thread-safe: one owner (an endpoint, under its mutex), which
// holds it by pointer (it owns a socket and is neither copied nor moved).
// Never blocks: the connect is non-blocking and its outcome is read with
// poll(2) of timeout 0 on later calls.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

namespace regpool::tcp {

class StallProbe {
 public:
  using Clock = std::chrono::steady_clock;
  struct Policy {
    std::chrono::milliseconds patience{100};
    std::chrono::milliseconds first_gap{100};
    std::chrono::milliseconds max_gap{1000};
    std::chrono::milliseconds answer_within{1000};
  };

  StallProbe() = default;
  explicit StallProbe(const Policy& policy) noexcept : policy_(policy) {}
  StallProbe(const StallProbe&) = delete;
  StallProbe& operator=(const StallProbe&) = delete;
  ~StallProbe();

  // Where the peer listens: a struct sockaddr_in (16 bytes, AF_INET) or
  // sockaddr_in6 (28 bytes, AF_INET6) as the peer's name carries it. False
  // (and the probe stays inert: stalled() never says gone) for anything
  // else, a zero port, or an unspecified address (a connect to it would
  // reach this host, not the peer's).
  bool set_address(std::span<const std::byte> addr) noexcept;
  bool armed() const noexcept { return addr_len_ != 0; }

  // The peer keeps us waiting (a post refused for now, an answer owed).
  // True once its listener refused a probe: the peer is gone, and stays so
  // for this probe's life.
  bool stalled(Clock::time_point now) noexcept;
  // An answer as soon as the socket gives one, without the stall's
  // patience: for a failure report that cannot say whether the peer died
  // (net cancels an op the same way when the target refuses it and when
  // the connection closed under it). Starts a probe unless one is under
  // way; pending until it has an answer; gone only on a refusal; alive for
  // a listener, no answer within answer_within, or an address it cannot
  // probe (nothing proven).
  enum class Look : std::uint8_t { pending, gone, alive };
  Look look(Clock::time_point now) noexcept;
  // A post to the peer went through: a stall, if any, is over.
  void moving() noexcept {
    if (since_ != Clock::time_point{}) end_stall();
  }
  bool gone() const noexcept { return gone_; }
  // Probes started so far.
  std::uint64_t probes() const noexcept { return probes_; }

 private:
  enum class Verdict : std::uint8_t { pending, listening, refused, unknown };
  Verdict start() noexcept;
  Verdict check() noexcept;
  // The running probe's answer (unknown once answer_within has passed), or
  // a new probe's first answer.
  Verdict poll_or_start(Clock::time_point now) noexcept;
  Verdict finish(int err) noexcept;
  void close_fd() noexcept;
  void end_stall() noexcept;

  Policy policy_{};
  alignas(8) std::byte addr_[28]{};
  std::uint32_t addr_len_ = 0;
  int fd_ = -1;
  bool gone_ = false;
  std::uint64_t probes_ = 0;
  Clock::time_point since_{};    // first wait of the current stall; {} when none
  Clock::time_point last_{};     // latest wait of it
  Clock::time_point next_{};     // the next probe may start
  Clock::time_point started_{};  // the probe under way began
  std::chrono::milliseconds gap_{};
};

}  // namespace regpool::tcp
