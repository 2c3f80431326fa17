#include "core/dlock_thread.hpp"

namespace dlock::internal {
namespace {

// Per thread, written only by the thread itself: no shared state.
thread_local bool t_dlock_thread = false;

}  // namespace

void MarkDlockThread() noexcept { t_dlock_thread = true; }

bool OnDlockThread() noexcept { return t_dlock_thread; }

}  // namespace dlock::internal
