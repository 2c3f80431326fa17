#include "stores/redis/redis_subscriber.hpp"

#include "core/dlock_thread.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <thread>

namespace dlock::internal::redis {

struct Subscriber::Waiter {
  // Fixed by start().
  const void* owner = nullptr;
  std::vector<std::string> ids;
  std::string own;                                // async_wait_turn's, or empty
  std::shared_ptr<std::atomic<bool>> own_intact;  // set with own
  std::optional<HeadMark> head;                   // a head watch's: the head it saw
  std::vector<std::string> ahead_left;            // of its `ahead`, those not seen gone yet
  std::vector<std::string> ahead;                 // all of them (again after a re-subscription)
  SessionFn session;
  CheckFn check;
  // Guarded by mu_ from here on.
  enum class Phase { kWaiting, kSettled, kDelivering, kDelivered };
  Phase phase = Phase::kWaiting;
  Channel* channel = nullptr;            // while kWaiting
  bool checked = false;                  // a check covering this waiter is done
  std::uint64_t checked_generation = 0;  // the channel's generation of the last one
  Clock::time_point retry_at{};          // when to retry a failed first check
  Status outcome;                        // once settled
  std::function<void(Status)> done;
  std::thread::id deliverer;  // while kDelivering
};

struct Subscriber::Channel {
  std::string name;
  std::string queue;
  ChanState state = ChanState::kIdle;
  std::vector<std::shared_ptr<Waiter>> waiters;
  IoClock::time_point linger_until{};
  // The shared re-check (see the header): when, and whether one is running.
  Clock::time_point next_check = Clock::time_point::max();
  bool check_running = false;
  // Counts confirmed subscriptions: a check that crossed a re-subscription
  // may have missed what was published while the connection was down.
  std::uint64_t generation = 0;
};

// One check the subscriber thread runs, for the waiters of one channel.
struct Subscriber::CheckJob {
  Channel* channel = nullptr;
  std::string queue;
  std::vector<std::string> ids;
  std::vector<std::shared_ptr<Waiter>> members;  // the waiters whose ids it covers
  CheckFn check;                                 // a copy: the waiter may be settled meanwhile
  std::uint64_t generation = 0;
  bool recheck = false;  // some member had been checked before
};

// What start() returns: cancels on destruction.
class Subscriber::Handle {
 public:
  Handle(Subscriber& sub, std::shared_ptr<Waiter> w) : sub_(sub), w_(std::move(w)) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { sub_.cancel(w_); }

