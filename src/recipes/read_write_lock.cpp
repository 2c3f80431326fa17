#include "dlock/read_write_lock.hpp"

#include <map>
#include <thread>

#include "core/access.hpp"
#include "core/hold_core.hpp"
#include "core/thread_annotations.hpp"
#include "recipes/thread_owned_lock.hpp"

namespace dlock {
namespace internal {

// Per-thread read and write holds of one ReadWriteLock object.
class ReadWriteCore {
 public:
  ReadWriteCore(Client client, std::string name) : client_(std::move(client)), name_(std::move(name)) {
    ThrowIfError(ValidateLockName(name_));
  }
  ~ReadWriteCore() {
    // Released without mu_: a release may call the application back.
    decltype(threads_) threads;
    {
      MutexLock g(mu_);
      threads.swap(threads_);
    }
    for (auto& [thread, t] : threads) {
      t.read.release();
      t.write.release();
    }
  }

  bool lock_read(Clock::duration timeout, std::stop_token stop, bool try_only) DLOCK_EXCLUDES(mu_) {
    const auto me = std::this_thread::get_id();
    std::optional<std::int64_t> downgrade_from;
    std::uint64_t write_token = 0;
    std::shared_ptr<Session> write_session;
    {
      MutexLock g(mu_);
      auto it = threads_.find(me);
      if (it != threads_.end() && it->second.reads > 0) {
        throw_if_lost(it->second.read);
        ++it->second.reads;
        return true;
      }
      if (it != threads_.end() && it->second.writes > 0) {
        throw_if_lost(it->second.write);
        const auto& held = CoreOf(it->second.write)->entries().front();
        downgrade_from = held.sequence;
        write_token = it->second.write.fencing_token();
        write_session = CoreOf(it->second.write)->session();
      }
    }
    auto request = MakeRequest(client_, name_, entry_kind::kRead, SharedRule, timeout, std::move(stop), try_only);
    if (downgrade_from) {
      // Downgrade: the read entry takes the write entry's place in the queue,
      // on the same session, so no writer can get in between.
      request.sequence = downgrade_from;
      request.session = write_session;
      request.use_gate = false;
    }
    // A downgraded read hold keeps the write hold's fencing token: it takes
    // the writer's place, and a writer queued behind must not get a smaller
    // token than a hold granted before it.
    auto hold = AcquireHold(client_, name_, request, downgrade_from ? std::optional(write_token) : std::nullopt);
    if (!hold) return false;
    MutexLock g(mu_);
    auto& t = threads_[me];
    t.read = std::move(*hold);
    t.reads = 1;
    return true;
  }

  bool lock_write(Clock::duration timeout, std::stop_token stop, bool try_only) DLOCK_EXCLUDES(mu_) {
    const auto me = std::this_thread::get_id();
    {
      MutexLock g(mu_);
      auto it = threads_.find(me);
      if (it != threads_.end() && it->second.writes > 0) {
        throw_if_lost(it->second.write);
        ++it->second.writes;
        return true;
      }
      if (it != threads_.end() && it->second.reads > 0) {
        throw Error(FailedPreconditionError("this thread holds the read lock of " + name_ +
                                            "; upgrading to the write lock would deadlock"));
      }
    }
    auto hold =
        AcquireHold(client_, name_,
                    MakeRequest(client_, name_, entry_kind::kWrite, ExclusiveRule, timeout, std::move(stop), try_only));
    if (!hold) return false;
    MutexLock g(mu_);
    auto& t = threads_[me];
    t.write = std::move(*hold);
    t.writes = 1;
    return true;
  }

  void unlock_read() noexcept DLOCK_EXCLUDES(mu_) { unlock(&PerThread::reads, &PerThread::read, "read"); }
  void unlock_write() noexcept DLOCK_EXCLUDES(mu_) { unlock(&PerThread::writes, &PerThread::write, "write"); }

  std::optional<std::uint64_t> token(bool write) const DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    const Hold* h = find(write);
    if (!h) return std::nullopt;
    return h->fencing_token();
  }
  std::stop_token lost_token(bool write) const DLOCK_EXCLUDES(mu_) {
    // Outside mu_: requesting the stop runs the application's callbacks,
    // which may call back into this lock.
    std::shared_ptr<HoldCore> core;
    {
      MutexLock g(mu_);
      if (const Hold* h = find(write)) core = CoreOf(*h);
    }
    return core ? core->lost_token() : std::stop_token();
  }

  std::optional<Hold> acquire(std::string_view kind, Clock::duration timeout, std::stop_token stop) {
    Result<std::optional<Hold>> got =
        WaitFor<std::optional<Hold>>(*CoreOf(client_), [&](AcquireCallback done, FailureSink failure) {
          async_starter(kind, timeout, std::move(stop), std::move(failure))(std::move(done));
        });
    if (!got.ok()) throw Error(got.status());
    return std::move(got).value();
  }

  // What acquire() does, without blocking: starts it when called.
  std::function<void(AcquireCallback)> async_starter(std::string_view kind, Clock::duration timeout,
                                                     std::stop_token stop, FailureSink failure = nullptr) const {
    return HoldStarter(
        client_, name_,
        [client = client_, name = name_, kind = std::string(kind), timeout, stop = std::move(stop), failure] {
          bool write = kind == entry_kind::kWrite;
          auto request = MakeRequest(client, name, kind, write ? GrantRule(ExclusiveRule) : GrantRule(SharedRule),
                                     timeout, stop, false);
          request.thread = "hold";
          request.failure = failure;
          return request;
        });
  }

  const std::string& name() const noexcept { return name_; }

 private:
  struct PerThread {
    Hold read;
    int reads = 0;
    Hold write;
    int writes = 0;
  };

