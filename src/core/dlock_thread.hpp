// Internal: which threads are dlock's own.
//
// Every thread dlock starts (a client's executor and session opener, a
// store's threads) marks itself, and so does a store client library's thread
// when it runs one of dlock's callbacks. The last handle of a client joins
// the client's threads only from a thread that is not marked: from a marked
// one, joining could wait for the caller itself or for a thread that waits
// for it.
#ifndef DLOCK_SRC_CORE_DLOCK_THREAD_HPP_
#define DLOCK_SRC_CORE_DLOCK_THREAD_HPP_

#include <thread>

namespace dlock::internal {

// Marks the calling thread as dlock's, for as long as it lives.
void MarkDlockThread() noexcept;
// The same for a thread dlock started, which also takes `name` (at most 15
// characters: what `top -H`, `ps -L` and debuggers show).
void MarkDlockThread(const char* name) noexcept;

// True on a thread marked by MarkDlockThread().
bool OnDlockThread() noexcept;

// Joins `thread`; called on that very thread (the last owner of what runs
// it went inside one of its callbacks), detaches it instead: it then ends
// when that callback returns, so it must hold what it still uses.
template <class Thread>
void JoinOrDetach(Thread& thread) noexcept {
  if (!thread.joinable()) return;
  if (thread.get_id() == std::this_thread::get_id()) {
    thread.detach();
  } else {
    thread.join();
  }
}

}  // namespace dlock::internal

#endif  // DLOCK_SRC_CORE_DLOCK_THREAD_HPP_
