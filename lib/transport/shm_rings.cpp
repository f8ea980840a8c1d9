#include "transport/shm_rings.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "platform/copy.hpp"
#include "platform/ticks.hpp"
#include "transport/fabric_shm.hpp"

namespace regpool::shm_rings {

namespace {

std::uint64_t load_u64(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::uint32_t load_u32(const std::byte* p) noexcept {
  std::uint32_t v = 0;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// An aligned word of a shared mapping, read or written as an atomic. The
// peer's mapping is read-only: only loads go through it.
std::atomic_ref<std::uint64_t> shared_word(const std::byte* p) noexcept {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(const_cast<std::byte*>(p)));
}

std::uint64_t address_of(const void* p) noexcept {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
}

std::string errno_text(const char* what, const std::string& path, int e) {
  return std::string(what) + " " + path + ": " + std::strerror(e);
}

}  // namespace

std::string file_name(std::string_view region) {
  // NAME_MAX: a longer name cannot be a file.
  if (region.empty() || region.find('/') != std::string_view::npos || region.find('\0') != std::string_view::npos ||
      kFilePrefix.size() + region.size() > 255) {
    return {};
  }
  std::string out(kFilePrefix);
  out.append(region);
  return out;
}

bool header_ok(std::span<const std::byte> head, std::int64_t pid) noexcept {
  if (head.size() < kHeaderChecked) return false;
  return load_u64(head.data() + kMagicOffset) == kMagic && load_u32(head.data() + kVersionOffset) == kVersion &&
         load_u32(head.data() + kSlotsOffset) == kSlots && load_u64(head.data() + kRingOffset) == kRingBytes &&
         load_u64(head.data() + kNonceOffset) != 0 &&
         static_cast<std::int64_t>(load_u64(head.data() + kPidOffset)) == pid;
}

bool parse_record(std::uint32_t kind_word, std::uint32_t length, std::uint64_t offset, Record& out) noexcept {
  // The offset is ours (a position we advanced), but a pure check takes
  // nothing for granted.
  if (offset % kRecordAlign != 0 || offset >= kRingBytes) return false;
  const std::uint32_t gap = kind_word >> 16;
  // Only data records have a gap; every other kind word is its kind alone.
  if (gap != 0 && (kind_word & 0xffff) != static_cast<std::uint32_t>(RecordKind::data)) return false;
  switch (static_cast<RecordKind>(kind_word & 0xffff)) {
    case RecordKind::data:
      if (gap % kRecordAlign != 0 || gap > kGapMax || length > kEagerMax ||
          offset + kRecordHeader + gap + length > kRingBytes) {
        return false;
      }
      out = Record{RecordKind::data, length, gap, align_record(kRecordHeader + gap + length)};
      return true;
    case RecordKind::pad:
      if (length != 0) return false;
      out = Record{RecordKind::pad, 0, 0, kRingBytes - offset};
      return true;
    case RecordKind::large:
      if (length != 16 || offset + kRecordHeader + 16 > kRingBytes) return false;
      out = Record{RecordKind::large, 16, 0, align_record(kRecordHeader + 16)};
      return true;
  }
  return false;
}

bool large_ok(std::uint64_t address, std::uint64_t length) noexcept {
  // A message of any length up to kLargeMax (where a sender stops copying
  // is its own choice: FabricEndpointOptions::shm_ring_copy_max), and an
  // address range that does not wrap.
  return length != 0 && length <= kLargeMax && address != 0 && address + length > address;
}

bool parse_knock(std::span<const std::byte> slot, Knock& out) {
  if (slot.size() < kKnockSlotBytes) return false;
  const std::uint64_t nonce = load_u64(slot.data() + kKnockNonce);
  if (nonce == 0 || load_u64(slot.data() + kKnockReady) != nonce) return false;
  const std::uint64_t length = load_u64(slot.data() + kKnockLength);
  if (length == 0 || length > kKnockRegionMax) return false;
  const std::string_view region(reinterpret_cast<const char*>(slot.data() + kKnockRegion), length);
  const std::int64_t pid = fabric_shm::region_file_pid(region);
  if (pid == 0 || static_cast<std::int64_t>(load_u64(slot.data() + kKnockPid)) != pid) return false;
  out.nonce = nonce;
  out.pid = pid;
  out.region.assign(region);
  return true;
}

int find_entry(const std::byte* entries, std::uint64_t nonce, std::uint64_t& state) noexcept {
  if (nonce == 0) return -1;
  for (std::uint32_t i = 0; i < kSlots; ++i) {
    const std::byte* e = entries + static_cast<std::size_t>(i) * kEntryBytes;
    const std::uint64_t before = shared_word(e + kEntryState).load(std::memory_order_acquire);
    const auto st = static_cast<EntryState>(before & 0xff);
    if (st != EntryState::live && st != EntryState::retired) continue;
    const std::uint64_t n = shared_word(e + kEntryNonce).load(std::memory_order_acquire);
    // The owner clears the state before it rewrites an entry: the same
    // state word on both sides of the nonce means the nonce belongs to it.
    if (n != nonce || shared_word(e + kEntryState).load(std::memory_order_acquire) != before) continue;
    state = before;
    return static_cast<int>(i);
  }
  return -1;
}

// ------------------------------------------------------------------ Outbox

Outbox::~Outbox() {
  if (base_) ::munmap(base_, kFileBytes);
  if (!path_.empty()) (void)::unlink(path_.c_str());
  if (knocks_) ::munmap(knocks_, kKnockBytes);
  if (!knock_path_.empty()) (void)::unlink(knock_path_.c_str());
}

std::atomic<std::uint64_t>* Outbox::word(std::size_t offset) const noexcept {
  // The mapping is page-aligned and every offset a multiple of 8.
  return std::launder(reinterpret_cast<std::atomic<std::uint64_t>*>(base_ + offset));
}

std::string Outbox::create(std::string_view region) {
  (void)fabric_shm::sweep_dead_files("/dev/shm", kFilePrefix);
  const std::string name = file_name(region);
  if (name.empty()) return "the region name '" + std::string(region) + "' is not a file name";
  std::string path = "/dev/shm/" + name;
  std::string knock_path = "/dev/shm/" + std::string(kKnockPrefix) + std::string(region);
  std::uint64_t nonce = 0;
  while (nonce == 0) {
    if (::getrandom(&nonce, sizeof nonce, 0) != static_cast<ssize_t>(sizeof nonce)) {
      if (errno == EINTR) continue;
      return std::string("getrandom for the file's nonce: ") + std::strerror(errno);
    }
  }
  (void)fabric_shm::sweep_dead_files("/dev/shm", kKnockPrefix);
  try {
    slots_.resize(kSlots);
    region_.assign(region);
  } catch (...) {
    return "out of memory";
  }
  // Our pid is in the region's name: a file of this name was left by a
  // dead process that had our pid (or planted): replaced.
  std::byte* base = nullptr;
  if (const int e = fabric_shm::create_user_file(path.c_str(), kFileBytes, base); e != 0) {
    return errno_text("cannot create, size or map", path, e);
  }
  std::byte* knocks = nullptr;
  if (const int e = fabric_shm::create_user_file(knock_path.c_str(), kKnockBytes, knocks); e != 0) {
    ::munmap(base, kFileBytes);
    (void)::unlink(path.c_str());
    return errno_text("cannot create, size or map", knock_path, e);
  }
  knocks_ = knocks;
  knock_path_ = std::move(knock_path);
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(knocks_)).store(kKnockMagic,
                                                                                    std::memory_order_release);
  base_ = base;
  path_ = std::move(path);
  nonce_ = nonce;
  const auto pid = static_cast<std::uint64_t>(::getpid());
  const std::uint64_t version_slots = kVersion | (static_cast<std::uint64_t>(kSlots) << 32);
  std::memcpy(base_ + kVersionOffset, &version_slots, sizeof version_slots);
  std::memcpy(base_ + kRingOffset, &kRingBytes, sizeof kRingBytes);
  std::memcpy(base_ + kNonceOffset, &nonce_, sizeof nonce_);
  std::memcpy(base_ + kPidOffset, &pid, sizeof pid);
  // The magic last: a peer that maps the file early sees no header rather
  // than half of one.
  word(kMagicOffset)->store(kMagic, std::memory_order_release);
  return {};
}

void Outbox::publish(int slot) noexcept {
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  // Cleared first (find_entry reads the state on both sides of the nonce).
  entry_word(slot, kEntryState)->store(0, std::memory_order_release);
  entry_word(slot, kEntryNonce)->store(s.peer_nonce, std::memory_order_release);
  entry_word(slot, kEntryRing)->store(0, std::memory_order_release);
  entry_word(slot, kEntryConsumed)->store(s.pos, std::memory_order_release);
  entry_word(slot, kEntryCosts)->store(costs(s), std::memory_order_release);
  entry_word(slot, kEntryRing)->store(s.ring, std::memory_order_release);
  entry_word(slot, kEntryState)->store((s.generation << 8) | static_cast<std::uint64_t>(s.state),
                                       std::memory_order_release);
  word(kDirGenOffset)->fetch_add(1, std::memory_order_acq_rel);
}

int Outbox::claim(std::uint64_t peer_nonce, std::int64_t peer_pid) noexcept {
  if (!base_) return -1;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.state == EntryState::retired && s.peer_nonce == peer_nonce) {
      s.state = EntryState::live;
      s.peer_pid = peer_pid;
      publish(static_cast<int>(i));
      return static_cast<int>(i);
    }
  }
  auto take = [&](std::size_t i) {
    Slot& s = slots_[i];
    const std::uint64_t generation = s.generation + 1;
    s = Slot{};
    s.generation = generation;
    s.peer_nonce = peer_nonce;
    s.peer_pid = peer_pid;
    s.state = EntryState::live;
    publish(static_cast<int>(i));
    return static_cast<int>(i);
  };
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].state == EntryState::free) return take(i);
  }
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].state == EntryState::retired && !slots_[i].held && !fabric_shm::process_alive(slots_[i].peer_pid)) {
      return take(i);
    }
  }
  return -1;
}

