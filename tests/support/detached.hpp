// The smallest coroutine type (the acceptance program's): it starts at once
// and frees itself when it ends, so an awaitable that works with it needs
// nothing from the coroutine's type.
#ifndef DLOCK_TESTS_SUPPORT_DETACHED_HPP_
#define DLOCK_TESTS_SUPPORT_DETACHED_HPP_

#include <coroutine>
#include <exception>

namespace dlock::testing {

struct Detached {
  struct promise_type {
    Detached get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_DETACHED_HPP_
