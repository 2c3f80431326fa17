#include "core/dlock_thread.hpp"

#include <pthread.h>

namespace dlock::internal {
namespace {

// Per thread, written only by the thread itself: no shared state.
thread_local bool t_dlock_thread = false;

}  // namespace

void MarkDlockThread() noexcept { t_dlock_thread = true; }

void MarkDlockThread(const char* name) noexcept {
  MarkDlockThread();
  (void)::pthread_setname_np(::pthread_self(), name);  // best effort: ERANGE for a name too long
}

bool OnDlockThread() noexcept { return t_dlock_thread; }

}  // namespace dlock::internal
