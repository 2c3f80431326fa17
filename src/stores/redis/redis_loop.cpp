#include "stores/redis/redis_loop.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>

#include "core/dlock_thread.hpp"

namespace dlock::internal::redis {

RequestLoop::RequestLoop(Endpoint endpoint, std::chrono::milliseconds connect_timeout)
    : endpoint_(std::move(endpoint)), connect_timeout_(connect_timeout), wake_(MaybeSignal()), stop_(MaybeSignal()) {}

std::shared_ptr<RequestLoop> RequestLoop::start(Endpoint endpoint, std::chrono::milliseconds connect_timeout) {
  std::shared_ptr<RequestLoop> loop(new RequestLoop(std::move(endpoint), connect_timeout));
  MutexLock lk(loop->thread_mu_);
  loop->thread_ = std::jthread([self = loop](std::stop_token st) {
    MarkDlockThread("dlock-redis-io");
    self->run(st);
  });
  return loop;
}

RequestLoop::~RequestLoop() {
  // Only once the thread's reference is gone: it has returned (or is
  // returning, if this runs on it).
  MutexLock lk(thread_mu_);
  JoinOrDetach(thread_);
}

void RequestLoop::shut_down() noexcept {
  std::jthread thread;
  {
    MutexLock lk(thread_mu_);
    thread = std::move(thread_);
  }
  thread.request_stop();
  if (stop_) stop_->signal();
  JoinOrDetach(thread);  // inside a callback: the thread ends when it returns
}

void RequestLoop::submit(std::vector<Command> cmds, IoClock::time_point deadline, Done done) {
  {
    MutexLock lk(mu_);
    if (!ended_) {
      queue_.push_back(Job{std::move(cmds), deadline, std::move(done), {}, false, false});
      done = nullptr;
    }
  }
  if (done) {  // after shut_down(): nobody would ever answer it
    done(UnavailableError("redis store closed"));
    return;
  }
  if (wake_) wake_->signal();
}

void RequestLoop::fail(Job& job, const Status& s) {
  Done done = std::move(job.done);
  job.cmds.clear();
  if (done) done(s);
}

// Writes what was queued (connecting first if need be). False if the
// connection failed (the jobs are then retried or failed).
bool RequestLoop::send_queued(std::deque<Job>& inflight) {
  std::deque<Job> batch;
  {
    MutexLock lk(mu_);
    batch.swap(queue_);
  }
  if (batch.empty()) return true;
  bool fresh = false;
  if (!conn_) {
    IoClock::time_point latest = IoClock::now();
    for (const auto& job : batch) latest = std::max(latest, job.deadline);
    auto c = Conn::open(endpoint_, std::min(latest, IoClock::now() + connect_timeout_), FdOf(stop_));
    if (!c.ok()) {
      Status s = c.status().code() == ErrorCode::kCancelled ? UnavailableError("redis store closed") : c.status();
      for (auto& job : batch) fail(job, s);
      return false;
    }
    conn_ = std::move(*c);
    fresh = true;
  }
  std::vector<Command> all;
  for (auto& job : batch) {
    job.fresh = fresh;
    all.insert(all.end(), job.cmds.begin(), job.cmds.end());
  }
  Status s = conn_->write(all, IoClock::now() + connect_timeout_);
  for (auto& job : batch) inflight.push_back(std::move(job));
  if (!s.ok()) {
    drop(inflight, /*deadline_passed=*/false);
    return false;
  }
  return true;
}

void RequestLoop::read_replies(std::deque<Job>& inflight) {
  for (;;) {
    auto r = conn_->read_one(IoClock::now());  // what has arrived, without waiting
    if (!r.ok() || (r->has_value() && inflight.empty())) {
      drop(inflight, /*deadline_passed=*/false);
      return;
    }
    if (!r->has_value()) return;
    Job& head = inflight.front();
    head.replies.push_back(std::move(**r));
    if (head.replies.size() < head.cmds.size()) continue;
    Job job = std::move(head);
    inflight.pop_front();
    Done done = std::move(job.done);
    done(std::move(job.replies));
  }
}

// The connection is gone (or must go: a deadline passed). Each request on
// it is sent once more on a new one, unless it timed out, was already on a
// fresh connection, or was retried before.
void RequestLoop::drop(std::deque<Job>& inflight, bool deadline_passed) {
  conn_.reset();
  const IoClock::time_point now = IoClock::now();
  std::deque<Job> again;
  std::deque<Job> failed;
  for (auto& job : inflight) {
    const bool timed_out = now >= job.deadline;
    if (!timed_out && !job.retried && !job.fresh) {
      job.retried = true;
      job.replies.clear();
      again.push_back(std::move(job));
    } else {
      failed.push_back(std::move(job));
    }
  }
  inflight.clear();
  {
    MutexLock lk(mu_);
    for (auto it = again.rbegin(); it != again.rend(); ++it) queue_.push_front(std::move(*it));
  }
  for (auto& job : failed) {
    fail(job, UnavailableError(deadline_passed && now >= job.deadline ? "redis store: request timed out"
                                                                      : "redis store: connection lost"));
  }
}

void RequestLoop::run(std::stop_token st) {
  using std::chrono::milliseconds;
  std::deque<Job> inflight;
  while (!st.stop_requested()) {
    if (!send_queued(inflight)) continue;
    IoClock::time_point wake_at = IoClock::now() + std::chrono::seconds(60);
    for (const auto& job : inflight) wake_at = std::min(wake_at, job.deadline);
    pollfd fds[3] = {{FdOf(wake_), POLLIN, 0}, {FdOf(stop_), POLLIN, 0}, {conn_ ? conn_->fd() : -1, POLLIN, 0}};
    auto ms = std::chrono::ceil<milliseconds>(wake_at - IoClock::now()).count();
    ms = std::clamp<long long>(ms, 0, wake_ ? 60'000 : 20);  // without an eventfd: look again soon
    int pr = ::poll(fds, 3, static_cast<int>(ms));
    if (pr < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) break;
    if ((fds[0].revents & POLLIN) && wake_) wake_->drain();
    if (conn_ && (fds[2].revents & (POLLIN | POLLHUP | POLLERR))) read_replies(inflight);
    const IoClock::time_point now = IoClock::now();
    if (std::any_of(inflight.begin(), inflight.end(), [&](const Job& j) { return now >= j.deadline; })) {
      drop(inflight, /*deadline_passed=*/true);
    }
  }
  for (auto& job : inflight) fail(job, UnavailableError("redis store closed"));
  std::deque<Job> left;
  {
    MutexLock lk(mu_);
    ended_ = true;
    left.swap(queue_);
  }
  for (auto& job : left) fail(job, UnavailableError("redis store closed"));
}

}  // namespace dlock::internal::redis