void Outbox::retire(int slot) noexcept {
  if (slot < 0 || static_cast<std::size_t>(slot) >= slots_.size()) return;
  slots_[static_cast<std::size_t>(slot)].state = EntryState::retired;
  publish(slot);
}

bool Outbox::knocked() const noexcept {
  return knocks_ && shared_word(knocks_ + kKnockSeqOffset).load(std::memory_order_acquire) != knock_seq_;
}

void Outbox::take_knocks(std::vector<Knock>& out) noexcept {
  if (!knocks_) return;
  knock_seq_ = shared_word(knocks_ + kKnockSeqOffset).load(std::memory_order_acquire);
  for (std::size_t i = 1; i <= kKnockSlots && out.size() < out.capacity(); ++i) {
    std::byte* slot = knocks_ + i * kKnockSlotBytes;
    const std::uint64_t ready = shared_word(slot + kKnockReady).load(std::memory_order_acquire);
    if (ready == 0) continue;
    std::byte copy[kKnockSlotBytes];
    std::memcpy(copy, slot, sizeof copy);
    Knock k;
    bool ok = false;
    try {
      ok = parse_knock(copy, k);
    } catch (...) {
      ok = false;  // out of memory for the region string: dropped
    }
    // Given back either way: ready first, so a sender that claims the slot
    // next finds it wholly free once the nonce is 0.
    shared_word(slot + kKnockReady).store(0, std::memory_order_release);
    shared_word(slot + kKnockNonce).store(0, std::memory_order_release);
    if (ok) out.push_back(std::move(k));  // within capacity: no allocation
  }
}

