// Internal: what every asynchronous recipe operation shares. An operation is
// a state machine whose steps run one at a time: on the client's executor
// thread, or, for a blocking caller, on the caller's own thread while it
// waits (CallerSteps). Each step starts one asynchronous store call (or a
// wait, or a pause) whose completion posts the next step, so an operation's
// fields need no lock. The only other way in is
// interrupt(), run when the deadline passes or `stop` is requested; it cuts
// short what the current step armed in on_interrupt_ (a wait, a pause, a
// recovery, a place in a local line), never a store request: each request
// ends by its own deadline, and its outcome must be seen, or an entry could
// be left behind.
#ifndef DLOCK_SRC_RECIPES_OPERATION_HPP_
#define DLOCK_SRC_RECIPES_OPERATION_HPP_

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string_view>
#include <utility>

#include "core/client_core.hpp"
#include "core/system_clock.hpp"
#include "dlock/store.hpp"
#include "recipes/caller_steps.hpp"

namespace dlock::internal {

// `Self` derives from Operation<Self> and defines abort(const char* what),
// which ends it with an error after an exception inside a step (memory, at
// worst): never an operation without an outcome.
template <class Self>
class Operation : public std::enable_shared_from_this<Self> {
 public:
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;

 protected:
  using Step = std::function<void(Self&)>;

  Operation(std::shared_ptr<ClientCore> client, Clock::time_point deadline, std::stop_token stop, FailureSink caller)
      : client_(client->shared_from_this()),
        user_(std::move(client)),
        deadline_(deadline),
        stop_(std::move(stop)),
        caller_(std::move(caller)) {}
  ~Operation() = default;

  Self& self() { return static_cast<Self&>(*this); }

  // A task for the executor that runs `fn` unless the operation has finished.
  std::function<void()> step(Step fn) {
    return [op = this->shared_from_this(), fn = std::move(fn)] {
      if (op->finished_) return;
      try {
        fn(*op);
      } catch (const std::exception& e) {
        op->keep(std::current_exception());
        op->abort(e.what());
      } catch (...) {
        op->keep(std::current_exception());
        op->abort("unknown exception");
      }
    };
  }

  // Queues a task where this operation's steps run (never runs it here).
  void post(std::function<void()> task) {
    if (caller_) return caller_->steps.post(std::move(task));
    client_->executor().post(std::move(task));
  }

  // A completion for the store (called on any thread): posts `fn(result)`.
  template <class T>
  std::function<void(T)> then(std::function<void(Self&, T)> fn) {
    return [op = this->shared_from_this(), fn = std::move(fn)](T result) {
      op->post(op->step([fn, result = std::make_shared<T>(std::move(result))](Self& s) { fn(s, std::move(*result)); }));
    };
  }
  // The same for a completion without a result, such as ClientCore's
  // (which run on the executor, not necessarily where the steps run).
  std::function<void()> then(Step fn) {
    return [op = this->shared_from_this(), task = step(std::move(fn))] { op->post(task); };
  }

  // A store request, whose answer `next` gets as the operation's next step.
  // On a blocking caller's own thread (its steps running there now), it is
  // made with the store's blocking form: the caller waits anyway, and the
  // answer then reaches it without a hand-over from a store thread (and,
  // on a store with a request thread, without one there either). Elsewhere
  // (the executor), with the asynchronous form.
  template <class T>
  void request(const std::function<T()>& blocking, const std::function<void(std::function<void(T)>)>& async,
               std::function<void(Self&, T)> next) {
    std::function<void(T)> done = then<T>(std::move(next));
    if (caller_ && caller_->steps.on_running_thread()) return done(blocking());
    async(std::move(done));
  }

  // Whether wait_any_gone() below would wait on this thread. Not with a
  // hand-moved client clock: the store's wait takes our deadline as real
  // time (poll's timeout), and the client's timer could not cut it short.
  bool waits_here(const Session& session) const {
    return caller_ && caller_->steps.on_running_thread() && session.waits_on_calling_thread() &&
           IsSystemClock(client_->clock());
  }

  // Waits until an entry of `ids` is gone from `queue`; `next` gets the
  // outcome as the operation's next step. On a blocking caller's own thread,
  // where the store's blocking wait sleeps in the calling thread itself
  // (Session::waits_on_calling_thread), it is made there, with the
  // operation's deadline and stop token: the wake-up reaches the caller
  // without a store thread in between (a deadline or stop posted meanwhile
  // runs after it and finds nothing armed). Otherwise the asynchronous wait
  // is armed in wait_, and a deadline or stop cancels it (its completion,
  // kCancelled, follows).
  void wait_any_gone(Session& session, std::string_view queue, std::span<const std::string> ids,
                     std::function<void(Self&, Status)> next) {
    std::function<void(Status)> done = then<Status>(std::move(next));
    if (waits_here(session)) {
      on_interrupt_ = nullptr;
      return done(session.wait_any_gone(queue, ids, deadline_, stop_));
    }
    wait_ = session.async_wait_any_gone(queue, ids, std::move(done));
    on_interrupt_ = [this] { wait_.reset(); };
  }

