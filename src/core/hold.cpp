#include "core/hold_core.hpp"

namespace dlock {
namespace internal {

std::shared_ptr<HoldCore> HoldCore::make(std::shared_ptr<ClientCore> client, std::shared_ptr<Session> session,
                                         std::string name, std::vector<HeldEntry> entries, std::uint64_t token,
                                         std::uint32_t permits) {
  std::shared_ptr<HoldCore> core(
      new HoldCore(std::move(client), std::move(session), std::move(name), std::move(entries), token, permits));
  std::weak_ptr<HoldCore> weak = core;
  auto sub = core->session_->subscribe([weak](SessionState s) {
    if (auto self = weak.lock()) self->on_session_state(s);
  });
  {
    MutexLock g(core->mu_);
    core->subscription_ = std::move(sub);
  }
  // The session may have changed before we subscribed. What we read here
  // races with the session's own ordered delivery (a reconnect delivered
  // while we apply an older kSuspended would leave the hold uncertain for
  // good), so read again until what we applied is what the session says.
  SessionState applied = SessionState::kConnected;
  for (int round = 0; round < 64; ++round) {
    const SessionState now = core->session_->state();
    if (now == applied) break;
    core->on_session_state(now);
    applied = now;
  }
  core->watch_entries();
  return core;
}

void HoldCore::watch_entries() {
  std::map<std::string, std::vector<std::string>> by_queue;
  for (const HeldEntry& e : entries_) by_queue[e.queue].push_back(e.id);
  for (const auto& [queue, ids] : by_queue) watch_queue(queue, ids, 0);
}

void HoldCore::watch_queue(const std::string& queue, const std::vector<std::string>& ids, int round) {
  std::weak_ptr<HoldCore> weak = weak_from_this();
  std::shared_ptr<void> watch = session_->async_wait_any_gone(queue, ids, [weak, queue, ids, round](Status waited) {
    if (auto self = weak.lock()) self->on_entry_watch(queue, ids, round, waited);
  });
  std::shared_ptr<void> spent;  // cancelled (or destroyed) outside mu_
  {
    MutexLock g(mu_);
    auto& slot = entry_watches_[queue];
    if (state_ == HoldState::kReleased || (slot.second && slot.first > round)) {
      spent = std::move(watch);  // released meanwhile, or an older round answering late
    } else {
      spent = std::exchange(slot, {round, std::move(watch)}).second;
    }
  }
}

void HoldCore::on_entry_watch(const std::string& queue, const std::vector<std::string>& ids, int round,
                              const Status& waited) {
  if (waited.ok()) {
    // Told from the executor, never inside the store's completion: a
    // release cancels this wait and may wait for the completion to return,
    // and a listener may block (review finding: a listener that locked
    // deadlocked with a release on the dlock thread).
    client_->executor().post(
        [self = shared_from_this()] { self->delivery_.post([self] { self->apply(HoldState::kLost); }); });
    return;
  }
  // A cancel is our own release; a session that ends is told by its
  // listener; a bad argument would fail again.
  const ErrorCode code = waited.code();
  if (code == ErrorCode::kCancelled || code == ErrorCode::kSessionLost || code == ErrorCode::kInvalidArgument) return;
  // Store trouble (an unavailable store is also a suspension the session
  // reports): watch again, 50 ms doubling to 2 s after each failure.
  if (round + 1 == 5)
    client_->report(UnavailableError("still failing to watch the entry of " + name_ + ": " + waited.to_string()));
  const auto pause =
      std::min<Clock::duration>(std::chrono::milliseconds(50) * (1 << std::min(round, 6)), std::chrono::seconds(2));
  std::weak_ptr<HoldCore> weak = weak_from_this();
  client_->executor().at(DeadlineAfter(client_->now(), pause), [weak, queue, ids, round] {
    auto self = weak.lock();
    if (!self) return;
    {
      MutexLock g(self->mu_);
      if (self->state_ == HoldState::kReleased || self->state_ == HoldState::kLost) return;
    }
    self->watch_queue(queue, ids, round + 1);
  });
}

HoldCore::HoldCore(std::shared_ptr<ClientCore> client, std::shared_ptr<Session> session, std::string name,
                   std::vector<HeldEntry> entries, std::uint64_t token, std::uint32_t permits)
    : client_(std::move(client)),
      session_(std::move(session)),
      name_(std::move(name)),
      entries_(std::move(entries)),
      token_(token),
      permits_(permits) {}

HoldCore::~HoldCore() { release(); }

namespace {

HoldState FromSession(SessionState s) {
  switch (s) {
    case SessionState::kConnected: return HoldState::kHeld;
    case SessionState::kSuspended: return HoldState::kUncertain;
    default: return HoldState::kLost;
  }
}

}  // namespace

HoldState HoldCore::state() const noexcept {
  HoldState told;
  {
    MutexLock g(mu_);
    told = state_;
  }
  if (told == HoldState::kReleased || told == HoldState::kLost) return told;
  // What the session says now (its own clock included) may be newer than
  // what its listeners have told us so far; the worse of the two counts.
  const HoldState now = FromSession(session_->state());
  if (now == HoldState::kLost) return now;
  if (told == HoldState::kUncertain) return told;  // a reconnect not yet delivered
  return now;
}

std::stop_token HoldCore::lost_token() const noexcept {
  HoldState s = state();
  if (s == HoldState::kUncertain || s == HoldState::kLost) lost_.request_stop();
  return lost_.get_token();
}

void HoldCore::on_session_state(SessionState s) {
  const HoldState next = FromSession(s);
  delivery_.post([self = shared_from_this(), next] { self->apply(next); });
}

void HoldCore::apply(HoldState next) {
  {
    MutexLock g(mu_);
    // Released and lost are final; lost is never un-lost by a reconnect.
    if (state_ == HoldState::kReleased || state_ == HoldState::kLost || state_ == next) return;
    state_ = next;
  }
  if (next != HoldState::kHeld) lost_.request_stop();
  listeners_.notify(next);
}

std::shared_ptr<void> HoldCore::on_state_change(std::function<void(HoldState)> fn) {
  return listeners_.add(std::move(fn));
}

void HoldCore::release() noexcept {
  std::shared_ptr<void> subscription;
  std::map<std::string, std::pair<int, std::shared_ptr<void>>> watches;
  {
    MutexLock g(mu_);
    if (state_ == HoldState::kReleased) return;
    state_ = HoldState::kReleased;
    subscription = std::move(subscription_);
    watches = std::move(entry_watches_);
  }
  listeners_.clear();
  subscription.reset();
  // Cancelled before our own removals would wake them (a cancel may wait
  // for a completion running on a store thread; completions never wait for
  // our listeners: on_entry_gone posts).
  watches.clear();
  // Give back in reverse order of taking.
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    client_->remove_guaranteed(session_, it->queue, it->id);
  }
}

}  // namespace internal