void Outbox::hold(int slot, bool held) noexcept {
  if (slot >= 0 && static_cast<std::size_t>(slot) < slots_.size()) slots_[static_cast<std::size_t>(slot)].held = held;
}

std::uint32_t Outbox::live_slots() const noexcept {
  std::uint32_t n = 0;
  for (const Slot& s : slots_) n += s.state == EntryState::live ? 1 : 0;
  return n;
}

// -------------------------------------------------------------------- Link

Link::~Link() {
  if (base_) ::munmap(const_cast<std::byte*>(base_), kFileBytes);
  if (knocks_) ::munmap(knocks_, kKnockBytes);
}

std::string Link::open(std::string_view region, std::int64_t pid) {
  const std::string name = file_name(region);
  if (name.empty()) return "the region name '" + std::string(region) + "' is not a file name";
  const std::string path = "/dev/shm/" + name;
  // O_NONBLOCK: a FIFO planted under the name must not block the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return errno_text("cannot open", path, errno);
  struct stat st {};
  void* p = MAP_FAILED;
  std::string why;
  if (::fstat(fd, &st) != 0) {
    why = errno_text("cannot stat", path, errno);
  } else if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    why = path + " is not a regular file of this user";
  } else if (static_cast<std::uint64_t>(st.st_size) != kFileBytes) {
    why = path + " has " + std::to_string(st.st_size) + " bytes, not " + std::to_string(kFileBytes) +
          " (another regpool version?)";
  } else {
    p = ::mmap(nullptr, kFileBytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) why = errno_text("cannot map", path, errno);
  }
  ::close(fd);
  if (p == MAP_FAILED) return why;
  const auto* base = static_cast<const std::byte*>(p);
  std::byte head[kHeaderChecked];
  const std::uint64_t magic = shared_word(base + kMagicOffset).load(std::memory_order_acquire);
  std::memcpy(head, base, sizeof head);
  std::memcpy(head + kMagicOffset, &magic, sizeof magic);
  if (!header_ok(head, pid)) {
    ::munmap(p, kFileBytes);
    return path + ": not a message-ring file of process " + std::to_string(pid) + " in this layout (version " +
           std::to_string(kVersion) + ")";
  }
  if (base_) ::munmap(const_cast<std::byte*>(base_), kFileBytes);
  try {
    region_.assign(region);
  } catch (...) {
    ::munmap(p, kFileBytes);
    return "out of memory";
  }
  base_ = base;
  pid_ = pid;
  peer_nonce_ = load_u64(head + kNonceOffset);
  return {};
}

