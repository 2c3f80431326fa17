// Internal: a thread of an etcd:// store (it has two: one for requests and
// watches, one for leases), and the streams it drives.
//
// Every asynchronous gRPC operation started on a Loop (posted there from
// any thread) completes on its one grpc::CompletionQueue, which the Loop's
// thread drains: gRPC's own threads never run dlock code (docs/etcd.md,
// "Threads"). The same thread runs timers and tasks posted from other
// threads, so the streams' state needs no lock: it belongs to this thread.
//
// Shutting down: shut_down() cancels every call in flight; the thread keeps
// draining until the last operation has come back, then shuts the queue
// down and ends. The thread holds a reference to its loop, so a completion
// may drop the last reference to the loop's owner.
#ifndef DLOCK_SRC_STORES_ETCD_ETCD_LOOP_HPP_
#define DLOCK_SRC_STORES_ETCD_ETCD_LOOP_HPP_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "core/thread_annotations.hpp"

namespace dlock::internal::etcd {

class Loop : public std::enable_shared_from_this<Loop> {
 public:
  using Task = std::function<void()>;
  using TimePoint = std::chrono::steady_clock::time_point;

  // `name`: the thread's (a string literal, at most 15 characters).
  static std::shared_ptr<Loop> start(const char* name);
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // Cancels what is in flight and ends the thread once it has all come back.
  // Joins the thread, except from the thread itself. Idempotent.
  void shut_down() noexcept DLOCK_EXCLUDES(mu_);

  bool on_loop_thread() const noexcept { return std::this_thread::get_id() == thread_id_; }

  // Any thread: runs `task` on the loop thread, after the tasks posted
  // before it. False (and `task` dropped) once the loop is shutting down.
  bool post(Task task) DLOCK_EXCLUDES(mu_);

  // Loop thread only (so that every gRPC operation of a store, and the
  // objects it fills in, belong to one thread; gRPC is not built with
  // ThreadSanitizer, which could not see a hand-over between threads): a tag
  // for one gRPC operation of the call `ctx`, which must be started on
  // queue() right away; `fn(ok)` runs on the loop thread when it completes. nullptr once the loop is shutting down
  // (start nothing), unless `ctx` already has an operation in flight (a stream's next step, e.g. its Finish after a
  // failed read, is always allowed). The loop cancels `ctx` when it shuts down.
  void* tag(grpc::ClientContext* ctx, std::function<void(bool)> fn) DLOCK_EXCLUDES(mu_);
  grpc::CompletionQueue* queue() { return &cq_; }
  // Loop thread only: runs `task` on the loop thread at `when` (real time),
  // unless cancelled before. Ids are never 0.
  std::uint64_t at(TimePoint when, Task task);
  void cancel_timer(std::uint64_t id);

  // Any thread: keeps `object` until the thread has drained every operation
  // (objects whose callbacks may still be in flight when their owner goes).
  void keep_until_drained(std::shared_ptr<void> object) DLOCK_EXCLUDES(mu_);

 private:
  struct Tag {
    grpc::ClientContext* ctx;
    std::function<void(bool)> fn;
  };

  Loop() = default;
  void run();
  void run_due_timers();
  void run_posted() DLOCK_EXCLUDES(mu_);
  void finish(Tag* t, bool ok) DLOCK_EXCLUDES(mu_);
  bool drained() DLOCK_EXCLUDES(mu_);

  grpc::CompletionQueue cq_;
  grpc::Alarm wake_;  // set (in the past) to wake the thread for posted tasks
  char wake_tag_ = 0;
  std::thread::id thread_id_;

  Mutex mu_;
  std::deque<Task> posted_ DLOCK_GUARDED_BY(mu_);
  bool wake_set_ DLOCK_GUARDED_BY(mu_) = false;
  bool stopping_ DLOCK_GUARDED_BY(mu_) = false;
  std::uint64_t outstanding_ DLOCK_GUARDED_BY(mu_) = 0;              // tags handed out and not yet finished
  std::map<grpc::ClientContext*, int> calls_ DLOCK_GUARDED_BY(mu_);  // operations in flight per call
  std::vector<std::shared_ptr<void>> kept_ DLOCK_GUARDED_BY(mu_);

  // The loop thread's only.
  std::map<std::pair<TimePoint, std::uint64_t>, Task> timers_;
  std::map<std::uint64_t, TimePoint> timer_index_;
  std::uint64_t next_timer_ = 1;