 private:
  Subscriber& sub_;
  std::shared_ptr<Waiter> w_;
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
    : opt_(std::move(options)), wake_(MaybeSignal()), stop_(MaybeSignal()) {}

std::shared_ptr<Subscriber> Subscriber::start(SubscriberOptions options) {
  std::shared_ptr<Subscriber> sub(new Subscriber(std::move(options)));
  MutexLock lk(sub->thread_mu_);
  sub->clock_subscription_ = sub->opt_.clock->on_advance([weak = std::weak_ptr<Subscriber>(sub)] {
    if (auto s = weak.lock()) s->poke();
  });
  sub->thread_ = std::jthread([self = sub](std::stop_token st) {
    MarkDlockThread("dlock-redis-sub");
    self->run(st);
  });
  sub->thread_id_ = sub->thread_.get_id();
  return sub;
}

Subscriber::~Subscriber() {
  // Only once the thread's reference is gone: it has returned (or is
  // returning, if this runs on it).
  MutexLock lk(thread_mu_);
  JoinOrDetach(thread_);
}

void Subscriber::shut_down() noexcept {
  std::jthread thread;
  std::shared_ptr<void> subscription;
  {
    MutexLock lk(thread_mu_);
    thread = std::move(thread_);
    subscription = std::move(clock_subscription_);
  }
  subscription.reset();
  thread.request_stop();
  if (stop_) stop_->signal();
  JoinOrDetach(thread);  // inside a callback: the thread ends when it returns
}

void Subscriber::wake() const {
  if (wake_) wake_->signal();
}

void Subscriber::poke() const { wake(); }

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

void Subscriber::mark_gone(Channel& ch, const std::vector<std::string>& gone, const CheckJob* job) {
  if (gone.empty()) return;
  auto in = [](const std::vector<std::string>& set, const std::string& id) {
    return std::find(set.begin(), set.end(), id) != set.end();
  };
  std::vector<std::shared_ptr<Waiter>> hit;
  for (const auto& w : ch.waiters) {
    // A check counts for a waiter only if it covered it (its ids, `own` and
    // `ahead` were among the check's).
    const bool covered = job && std::find(job->members.begin(), job->members.end(), w) != job->members.end();
    if (!job || covered) std::erase_if(w->ahead_left, [&](const std::string& id) { return in(gone, id); });
    const bool own_gone = !w->own.empty() && in(gone, w->own);
    // A check vouches from what it read itself: every entry ahead (next_job
    // asks for all of them), in the same atomic read as `own`. Removals
    // recorded before it may have been told by an earlier incarnation of the
    // server (one that lost data since, while our subscription has not yet
    // noticed: a half-open connection), so they do not count for a check.
    const bool ahead_read_gone =
        covered && std::all_of(w->ahead.begin(), w->ahead.end(), [&](const std::string& id) { return in(gone, id); });
    if (!own_gone && std::none_of(w->ids.begin(), w->ids.end(), [&](const std::string& id) { return in(gone, id); })) {
      continue;
    }
    hit.push_back(w);
    if (!w->own_intact || w->phase != Waiter::Phase::kWaiting) continue;
    // Vouched (see WaitSpec::own): every entry ahead and the id waited for
    // gone, and `own` not, all read by this very check at once; or told by a
    // message of the subscription under which the waiter's last check looked
    // at `own` (so that no message of its removal was missed), with every
    // entry ahead told gone since that subscription began.
    const bool vouched =
        job ? ahead_read_gone : (w->checked && w->checked_generation == ch.generation && w->ahead_left.empty());
    w->own_intact->store(!own_gone && vouched);
  }
  for (const auto& w : hit) settle(w, OkStatus());
}

void Subscriber::mark_head_moved(Channel& ch, const std::optional<HeadMark>& now, const CheckJob* job) {
  std::vector<std::shared_ptr<Waiter>> moved;
  for (const auto& w : ch.waiters) {
    if (!w->head) continue;
    // A check counts only for the watches it covered (armed before it began).
    if (job && std::find(job->members.begin(), job->members.end(), w) == job->members.end()) continue;
    if (!now || *now != *w->head) moved.push_back(w);
  }
  for (const auto& w : moved) settle(w, OkStatus());
}

// --- Waits
//
// A wait is a Waiter on its channel. It is settled (its outcome decided, and
// taken off the channel) under mu_, by whoever learns the outcome; its
// `done` then runs without mu_, on the thread that claims it in flush() (or
// in cancel(), on the thread destroying the handle).

std::shared_ptr<void> Subscriber::start(WaitSpec spec) {
  auto w = std::make_shared<Waiter>();
  w->owner = spec.owner;
  w->ids = std::move(spec.ids);
  w->own = std::move(spec.own);
  w->own_intact = std::move(spec.own_intact);
  w->head = std::move(spec.head);
  w->ahead = spec.ahead;
  w->ahead_left = std::move(spec.ahead);
  w->session = std::move(spec.session);
  w->check = std::move(spec.check);
  w->done = std::move(spec.done);
  auto handle = std::make_shared<Handle>(*this, w);
  MutexLock lk(mu_);
  auto& slot = channels_[spec.channel];
  if (!slot) {
    slot = std::make_unique<Channel>();
    slot->name = spec.channel;
    slot->queue = std::move(spec.queue);
  }
  slot->waiters.push_back(w);
  w->channel = slot.get();
  wake();  // the subscriber thread subscribes if not yet, or checks
  return handle;
}

void Subscriber::leave(Channel& ch, Waiter& w) {
  std::erase_if(ch.waiters, [&](const std::shared_ptr<Waiter>& o) { return o.get() == &w; });
  w.channel = nullptr;
  if (ch.waiters.empty()) {
    // The subscriber thread keeps the subscription for a while, then drops it.
    ch.linger_until = IoClock::now() + opt_.linger;
    wake();
  }
}

void Subscriber::settle(const std::shared_ptr<Waiter>& w, Status s) {
  if (w->phase != Waiter::Phase::kWaiting) return;
  // A lost session first: its own entries are gone too, whatever else went.
  if (s.ok() && w->session) {
    if (Status ls = w->session(); !ls.ok()) s = std::move(ls);
  }
  w->outcome = std::move(s);
  w->phase = Waiter::Phase::kSettled;
  if (w->channel) leave(*w->channel, *w);
  // Nothing calls into the session for it any more.
  w->session = nullptr;
  w->check = nullptr;
  ready_.push_back(w);
}

void Subscriber::flush() {
  MutexLock lk(mu_);
  while (!ready_.empty()) {
    std::shared_ptr<Waiter> w = std::move(ready_.back());
    ready_.pop_back();
    if (w->phase != Waiter::Phase::kSettled) continue;  // its handle's destructor delivered it
    w->phase = Waiter::Phase::kDelivering;
    w->deliverer = std::this_thread::get_id();
    std::function<void(Status)> done = std::move(w->done);
    Status outcome = w->outcome;
    lk.unlock();
    if (done) done(std::move(outcome));
    done = nullptr;  // its captures go before the destructor may return
    lk.lock();
    w->phase = Waiter::Phase::kDelivered;
    changed_.notify_all();
  }
}

void Subscriber::cancel(const std::shared_ptr<Waiter>& w) {
  MutexLock lk(mu_);
  switch (w->phase) {
    case Waiter::Phase::kWaiting:
      settle(w, CancelledError("waiting on queue " + (w->channel ? w->channel->queue : std::string()) + ": cancelled"));
      [[fallthrough]];
    case Waiter::Phase::kSettled: {
      // Delivered here, before the destructor returns.
      w->phase = Waiter::Phase::kDelivering;
      w->deliverer = std::this_thread::get_id();
      std::function<void(Status)> done = std::move(w->done);
      Status outcome = w->outcome;
      lk.unlock();
      if (done) done(std::move(outcome));
      done = nullptr;
      lk.lock();
      w->phase = Waiter::Phase::kDelivered;
      changed_.notify_all();
      return;
    }
    case Waiter::Phase::kDelivering:
      // Inside its own `done` (or one delivered before it on this thread):
      // waiting would deadlock.
      if (w->deliverer == std::this_thread::get_id()) return;
      while (w->phase != Waiter::Phase::kDelivered) changed_.wait(lk.native());
      return;
    case Waiter::Phase::kDelivered: return;
  }
}

void Subscriber::quiesce(const void* owner) {
  {
    MutexLock lk(mu_);
    std::vector<std::shared_ptr<Waiter>> orphans;
    for (auto& [name, ch] : channels_) {
      for (const auto& w : ch->waiters) {
        if (w->owner == owner) orphans.push_back(w);
      }
    }
    for (const auto& w : orphans) {
      w->session = nullptr;  // the session is going: do not ask it
      settle(w, SessionLostError("the waiting session was closed"));
    }
    // A check of this session's on the subscriber thread calls into it.
    if (std::this_thread::get_id() != thread_id_) {
      while (checking_owner_ == owner) changed_.wait(lk.native());
    }
  }
  flush();
}

// Settles every wait whose session ended (lost or closed). Each session is
// asked once.
void Subscriber::settle_ended_sessions() {
  std::map<const void*, Status> verdicts;
  std::vector<std::pair<std::shared_ptr<Waiter>, Status>> ended;
  for (auto& [name, ch] : channels_) {
    for (const auto& w : ch->waiters) {
      auto [it, fresh] = verdicts.try_emplace(w->owner);
      if (fresh && w->session) it->second = w->session();
      if (!it->second.ok()) ended.emplace_back(w, it->second);
    }
  }
  for (auto& [w, s] : ended) settle(w, s);
}

// The next check due, if any: a channel whose subscription is confirmed,
// with a waiter not yet checked (and not backing off), or whose shared
// re-check is due. One check covers every waiter of the channel.
std::optional<Subscriber::CheckJob> Subscriber::next_job(Clock::time_point now) {
  for (auto& [name, ch] : channels_) {
    if (ch->state != ChanState::kSubscribed || ch->check_running || ch->waiters.empty()) continue;
    const std::shared_ptr<Waiter>* first = nullptr;
    bool any_checked = false;
    for (const auto& w : ch->waiters) {
      if (!w->checked && now >= w->retry_at && !first) first = &w;
      any_checked = any_checked || w->checked;
    }
    const bool recheck = any_checked && now >= ch->next_check;
    if (!first && !recheck) continue;
    CheckJob job;
    job.channel = ch.get();
    job.queue = ch->queue;
    job.members = ch->waiters;
    job.check = first ? (*first)->check : ch->waiters.front()->check;
    job.generation = ch->generation;
    job.recheck = any_checked;
    for (const auto& w : ch->waiters) {
      for (const auto& id : w->ids) {
        if (std::find(job.ids.begin(), job.ids.end(), id) == job.ids.end()) job.ids.push_back(id);
      }
      auto add = [&](const std::string& id) {
        if (std::find(job.ids.begin(), job.ids.end(), id) == job.ids.end()) job.ids.push_back(id);
      };
      if (!w->own.empty()) add(w->own);
      for (const auto& id : w->ahead) add(id);  // all of them: see mark_gone
    }
    ch->check_running = true;
    checking_owner_ = first ? (*first)->owner : ch->waiters.front()->owner;
    return job;
  }
  return std::nullopt;
}

void Subscriber::after_check(const CheckJob& job, const Result<CheckResult>& r) {
  ++stats_.checks;
  if (job.recheck) ++stats_.fallback_checks;
  checking_owner_ = nullptr;
  changed_.notify_all();
  Channel& ch = *job.channel;  // kept in channels_ while check_running
  ch.check_running = false;
  const Clock::time_point now = opt_.clock->now();
  if (r.ok()) {
    for (const auto& w : job.members) {
      w->checked = true;
      w->checked_generation = job.generation;
    }
    mark_gone(ch, r->gone, &job);
    if (r->head) mark_head_moved(ch, r->head, &job);
    ch.next_check = next_check_at(now, r->soonest_ttl_ms);
    // Crossed a re-subscription: look again for what was published meanwhile.
    if (ch.generation != job.generation) ch.next_check = now;
    return;
  }
  ch.next_check = now + opt_.retry_interval;
  const bool transient = r.status().code() == ErrorCode::kUnavailable;
  for (const auto& w : job.members) {
    if (w->checked || w->phase != Waiter::Phase::kWaiting) continue;
    if (transient) {
      w->retry_at = now + opt_.retry_interval;  // keep waiting through the outage
    } else {
      settle(w, r.status());
    }
  }
}

// Runs, on the subscriber thread, every check that is due, and settles what
// they (and the sessions) say.
void Subscriber::serve_waits() {
  for (int guard = 0; guard < 1000; ++guard) {
    std::optional<CheckJob> job;
    {
      MutexLock lk(mu_);
      settle_ended_sessions();
      job = next_job(opt_.clock->now());
    }
    flush();
    if (!job) return;
    auto r = SafeCheck(job->check, job->queue, job->ids);
    job->check = nullptr;  // its captures go with the check
    {
      MutexLock lk(mu_);
      after_check(*job, r);
    }
    flush();
  }
}

// When the subscriber thread must next look at the waits (a retry, a
// re-check), in real time.
IoClock::time_point Subscriber::next_wait_event(IoClock::time_point io_now) {
  Clock::time_point soonest = Clock::time_point::max();
  Clock::time_point now = opt_.clock->now();
  {
    MutexLock lk(mu_);
    for (auto& [name, ch] : channels_) {
      if (ch->state != ChanState::kSubscribed || ch->check_running) continue;
      for (const auto& w : ch->waiters) {
        soonest = std::min(soonest, w->checked ? ch->next_check : w->retry_at);
      }
    }
  }
  if (soonest == Clock::time_point::max()) return IoClock::time_point::max();
  if (soonest <= now) return io_now;
  return io_now + std::min<Clock::duration>(soonest - now, std::chrono::seconds(60));
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
      break;
    }
    if (!r->has_value()) break;
    handle_reply(link, **r);
  }
  flush();  // the waits that a message settled
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
  {
    MutexLock lk(mu_);
    std::vector<std::shared_ptr<Waiter>> failed;
    for (auto& [name, ch] : channels_) {
      if (only_subscribing && ch->state != ChanState::kSubscribing) continue;
      failed.insert(failed.end(), ch->waiters.begin(), ch->waiters.end());
    }
    for (const auto& w : failed) settle(w, s);
  }
  flush();
}

void Subscriber::on_subscribed(const std::string& name) {
  auto it = channels_.find(name);
  if (it == channels_.end()) return;
  Channel& ch = *it->second;
  ch.state = ChanState::kSubscribed;
  // Waiters that checked under an earlier subscription may have missed
  // messages while it was down: re-check the queue now.
  ++ch.generation;
  // A server that lost data brings removed entries back;
  // removals told before this subscription are looked at again.
  for (const auto& w : ch.waiters) w->ahead_left = w->ahead;
  bool stale = std::any_of(ch.waiters.begin(), ch.waiters.end(), [](const auto& w) { return w->checked; });
  if (stale) ch.next_check = opt_.clock->now();
  // Waiters that have not checked yet are checked on the thread's next turn.
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
  mark_gone(*it->second, ids, nullptr);
  mark_head_moved(*it->second, std::nullopt, nullptr);
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
    serve_waits();
    wake_at = std::min(wake_at, next_wait_event(IoClock::now()));
    if (await_input(link, wake_at) == Step::kStop) break;
  }
}

}  // namespace dlock::internal::redis