std::uint64_t Link::peer_word(std::size_t offset) const noexcept {
  return shared_word(base_ + offset).load(std::memory_order_acquire);
}

bool Link::resolve(Outbox& own) noexcept {
  const std::uint64_t gen = peer_word(kDirGenOffset);
  if (gen == dir_gen_) return peer_slot_ >= 0;
  dir_gen_ = gen;
  std::uint64_t state = 0;
  const int e = find_entry(base_ + kHeaderBytes, own.nonce(), state);
  if (e < 0) {
    // Not (or no longer) in its directory. What we had read of its last
    // ring stays in our slot: the same ring found again goes on from there.
    peer_slot_ = -1;
    return false;
  }
  peer_slot_ = e;
  peer_state_ = state;
  Outbox::Slot& s = own.slots_[static_cast<std::size_t>(slot_)];
  const std::uint64_t ring = ring_id(static_cast<std::uint32_t>(e), state >> 8);
  if (s.ring != ring) {
    // A ring we have not read before (the peer's first for us, or a slot it
    // gave us anew): from its start.
    s.ring = ring;
    s.pos = 0;
    s.next_seq = 1;
    own.entry_word(slot_, kEntryRing)->store(0, std::memory_order_release);
    own.entry_word(slot_, kEntryConsumed)->store(0, std::memory_order_release);
    own.entry_word(slot_, kEntryRing)->store(ring, std::memory_order_release);
  }
  return true;
}

bool Link::known(Outbox& own) noexcept {
  if (!resolve(own)) return false;
  // Every change of an entry's state bumps the directory generation: while
  // it stays, the answer does, and the entry's line (which the peer writes
  // at every message it reads) is not touched on the send path.
  if (known_gen_ == dir_gen_) return true;
  // A peer that removed us retires our entry and reads our ring no more.
  if (static_cast<EntryState>(peer_entry_word(kEntryState) & 0xff) != EntryState::live) return false;
  known_gen_ = dir_gen_;
  knocked_ = false;
  return true;
}