std::string_view HoldStateName(HoldState state) noexcept {
  switch (state) {
    case HoldState::kHeld: return "held";
    case HoldState::kUncertain: return "uncertain";
    case HoldState::kLost: return "lost";
    case HoldState::kReleased: return "released";
  }
  return "unknown";
}

Hold& Hold::operator=(Hold&& other) noexcept {
  if (this != &other) {
    release();
    core_ = std::move(other.core_);
  }
  return *this;
}

Hold::~Hold() { release(); }

bool Hold::held() const noexcept {
  if (!core_) return false;
  HoldState s = core_->state();
  return s == HoldState::kHeld || s == HoldState::kUncertain;
}

HoldState Hold::state() const noexcept { return core_ ? core_->state() : HoldState::kReleased; }

std::uint64_t Hold::fencing_token() const noexcept { return core_ ? core_->token() : 0; }

const std::string& Hold::name() const noexcept {
  static const std::string kEmpty;
  return core_ ? core_->name() : kEmpty;
}

std::uint32_t Hold::permits() const noexcept { return core_ ? core_->permits() : 0; }

std::stop_token Hold::lost_token() const noexcept { return core_ ? core_->lost_token() : std::stop_token(); }

std::shared_ptr<void> Hold::on_state_change(std::function<void(HoldState)> fn) const {
  if (!core_) return nullptr;
  return core_->on_state_change(std::move(fn));
}

// The core stays until the Hold is destroyed or assigned: another thread may
// be reading the hold's state while this one releases it (hold.hpp).
void Hold::release() noexcept {
  if (core_) core_->release();
}

}  // namespace dlock
