#pragma once
// std::pmr adapter: standard containers whose storage is registered memory.
// Each allocation is an LDO; the container sees only its data section.

#include <memory_resource>

#include "regpool/pool.hpp"

namespace regpool {

// Thread-safety: as Pool. The pool must outlive the resource and every
// container using it. Allocation failure throws std::bad_alloc, as the
// std::pmr contract requires.
class REGPOOL_API PoolResource final : public std::pmr::memory_resource {
 public:
  explicit PoolResource(Pool& pool) noexcept : pool_(&pool) {}
  Pool& pool() const noexcept { return *pool_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override;
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override;

  Pool* pool_;
};

}  // namespace regpool