  void throw_if_lost(const Hold& h) const {
    if (h.state() == HoldState::kLost) {
      throw Error(SessionLostError("this thread's hold on " + name_ + " was lost; unlock it before locking again"));
    }
  }

  // The calling thread's hold on one side; valid while mu_ is held.
  const Hold* find(bool write) const DLOCK_REQUIRES(mu_) {
    auto it = threads_.find(std::this_thread::get_id());
    if (it == threads_.end()) return nullptr;
    if (write ? it->second.writes == 0 : it->second.reads == 0) return nullptr;
    return write ? &it->second.write : &it->second.read;
  }

  // Releases and reports outside mu_.
  void unlock(int PerThread::*count, Hold PerThread::*hold, const char* side) noexcept DLOCK_EXCLUDES(mu_) {
    Hold to_release;
    bool held = false;
    {
      MutexLock g(mu_);
      auto it = threads_.find(std::this_thread::get_id());
      if (it != threads_.end() && it->second.*count > 0) {
        held = true;
        if (--(it->second.*count) > 0) return;
        to_release = std::move(it->second.*hold);
        if (it->second.reads == 0 && it->second.writes == 0) threads_.erase(it);
      }
    }
    // Both outside mu_: the application's callback may call back in.
    if (!held) {
      CoreOf(client_)->report(FailedPreconditionError(std::string("unlock of the ") + side + " lock of " + name_ +
                                                      " by a thread that does not hold it"));
      return;
    }
    to_release.release();
  }

  const Client client_;
  const std::string name_;
  mutable Mutex mu_;
  std::map<std::thread::id, PerThread> threads_ DLOCK_GUARDED_BY(mu_);
};

}  // namespace internal

ReadWriteLock::ReadWriteLock(Client client, std::string name)
    : core_(std::make_unique<internal::ReadWriteCore>(std::move(client), std::move(name))),
      reader_(core_.get()),
      writer_(core_.get()) {}
ReadWriteLock::~ReadWriteLock() = default;

const std::string& ReadWriteLock::name() const noexcept { return core_->name(); }

std::optional<Hold> ReadWriteLock::acquire_read(Clock::duration timeout, std::stop_token stop) {
  return core_->acquire(entry_kind::kRead, timeout, std::move(stop));
}
std::optional<Hold> ReadWriteLock::acquire_write(Clock::duration timeout, std::stop_token stop) {
  return core_->acquire(entry_kind::kWrite, timeout, std::move(stop));
}

std::optional<Hold> ReadWriteLock::Reader::acquire(Clock::duration timeout, std::stop_token stop) {
  return core_->acquire(entry_kind::kRead, timeout, std::move(stop));
}
void ReadWriteLock::Reader::async_acquire(Clock::duration timeout, std::stop_token stop, AcquireCallback done) {
  core_->async_starter(entry_kind::kRead, timeout, std::move(stop))(std::move(done));
}
AcquireAwaitable ReadWriteLock::Reader::async_acquire(Clock::duration timeout, std::stop_token stop) {
  return AcquireAwaitable(core_->async_starter(entry_kind::kRead, timeout, std::move(stop)));
}
std::future<std::optional<Hold>> ReadWriteLock::Reader::acquire_future(Clock::duration timeout, std::stop_token stop) {
  return internal::FutureOf(core_->async_starter(entry_kind::kRead, timeout, std::move(stop)));
}
std::optional<Hold> ReadWriteLock::Writer::acquire(Clock::duration timeout, std::stop_token stop) {
  return core_->acquire(entry_kind::kWrite, timeout, std::move(stop));
}
void ReadWriteLock::Writer::async_acquire(Clock::duration timeout, std::stop_token stop, AcquireCallback done) {
  core_->async_starter(entry_kind::kWrite, timeout, std::move(stop))(std::move(done));
}
AcquireAwaitable ReadWriteLock::Writer::async_acquire(Clock::duration timeout, std::stop_token stop) {
  return AcquireAwaitable(core_->async_starter(entry_kind::kWrite, timeout, std::move(stop)));
}
std::future<std::optional<Hold>> ReadWriteLock::Writer::acquire_future(Clock::duration timeout, std::stop_token stop) {
  return internal::FutureOf(core_->async_starter(entry_kind::kWrite, timeout, std::move(stop)));
}

void ReadWriteLock::Reader::lock_shared() {
  if (!core_->lock_read(kForever, {}, false)) throw Error(InternalError("lock_shared() returned without the lock"));
}
bool ReadWriteLock::Reader::try_lock_shared() { return core_->lock_read(Clock::duration::zero(), {}, true); }
bool ReadWriteLock::Reader::lock_shared_for(Clock::duration timeout, std::stop_token stop) {
  return core_->lock_read(timeout, std::move(stop), false);
}
void ReadWriteLock::Reader::unlock_shared() noexcept { core_->unlock_read(); }
std::optional<std::uint64_t> ReadWriteLock::Reader::fencing_token() const { return core_->token(false); }
std::stop_token ReadWriteLock::Reader::lost_token() const { return core_->lost_token(false); }

void ReadWriteLock::Writer::lock() {
  if (!core_->lock_write(kForever, {}, false)) throw Error(InternalError("lock() returned without the lock"));
}
bool ReadWriteLock::Writer::try_lock() { return core_->lock_write(Clock::duration::zero(), {}, true); }
bool ReadWriteLock::Writer::lock_for(Clock::duration timeout, std::stop_token stop) {
  return core_->lock_write(timeout, std::move(stop), false);
}
void ReadWriteLock::Writer::unlock() noexcept { core_->unlock_write(); }
std::optional<std::uint64_t> ReadWriteLock::Writer::fencing_token() const { return core_->token(true); }
std::stop_token ReadWriteLock::Writer::lost_token() const { return core_->lost_token(true); }

}  // namespace dlock