bool Link::knock(Outbox& own) noexcept {
  if (knocked_ || own.region_.size() > kKnockRegionMax) return false;
  if (!knocks_) {
    // A fixed buffer: no allocation on the send path (the region name
    // passed file_name's checks at open).
    char path[320];
    std::snprintf(path, sizeof path, "/dev/shm/%.*s%s", static_cast<int>(kKnockPrefix.size()), kKnockPrefix.data(),
                  region_.c_str());
    void* p = fabric_shm::map_user_file(path, kKnockBytes, true);
    if (p == MAP_FAILED) return false;
    if (shared_word(static_cast<std::byte*>(p)).load(std::memory_order_acquire) != kKnockMagic) {
      ::munmap(p, kKnockBytes);
      return false;
    }
    knocks_ = static_cast<std::byte*>(p);
  }
  for (std::size_t i = 1; i <= kKnockSlots; ++i) {
    std::byte* slot = knocks_ + i * kKnockSlotBytes;
    std::uint64_t expected = 0;
    if (!shared_word(slot + kKnockNonce).compare_exchange_strong(expected, own.nonce_, std::memory_order_acq_rel)) {
      continue;
    }
    const auto pid = static_cast<std::uint64_t>(::getpid());
    const std::uint64_t length = own.region_.size();
    std::memcpy(slot + kKnockPid, &pid, sizeof pid);
    std::memcpy(slot + kKnockLength, &length, sizeof length);
    std::memcpy(slot + kKnockRegion, own.region_.data(), length);
    shared_word(slot + kKnockReady).store(own.nonce_, std::memory_order_release);
    shared_word(knocks_ + kKnockSeqOffset).fetch_add(1, std::memory_order_acq_rel);
    knocked_ = true;
    return true;
  }
  return false;
}

std::uint64_t Link::acked(Outbox& own) noexcept {
  Outbox::Slot& s = own.slots_[static_cast<std::size_t>(slot_)];
  if (!resolve(own)) return s.acked;
  const std::uint64_t mine = ring_id(static_cast<std::uint32_t>(slot_), s.generation);
  if (peer_entry_word(kEntryRing) != mine) return s.acked;
  const std::uint64_t c = peer_entry_word(kEntryConsumed);
  // The ring word again: a consumed position read while the peer switched
  // rings belongs to the other one.
  if (peer_entry_word(kEntryRing) != mine) return s.acked;
  if (!consumed_ok(c, s.acked, s.head)) {
    ++corrupt_;
    return s.acked;
  }
  s.acked = c;
  return c;
}

bool Link::write(Outbox& own, RecordKind kind, const void* payload, std::uint64_t length, const void* extra,
                 std::uint64_t extra_length) noexcept {
  Outbox::Slot& s = own.slots_[static_cast<std::size_t>(slot_)];
  const std::uint64_t bytes = length + extra_length;
  std::byte* ring = own.ring(slot_);
  // Placement (in the header): the longer piece's copy is the one that
  // could alias; `before` is what precedes it in the record.
  const bool placed = kind == RecordKind::data && bytes >= kPlaceFrom;
  const bool body_leads = extra_length > length;
  const std::uint64_t source = placed ? address_of(body_leads ? extra : payload) : 0;
  const std::uint64_t before = address_of(ring) + kRecordHeader + (body_leads ? length : 0);
  auto need_at = [&](std::uint64_t at, std::uint64_t& gap) {
    gap = placed ? placement_gap(before + at, source) : 0;
    return align_record(kRecordHeader + gap + bytes);
  };
  std::uint64_t offset = s.head % kRingBytes;
  std::uint64_t gap = 0;
  std::uint64_t need = need_at(offset, gap);
  // The same record at the ring's beginning (a rewind); unplaced records
  // are the same size anywhere.
  std::uint64_t gap0 = 0;
  const std::uint64_t need0 = placed ? need_at(0, gap0) : need;
  // Past the first kRewindAfter bytes, a ring the receiver has emptied
  // starts over from its beginning (a pad skips the rest): traffic that
  // never fills it keeps to a few warm lines and pages instead of walking
  // the whole ring, which cost a 64 KiB ping-pong 1.7x (bench/RESULTS.md).
  // One look at the receiver's position per kRewindAfter bytes written.
  std::uint64_t pad = kRingBytes - offset < need ? kRingBytes - offset : 0;
  // Only where the pad and the record (placed at the beginning) fit an
  // empty ring (need0 <= offset), or an empty ring would refuse it for
  // ever: a record longer than the bytes behind it goes on from here
  // instead.
  if (pad == 0 && offset >= kRewindAfter && need0 <= offset && s.head + need - s.acked > kRewindAfter &&
      acked(own) == s.head) {
    pad = kRingBytes - offset;
  }
  if (pad != 0) {
    gap = gap0;
    need = need0;
  }
  if (s.head + pad + need - s.acked > kRingBytes && s.head + pad + need - acked(own) > kRingBytes) return false;
  auto head = [&](std::uint64_t at, RecordKind k, std::uint64_t len, std::uint64_t g) {
    const std::uint64_t kind_len = static_cast<std::uint64_t>(k) | (g << 16) | (len << 32);
    std::memcpy(ring + at + 8, &kind_len, sizeof kind_len);
    shared_word(ring + at).store(++s.seq, std::memory_order_release);
  };
  if (pad != 0) {
    head(offset, RecordKind::pad, 0, 0);
    s.head += pad;
    offset = 0;
  }
  // A long copy is timed (costs, in the header): two counter reads on a
  // copy of microseconds; not into bytes written for the first time.
  const bool timed = kind == RecordKind::data && bytes > kAdaptFrom && offset + need <= s.written_high;
  s.written_high = std::max(s.written_high, offset + need);
  const std::uint64_t t0 = timed ? platform::ticks() : 0;
  std::byte* const to = ring + offset + kRecordHeader + gap;
  if (length != 0) platform::copy_message(to, payload, length);
  if (extra_length != 0) platform::copy_message(to + length, extra, extra_length);
  if (timed) s.copy_in = cost_average(s.copy_in, platform::ticks() - t0, bytes);
  head(offset, kind, bytes, gap);
  s.head += need;
  return true;
}

