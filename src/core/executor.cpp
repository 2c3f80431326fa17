#include "core/executor.hpp"

#include "core/dlock_thread.hpp"

namespace dlock::internal {

namespace {

// The thread's entry point: a type of internal linkage, so that the
// std::thread state instantiated for it stays out of the exported symbols.
struct QueueThread {
  std::shared_ptr<Executor::Queue> queue;
  void operator()() const;
};

}  // namespace

class Executor::Queue : public std::enable_shared_from_this<Queue> {
 public:
  explicit Queue(std::shared_ptr<Clock> clock) : clock_(std::move(clock)) {}

  const Clock& clock() const noexcept { return *clock_; }
  Clock& mutable_clock() const noexcept { return *clock_; }

  void wake() DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    cv_.notify_all();
  }

  void post(std::function<void()> task) DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    if (stopped_) return;
    ready_.push_back(std::move(task));
    start_locked();
    cv_.notify_all();
  }

  TimerId at(Clock::time_point when, std::function<void()> task) DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    const TimerId id = ++next_id_;
    if (stopped_) return id;
    timers_.emplace(std::make_pair(when, id), std::move(task));
    due_.emplace(id, when);
    start_locked();
    cv_.notify_all();
    return id;
  }

  void cancel(TimerId id) noexcept DLOCK_EXCLUDES(mu_) {
    std::function<void()> dropped;  // destroyed after mu_ is released: it may own anything
    MutexLock g(mu_);
    auto it = due_.find(id);
    if (it == due_.end()) return;
    auto timer = timers_.find({it->second, id});
    if (timer != timers_.end()) {
      dropped = std::move(timer->second);
      timers_.erase(timer);
    }
    due_.erase(it);
    g.unlock();
  }

  bool in_executor() const noexcept DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    return thread_id_ == std::this_thread::get_id();
  }

  // Ends the thread; the tasks not yet run are dropped.
  void stop() noexcept DLOCK_EXCLUDES(mu_) {
    std::jthread thread;
    std::deque<std::function<void()>> ready;
    std::map<std::pair<Clock::time_point, TimerId>, std::function<void()>> timers;
    {
      MutexLock g(mu_);
      stopped_ = true;
      thread = std::move(thread_);
      ready.swap(ready_);
      timers.swap(timers_);
      due_.clear();
      cv_.notify_all();
    }
    // Outside mu_: destroying a task may destroy what posts to this queue.
    ready.clear();
    timers.clear();
    JoinOrDetach(thread);  // from one of our own tasks: the thread ends when it returns
  }

  // The thread's loop (QueueThread runs it).
  void run() DLOCK_EXCLUDES(mu_) {
    while (true) {
      std::function<void()> task = next_task();
      if (!task) return;
      try {
        task();
      } catch (...) {  // a task's failure must not end the others
      }
    }
  }

 private:
  void start_locked() DLOCK_REQUIRES(mu_) {
    if (thread_.joinable()) return;
    thread_ = std::jthread(QueueThread{shared_from_this()});
    thread_id_ = thread_.get_id();
  }

  // The next task due, or null once stopped.
  std::function<void()> next_task() DLOCK_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (!stopped_) {
      // A due timer first: tasks that keep posting tasks must not starve
      // the deadlines (review finding).
      const Clock::time_point now = clock_->now();
      if (!timers_.empty() && timers_.begin()->first.first <= now) {
        auto node = timers_.extract(timers_.begin());
        due_.erase(node.key().second);
        return std::move(node.mapped());
      }
      if (!ready_.empty()) {
        std::function<void()> task = std::move(ready_.front());
        ready_.pop_front();
        return task;
      }
      const Clock::time_point wake = timers_.empty() ? kNoDeadline : timers_.begin()->first.first;
      clock_->wait_until(cv_, lock.native(), {}, wake, [&] {
        mu_.assert_held();  // run by wait_until under the lock
        return stopped_ || !ready_.empty() || (!timers_.empty() && timers_.begin()->first.first < wake);
      });
    }
    return nullptr;
  }

  const std::shared_ptr<Clock> clock_;
  mutable Mutex mu_;
  std::condition_variable_any cv_;
  bool stopped_ DLOCK_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> ready_ DLOCK_GUARDED_BY(mu_);
  // By due time, then by id (the order they were set).
  std::map<std::pair<Clock::time_point, TimerId>, std::function<void()>> timers_ DLOCK_GUARDED_BY(mu_);
  std::map<TimerId, Clock::time_point> due_ DLOCK_GUARDED_BY(mu_);
  TimerId next_id_ DLOCK_GUARDED_BY(mu_) = 0;
  std::jthread thread_ DLOCK_GUARDED_BY(mu_);
  std::thread::id thread_id_ DLOCK_GUARDED_BY(mu_);
};

void QueueThread::operator()() const {
  MarkDlockThread("dlock-executor");
  queue->run();
}

Executor::Executor(std::shared_ptr<Clock> clock) : queue_(std::make_shared<Queue>(std::move(clock))) {
  // A clock moved by hand may have made timers due.
  std::weak_ptr<Queue> weak = queue_;
  advanced_ = queue_->mutable_clock().on_advance([weak] {
    if (auto q = weak.lock()) q->wake();
  });
}

Executor::~Executor() {
  advanced_.reset();
  queue_->stop();
}

void Executor::shut_down() noexcept { queue_->stop(); }

void Executor::post(std::function<void()> task) { queue_->post(std::move(task)); }
Executor::TimerId Executor::at(Clock::time_point when, std::function<void()> task) {
  return queue_->at(when, std::move(task));
}
void Executor::cancel(TimerId id) noexcept { queue_->cancel(id); }
bool Executor::in_executor() const noexcept { return queue_->in_executor(); }
const Clock& Executor::clock() const noexcept { return queue_->clock(); }

}  // namespace dlock::internal
