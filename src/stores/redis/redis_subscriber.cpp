#include "stores/redis/redis_subscriber.hpp"

#include <poll.h>
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

// The connection and its keep-alive PINGs. Only the subscriber thread
// touches them: no lock.
struct Subscriber::Link {
  std::unique_ptr<Conn> conn;
  IoClock::time_point next_connect = IoClock::now();
  IoClock::duration ping_every{};
  IoClock::time_point next_ping = IoClock::time_point::max();
  bool ping_outstanding = false;
  IoClock::time_point pong_deadline{};
};

// What the channel table asks of the connection, read at the top of each
// turn of the subscriber thread.
struct Subscriber::Plan {
  std::vector<Command> to_send;  // SUBSCRIBEs and UNSUBSCRIBEs (only when connected)
  bool want_connection = false;  // some channel has waiters or lingers
  IoClock::time_point wake_at;   // when the soonest lingering channel ends, at most a minute away
};

namespace {

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

Subscriber::Subscriber(SubscriberOptions options)
    : opt_(std::move(options)), wake_(MaybeSignal()), stop_(MaybeSignal()) {
  clock_subscription_ = opt_.clock->on_advance([this] { poke(); });
  thread_ = std::jthread([this](std::stop_token st) { run(st); });
}

Subscriber::~Subscriber() {
  clock_subscription_.reset();
  thread_.request_stop();
  if (stop_) stop_->signal();
  if (thread_.joinable()) thread_.join();
}

void Subscriber::wake() const {
  if (wake_) wake_->signal();
}

void Subscriber::poke() {
  MutexLock lk(mu_);
  for (auto& [name, ch] : channels_) signal_all(*ch);
}

SubscriberStats Subscriber::stats() const {
  MutexLock lk(mu_);
  return stats_;
}

Clock::time_point Subscriber::next_check_at(Clock::time_point now, std::int64_t soonest_ms) const {
  using std::chrono::milliseconds;
  if (soonest_ms < 0) return now + opt_.ttl;
  // Just after the soonest lease can have run out (a live session renews it
  // before then, and the next check looks again); never sooner than 20ms and
  // never later than one TTL.
  auto after =
      std::clamp(milliseconds(soonest_ms) + milliseconds(10), milliseconds(20), std::max(opt_.ttl, milliseconds(20)));
  return now + after;
}

void Subscriber::signal_all(Channel& ch) {
  for (Waiter* w : ch.waiters) {
    w->signaled = true;
    w->cv.notify_all();
  }
}

void Subscriber::mark_gone(Channel& ch, const std::vector<std::string>& gone) {
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

// --- Waits
//
// A wait registers a Waiter on its channel and sleeps on the Waiter's cv.
// Each time it wakes, it first looks whether it is done (session lost, an id
// gone, an error, cancelled, deadline), then whether it has a check to run:
// its own first check once the channel is subscribed, or the queue's shared
// re-check when that is due and no other waiter has claimed it. Checks run
// without mu_.

Subscriber::Channel& Subscriber::join(const std::string& queue, const std::string& channel, Waiter& w) {
  auto& slot = channels_[channel];
  if (!slot) {
    slot = std::make_unique<Channel>();
    slot->name = channel;
    slot->queue = queue;
  }
  slot->waiters.push_back(&w);
  wake();  // the subscriber thread subscribes if not yet
  return *slot;
}

void Subscriber::leave(Channel& ch, Waiter& w) {
  std::erase(ch.waiters, &w);
  if (ch.waiters.empty()) {
    // The subscriber thread keeps the subscription for a while, then drops it.
    ch.linger_until = IoClock::now() + opt_.linger;
    wake();
  }
}

Status Subscriber::after_first_check(Channel& ch, Waiter& w, const Result<CheckResult>& r) {
  ++stats_.checks;
  if (r.ok()) {
    w.checked = true;
    mark_gone(ch, r->gone);
    Clock::time_point next = next_check_at(opt_.clock->now(), r->soonest_ttl_ms);
    // A sooner lease end than the channel knew of: every waiter re-reads
    // when to wake.
    if (next < ch.next_check) {
      ch.next_check = next;
      signal_all(ch);
    }
    return OkStatus();
  }
  if (r.status().code() == ErrorCode::kUnavailable) {
    w.retry_at = opt_.clock->now() + opt_.retry_interval;  // keep waiting through the outage
    return OkStatus();
  }
  return r.status();
}

std::vector<std::string> Subscriber::claim_recheck(Channel& ch) {
  ch.check_claimed = true;
  // The ids of every waiter still waiting; a waiter that has not made its
  // first check yet makes it itself.
  std::vector<std::string> all;
  for (Waiter* o : ch.waiters) {
    if (!o->checked || o->gone) continue;
    for (const auto& id : o->ids) {
      if (std::find(all.begin(), all.end(), id) == all.end()) all.push_back(id);
    }
  }
  return all;
}

void Subscriber::after_recheck(Channel& ch, const Result<CheckResult>& r) {
  ++stats_.checks;
  ++stats_.fallback_checks;
  ch.check_claimed = false;
  if (r.ok()) {
    mark_gone(ch, r->gone);
    ch.next_check = next_check_at(opt_.clock->now(), r->soonest_ttl_ms);
  } else {
    ch.next_check = opt_.clock->now() + opt_.retry_interval;
  }
  // The re-check is free to claim again, at a new time.
  signal_all(ch);
}

Status Subscriber::wait(const std::string& queue, const std::string& channel, const std::vector<std::string>& ids,
                        Clock::time_point deadline, std::stop_token stop, const SessionFn& session,
                        const CheckFn& check) {
  Waiter w;
  w.ids = ids;
  MutexLock lk(mu_);
  Channel& ch = join(queue, channel, w);
  struct Leave {
    Subscriber* self;
    Channel* ch;
    Waiter* w;
    ~Leave() {
      self->mu_.assert_held();  // declared after `lk`, so destroyed before it
      self->leave(*ch, *w);
    }
  };
  Leave leave{this, &ch, &w};
  const Clock& clock = *opt_.clock;
  for (;;) {
    // A lost session first: its own entries are gone too, whatever else went.
    if (Status s = session(); !s.ok()) return s;
    if (w.gone) return OkStatus();
    if (!w.error.ok()) return w.error;
    if (stop.stop_requested()) return CancelledError("waiting on queue " + queue + ": cancelled");
    Clock::time_point now = clock.now();
    if (now >= deadline) return DeadlineExceededError("waiting on queue " + queue);
    const bool subscribed = ch.state == ChanState::kSubscribed;

    if (subscribed && !w.checked && now >= w.retry_at) {
      // First check, after the subscription is confirmed: a release from now
      // on is published to us; one before is seen by the check.
      lk.unlock();
      auto r = SafeCheck(check, queue, ids);
      lk.lock();
      if (Status s = after_first_check(ch, w, r); !s.ok()) return s;
      continue;
    }
    if (subscribed && w.checked && !ch.check_claimed && now >= ch.next_check) {
      // The queue's shared re-check, for every waiter on it at once.
      std::vector<std::string> all = claim_recheck(ch);
      lk.unlock();
      auto r = SafeCheck(check, queue, all);
      lk.lock();
      after_recheck(ch, r);
      continue;
    }
    // Nothing to do: sleep until a message, a poke, the deadline, or the
    // next check this waiter may have to make.
    Clock::time_point wake_at = deadline;
    if (subscribed && !w.checked) wake_at = std::min(wake_at, w.retry_at);
    if (subscribed && w.checked && !ch.check_claimed) wake_at = std::min(wake_at, ch.next_check);
    w.signaled = false;
    clock.wait_until(w.cv, lk.native(), stop, wake_at, [&] { return w.signaled || w.gone || !w.error.ok(); });
  }
}

// --- The subscriber thread
//
// Each turn: read from the channel table what to (un)subscribe, connect if
// a channel is wanted and there is no connection, send the (UN)SUBSCRIBEs,
// PING a connection that has been quiet, then poll for replies, a wake-up or
// the stop signal. Any I/O failure drops the connection: every channel goes
// back to kIdle, and the next turns reconnect and subscribe again.

Subscriber::Plan Subscriber::plan(bool connected, IoClock::time_point now) {
  Plan p;
  p.wake_at = now + std::chrono::seconds(60);
  MutexLock lk(mu_);
  for (auto it = channels_.begin(); it != channels_.end();) {
    Channel& ch = *it->second;
    // A channel is wanted while it has waiters, and lingers a while after.
    const bool wanted = !ch.waiters.empty() || now < ch.linger_until;
    if (ch.waiters.empty() && now < ch.linger_until) p.wake_at = std::min(p.wake_at, ch.linger_until);
    if (wanted) p.want_connection = true;
    if (connected) {
      if (wanted && ch.state == ChanState::kIdle) {
        p.to_send.push_back({"SUBSCRIBE", ch.name});
        ch.state = ChanState::kSubscribing;
        ++stats_.subscribes;
      } else if (!wanted && ch.state == ChanState::kSubscribed) {
        p.to_send.push_back({"UNSUBSCRIBE", ch.name});
        ch.state = ChanState::kUnsubscribing;
      }
    }
    // Forgotten only once the server is done with it (or the connection is).
    if (!wanted && ch.state == ChanState::kIdle) {
      it = channels_.erase(it);
    } else {
      ++it;
    }
  }
  return p;
}

Subscriber::Step Subscriber::connect(Link& link, IoClock::time_point now, IoClock::time_point& wake_at) {
  if (now >= link.next_connect) {
    auto c = Conn::open(opt_.endpoint, now + opt_.io_timeout, FdOf(stop_));
    if (c.ok()) {
      link.conn = std::move(*c);
      link.next_ping = IoClock::now() + link.ping_every;
      MutexLock lk(mu_);
      ++stats_.connects;
      return Step::kRestart;  // subscribe to everything wanted
    }
    if (c.status().code() == ErrorCode::kCancelled) return Step::kStop;
    if (c.status().code() == ErrorCode::kUnauthenticated || c.status().code() == ErrorCode::kPermissionDenied) {
      // Retrying will not help the waits: tell them.
      fail_waiters(c.status(), /*only_subscribing=*/false);
    }
    link.next_connect = IoClock::now() + opt_.retry_interval;
  }
  wake_at = std::min(wake_at, link.next_connect);
  return Step::kGoOn;
}

Subscriber::Step Subscriber::ping(Link& link, IoClock::time_point& wake_at) {
  bool any = false;
  {
    MutexLock lk(mu_);
    any = !channels_.empty();
  }
  const IoClock::time_point now = IoClock::now();
  if (link.ping_outstanding) {
    if (now >= link.pong_deadline) {  // a server that stopped answering
      drop(link);
      return Step::kRestart;
    }
    wake_at = std::min(wake_at, link.pong_deadline);
  } else if (any) {
    // Only while a channel is in use: an idle connection need not be watched.
    if (now >= link.next_ping) {
      if (!link.conn->write({{"PING"}}, now + opt_.io_timeout).ok()) {
        drop(link);
        return Step::kRestart;
      }
      link.ping_outstanding = true;
      link.pong_deadline = now + opt_.io_timeout;
      wake_at = std::min(wake_at, link.pong_deadline);
    } else {
      wake_at = std::min(wake_at, link.next_ping);
    }
  }
  return Step::kGoOn;
}

Subscriber::Step Subscriber::await_input(Link& link, IoClock::time_point wake_at) {
  using std::chrono::milliseconds;
  pollfd fds[3] = {{FdOf(wake_), POLLIN, 0}, {FdOf(stop_), POLLIN, 0}, {link.conn ? link.conn->fd() : -1, POLLIN, 0}};
  auto ms = std::chrono::ceil<milliseconds>(wake_at - IoClock::now()).count();
  ms = std::clamp<long long>(ms, 0, 60'000);
  int pr = ::poll(fds, link.conn ? 3 : 2, static_cast<int>(ms));
  if (pr < 0 && errno != EINTR) return Step::kStop;
  if (fds[1].revents & POLLIN) return Step::kStop;
  if ((fds[0].revents & POLLIN) && wake_) wake_->drain();
  if (link.conn && (fds[2].revents & (POLLIN | POLLHUP | POLLERR))) read_replies(link);
  return Step::kGoOn;
}

void Subscriber::read_replies(Link& link) {
  // Everything that has arrived, without waiting for more.
  for (;;) {
    auto r = link.conn->read_one(IoClock::now());
    if (!r.ok()) {
      drop(link);
      return;
    }
    if (!r->has_value()) return;
    handle_reply(link, **r);
  }
}

void Subscriber::handle_reply(Link& link, const Reply& reply) {
  if (reply.is_error()) {
    // Only an ACL can refuse a SUBSCRIBE: tell the waits of the channels we
    // were subscribing to.
    fail_waiters(ErrorReplyStatus(reply.str(), "subscribing to queue notifications"), /*only_subscribing=*/true);
    return;
  }
  if (!reply.is_array() || reply.size() < 2) return;
  std::string_view kind = ElementStr(reply.element(0));
  std::string name(ElementStr(reply.element(1)));
  MutexLock lk(mu_);
  if (kind == "message" && reply.size() >= 3) {
    ++stats_.messages;
    dispatch(name, ElementStr(reply.element(2)));
  } else if (kind == "subscribe") {
    on_subscribed(name);
  } else if (kind == "unsubscribe") {
    on_unsubscribed(name);
  } else if (kind == "pong") {
    link.ping_outstanding = false;
    link.next_ping = IoClock::now() + link.ping_every;
  }
}

void Subscriber::fail_waiters(const Status& s, bool only_subscribing) {
  MutexLock lk(mu_);
  for (auto& [name, ch] : channels_) {
    if (only_subscribing && ch->state != ChanState::kSubscribing) continue;
    for (Waiter* w : ch->waiters) {
      w->error = s;
      w->cv.notify_all();
    }
  }
}

void Subscriber::on_subscribed(const std::string& name) {
  auto it = channels_.find(name);
  if (it == channels_.end()) return;
  Channel& ch = *it->second;
  ch.state = ChanState::kSubscribed;
  // Waiters that checked under an earlier subscription may have missed
  // messages while it was down: re-check the queue now.
  bool stale = std::any_of(ch.waiters.begin(), ch.waiters.end(), [](Waiter* w) { return w->checked; });
  if (stale) ch.next_check = opt_.clock->now();
  // Waiters that have not checked yet may now.
  signal_all(ch);
}

void Subscriber::on_unsubscribed(const std::string& name) {
  auto it = channels_.find(name);
  if (it != channels_.end() && it->second->state == ChanState::kUnsubscribing) {
    it->second->state = ChanState::kIdle;  // the next plan() forgets it, or subscribes again
  }
}

void Subscriber::dispatch(const std::string& channel, std::string_view payload) {
  auto it = channels_.find(channel);
  if (it == channels_.end()) return;
  std::vector<std::string> ids;
  SplitIds(payload, ids);
  mark_gone(*it->second, ids);
}

void Subscriber::drop(Link& link) {
  link.conn.reset();
  link.ping_outstanding = false;
  link.next_ping = IoClock::time_point::max();
  MutexLock lk(mu_);
  // Every subscription went with the connection; a channel nobody waits on
  // any more is forgotten now.
  for (auto it = channels_.begin(); it != channels_.end();) {
    it->second->state = ChanState::kIdle;
    if (it->second->waiters.empty()) {
      it = channels_.erase(it);
    } else {
      ++it;
    }
  }
}

void Subscriber::run(std::stop_token st) {
  Link link;
  link.ping_every = std::clamp(opt_.ttl, std::chrono::milliseconds(1000), std::chrono::milliseconds(30'000));
  while (!st.stop_requested()) {
    const IoClock::time_point now = IoClock::now();
    Plan p = plan(link.conn != nullptr, now);
    IoClock::time_point wake_at = p.wake_at;
    if (!link.conn && p.want_connection) {
      Step s = connect(link, now, wake_at);
      if (s == Step::kStop) break;        // stopped while connecting
      if (s == Step::kRestart) continue;  // connected: plan again, to subscribe to everything wanted
    }
    if (link.conn && !p.to_send.empty() && !link.conn->write(p.to_send, IoClock::now() + opt_.io_timeout).ok()) {
      drop(link);  // the next turns reconnect and subscribe again
      continue;
    }
    if (link.conn && ping(link, wake_at) == Step::kRestart) continue;  // the connection was dropped
    if (await_input(link, wake_at) == Step::kStop) break;
  }
}

}  // namespace dlock::internal::redis