bool Link::send_data(Outbox& own, const void* bytes, std::uint64_t length) noexcept {
  if (length > kEagerMax) return false;
  return write(own, RecordKind::data, bytes, length, nullptr, 0);
}

bool Link::send_data(Outbox& own, const void* head, std::uint64_t head_length, const void* body,
                     std::uint64_t body_length) noexcept {
  if (head_length > kEagerMax || body_length > kEagerMax - head_length) return false;
  return write(own, RecordKind::data, head, head_length, body, body_length);
}

bool Link::send_large(Outbox& own, const void* address, std::uint64_t length, std::uint64_t& end) noexcept {
  const std::uint64_t a = address_of(address);
  if (!write(own, RecordKind::large, &a, sizeof a, &length, sizeof length)) return false;
  end = own.slots_[static_cast<std::size_t>(slot_)].head;
  return true;
}

bool Link::send_large_now(Outbox& own, std::uint64_t length) noexcept {
  if (length <= kAdaptFrom || length > kEagerMax) return length > kEagerMax;
  Outbox::Slot& s = own.slots_[static_cast<std::size_t>(slot_)];
  // One load on a send of over 16 KiB; not found yet: nothing measured,
  // the ring.
  const std::uint64_t costs = peer_costs(own);
  if ((costs & kCostsRingOnly) != 0) return false;
  return with_probes(own, s, prefer_large(s.copy_in, costs));
}

bool Link::read_now(Outbox& own, std::uint64_t length) noexcept {
  if (length <= kAdaptFrom || length > kEagerMax) return false;
  Outbox::Slot& s = own.slots_[static_cast<std::size_t>(slot_)];
  const std::uint64_t costs = peer_costs(own);
  return with_probes(own, s, prefer_read(s.copy_in, costs), read_far_apart(s.copy_in, costs));
}

bool Link::with_probes(Outbox& own, Outbox::Slot& s, bool large, bool far_apart) noexcept {
  // Probes (costs, in the header): often after the choice changed, ever
  // rarer while it holds.
  if (large != s.chose_large) {
    s.chose_large = large;
    s.probe_every = kProbeFirst;
    s.probe_in = std::min(s.probe_in, kProbeFirst);
  }
  // A stream (records we wrote still unread; the position is on the line
  // just loaded) probes up to kProbeStream sends apart, a ping-pong up to
  // kProbeMost.
  const std::uint32_t most = acked(own) != s.head ? kProbeStream : kProbeMost;
  if (far_apart && s.probe_every < most) s.probe_every = s.probe_in = most;
  if (s.probe_in > most) s.probe_in = most;
  // A probe of the read while the copies hold is kProbeReads sends in a
  // row, the last ones of the interval.
  if (--s.probe_in > (large ? 0U : kProbeReads - 1)) return large;
  if (s.probe_in != 0) return !large;
  s.probe_every = std::min(2 * s.probe_every, most);
  s.probe_in = s.probe_every;
  return !large;
}

std::uint64_t Link::written(const Outbox& own) const noexcept {
  return own.slots_[static_cast<std::size_t>(slot_)].head;
}

