#pragma once
// A copy of a byte blob that ends exactly where an unmapped page begins, so
// any read past its last byte faults: how the peer-name tests prove that a
// parser never reads beyond what a peer sent.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <span>
#include <stdexcept>

namespace rpt {

class AtGuardPage {
 public:
  explicit AtGuardPage(std::span<const std::byte> blob) {
    page_ = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    void* p = ::mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap");
    base_ = static_cast<std::byte*>(p);
    if (::mprotect(base_ + page_, page_, PROT_NONE) != 0) throw std::runtime_error("mprotect");
    start_ = base_ + page_ - blob.size();
    if (!blob.empty()) std::memcpy(start_, blob.data(), blob.size());
    size_ = blob.size();
  }
  ~AtGuardPage() { ::munmap(base_, 2 * page_); }
  AtGuardPage(const AtGuardPage&) = delete;
  AtGuardPage& operator=(const AtGuardPage&) = delete;
  std::span<const std::byte> bytes() const { return {start_, size_}; }

 private:
  std::size_t page_ = 0;
  std::byte* base_ = nullptr;
  std::byte* start_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace rpt
