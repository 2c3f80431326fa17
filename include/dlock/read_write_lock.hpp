// File: dlock/read_write_lock.hpp
//
// dlock::ReadWriteLock: many readers or one writer, across processes and
// machines, in the manner of Curator's InterProcessReadWriteLock (and with its
// layout on ZooKeeper). Fair: requests are served in arrival order, so a
// waiting writer is not starved by readers that come after it.
//
//   dlock::ReadWriteLock rw(client, "catalog");
//   { std::shared_lock r(rw.reader()); read_catalog(); }
//   { std::unique_lock w(rw.writer()); rewrite_catalog(); }
//
// Reentrant per thread on both sides. A thread that holds the write lock may
// take the read lock and then release the write lock (downgrade); the read
// entry takes the write entry's place in the queue, so no writer can slip in
// between; the read hold keeps the write hold's fencing token, so a writer
// queued behind (whose token is larger) is never outranked by it. Upgrading
// (read held, write requested) would deadlock and is refused with
// dlock::Error(kFailedPrecondition).
//
// On a name shared with a Mutex, a Mutex hold counts as a writer.
//
// Reader::fencing_token() and Writer::fencing_token() are the calling
// thread's, std::nullopt when it does not hold that side (the convention of
// every lock object; a Hold's token is a plain number: see hold.hpp).
//
// Thread-safety: all methods are thread-safe; lock functions block and throw
// dlock::Error when the store fails; unlock functions never throw.
#ifndef DLOCK_READ_WRITE_LOCK_HPP_
#define DLOCK_READ_WRITE_LOCK_HPP_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>

#include "dlock/async.hpp"
#include "dlock/client.hpp"
#include "dlock/export.hpp"
#include "dlock/hold.hpp"
#include "dlock/timeout.hpp"

namespace dlock {

namespace internal {
class ReadWriteCore;
}  // namespace internal

class DLOCK_EXPORT ReadWriteLock {
 public:
  // The shared side; SharedTimedLockable, so std::shared_lock works.
  class DLOCK_EXPORT Reader {
   public:
    void lock_shared();
    bool try_lock_shared();
    template <class Rep, class Period>
    bool try_lock_shared_for(const std::chrono::duration<Rep, Period>& timeout) {
      return lock_shared_for(ToTimeout(timeout), {});
    }
    template <class C, class D>
    bool try_lock_shared_until(const std::chrono::time_point<C, D>& deadline) {
      return lock_shared_for(ToTimeout(deadline), {});
    }
    bool lock_shared_for(Clock::duration timeout, std::stop_token stop);
    void unlock_shared() noexcept;
    // Thread-agnostic, non-reentrant holds of this side (dlock/async.hpp).
    std::optional<Hold> acquire(Clock::duration timeout = kForever, std::stop_token stop = {});
    void async_acquire(Clock::duration timeout, std::stop_token stop, AcquireCallback done);
    AcquireAwaitable async_acquire(Clock::duration timeout = kForever, std::stop_token stop = {});
    std::future<std::optional<Hold>> acquire_future(Clock::duration timeout = kForever, std::stop_token stop = {});
    std::optional<std::uint64_t> fencing_token() const;
    std::stop_token lost_token() const;

   private:
    friend class ReadWriteLock;
    explicit Reader(internal::ReadWriteCore* core) : core_(core) {}
    internal::ReadWriteCore* core_;
  };

  // The exclusive side; TimedLockable, so std::unique_lock works.
  class DLOCK_EXPORT Writer {
   public:
    void lock();
    bool try_lock();
    template <class Rep, class Period>
    bool try_lock_for(const std::chrono::duration<Rep, Period>& timeout) {
      return lock_for(ToTimeout(timeout), {});
    }
    template <class C, class D>
    bool try_lock_until(const std::chrono::time_point<C, D>& deadline) {
      return lock_for(ToTimeout(deadline), {});
    }
    bool lock_for(Clock::duration timeout, std::stop_token stop);
    void unlock() noexcept;
    // Thread-agnostic, non-reentrant holds of this side (dlock/async.hpp).
    std::optional<Hold> acquire(Clock::duration timeout = kForever, std::stop_token stop = {});
    void async_acquire(Clock::duration timeout, std::stop_token stop, AcquireCallback done);
    AcquireAwaitable async_acquire(Clock::duration timeout = kForever, std::stop_token stop = {});
    std::future<std::optional<Hold>> acquire_future(Clock::duration timeout = kForever, std::stop_token stop = {});
    std::optional<std::uint64_t> fencing_token() const;
    std::stop_token lost_token() const;

   private:
    friend class ReadWriteLock;
    explicit Writer(internal::ReadWriteCore* core) : core_(core) {}
    internal::ReadWriteCore* core_;
  };

  // Throws dlock::Error(kInvalidArgument) for a bad name.
  ReadWriteLock(Client client, std::string name);
  ~ReadWriteLock();
  ReadWriteLock(const ReadWriteLock&) = delete;
  ReadWriteLock& operator=(const ReadWriteLock&) = delete;

  Reader& reader() noexcept { return reader_; }
  Writer& writer() noexcept { return writer_; }

  // Thread-agnostic, non-reentrant holds.
  std::optional<Hold> acquire_read(Clock::duration timeout = kForever, std::stop_token stop = {});
  std::optional<Hold> acquire_write(Clock::duration timeout = kForever, std::stop_token stop = {});

  const std::string& name() const noexcept;

 private:
  std::unique_ptr<internal::ReadWriteCore> core_;
  Reader reader_;
  Writer writer_;
};

}  // namespace dlock

#endif  // DLOCK_READ_WRITE_LOCK_HPP_