Read read_record(const std::byte* ring, std::uint64_t offset, std::uint64_t expected, Incoming& in) noexcept {
  if (offset % kRecordAlign != 0 || offset >= kRingBytes) return Read::corrupt;
  if (shared_word(ring + offset).load(std::memory_order_acquire) != expected) return Read::none;
  const std::uint64_t kind_len = load_u64(ring + offset + 8);
  Record r;
  if (!parse_record(static_cast<std::uint32_t>(kind_len), static_cast<std::uint32_t>(kind_len >> 32), offset, r)) {
    return Read::corrupt;
  }
  in = Incoming{};
  in.kind = r.kind;
  in.advance = r.advance;
  if (r.kind == RecordKind::data) {
    in.data = ring + offset + kRecordHeader + r.gap;
    in.gap = r.gap;
    in.length = r.length;
  } else if (r.kind == RecordKind::large) {
    in.address = load_u64(ring + offset + kRecordHeader);
    in.length = load_u64(ring + offset + kRecordHeader + 8);
    if (!large_ok(in.address, in.length)) return Read::corrupt;
  }
  return Read::ready;
}

Read Link::peek(Outbox& own, Incoming& in) noexcept {
  if (!resolve(own)) return Read::none;
  const Outbox::Slot& s = own.slots_[static_cast<std::size_t>(slot_)];
  const std::byte* ring = base_ + kRingsOffset + static_cast<std::size_t>(peer_slot_) * kRingBytes;
  // At most a pad and then a message.
  for (int i = 0; i < 2; ++i) {
    const Read r = read_record(ring, s.pos % kRingBytes, s.next_seq, in);
    if (r == Read::corrupt) ++corrupt_;
    if (r != Read::ready || in.kind != RecordKind::pad) return r;
    consume(own, in);
  }
  // Two pads in a row: a sender that only pads. Nothing to read now.
  return Read::none;
}

bool Link::first_read(Outbox& own, const Incoming& in) noexcept {
  Outbox::Slot& s = own.slots_[static_cast<std::size_t>(slot_)];
  const std::uint64_t end = s.pos % kRingBytes + in.advance;
  if (end <= s.read_high) return false;
  s.read_high = end;
  return true;
}

void Link::note_cost(Outbox& own, bool large, std::uint64_t ticks, std::uint64_t bytes) noexcept {
  if (bytes <= kAdaptFrom) return;
  Outbox::Slot& s = own.slots_[static_cast<std::size_t>(slot_)];
  if (large) {
    count_read(s, ticks, bytes);
  } else {
    s.copy_out = cost_average(s.copy_out, ticks, bytes);
    s.after_read = false;
  }
  // A message copied out or read into a posted receive: not one taken
  // where it lies (any more).
  s.ring_only = false;
  own.entry_word(slot_, kEntryCosts)->store(own.costs(s), std::memory_order_release);
}

void Link::note_take(Outbox& own, std::uint64_t ticks, std::uint64_t bytes) noexcept {
  if (bytes <= kAdaptFrom) return;
  Outbox::Slot& s = own.slots_[static_cast<std::size_t>(slot_)];
  s.copy_out = cost_average(s.copy_out, ticks, bytes);
  s.after_read = false;
  s.ring_only = true;
  own.entry_word(slot_, kEntryCosts)->store(own.costs(s), std::memory_order_release);
}

void Link::note_read(Outbox& own, std::uint64_t ticks, std::uint64_t bytes) noexcept {
  if (bytes <= kAdaptFrom || bytes > kEagerMax) return;
  Outbox::Slot& s = own.slots_[static_cast<std::size_t>(slot_)];
  count_read(s, ticks, bytes);
  own.entry_word(slot_, kEntryCosts)->store(own.costs(s), std::memory_order_release);
}

void Link::count_read(Outbox::Slot& s, std::uint64_t ticks, std::uint64_t bytes) noexcept {
  if (s.after_read) s.read = cost_average(s.read, ticks, bytes);
  s.after_read = true;
}

void Link::consume(Outbox& own, const Incoming& in) noexcept {
  Outbox::Slot& s = own.slots_[static_cast<std::size_t>(slot_)];
  s.pos += in.advance;
  ++s.next_seq;
  own.entry_word(slot_, kEntryConsumed)->store(s.pos, std::memory_order_release);
}

}  // namespace regpool::shm_rings