  Mutex thread_mu_;
  std::thread thread_ DLOCK_GUARDED_BY(thread_mu_);
};

// A bidirectional stream on a Loop: at most one read and one write in flight
// (gRPC's rule), writes queued in order, Finish once both are done. Loop
// thread only, except where said.
template <class Request, class Response>
class BidiStream {
 public:
  using Prepare = std::function<std::unique_ptr<grpc::ClientAsyncReaderWriter<Request, Response>>(
      grpc::ClientContext*, grpc::CompletionQueue*)>;
  struct Handlers {
    std::function<void()> on_ready;                   // started: writes go out now
    std::function<void(Response&)> on_message;        // every message, in order
    std::function<void(const grpc::Status&)> on_end;  // once; the stream is done for
  };

  BidiStream(std::shared_ptr<Loop> loop, Handlers handlers) : loop_(std::move(loop)), handlers_(std::move(handlers)) {}

  // Opens a new stream (the previous one must have ended). `setup` adds
  // metadata to the context.
  void open(const Prepare& prepare, const std::function<void(grpc::ClientContext&)>& setup) {
    ctx_ = std::make_unique<grpc::ClientContext>();  // the last stream's is no longer in flight
    setup(*ctx_);
    open_ = true;
    ready_ = false;
    ended_ = false;
    read_pending_ = write_pending_ = false;
    writes_.clear();
    ++generation_;
    void* t = loop_->tag(ctx_.get(), [this, g = generation_](bool ok) {
      if (g != generation_) return;
      start_pending_ = false;
      if (!ok || ended_) return fail();
      ready_ = true;
      read_next();
      if (handlers_.on_ready) handlers_.on_ready();
    });
    if (t == nullptr) {
      open_ = false;
      return;
    }
    stream_ = prepare(ctx_.get(), loop_->queue());
    start_pending_ = true;
    stream_->StartCall(t);
  }

  bool ready() const { return ready_ && !ended_; }
  bool open_or_opening() const { return open_; }

  // Queues a message; dropped unless ready().
  void write(Request req) {
    if (!ready()) return;
    writes_.push_back(std::move(req));
    write_next();
  }

  // Ends the stream (its on_end follows).
  void cancel() {
    if (open_) ctx_->TryCancel();
  }

 private:
  void read_next() {
    if (ended_) return;
    void* t = loop_->tag(ctx_.get(), [this, g = generation_](bool ok) {
      if (g != generation_) return;
      read_pending_ = false;
      if (!ok || ended_) return fail();
      handlers_.on_message(response_);
      read_next();
    });
    if (t == nullptr) return fail();
    read_pending_ = true;
    stream_->Read(&response_, t);
  }

  void write_next() {
    if (write_pending_ || writes_.empty() || ended_) return;
    void* t = loop_->tag(ctx_.get(), [this, g = generation_](bool ok) {
      if (g != generation_) return;
      write_pending_ = false;
      if (!ok || ended_) return fail();
      writes_.pop_front();
      write_next();
    });
    if (t == nullptr) return fail();
    write_pending_ = true;
    stream_->Write(writes_.front(), t);
  }

  // The stream failed: once no read or write is in flight, Finish it for
  // its status, then tell the owner.
  void fail() {
    if (!ended_) {
      ended_ = true;
      ctx_->TryCancel();
    }
    if (read_pending_ || write_pending_ || start_pending_ || finishing_) return;
    finishing_ = true;
    void* t = loop_->tag(ctx_.get(), [this, g = generation_](bool) {
      if (g != generation_) return;
      finishing_ = false;
      end(status_);
    });
    if (t == nullptr) return end(grpc::Status(grpc::StatusCode::CANCELLED, "the store is closing"));
    stream_->Finish(&status_, t);
  }

  void end(const grpc::Status& status) {
    // ctx_ stays until the next open(): the loop still counts this call as
    // in flight until the completion that runs this returns, and a
    // concurrent shut_down() may cancel it meanwhile.
    stream_.reset();
    open_ = false;
    writes_.clear();
    ready_ = false;
    ++generation_;
    handlers_.on_end(status);
  }

  std::shared_ptr<Loop> loop_;
  Handlers handlers_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<Request, Response>> stream_;
  Response response_;
  grpc::Status status_;
  std::deque<Request> writes_;
  std::uint64_t generation_ = 0;  // completions of an ended stream are ignored
  bool open_ = false;             // opened, and not ended yet
  bool ready_ = false;
  bool ended_ = false;
  bool start_pending_ = false;
  bool read_pending_ = false;
  bool write_pending_ = false;
  bool finishing_ = false;
};

}  // namespace dlock::internal::etcd

#endif  // DLOCK_SRC_STORES_ETCD_ETCD_LOOP_HPP_