  // Keeps the first exception for a blocking caller (acquire.hpp, FailureSink).
  void keep(std::exception_ptr e) {
    if (caller_) caller_->keep(std::move(e));
  }

  // Arms the deadline timer and the stop callback, and keeps the operation
  // alive until it finishes: while it waits for a session to come back,
  // only weak references lead to it.
  void arm() {
    keep_alive_ = this->shared_from_this();
    std::weak_ptr<Self> weak = this->weak_from_this();
    auto interrupt = [weak] {
      if (auto op = weak.lock()) op->post(op->step([](Self& s) { s.interrupt(); }));
    };
    if (deadline_ != kNoDeadline) deadline_timer_ = client_->executor().at(deadline_, interrupt);
    stop_callback_.emplace(stop_, interrupt);
  }

  // Marks the operation finished and disarms it; the caller reports next
  // (from a step, which holds its own reference).
  void disarm() {
    finished_ = true;
    // Before the outcome is handed over: a caller that lets go of its last
    // handle once it has it must be the one that drops the last user
    // reference (ClientCore::on_last_user_gone).
    user_.reset();
    keep_alive_.reset();
    on_interrupt_ = nullptr;
    if (deadline_timer_) client_->executor().cancel(*deadline_timer_);
    stop_callback_.reset();
  }

  // The deadline passed or `stop` was requested.
  void interrupt() {
    if (auto fn = std::exchange(on_interrupt_, nullptr)) fn();
  }

  bool stopped() const { return stop_.stop_requested(); }
  bool expired() const { return stopped() || client_->now() >= deadline_; }
  static bool ended(const Session& session) {
    SessionState s = session.state();
    return s == SessionState::kLost || s == SessionState::kClosed;
  }

  // After kUnavailable: waits for `session` to come back. `next(connected)`
  // runs once: false if it did not (deadline, stop, or the session ended).
  void recover(const std::shared_ptr<Session>& session, std::function<void(Self&, bool)> next) {
    auto resolved = std::make_shared<bool>(false);
    auto resolve = [resolved, session, next](Self& s) {
      if (std::exchange(*resolved, true)) return;
      s.recovery_.reset();
      s.on_interrupt_ = nullptr;
      next(s, session->state() == SessionState::kConnected);
    };
    if (session->state() != SessionState::kSuspended || expired()) return resolve(self());
    std::weak_ptr<Self> weak = this->weak_from_this();
    recovery_ = session->subscribe([weak, resolve](SessionState state) {
      if (state == SessionState::kSuspended) return;
      if (auto op = weak.lock()) op->post(op->step(resolve));
    });
    on_interrupt_ = [this, resolve] { resolve(self()); };
    // A change between the look above and the subscription.
    if (session->state() != SessionState::kSuspended) post(step(resolve));
  }

  // Retry pacing for requests that fail at once although the session says
  // it is connected: 5 ms doubling to 500 ms, cut short by the deadline and
  // by stop. These are error retries, not waits for the lock.
  void pause(Step next) {
    auto resolved = std::make_shared<bool>(false);
    auto resume = [resolved, next](Self& s) {
      if (std::exchange(*resolved, true)) return;
      s.on_interrupt_ = nullptr;
      next(s);
    };
    const Clock::time_point until = std::min(deadline_, DeadlineAfter(client_->now(), backoff_));
    backoff_ = std::min<Clock::duration>(backoff_ * 2, std::chrono::milliseconds(500));
    client_->executor().at(until, then(Step(resume)));
    on_interrupt_ = [this, resume] { resume(self()); };
  }

  // The engine's reference, for the steps; and the caller's, which counts
  // as a handle of theirs until the outcome is handed over (see disarm()).
  const std::shared_ptr<ClientCore> client_;
  std::shared_ptr<ClientCore> user_;
  const Clock::time_point deadline_;
  const std::stop_token stop_;
  bool finished_ = false;
  std::function<void()> on_interrupt_;  // what a deadline or stop cuts short now
  std::shared_ptr<void> wait_;          // the store wait in progress
  std::shared_ptr<void> recovery_;      // the session subscription of a recovery in progress
  const FailureSink caller_;            // a blocking caller's, or null

 private:
  std::shared_ptr<Self> keep_alive_;  // from arm() to disarm()
  std::optional<Executor::TimerId> deadline_timer_;
  std::optional<std::stop_callback<std::function<void()>>> stop_callback_;
  Clock::duration backoff_ = std::chrono::milliseconds(5);
};

}  // namespace dlock::internal

#endif  // DLOCK_SRC_RECIPES_OPERATION_HPP_
