#pragma once
// A registration backend that registers nothing but records everything, so
// the allocator can be tested without a NIC (the eRPC lesson): it counts
// calls, can be told to fail, and logs events in order.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "regpool/domain.hpp"

namespace regpool::test {

class FakeDomain final : public Domain {
 public:
  explicit FakeDomain(std::string name = "fake", AddressMode mode = AddressMode::virtual_address)
      : name_(std::move(name)), mode_(mode) {}

  std::string name() const override { return name_; }
  AddressMode address_mode() const noexcept override { return mode_; }
  // Pins by default, like a NIC; false makes it look like a software
  // provider (pools may then give pages back with MADV_DONTNEED).
  bool pins_memory() const noexcept override { return pins_; }
  void set_pins_memory(bool pins) { pins_ = pins; }

  // The next `n` registrations fail with Status::registration_failed and
  // provider code -1234.
  void fail_next(int n) { fail_.store(n); }
  std::uint64_t calls() const { return calls_.load(); }
  std::vector<std::string> events() const {
    std::lock_guard g(m_);
    return events_;
  }
  // Live registered ranges (base, length).
  std::vector<std::pair<const std::byte*, std::size_t>> ranges() const {
    std::lock_guard g(m_);
    return ranges_;
  }
  void log(std::string e) const {
    std::lock_guard g(m_);
    events_.push_back(std::move(e));
  }

 protected:
  Native do_register(void* addr, std::size_t length, Access access) override {
    calls_.fetch_add(1);
    if (fail_.load() > 0) {
      fail_.fetch_sub(1);
      throw Error(Status::registration_failed, -1234, "fake domain '" + name_ + "': told to fail");
    }
    log("register " + std::to_string(length));
    {
      std::lock_guard g(m_);
      ranges_.emplace_back(static_cast<const std::byte*>(addr), length);
    }
    const std::uint64_t key = next_key_.fetch_add(1);
    (void)access;
    return Native{addr, reinterpret_cast<void*>(key), key, static_cast<std::uint32_t>(key), mode_};
  }
  void do_deregister(const Native&, void* addr, std::size_t length) noexcept override {
    log("deregister " + std::to_string(length));
    std::lock_guard g(m_);
    std::erase(ranges_, std::pair<const std::byte*, std::size_t>(static_cast<const std::byte*>(addr), length));
  }

 private:
  std::string name_;
  AddressMode mode_;
  bool pins_ = true;
  std::atomic<int> fail_{0};
  std::atomic<std::uint64_t> calls_{0};
  std::atomic<std::uint64_t> next_key_{100};
  mutable std::mutex m_;
  mutable std::vector<std::string> events_;
  std::vector<std::pair<const std::byte*, std::size_t>> ranges_;
};

}  // namespace regpool::test
