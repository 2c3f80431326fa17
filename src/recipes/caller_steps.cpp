#include "recipes/caller_steps.hpp"

#include <utility>

namespace dlock::internal {

void CallerSteps::post(std::function<void()> task) {
  MutexLock g(mu_);
  if (closed_) {
    g.unlock();  // closed for good: nothing queued here can still go ahead of it
    client_->executor().post(std::move(task));
    return;
  }
  tasks_.push_back(std::move(task));
  cv_.notify_one();
}

void CallerSteps::finish() {
  MutexLock g(mu_);
  finished_ = true;
  cv_.notify_one();
}

void CallerSteps::run() {
  running_.store(std::this_thread::get_id(), std::memory_order_release);
  MutexLock g(mu_);
  while (true) {
    cv_.wait(g.native(), [&]() DLOCK_NO_THREAD_SAFETY_ANALYSIS { return finished_ || !tasks_.empty(); });
    if (finished_) break;
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    g.unlock();
    try {
      task();
    } catch (...) {  // the engine's steps catch their own; see Executor
    }
    task = nullptr;  // without mu_: it may own the last reference to anything
    g.lock();
  }
  // Closed, under mu_: a post that sees closed_ comes after these.
  closed_ = true;
  running_.store(std::thread::id(), std::memory_order_release);
  for (auto& task : tasks_) client_->executor().post(std::move(task));
  tasks_.clear();
}

}  // namespace dlock::internal
