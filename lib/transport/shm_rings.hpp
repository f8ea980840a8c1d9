#pragma once
// regpool's own message path between shm peers (docs/architecture.md,
// "shm message rings").
//
// Why: libfabric 1.17's shm send path costs about 1,800 instructions per
// message round and takes a spin lock in the target's region; UCX's whole
// tag exchange is 1.1-1.3x the bare two-copy floor of this machine
// (bench-shm-floor), libfabric shm's about 3.5x (bench/RESULTS.md). A
// message that is one record in a ring the sender owns costs two copies and
// a few loads and stores, and no lock that a killed peer could leave held.
//
// Layout: every shm endpoint owns one file, /dev/shm/regpool-rings.<region>
// (its libfabric region's name, which carries its pid), mapped read-write
// by the owner and read-only by its peers, so no peer can write a byte of
// it:
//  - a header: magic, version, slot count, ring size, the file's random
//    nonce (who it is), the owner's pid, and a directory generation bumped
//    at every change of the directory;
//  - kSlots directory entries, one per peer the owner has inserted: state
//    and generation, the peer's nonce, and what the owner has consumed of
//    that peer's ring for it (position, and which ring incarnation), and
//    what reading that ring has cost it (costs, below);
//  - kSlots rings of kRingBytes, one per entry: the owner's messages to
//    that peer.
// A sender writes records into its ring for the receiver; the receiver
// finds that ring by looking for its own nonce in the sender's directory,
// reads records in order and publishes how far it has read in its own
// entry for the sender, which is how the sender knows what room it has.
// A record is 16 bytes of header (sequence number, kind, length) and its
// payload, 64-byte aligned, never wrapping (a pad record skips to the
// ring's start). A long data record may leave a gap between its header
// and its payload (placement, below). The sequence number is written last
// with release: a receiver that sees the one it expects sees the whole
// record.
//
// A send longer than the sender's copy limit (FabricEndpointOptions::
// shm_ring_copy_max, at most kEagerMax), or longer than kAdaptFrom where
// the pair measured that cheaper (costs, below), goes as a `large` record
// naming the sender's buffer; the receiver copies it straight from the
// sender's memory (process_vm_readv, which regpool's shm already
// requires), and the sender's send completes when the receiver's consumed
// position passes that record. Order is kept: one ring per pair carries
// every message.
//
// Everything read from a peer's file is checked before use (pure
// functions below, fuzzed in test/fuzz/shm_rings_fuzz.cpp): a record of
// unknown kind, with a length past the ring's end or above kEagerMax, a
// large record naming no message or an address range that wraps, or
// a consumed position outside what was sent, is the peer's corruption,
// never ours. A peer's file could change under us at any time: header
// fields are read once into locals, lengths are checked before copying,
// and the payload is copied out of the mapping as bytes (a peer that
// rewrites it meanwhile garbles only its own message).
//
// Not thread-safe: used under the owning endpoint's mutex.

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace regpool::shm_rings {

inline constexpr std::string_view kFilePrefix = "regpool-rings.";
inline constexpr std::uint64_t kMagic = 0x31474e4952505252ULL;  // "RRPRING1" little endian
// 2: large records of any length (version 1 refused those of kEagerMax
// bytes or fewer, which senders now send). 3: data records with a gap
// before their payload (version 2 refused any kind word but the kind).
// Peers of another version refuse each other at insert_peer, naming it.
inline constexpr std::uint32_t kVersion = 3;
inline constexpr std::uint32_t kSlots = 256;
inline constexpr std::uint64_t kRingBytes = 256 * 1024;
inline constexpr std::uint64_t kRecordAlign = 64;
inline constexpr std::uint64_t kRecordHeader = 16;
// The largest record of data a ring carries: 64 KiB and room for a
// Messenger header, and the default of FabricEndpointOptions::
// shm_ring_copy_max, the longest send a sender copies into its ring (a
// longer one goes as a large record). The Messenger's sends are copied
// into the ring straight from its caller's buffer (send_copy, up to
// MessengerConfig::eager_copy), above kAdaptFrom only into a ring its
// receiver has emptied and where the pair's costs choose the ring.
inline constexpr std::uint64_t kEagerMax = 65 * 1024;
// Where a sender that finds its ring empty starts over from the beginning
// (Link::write).
inline constexpr std::uint64_t kRewindAfter = 16 * 1024;
inline constexpr std::uint64_t kHeaderBytes = 4096;
inline constexpr std::uint64_t kEntryBytes = 64;
inline constexpr std::uint64_t kRingsOffset = kHeaderBytes + kSlots * kEntryBytes;
inline constexpr std::uint64_t kFileBytes = kRingsOffset + kSlots * kRingBytes;
// The largest message a large record may name (the receiver checks it
// before reading).
inline constexpr std::uint64_t kLargeMax = std::uint64_t{1} << 48;

// Header offsets.
inline constexpr std::size_t kMagicOffset = 0;
inline constexpr std::size_t kVersionOffset = 8;   // u32
inline constexpr std::size_t kSlotsOffset = 12;    // u32
inline constexpr std::size_t kRingOffset = 16;     // u64 ring bytes
inline constexpr std::size_t kNonceOffset = 24;    // u64
inline constexpr std::size_t kPidOffset = 32;      // i64
inline constexpr std::size_t kDirGenOffset = 40;   // u64, atomic
inline constexpr std::size_t kHeaderChecked = 48;  // bytes header_ok reads
// Entry offsets (all u64, atomic).
inline constexpr std::size_t kEntryState = 0;     // generation << 8 | EntryState
inline constexpr std::size_t kEntryNonce = 8;     // the peer this entry is for
inline constexpr std::size_t kEntryConsumed = 16; // bytes consumed of that peer's ring for us
inline constexpr std::size_t kEntryRing = 24;     // which ring: ring_id(peer's slot, its generation); 0 none
inline constexpr std::size_t kEntryCosts = 32;    // what reading that peer's messages costs us (costs below)

// Knocks. A receiver reads the rings of the peers it has inserted; a sender
// it has not inserted (a client it has not met yet: receives take messages
// from anyone) announces itself in the receiver's knock file,
// /dev/shm/regpool-knock.<region>, the one file peers may write: a slot
// per knock with the sender's nonce, pid and region name. The receiver
// then reads that sender's ring too, its messages completing without a
// peer id as the provider's do for an unknown source. Every knock is
// checked (parse_knock, fuzzed) and the file it names opened with the same
// checks as an inserted peer's.
inline constexpr std::string_view kKnockPrefix = "regpool-knock.";
inline constexpr std::uint64_t kKnockMagic = 0x314b434f4e4b5252ULL;  // "RRKNOCK1"
inline constexpr std::uint64_t kKnockBytes = 4096;
inline constexpr std::size_t kKnockSlotBytes = 64;
inline constexpr std::size_t kKnockSlots = kKnockBytes / kKnockSlotBytes - 1;  // the first is the header
inline constexpr std::size_t kKnockSeqOffset = 8;  // header: magic, then a counter bumped by every knock
// Slot offsets: nonce (claimed by compare-exchange from 0), ready (the
// nonce again, stored last), pid, region length, region.
inline constexpr std::size_t kKnockNonce = 0;
inline constexpr std::size_t kKnockReady = 8;
inline constexpr std::size_t kKnockPid = 16;
inline constexpr std::size_t kKnockLength = 24;
inline constexpr std::size_t kKnockRegion = 32;
inline constexpr std::size_t kKnockRegionMax = kKnockSlotBytes - kKnockRegion;

struct Knock {
  std::uint64_t nonce = 0;
  std::int64_t pid = 0;
  std::string region;
};
// A knock slot's bytes (kKnockSlotBytes, as copied out of the file): false
// unless it is complete (ready equal to a non-zero nonce) and names a
// region of libfabric shm's exact shape whose pid is the knock's.
bool parse_knock(std::span<const std::byte> slot, Knock& out);

enum class EntryState : std::uint8_t { free = 0, live = 1, retired = 2 };
// A record's kind word: the kind in its low 16 bits, a data record's gap
// (placement, below) in its high 16.
enum class RecordKind : std::uint32_t { data = 1, pad = 2, large = 3 };

// Placement. A sender copying a long message into its ring reads the
// message while it writes the ring. Where the two addresses lie a short
// distance apart modulo 4 KiB, each load aliases a store still pending
// (the CPU compares only an address's low 12 bits first), and when the
// receiver runs far from the sender, each of those stores waits for a line
// from the other CPU: a 64 KiB copy took 8.8 us instead of 4.3
// (bench/RESULTS.md, "why a Messenger's large copy into the shm ring
// loses far apart"). A ring that starts over from its beginning puts every
// such record at the same offset, so one unlucky buffer is unlucky every
// time. So a data record of kPlaceFrom bytes or more whose payload would
// start less than kAliasClear bytes from its source modulo 4 KiB (either
// way) leaves a gap, a multiple of kRecordAlign below kGapMax, between its
// header and its payload, putting the two about 2 KiB apart. From 8 KiB:
// the gap costs the receiver a line of its own for the header, which far
// apart made 4-6 KiB records 1-5 % slower than aliasing did, while from
// 8 KiB the aliasing costs more (bench/RESULTS.md).
inline constexpr std::uint64_t kPlaceFrom = 8192;
inline constexpr std::uint64_t kAliasClear = 1024;
inline constexpr std::uint64_t kGapMax = 4096 - kRecordAlign;

// A ring's identity as a receiver publishes it: the sender's slot and that
// slot's generation (which changes whenever the slot is given to another
// peer). Never 0.
constexpr std::uint64_t ring_id(std::uint32_t slot, std::uint64_t generation) noexcept {
  return (static_cast<std::uint64_t>(slot) + 1) | (generation << 32);
}

constexpr std::uint64_t align_record(std::uint64_t n) noexcept { return (n + kRecordAlign - 1) & ~(kRecordAlign - 1); }

// The gap (placement, above) for a payload that would start at address
// `at` with its bytes copied from `source`: 0 when the two are clear of
// each other modulo 4 KiB, else the gap that puts them 2 KiB to 2 KiB +
// 63 bytes apart. Pure; at most kGapMax.
constexpr std::uint64_t placement_gap(std::uint64_t at, std::uint64_t source) noexcept {
  const std::uint64_t apart = (at - source) % 4096;
  if (apart >= kAliasClear && apart <= 4096 - kAliasClear) return 0;
  return align_record((4096 + 2048 - apart) % 4096);
}

// The file's name for libfabric region `region` ("<pid>:<n>:<n>"); empty
// when the region name is not a plain file name.
std::string file_name(std::string_view region);

// Whether a header (at least kHeaderChecked bytes) is one of ours, of this
// version and layout, and names `pid` as its owner.
bool header_ok(std::span<const std::byte> head, std::int64_t pid) noexcept;

// A record as the receiver sees it, from its kind and length (read once,
// after its sequence number matched) and its offset in the ring. Pure:
// false means the sender corrupted its ring.
struct Record {
  RecordKind kind = RecordKind::data;
  std::uint32_t length = 0;   // data: payload bytes
  std::uint32_t gap = 0;      // data: bytes between the header and the payload
  std::uint64_t advance = 0;  // bytes the record takes, pad and gap included
};
bool parse_record(std::uint32_t kind_word, std::uint32_t length, std::uint64_t offset, Record& out) noexcept;
// A large record's payload (the sender's address and the message length).
bool large_ok(std::uint64_t address, std::uint64_t length) noexcept;

// The entry of `entries` (kSlots entries of a peer's directory) that is
// live or retired and names `nonce`: its index, and its state word in
// `state`. -1 when none. Reads each word once.
int find_entry(const std::byte* entries, std::uint64_t nonce, std::uint64_t& state) noexcept;

// Whether a consumed position a receiver published may be believed: never
// behind what it published before, never past what was written.
constexpr bool consumed_ok(std::uint64_t consumed, std::uint64_t previous, std::uint64_t head) noexcept {
  return consumed >= previous && consumed <= head;
}

// What a receiver found at the head of a peer's ring.
enum class Read : std::uint8_t { none, ready, corrupt };
struct Incoming {
  RecordKind kind = RecordKind::data;
  const std::byte* data = nullptr;  // data: the payload, in the peer's mapping
  std::uint64_t gap = 0;            // data: bytes between the header and the payload
  std::uint64_t length = 0;         // data or large: the message's length
  std::uint64_t address = 0;        // large: where it is in the sender
  std::uint64_t advance = 0;        // bytes the record takes
};
// The record at `offset` of `ring` (a peer's ring of kRingBytes) if its
// sequence number is `expected`: none when it is not there yet, corrupt
// when it cannot be believed; a pad comes back ready, as itself. Reads
// each header word once; `in.data` points into `ring`.
Read read_record(const std::byte* ring, std::uint64_t offset, std::uint64_t expected, Incoming& in) noexcept;

// Costs: which path a send between kAdaptFrom and the sender's copy limit
// takes, chosen per pair from what each path was measured to cost there.
//
// Why: the two paths' costs depend on where the host puts the two
// processes' CPUs, and the host moves them (bench/RESULTS.md, "shm sends
// above 16 KiB as large records"). With the CPUs near each other (a
// shared cache) the two copies through the ring win at every size up to
// 65 KiB, by 1.5-2.5x; far apart, each copy moves every line between the
// caches, and one read straight from the sender's buffer wins a stream of
// 64 KiB sends by 1.4x. No fixed limit is right for both.
//
// What is measured, in ticks (platform/ticks.hpp) per KiB, each an
// average over recent messages longer than kAdaptFrom: the sender's copy
// into its ring (copy_in, its own), and the receiver's copy out of it
// (copy_out) and its read of a large record (read), which the receiver
// publishes in its directory entry for the sender (kEntryCosts: copy_out
// in the low half, read in the high half, 0 for not measured yet). The
// sender sends large when the read costs at most 7/8 of the two copies
// together. Together, not the slower of them: in a ping-pong they add up,
// and in a stream they were measured not to overlap either (64 KiB sends
// with the CPUs apart: copies of 85 and 82 ticks a KiB, a stream of
// 16-18 GB/s, the rate of their sum). The margin keeps a pair whose
// figures are close on the ring, the default before this choice existed.
// Now and then a send goes the other way, to keep the other path's
// figure current (each path's figure is measured only while it is
// taken): kProbeFirst sends after a change of choice, then at twice the
// last interval while the choice holds, up to kProbeMost, or up to
// kProbeStream while the receiver has not read everything we sent (a
// stream). A ping-pong whose placement stays put pays one send in 1024 on
// its slower path: with one in 128 or 256 the probes showed in its 99th
// percentile (1.4-2x the median: each side probes, so a round trip meets
// one twice as often). A stream has no per-message latency to spoil, and
// needs the faster probes: one that follows a ping-pong starts from a read
// figure measured at its dearest (180-380 ticks a KiB against 93 in a
// stream), and at one probe in 1024 a stream of 4000 64 KiB sends ended
// before the figure came down. A change, of placement or of traffic,
// shows within a few intervals, then the probes come often again.
//
// A receiver whose last message over kAdaptFrom was taken where it lay in
// the ring (by a Messenger: Endpoint::offer_in_place) sets kCostsRingOnly
// in the word: for such a message a large record always costs more (a
// posted receive, then the Messenger's own copy out of it), and probes
// cost most (measured: one large record in 128 made a Messenger's 24-64
// KiB stream 15-27 % slower). Its senders copy and never probe for large
// records, until a message is copied out or read into a posted receive
// again. Such a receiver still publishes what its copies out of the ring
// cost (copy_out: the take, timed) and what reading from the sender's
// memory costs it (read: its own gets from that peer, which is how a
// Messenger's rendezvous receive moves the bytes, timed in the post):
// the sending Messenger chooses between a copied eager message and a
// rendezvous from those (read_now, prefer_read), with its own probes.
//
// A copy into or out of ring bytes touched for the first time is not
// counted: it pays the page faults of a new mapping (measured: a sender's
// copy_in at 697 ticks a KiB over its first 24 KiB messages against 51
// once settled; sampled only at probes afterwards, such a figure held the
// wrong choice for a thousand messages). Ping-pongs rewind to the ring's
// first bytes, so a few messages settle it; a stream, once around.
// Nor is a read that does not follow another read (a large record's, or
// a get's): a link's first pays first touches too, of the destination's
// pages or in the kernel's first cross-memory copy between the two, and
// one that follows copies costs more than it would in a run of reads
// (measured on an Intel Xeon host, 24 KiB: the first 1,100-1,800 ticks a
// KiB, after copies 600-1,000, in a run 110-190; counted, they kept both
// choices on the copies there where reads won 2-3x). So a probe of the
// read while the copies hold is kProbeReads sends in a row.
//
// The published word is the peer's: any value is taken (it only picks
// between paths the sender can always take), and its fields are bounded
// by the type.
inline constexpr std::uint64_t kAdaptFrom = 16 * 1024;
inline constexpr std::uint32_t kProbeFirst = 64;
inline constexpr std::uint32_t kProbeMost = 1024;
inline constexpr std::uint32_t kProbeStream = 256;
// Sends in a probe of the read while the copies hold: the receiver counts
// only a read that follows another (a read that follows copies costs more
// than the path would once taken; above).
inline constexpr std::uint32_t kProbeReads = 2;
// The word's top bit; the read figure has the 31 bits below it.
inline constexpr std::uint64_t kCostsRingOnly = std::uint64_t{1} << 63;
inline constexpr std::uint32_t kReadMax = 0x7fffffffU;

// The running figure of one path's cost: a sample of `ticks` for `bytes`
// (> 0) taken into `average` (ticks per KiB, 0 for none yet). Lower
// samples count a half, higher ones a sixteenth (rounded up) and at most
// twice the figure: a copy that an interrupt or a preemption stretched a
// hundredfold (measured: one in a few hundred, on two busy CPUs) moves it
// by a sixteenth instead of flipping the choice for the next dozens of
// sends, while a path that really became slower shows within a dozen
// samples, and one that became cheaper within two or three (a path not
// taken has a sample only at each probe). Both paths are kept alike, so
// the comparison stays fair. Saturates instead of wrapping.
constexpr std::uint32_t cost_average(std::uint32_t average, std::uint64_t ticks, std::uint64_t bytes) noexcept {
  if (bytes == 0) return average;
  constexpr std::uint64_t kCap = 0xffffffffULL;
  // ticks * 1024 / bytes without overflow (bytes < 2^54: a remainder
  // times 1024 fits).
  const std::uint64_t whole = ticks / bytes;
  const std::uint64_t sample =
      whole > kCap / 1024 ? kCap : std::min(kCap, whole * 1024 + (ticks % bytes) * 1024 / bytes);
  const std::uint64_t s = sample == 0 ? 1 : sample;  // 0 means none yet
  const std::uint64_t a = average;
  if (a == 0) return static_cast<std::uint32_t>(s);
  if (s <= a) return static_cast<std::uint32_t>(a - (a - s) / 2);
  // Rounded up: a small figure rises too.
  return static_cast<std::uint32_t>(std::min(kCap, a + (std::min(s, 2 * a) - a + 15) / 16));
}

// The published word: copy_out in the low half, read (at most kReadMax)
// above it, kCostsRingOnly on top when `ring_only`.
constexpr std::uint64_t pack_costs(std::uint32_t copy_out, std::uint32_t read, bool ring_only = false) noexcept {
  return copy_out | (static_cast<std::uint64_t>(read < kReadMax ? read : kReadMax) << 32) |
         (ring_only ? kCostsRingOnly : 0);
}

// The two copies together and the read, from our copy_in and the
// receiver's published `costs`: false when one of the three is not
// measured yet.
constexpr bool measured_costs(std::uint32_t copy_in, std::uint64_t costs, std::uint64_t& copies,
                              std::uint64_t& read) noexcept {
  const auto copy_out = static_cast<std::uint32_t>(costs);
  read = (costs & ~kCostsRingOnly) >> 32;
  copies = static_cast<std::uint64_t>(copy_in) + copy_out;
  return copy_in != 0 && copy_out != 0 && read != 0;
}

// Whether the read costs at most num/den of the two copies together, all
// three measured.
constexpr bool read_within(std::uint32_t copy_in, std::uint64_t costs, std::uint64_t num,
                           std::uint64_t den) noexcept {
  std::uint64_t copies = 0, read = 0;
  return measured_costs(copy_in, costs, copies, read) && den * read <= num * copies;
}

// Whether a sender whose copy into the ring costs `copy_in` should send
// large to a receiver that published `costs` (pack_costs): only when all
// three are measured and the read costs at most 7/8 of the two copies
// together; never to a receiver that set kCostsRingOnly.
constexpr bool prefer_large(std::uint32_t copy_in, std::uint64_t costs) noexcept {
  return (costs & kCostsRingOnly) == 0 && read_within(copy_in, costs, 7, 8);
}

// Whether a sending Messenger should make a message a rendezvous (the
// receiver reads it from the sender's memory) instead of copying it
// through the ring: when the read costs at most 3/4 of the two copies
// together, whatever kCostsRingOnly says (a rendezvous lands in the
// receiver's own buffer). A wider margin than prefer_large's: a
// rendezvous adds two control messages (the notice and the fin), and its
// read's fixed cost (the system call, pinning the sender's pages) is in
// the figure only spread over each KiB (measured: at 24 KiB a rendezvous
// cost 1.5-2 us more than the copied message with the CPUs apart, at 64
// KiB as much or less; bench/RESULTS.md, "eager or rendezvous, measured").
constexpr bool prefer_read(std::uint32_t copy_in, std::uint64_t costs) noexcept {
  return read_within(copy_in, costs, 3, 4);
}

// Whether the figures put the read and the two copies at least 2x apart,
// either way, all three measured: read_now then probes the other path no
// more often than kProbeMost (or kProbeStream) apart from the start,
// where the usual ramp from kProbeFirst sent a 24 KiB ping-pong about
// 1 % of its messages by the path that cost 2-3x (its 99th percentile 3.9
// against 1.5 us).
constexpr bool read_far_apart(std::uint32_t copy_in, std::uint64_t costs) noexcept {
  std::uint64_t copies = 0, read = 0;
  return measured_costs(copy_in, costs, copies, read) && (read >= 2 * copies || 2 * read <= copies);
}

class Link;

// This endpoint's own file. Owns the per-slot state that never needs to be
// shared (producer position, what was read of the peer's ring), kept across
// a peer's removal while its entry is retired: a peer inserted again finds
// its ring where it left it.
class Outbox {
 public:
  Outbox() = default;
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;
  ~Outbox();

  // Makes the file for libfabric region `region` (our pid is in its name:
  // a file of that name is a dead process's and is replaced). Returns an
  // empty string, or why it could not (the errno's text and the path).
  std::string create(std::string_view region);
  bool valid() const noexcept { return base_ != nullptr; }
  std::uint64_t nonce() const noexcept { return nonce_; }
  const std::string& region() const noexcept { return region_; }

  // Whether anyone knocked since the last take_knocks (one load).
  bool knocked() const noexcept;
  // The complete knocks now in our knock file, each slot cleared as it is
  // read; slots that do not parse are cleared too. At most out's capacity.
  void take_knocks(std::vector<Knock>& out) noexcept;

  // The entry for a peer (its file's nonce, its pid): its retired entry when
  // it had one (same slot, same positions), else a free one, else a retired
  // one whose peer process is gone. -1 when every entry belongs to a live
  // peer.
  int claim(std::uint64_t peer_nonce, std::int64_t peer_pid) noexcept;
  // The peer was removed: its entry is kept (retired) for a return.
  void retire(int slot) noexcept;
  // A retired entry still in use (large sends waiting for the removed peer
  // to read them): never given to another peer while held.
  void hold(int slot, bool held) noexcept;
  // Stats.
  std::uint32_t live_slots() const noexcept;

 private:
  friend class Link;
  struct Slot {
    std::uint64_t generation = 0;
    std::uint64_t peer_nonce = 0;
    std::int64_t peer_pid = 0;
    EntryState state = EntryState::free;
    bool held = false;
    // Producer: our ring for the peer.
    std::uint64_t head = 0;  // bytes written
    std::uint64_t seq = 0;   // records written
    std::uint64_t acked = 0; // the peer's consumed position, as last believed
    std::uint32_t copy_in = 0;  // our copies into the ring (costs above)
    std::uint64_t written_high = 0;  // ring bytes written at least once (costs: first touches)
    std::uint32_t probe_every = kProbeFirst;  // the interval between probes
    std::uint32_t probe_in = kProbeFirst;     // sends to the next probe
    bool chose_large = false;                 // the choice, last we looked
    // Consumer: the peer's ring for us.
    std::uint64_t ring = 0;  // ring_id we read, 0 none yet
    std::uint64_t pos = 0;
    std::uint64_t next_seq = 1;
    std::uint32_t copy_out = 0;  // our copies out of the peer's ring
    std::uint32_t read = 0;      // our reads of its large records
    bool after_read = false;     // the last message we noted was read (costs: only then is a read counted)
    std::uint64_t read_high = 0;  // ring bytes read at least once (costs: first touches)
    bool ring_only = false;      // we publish kCostsRingOnly
  };
  std::uint64_t costs(const Slot& s) const noexcept { return pack_costs(s.copy_out, s.read, s.ring_only); }
  std::atomic<std::uint64_t>* word(std::size_t offset) const noexcept;
  std::atomic<std::uint64_t>* entry_word(int slot, std::size_t offset) const noexcept {
    return word(kHeaderBytes + static_cast<std::size_t>(slot) * kEntryBytes + offset);
  }
  void publish(int slot) noexcept;
  std::byte* ring(int slot) const noexcept { return base_ + kRingsOffset + static_cast<std::size_t>(slot) * kRingBytes; }

  std::byte* base_ = nullptr;
  std::string path_;
  std::uint64_t nonce_ = 0;
  std::string region_;
  std::vector<Slot> slots_;
  std::byte* knocks_ = nullptr;
  std::string knock_path_;
  std::uint64_t knock_seq_ = 0;  // the counter when last taken
};

// One peer's file, mapped read-only, and this endpoint's conversation with
// it through its slot of our Outbox.
class Link {
 public:
  Link() = default;
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;
  ~Link();

  // Maps the peer's file (named after its region; owned by our euid, of the
  // exact size, header checked, owner `pid`). Empty string, or why not.
  std::string open(std::string_view region, std::int64_t pid);
  std::uint64_t peer_nonce() const noexcept { return peer_nonce_; }
  std::int64_t pid() const noexcept { return pid_; }
  void bind(int slot) noexcept { slot_ = slot; }
  int slot() const noexcept { return slot_; }

  // Producer. A message of up to kEagerMax bytes copied into the ring:
  // false when the ring has no room now (the receiver has not read enough).
  bool send_data(Outbox& own, const void* bytes, std::uint64_t length) noexcept;
  // The same for a message of two pieces (a header and a body) gathered
  // into one record.
  bool send_data(Outbox& own, const void* head, std::uint64_t head_length, const void* body,
                 std::uint64_t body_length) noexcept;
  // A large record for the sender's buffer; `end` is the position the
  // receiver's consumed position must reach for the message to be read.
  bool send_large(Outbox& own, const void* address, std::uint64_t length, std::uint64_t& end) noexcept;
  // Whether a send of `length` bytes (kAdaptFrom < length <= kEagerMax)
  // should go as a large record (costs above): reads the receiver's
  // published costs and consumed position (acked), and counts the send
  // for the probes.
  bool send_large_now(Outbox& own, std::uint64_t length) noexcept;
  // Whether a Messenger's message of `length` bytes (kAdaptFrom < length
  // <= kEagerMax) should go by rendezvous instead of copied through the
  // ring (costs above, prefer_read): as send_large_now, with the same
  // probes. A link serves one or the other: a receiver that takes
  // messages in place sets kCostsRingOnly, and send_large_now then
  // answers no without counting.
  bool read_now(Outbox& own, std::uint64_t length) noexcept;
  // The position just past the last record written: the receiver's
  // consumed position reaches it once it has read everything sent so far.
  std::uint64_t written(const Outbox& own) const noexcept;
  // The receiver's consumed position of our ring, checked. False when what
  // the peer published cannot be believed (corrupt_ counts it).
  std::uint64_t acked(Outbox& own) noexcept;

  // Whether the peer reads our ring: its entry for us is there and live.
  bool known(Outbox& own) noexcept;
  // Announces us in the peer's knock file, once until it knows us (a full
  // file: not now, tried again at a later send). Returns whether a knock
  // was left.
  bool knock(Outbox& own) noexcept;

  // Consumer.
  Read peek(Outbox& own, Incoming& in) noexcept;
  void consume(Outbox& own, const Incoming& in) noexcept;
  // What copying a data record out (`large` false) or reading a large one
  // (true) of `bytes` took, in ticks: averaged and published for the
  // sender (costs above). Messages of kAdaptFrom bytes or fewer are not
  // counted.
  void note_cost(Outbox& own, bool large, std::uint64_t ticks, std::uint64_t bytes) noexcept;
  // Whether the record `in` (just peeked) lies, in part, in ring bytes we
  // have not read before (costs, above: such a copy out is not counted);
  // notes them as read. Only asked for records over kAdaptFrom.
  bool first_read(Outbox& own, const Incoming& in) noexcept;
  // What taking a data record of `bytes` where it lay took (the sink's
  // copy out of the ring): the copy_out figure, and kCostsRingOnly set
  // (costs above). note_cost clears it.
  void note_take(Outbox& own, std::uint64_t ticks, std::uint64_t bytes) noexcept;
  // What one of our own reads of `bytes` from the peer's memory took (a
  // get: a rendezvous receive's): the read figure, kCostsRingOnly as it
  // was.
  void note_read(Outbox& own, std::uint64_t ticks, std::uint64_t bytes) noexcept;

  std::uint64_t corrupt() const noexcept { return corrupt_; }

 private:
  // Finds the peer's entry for us (re-read when its directory changed):
  // false when the peer has not inserted us (yet).
  bool resolve(Outbox& own) noexcept;
  std::uint64_t peer_word(std::size_t offset) const noexcept;
  std::uint64_t peer_entry_word(std::size_t offset) const noexcept {
    return peer_word(kHeaderBytes + static_cast<std::size_t>(peer_slot_) * kEntryBytes + offset);
  }
  // The receiver's costs for our ring (pack_costs): its entry for us, the
  // line it writes at every message it reads. 0 (nothing measured) while
  // it has not inserted us.
  std::uint64_t peer_costs(Outbox& own) noexcept { return resolve(own) ? peer_entry_word(kEntryCosts) : 0; }
  // The choice `large` made by the costs, or the other path when a probe
  // is due (costs above): counts the send.
  // `far_apart` (read_far_apart): straight to the longest interval.
  bool with_probes(Outbox& own, Outbox::Slot& s, bool large, bool far_apart = false) noexcept;
  // A read's sample into the read figure, only when it follows another
  // read (after_read; costs above).
  static void count_read(Outbox::Slot& s, std::uint64_t ticks, std::uint64_t bytes) noexcept;
  bool write(Outbox& own, RecordKind kind, const void* payload, std::uint64_t length, const void* extra,
             std::uint64_t extra_length) noexcept;

  const std::byte* base_ = nullptr;
  std::string region_;         // the peer's
  std::byte* knocks_ = nullptr;  // its knock file, mapped at our first knock
  bool knocked_ = false;
  std::int64_t pid_ = 0;
  std::uint64_t peer_nonce_ = 0;
  int slot_ = -1;                   // our entry for the peer
  int peer_slot_ = -1;              // its entry for us, once found
  std::uint64_t peer_state_ = 0;    // that entry's state word when found
  std::uint64_t dir_gen_ = ~std::uint64_t{0};  // its directory generation when last searched
  std::uint64_t known_gen_ = ~std::uint64_t{0};  // ... when our entry there was last seen live
  std::uint64_t corrupt_ = 0;
};

}  // namespace regpool::shm_rings
