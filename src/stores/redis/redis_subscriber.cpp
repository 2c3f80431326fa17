#include "stores/redis/redis_subscriber.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>

namespace dlock::internal::redis {

struct Subscriber::Waiter {
  std::vector<std::string> ids;
  bool gone = false;             // an id of `ids` is gone
  bool signaled = false;         // something changed: look again
  bool checked = false;          // this waiter's own first check is done
  Clock::time_point retry_at{};  // when to retry a failed first check
  Status error;                  // a failure that ends this wait
  std::condition_variable_any cv;
};

struct Subscriber::Channel {
  std::string name;
  std::string queue;
  ChanState state = ChanState::kIdle;
  std::vector<Waiter*> waiters;
  IoClock::time_point linger_until{};
  // The shared re-check (see the header): when, and whether a waiter is on it.
  Clock::time_point next_check = Clock::time_point::max();
  bool check_claimed = false;
};

namespace {

void Signal(int fd) noexcept {
  std::uint64_t one = 1;
  ssize_t n = ::write(fd, &one, sizeof one);
  (void)n;  // an eventfd only fails when its counter would overflow
}

void Drain(int fd) noexcept {
  std::uint64_t v = 0;
  ssize_t n = ::read(fd, &v, sizeof v);
  (void)n;
}

void SplitIds(std::string_view payload, std::vector<std::string>& out) {
  while (!payload.empty()) {
    auto sp = payload.find(' ');
    std::string_view one = payload.substr(0, sp);
    if (!one.empty()) out.emplace_back(one);
    if (sp == std::string_view::npos) break;
    payload.remove_prefix(sp + 1);
  }
}

// Runs a check; an exception (out of memory) becomes an error, so that the
// wait's bookkeeping under the mutex stays consistent.
Result<CheckResult> SafeCheck(const Subscriber::CheckFn& check, const std::string& queue,
                              const std::vector<std::string>& ids) {
  try {
    return check(queue, ids);
  } catch (const std::exception& e) {
    return InternalError(std::string("checking queue ") + queue + ": " + e.what());
  }
}

}  // namespace

Subscriber::Subscriber(SubscriberOptions options) : opt_(std::move(options)) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  clock_subscription_ = opt_.clock->on_advance([this] { Poke(); });
  thread_ = std::jthread([this](std::stop_token st) { Run(st); });
}

Subscriber::~Subscriber() {
  clock_subscription_.reset();
  thread_.request_stop();
  if (stop_fd_ >= 0) Signal(stop_fd_);
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void Subscriber::Wake() {
  if (wake_fd_ >= 0) Signal(wake_fd_);
}

void Subscriber::Poke() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [name, ch] : channels_) {
    for (Waiter* w : ch->waiters) {
      w->signaled = true;
      w->cv.notify_all();
    }
  }
}

SubscriberStats Subscriber::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

Clock::time_point Subscriber::NextCheck(Clock::time_point now, std::int64_t soonest_ms) const {
  using std::chrono::milliseconds;
  if (soonest_ms < 0) return now + opt_.ttl;
  // Just after the soonest lease can have run out (a live session renews it
  // before then, and the next check looks again); never sooner than 20ms and
  // never later than one TTL.
  auto after =
      std::clamp(milliseconds(soonest_ms) + milliseconds(10), milliseconds(20), std::max(opt_.ttl, milliseconds(20)));
  return now + after;
}

void Subscriber::MarkGone(Channel& ch, const std::vector<std::string>& gone) {
  if (gone.empty()) return;
  for (Waiter* w : ch.waiters) {
    if (w->gone) continue;
    for (const auto& id : w->ids) {
      if (std::find(gone.begin(), gone.end(), id) != gone.end()) {
        w->gone = true;
        w->cv.notify_all();
        break;
      }
    }
  }
}

void Subscriber::Dispatch(const std::string& channel, std::string_view payload) {
  auto it = channels_.find(channel);
  if (it == channels_.end()) return;
  std::vector<std::string> ids;
  SplitIds(payload, ids);
  MarkGone(*it->second, ids);
}

void Subscriber::DropConnection() {
  connected_ = false;
  for (auto it = channels_.begin(); it != channels_.end();) {
    it->second->state = ChanState::kIdle;
    if (it->second->waiters.empty()) {
      it = channels_.erase(it);
    } else {
      ++it;
    }
  }
}

