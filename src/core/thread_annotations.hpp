// Clang thread-safety annotations and the annotated mutex dlock locks with.
//
// Every field that a mutex protects says so (`DLOCK_GUARDED_BY(mu_)`), and
// every function that expects a caller to hold a mutex says so
// (`DLOCK_REQUIRES(mu_)`), so that a clang build with `-Wthread-safety`
// checks the locking rules instead of comments. With other compilers the
// macros expand to nothing. See
// https://clang.llvm.org/docs/ThreadSafetyAnalysis.html.
//
// Use `Mutex` and `MutexLock` instead of `std::mutex` and `std::lock_guard` /
// `std::unique_lock`: the standard types carry no annotations, so the analysis
// cannot see what they hold. Condition-variable waits (Clock::wait_until)
// take `MutexLock::native()`: the wait gives the mutex up and takes it back
// before it returns, so for the analysis the mutex stays held throughout.
#pragma once

#include <mutex>

#if defined(__clang__)
#define DLOCK_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define DLOCK_THREAD_ANNOTATION(x)
#endif

#define DLOCK_CAPABILITY(name) DLOCK_THREAD_ANNOTATION(capability(name))
#define DLOCK_SCOPED_CAPABILITY DLOCK_THREAD_ANNOTATION(scoped_lockable)
#define DLOCK_GUARDED_BY(mu) DLOCK_THREAD_ANNOTATION(guarded_by(mu))
#define DLOCK_PT_GUARDED_BY(mu) DLOCK_THREAD_ANNOTATION(pt_guarded_by(mu))
#define DLOCK_ACQUIRED_AFTER(...) DLOCK_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define DLOCK_ACQUIRED_BEFORE(...) DLOCK_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define DLOCK_REQUIRES(...) DLOCK_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define DLOCK_ACQUIRE(...) DLOCK_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define DLOCK_RELEASE(...) DLOCK_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define DLOCK_TRY_ACQUIRE(...) DLOCK_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define DLOCK_EXCLUDES(...) DLOCK_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define DLOCK_ASSERT_HELD(x) DLOCK_THREAD_ANNOTATION(assert_capability(x))
#define DLOCK_RETURN_CAPABILITY(x) DLOCK_THREAD_ANNOTATION(lock_returned(x))
// For the few functions whose locking the analysis cannot follow (say why at
// each use).
#define DLOCK_NO_THREAD_SAFETY_ANALYSIS DLOCK_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace dlock::internal {

// A std::mutex the analysis can see.
class DLOCK_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() DLOCK_ACQUIRE() { mu_.lock(); }
  void unlock() DLOCK_RELEASE() { mu_.unlock(); }
  bool try_lock() DLOCK_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds the mutex where it cannot know
  // (inside a lambda run under the lock, for example). Checks nothing.
  void assert_held() const DLOCK_ASSERT_HELD(this) {}

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope; may give it up early and take it back.
class DLOCK_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) DLOCK_ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() DLOCK_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() DLOCK_RELEASE() { lock_.unlock(); }
  void lock() DLOCK_ACQUIRE() { lock_.lock(); }

  // The lock for condition-variable waits (Clock::wait_until,
  // std::condition_variable_any::wait); they return with the mutex held.
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace dlock::internal
