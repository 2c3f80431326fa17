#include "stores/etcd/etcd_loop.hpp"

#include <grpc/support/time.h>

#include "core/dlock_thread.hpp"

namespace dlock::internal::etcd {
namespace {

// The deadline of the wake-up alarm: one that gRPC sees as past. gRPC
// rounds an alarm's deadline up to the next millisecond, so "now" is a
// deadline in the future to it: the alarm then went into gRPC's timer heap,
// and its timer thread fired it, up to a millisecond later (each post woke
// that thread and then this loop's; perf showed the timer thread woken
// about 4 times per uncontended lock cycle). A past deadline completes the
// alarm on the posting thread, at once.
gpr_timespec PastDeadline() { return gpr_inf_past(GPR_CLOCK_MONOTONIC); }

}  // namespace

std::shared_ptr<Loop> Loop::start(const char* name) {
  std::shared_ptr<Loop> loop(new Loop());
  MutexLock lk(loop->thread_mu_);
  // The thread holds its loop: a completion may drop the owner's last reference.
  loop->thread_ = std::thread([loop, name] {
    MarkDlockThread(name);
    loop->run();
  });
  loop->thread_id_ = loop->thread_.get_id();
  return loop;
}

Loop::~Loop() = default;

void Loop::shut_down() noexcept {
  {
    MutexLock lk(mu_);
    if (!stopping_) {
      stopping_ = true;
      for (auto& [ctx, n] : calls_) ctx->TryCancel();
      if (!wake_set_) {
        // Wake the thread so that it sees stopping_.
        wake_set_ = true;
        ++outstanding_;
        wake_.Set(&cq_, PastDeadline(), &wake_tag_);
      }
    }
  }
  MutexLock lk(thread_mu_);
  JoinOrDetach(thread_);
}

bool Loop::post(Task task) {
  MutexLock lk(mu_);
  if (stopping_) return false;
  posted_.push_back(std::move(task));
  if (!wake_set_) {
    wake_set_ = true;
    ++outstanding_;
    wake_.Set(&cq_, PastDeadline(), &wake_tag_);
  }
  return true;
}

void* Loop::tag(grpc::ClientContext* ctx, std::function<void(bool)> fn) {
  MutexLock lk(mu_);
  auto it = calls_.find(ctx);
  if (stopping_ && it == calls_.end()) return nullptr;
  ++outstanding_;
  ++calls_[ctx];
  return new Tag{ctx, std::move(fn)};
}

void Loop::keep_until_drained(std::shared_ptr<void> object) {
  MutexLock lk(mu_);
  kept_.push_back(std::move(object));
}

std::uint64_t Loop::at(TimePoint when, Task task) {
  const std::uint64_t id = next_timer_++;
  timers_.emplace(std::make_pair(when, id), std::move(task));
  timer_index_.emplace(id, when);
  return id;
}

void Loop::cancel_timer(std::uint64_t id) {
  auto it = timer_index_.find(id);
  if (it == timer_index_.end()) return;
  timers_.erase({it->second, id});
  timer_index_.erase(it);
}

void Loop::run_due_timers() {
  const TimePoint now = std::chrono::steady_clock::now();
  while (!timers_.empty() && timers_.begin()->first.first <= now) {
    auto node = timers_.extract(timers_.begin());
    timer_index_.erase(node.key().second);
    node.mapped()();
  }
}

void Loop::run_posted() {
  std::deque<Task> tasks;
  {
    MutexLock lk(mu_);
    tasks.swap(posted_);
  }
  for (Task& t : tasks) t();
}

void Loop::finish(Tag* t, bool ok) {
  t->fn(ok);  // may start the call's next operation: the count below keeps the queue open for it
  {
    MutexLock lk(mu_);
    auto it = calls_.find(t->ctx);
    if (it != calls_.end() && --it->second == 0) calls_.erase(it);
    --outstanding_;
  }
  // Outside the lock: `fn`'s captures may hold the last reference to a
  // session or a store, whose destructor posts to this loop or shuts it down.
  delete t;
}

bool Loop::drained() {
  MutexLock lk(mu_);
  return stopping_ && outstanding_ == 0;
}

void Loop::run() {
  bool queue_shut = false;
  for (;;) {
    if (!queue_shut && drained()) {
      timers_.clear();
      timer_index_.clear();
      cq_.Shutdown();
      queue_shut = true;
    }
    // Completions before timers: a timer runs only once the queue has
    // nothing ready, so that a check such as "is a renewal overdue?" never
    // runs ahead of an answer that has already come (a busy loop would
    // otherwise take its own backlog for a silent server).
    gpr_timespec deadline = gpr_inf_future(GPR_CLOCK_MONOTONIC);
    if (!timers_.empty()) {
      auto left = std::chrono::duration_cast<std::chrono::microseconds>(timers_.begin()->first.first -
                                                                        std::chrono::steady_clock::now());
      if (left.count() < 0) left = std::chrono::microseconds(0);
      deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_micros(left.count(), GPR_TIMESPAN));
    }
    void* got = nullptr;
    bool ok = false;
    const auto status = cq_.AsyncNext(&got, &ok, deadline);
    if (status == grpc::CompletionQueue::SHUTDOWN) break;
    if (status == grpc::CompletionQueue::TIMEOUT) {
      run_due_timers();
      continue;
    }
    if (got == &wake_tag_) {
      {
        MutexLock lk(mu_);
        wake_set_ = false;
        --outstanding_;
      }
      run_posted();
      continue;
    }
    finish(static_cast<Tag*>(got), ok);
  }
  // Whatever was kept for the callbacks goes here, on this thread, once none
  // can run any more; tasks posted before the end are dropped with it.
  std::vector<std::shared_ptr<void>> kept;
  std::deque<Task> dropped;
  {
    MutexLock lk(mu_);
    kept.swap(kept_);
    dropped.swap(posted_);
  }
}

}  // namespace dlock::internal::etcd