Status Subscriber::Wait(const std::string& queue, const std::string& channel, const std::vector<std::string>& ids,
                        Clock::time_point deadline, std::stop_token stop, const SessionFn& session,
                        const CheckFn& check) {
  Waiter w;
  w.ids = ids;
  std::unique_lock<std::mutex> lk(mu_);
  auto& slot = channels_[channel];
  if (!slot) {
    slot = std::make_unique<Channel>();
    slot->name = channel;
    slot->queue = queue;
  }
  Channel* ch = slot.get();
  ch->waiters.push_back(&w);
  Wake();  // subscribe if not yet
  struct Leave {
    Subscriber* self;
    Channel* ch;
    Waiter* w;
    ~Leave() {
      std::erase(ch->waiters, w);
      if (ch->waiters.empty()) {
        ch->linger_until = IoClock::now() + self->opt_.linger;
        self->Wake();
      }
    }
  };
  // Declared after `lk`, so destroyed before it: leaves under mu_.
  Leave leave{this, ch, &w};
  const Clock& clock = *opt_.clock;
  for (;;) {
    // A lost session first: its own entries are gone too, whatever else went.
    if (Status s = session(); !s.ok()) return s;
    if (w.gone) return OkStatus();
    if (!w.error.ok()) return w.error;
    if (stop.stop_requested()) return CancelledError("waiting on queue " + queue + ": cancelled");
    Clock::time_point now = clock.now();
    if (now >= deadline) return DeadlineExceededError("waiting on queue " + queue);
    bool subscribed = ch->state == ChanState::kSubscribed;

    if (subscribed && !w.checked && now >= w.retry_at) {
      // First check, after the subscription is confirmed: a release from now
      // on is published to us; one before is seen by the check.
      lk.unlock();
      auto r = SafeCheck(check, queue, ids);
      lk.lock();
      ++stats_.checks;
      if (r.ok()) {
        w.checked = true;
        MarkGone(*ch, r->gone);
        Clock::time_point next = NextCheck(clock.now(), r->soonest_ttl_ms);
        if (next < ch->next_check) {
          ch->next_check = next;
          for (Waiter* o : ch->waiters) {
            o->signaled = true;
            o->cv.notify_all();
          }
        }
      } else if (r.status().code() == ErrorCode::kUnavailable) {
        w.retry_at = clock.now() + opt_.retry_interval;  // keep waiting through the outage
      } else {
        return r.status();
      }
      continue;
    }
    if (subscribed && w.checked && !ch->check_claimed && now >= ch->next_check) {
      // The queue's shared re-check, for every waiter on it at once.
      ch->check_claimed = true;
      std::vector<std::string> all;
      for (Waiter* o : ch->waiters) {
        if (!o->checked || o->gone) continue;
        for (const auto& id : o->ids) {
          if (std::find(all.begin(), all.end(), id) == all.end()) all.push_back(id);
        }
      }
      lk.unlock();
      auto r = SafeCheck(check, queue, all);
      lk.lock();
      ++stats_.checks;
      ++stats_.fallback_checks;
      ch->check_claimed = false;
      if (r.ok()) {
        MarkGone(*ch, r->gone);
        ch->next_check = NextCheck(clock.now(), r->soonest_ttl_ms);
      } else {
        ch->next_check = clock.now() + opt_.retry_interval;
      }
      for (Waiter* o : ch->waiters) {
        o->signaled = true;
        o->cv.notify_all();
      }
      continue;
    }
    Clock::time_point wake = deadline;
    if (subscribed && !w.checked) wake = std::min(wake, w.retry_at);
    if (subscribed && w.checked && !ch->check_claimed) wake = std::min(wake, ch->next_check);
    w.signaled = false;
    clock.wait_until(w.cv, lk, stop, wake, [&] { return w.signaled || w.gone || !w.error.ok(); });
  }
}

