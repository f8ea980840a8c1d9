#pragma once
// StackBatch<T, N>: up to N objects on the stack, constructed one at a time
// (emplace) and destroyed together (clear, or the destructor).
//
// Why not T[N]: an array constructs and destroys all N objects every time
// it is used, and the endpoint's batches (completions handed to callbacks,
// references released after unlocking) usually hold one or two. For the
// delivery batch that was 32 callbacks and 32 completions built and torn
// down per delivered completion, a few hundred instructions on the path of
// every callback-driven message (the Messenger's).

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace regpool::detail {

template <class T, std::size_t N>
class StackBatch {
 public:
  StackBatch() noexcept = default;
  ~StackBatch() { clear(); }
  StackBatch(const StackBatch&) = delete;
  StackBatch& operator=(const StackBatch&) = delete;

  // Precondition: !full().
  // An aggregate is built with braces: clang 14 has no parenthesised
  // aggregate initialisation (C++20's P0960), which gcc 12 accepts.
  template <class... Args>
  T& emplace(Args&&... args) noexcept {
    void* slot = storage_ + n_ * sizeof(T);
    T* p;
    if constexpr (std::is_aggregate_v<T>) {
      static_assert(noexcept(T{std::declval<Args>()...}));
      p = ::new (slot) T{std::forward<Args>(args)...};
    } else {
      static_assert(std::is_nothrow_constructible_v<T, Args&&...>);
      p = ::new (slot) T(std::forward<Args>(args)...);
    }
    ++n_;
    return *p;
  }
  std::size_t size() const noexcept { return n_; }
  bool full() const noexcept { return n_ == N; }
  T& operator[](std::size_t i) noexcept { return *std::launder(reinterpret_cast<T*>(storage_ + i * sizeof(T))); }
  void clear() noexcept {
    for (std::size_t i = 0; i < n_; ++i) (*this)[i].~T();
    n_ = 0;
  }

 private:
  alignas(T) unsigned char storage_[N * sizeof(T)];
  std::size_t n_ = 0;
};

}  // namespace regpool::detail
