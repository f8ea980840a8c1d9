#pragma once
// Error reporting. Two channels, by design:
//  - setup (opening domains, creating pools, registering arenas) throws
//    regpool::Error, because there is nothing sensible to do but stop;
//  - the data path (allocate, put/get/send, completions) returns Status or
//    Result<T> and never throws, so it can sit in a hot loop or a callback.

#include <cstdint>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

// REGPOOL_API: every public header includes this one, directly or not, and
// with it the export macro.
#include "regpool/export.hpp"

namespace regpool {

enum class Status : std::uint8_t {
  ok = 0,
  invalid_argument,   // a size, offset or option makes no sense
  out_of_bounds,      // a slice or remote range leaves its object
  access_denied,      // the export does not grant this operation
  capacity_exceeded,  // resize past the object's capacity
  pool_exhausted,     // the pool is at its hard cap
  out_of_memory,      // the OS refused a mapping
  registration_failed,
  memlock_limit,      // RLIMIT_MEMLOCK stopped pinning
  malformed,          // bytes from another process failed validation (what: in the message)
  bad_key,            // the peer rejected the remote key
  peer_unreachable,
  timeout,
  canceled,
  would_block,        // no resource right now; retry after progress()
  in_progress,
  unsupported,
  closed,             // the endpoint or pool is shut down
  transport_error,
  truncated,          // a message longer than its receive buffer: the buffer holds its first bytes
  message_too_large,  // a send longer than the peer accepts (its advertised limit): refused, nothing sent
};

// Static strings; never allocates.
REGPOOL_API const char* to_string(Status s) noexcept;

class REGPOOL_API Error : public std::runtime_error {
 public:
  // provider_code is the backend's own code (negative FI_* value, errno, ...)
  // so a caller can match on it without parsing the message.
  Error(Status status, int provider_code, const std::string& context);
  Status status() const noexcept { return status_; }
  int provider_code() const noexcept { return provider_code_; }

 private:
  Status status_;
  int provider_code_;
};

namespace detail {
// Handle types whose empty (default-constructed) state is cheap to make and
// whose destructor does nothing for it (Ldo): a Result of one holds a T
// even when it failed (an empty one), so destroying the Result is T's
// destructor alone, with no test of the status first. Opt in by
// specialising to true next to the type, before any Result<T> is used.
template <class T>
inline constexpr bool kResultKeepsEmpty = false;

// Storage and lifetime of Result<T>. Two specialisations instead of
// `~Result() requires ... = default`, which clang < 16 (Debian 12 ships 14)
// rejects: for trivially copyable T the whole Result stays trivially
// copyable, so returning one is a register move, not a call.
template <class T, bool Trivial = std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>>
class ResultStorage {
 protected:
  ResultStorage() noexcept = default;

  bool has_value() const noexcept { return status_ == Status::ok; }
  T* ptr() noexcept { return std::launder(reinterpret_cast<T*>(&storage_)); }
  const T* ptr() const noexcept { return std::launder(reinterpret_cast<const T*>(&storage_)); }

  Status status_ = Status::invalid_argument;
  alignas(T) unsigned char storage_[sizeof(T)];
};

template <class T>
class ResultStorage<T, false> {
 protected:
  ResultStorage() noexcept = default;
  ResultStorage(ResultStorage&& o) noexcept(std::is_nothrow_move_constructible_v<T>) : status_(o.status_) {
    if (holds_t()) new (&storage_) T(std::move(*o.ptr()));
  }
  ResultStorage& operator=(ResultStorage&& o) noexcept(std::is_nothrow_move_constructible_v<T>) {
    if (this != &o) {
      reset();
      status_ = o.status_;
      if (holds_t()) new (&storage_) T(std::move(*o.ptr()));
    }
    return *this;
  }
  ~ResultStorage() { reset(); }

  bool has_value() const noexcept { return status_ == Status::ok; }
  // Whether storage_ holds a constructed T: the value, or an empty one.
  bool holds_t() const noexcept { return kResultKeepsEmpty<T> || has_value(); }
  void reset() noexcept {
    if (holds_t()) ptr()->~T();
  }
  T* ptr() noexcept { return std::launder(reinterpret_cast<T*>(&storage_)); }
  const T* ptr() const noexcept { return std::launder(reinterpret_cast<const T*>(&storage_)); }

  Status status_ = Status::invalid_argument;
  alignas(T) unsigned char storage_[sizeof(T)];
};
}  // namespace detail

// A value or a Status. Deliberately tiny (no std::expected in C++20): the
// data path returns it, so it must never allocate or throw.
template <class T>
class [[nodiscard]] Result : private detail::ResultStorage<T> {
  using Base = detail::ResultStorage<T>;
  using Base::ptr;

 public:
  Result(T value) noexcept(std::is_nothrow_move_constructible_v<T>) {  // NOLINT: implicit by design
    this->status_ = Status::ok;
    new (&this->storage_) T(std::move(value));
  }
  Result(Status status) noexcept {  // NOLINT: implicit by design
    if (status == Status::ok) std::abort();  // an ok Result must carry a value
    this->status_ = status;
    if constexpr (detail::kResultKeepsEmpty<T>) new (&this->storage_) T();
  }
  Result(Result&&) = default;
  Result& operator=(Result&&) = default;
  Result(const Result&) = delete;
  Result& operator=(const Result&) = delete;
  ~Result() = default;

  bool ok() const noexcept { return this->status_ == Status::ok; }
  explicit operator bool() const noexcept { return ok(); }
  Status status() const noexcept { return this->status_; }

  // Accessing the value of a failed Result is a programming error: abort
  // rather than throw, since this type lives on the no-throw data path.
  T& value() & noexcept { check(); return *ptr(); }
  const T& value() const& noexcept { check(); return *ptr(); }
  T&& value() && noexcept { check(); return std::move(*ptr()); }
  T& operator*() & noexcept { return value(); }
  T&& operator*() && noexcept { return std::move(*this).value(); }
  T* operator->() noexcept { check(); return ptr(); }
  const T* operator->() const noexcept { check(); return ptr(); }

 private:
  void check() const noexcept {
    if (!ok()) std::abort();
  }
};

}  // namespace regpool