void Subscriber::Run(std::stop_token st) {
  using std::chrono::milliseconds;
  std::unique_ptr<Conn> conn;
  IoClock::time_point next_connect = IoClock::now();
  const auto ping_every = std::clamp(opt_.ttl, milliseconds(1000), milliseconds(30'000));
  IoClock::time_point next_ping = IoClock::time_point::max();
  bool ping_outstanding = false;
  IoClock::time_point pong_deadline{};

  auto drop = [&] {
    conn.reset();
    ping_outstanding = false;
    next_ping = IoClock::time_point::max();
    std::lock_guard<std::mutex> g(mu_);
    DropConnection();
  };

  while (!st.stop_requested()) {
    std::vector<Command> to_send;
    bool want_connection = false;
    IoClock::time_point now = IoClock::now();
    IoClock::time_point wake_at = now + std::chrono::seconds(60);
    {
      std::lock_guard<std::mutex> g(mu_);
      for (auto it = channels_.begin(); it != channels_.end();) {
        Channel& ch = *it->second;
        bool wanted = !ch.waiters.empty() || now < ch.linger_until;
        if (ch.waiters.empty() && now < ch.linger_until) wake_at = std::min(wake_at, ch.linger_until);
        if (wanted) want_connection = true;
        if (conn) {
          if (wanted && ch.state == ChanState::kIdle) {
            to_send.push_back({"SUBSCRIBE", ch.name});
            ch.state = ChanState::kSubscribing;
            ++stats_.subscribes;
          } else if (!wanted && ch.state == ChanState::kSubscribed) {
            to_send.push_back({"UNSUBSCRIBE", ch.name});
            ch.state = ChanState::kUnsubscribing;
          }
        }
        if (!wanted && ch.state == ChanState::kIdle) {
          it = channels_.erase(it);
        } else {
          ++it;
        }
      }
    }

    if (!conn && want_connection) {
      if (now >= next_connect) {
        auto c = Conn::Open(opt_.endpoint, now + opt_.io_timeout, stop_fd_);
        if (c.ok()) {
          conn = std::move(*c);
          next_ping = IoClock::now() + ping_every;
          std::lock_guard<std::mutex> g(mu_);
          connected_ = true;
          ++stats_.connects;
          continue;  // subscribe to everything wanted
        }
        if (c.status().code() == ErrorCode::kCancelled) break;
        if (c.status().code() == ErrorCode::kUnauthenticated || c.status().code() == ErrorCode::kPermissionDenied) {
          // Retrying will not help the waits: tell them.
          std::lock_guard<std::mutex> g(mu_);
          for (auto& [name, ch] : channels_) {
            for (Waiter* w : ch->waiters) {
              w->error = c.status();
              w->cv.notify_all();
            }
          }
        }
        next_connect = IoClock::now() + opt_.retry_interval;
      }
      wake_at = std::min(wake_at, next_connect);
    }

    if (conn && !to_send.empty()) {
      if (!conn->Write(to_send, IoClock::now() + opt_.io_timeout).ok()) {
        drop();
        continue;
      }
    }

    if (conn) {
      bool any;
      {
        std::lock_guard<std::mutex> g(mu_);
        any = !channels_.empty();
      }
      now = IoClock::now();
      if (ping_outstanding) {
        if (now >= pong_deadline) {  // a server that stopped answering
          drop();
          continue;
        }
        wake_at = std::min(wake_at, pong_deadline);
      } else if (any) {
        if (now >= next_ping) {
          if (!conn->Write({{"PING"}}, now + opt_.io_timeout).ok()) {
            drop();
            continue;
          }
          ping_outstanding = true;
          pong_deadline = now + opt_.io_timeout;
          wake_at = std::min(wake_at, pong_deadline);
        } else {
          wake_at = std::min(wake_at, next_ping);
        }
      }
    }

    pollfd fds[3] = {{wake_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}, {conn ? conn->fd() : -1, POLLIN, 0}};
    auto ms = std::chrono::ceil<milliseconds>(wake_at - IoClock::now()).count();
    ms = std::clamp<long long>(ms, 0, 60'000);
    int pr = ::poll(fds, conn ? 3 : 2, static_cast<int>(ms));
    if (pr < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) break;
    if (fds[0].revents & POLLIN) Drain(wake_fd_);
    if (conn && (fds[2].revents & (POLLIN | POLLHUP | POLLERR))) {
      for (;;) {
        auto r = conn->ReadOne(IoClock::now());
        if (!r.ok()) {
          drop();
          break;
        }
        if (!r->has_value()) break;
        const Reply& reply = **r;
        if (reply.is_error()) {
          // Only an ACL can refuse a SUBSCRIBE: tell the waits of the
          // channels we were subscribing to.
          Status s = ErrorReplyStatus(reply.str(), "subscribing to queue notifications");
          std::lock_guard<std::mutex> g(mu_);
          for (auto& [name, ch] : channels_) {
            if (ch->state != ChanState::kSubscribing) continue;
            for (Waiter* w : ch->waiters) {
              w->error = s;
              w->cv.notify_all();
            }
          }
          continue;
        }
        if (!reply.is_array() || reply.size() < 2) continue;
        std::string_view kind = ElementStr(reply.element(0));
        std::string name(ElementStr(reply.element(1)));
        std::lock_guard<std::mutex> g(mu_);
        if (kind == "message" && reply.size() >= 3) {
          ++stats_.messages;
          Dispatch(name, ElementStr(reply.element(2)));
        } else if (kind == "subscribe") {
          auto it = channels_.find(name);
          if (it == channels_.end()) continue;
          Channel& ch = *it->second;
          ch.state = ChanState::kSubscribed;
          // Waiters that checked under an earlier subscription may have missed
          // messages while it was down: re-check the queue now.
          bool stale = std::any_of(ch.waiters.begin(), ch.waiters.end(), [](Waiter* w) { return w->checked; });
          if (stale) ch.next_check = opt_.clock->now();
          for (Waiter* w : ch.waiters) {
            w->signaled = true;
            w->cv.notify_all();
          }
        } else if (kind == "unsubscribe") {
          auto it = channels_.find(name);
          if (it != channels_.end() && it->second->state == ChanState::kUnsubscribing) {
            it->second->state = ChanState::kIdle;
          }
        } else if (kind == "pong") {
          ping_outstanding = false;
          next_ping = IoClock::now() + ping_every;
        }
      }
    }
  }
  std::lock_guard<std::mutex> g(mu_);
  connected_ = false;
}

}  // namespace dlock::internal::redis
