#pragma once
// InlineCallback: the move-only callable with inline storage behind
// Endpoint's Callback and Messenger's MessageCallback.
//
// Storing one never allocates (std::function may), so operation slots can
// hold callbacks on the data path. Captures up to kCapacity bytes; larger,
// over-aligned or throwing-move callables fail to compile.
// Thread-safety: none of its own; it belongs to whoever holds it.

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace regpool {

template <class Arg>
class InlineCallback {
 public:
  static constexpr std::size_t kCapacity = 48;

  InlineCallback() noexcept = default;
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, InlineCallback> &&
                                              std::is_invocable_v<F&, Arg>>>
  InlineCallback(F&& f) noexcept {  // NOLINT: implicit by design, like std::function
    using Fn = std::decay_t<F>;
    static_assert(sizeof(Fn) <= kCapacity, "callback captures too much: capture a pointer instead");
    static_assert(alignof(Fn) <= alignof(std::max_align_t), "over-aligned callback");
    static_assert(std::is_nothrow_move_constructible_v<Fn>, "callback must be nothrow movable");
    new (storage_) Fn(std::forward<F>(f));
    ops_ = &kOps<Fn>;
  }
  InlineCallback(InlineCallback&& o) noexcept { move_from(o); }
  InlineCallback& operator=(InlineCallback&& o) noexcept {
    if (this != &o) {
      reset();
      move_from(o);
    }
    return *this;
  }
  InlineCallback(const InlineCallback&) = delete;
  InlineCallback& operator=(const InlineCallback&) = delete;
  ~InlineCallback() { reset(); }

  explicit operator bool() const noexcept { return ops_ != nullptr; }
  void operator()(Arg a) { ops_->call(storage_, std::forward<Arg>(a)); }
  void reset() noexcept {
    if (ops_) ops_->destroy(storage_);
    ops_ = nullptr;
  }

 private:
  struct Ops {
    void (*call)(void*, Arg);
    void (*move)(void* dst, void* src) noexcept;
    void (*destroy)(void*) noexcept;
  };
  template <class Fn>
  static constexpr Ops kOps{
      [](void* p, Arg a) { (*static_cast<Fn*>(p))(std::forward<Arg>(a)); },
      [](void* d, void* s) noexcept {
        new (d) Fn(std::move(*static_cast<Fn*>(s)));
        static_cast<Fn*>(s)->~Fn();
      },
      [](void* p) noexcept { static_cast<Fn*>(p)->~Fn(); }};
  void move_from(InlineCallback& o) noexcept {
    if (o.ops_) {
      o.ops_->move(storage_, o.storage_);
      ops_ = o.ops_;
      o.ops_ = nullptr;
    }
  }
  alignas(std::max_align_t) unsigned char storage_[kCapacity];
  const Ops* ops_ = nullptr;
};

}  // namespace regpool
