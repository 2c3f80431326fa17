// The handoff without the second look (Session::async_wait_turn) on a
// redis:// store whose server is less than perfect: it restarts from an older
// snapshot, so an entry ahead that was removed (and whose removal the
// subscriber was told of) comes back. The waiter must not be vouched for, and
// a Mutex waiter must not be granted beside the holder whose entry came back.
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "dlock/dlock.hpp"
#include "redis/holding_proxy.hpp"
#include "redis/redis_server.hpp"
#include "redis/redis_test_util.hpp"

namespace dlock {
namespace {
using namespace std::chrono_literals;
using namespace testing;

// X (a holder), P (a waiter) and W (ours) in one queue, saved to the
// snapshot; W waits its turn behind P (X and P ahead of it); then X is
// removed (`dlock break`) and its message has had time to reach W's
// subscriber. W's session uses `waiter_url` (direct, or through a proxy).
struct BrokenAhead {
  void Start(RedisServer& server, const std::string& q, const std::string& waiter_url) {
    const std::string direct = server.url("?ttl=10s&connect_timeout=1s");
    sa = MustOpen(direct);
    sb = MustOpen(direct);
    sc = MustOpen(waiter_url);
    a = MustSession(*sa);
    b = MustSession(*sb);
    c = MustSession(*sc);
    ASSERT_TRUE(a && b && c);
    auto ax = a->append(q, Spec(), In(5s));
    auto bp = b->append(q, Spec(), In(5s));
    auto cw = c->append(q, Spec(), In(5s));
    ASSERT_TRUE(ax.ok() && bp.ok() && cw.ok());
    x = ax->entry;
    p = bp->entry;
    w = cw->entry;
    ASSERT_EQ(server.CmdStr({"SAVE"}), "OK");  // X, P, W
    std::vector<std::string> ids{p.id};
    std::vector<std::string> ahead{x.id, p.id};
    handle = c->async_wait_turn(q, ids, ahead, w.id, [this](Status s, bool intact) {
      done.set_value({std::move(s), intact});
    });
    std::this_thread::sleep_for(500ms);            // past the first check
    ASSERT_TRUE(b->remove(q, x.id, In(5s)).ok());  // `dlock break` of X
    std::this_thread::sleep_for(300ms);            // its message reaches our subscriber
  }

  std::shared_ptr<Store> sa, sb, sc;
  std::shared_ptr<Session> a, b, c;
  Entry x, p, w;
  std::promise<std::pair<Status, bool>> done;
  std::future<std::pair<Status, bool>> fut = done.get_future();
  std::shared_ptr<void> handle;  // last: cancelled first
};

TEST(RedisHandoff, AnEntryAheadBackFromASnapshotIsNotVouchedGone) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  const std::string q = "review/rollback";
  BrokenAhead t;
  ASSERT_NO_FATAL_FAILURE(t.Start(*server, q, server->url("?ttl=10s&connect_timeout=1s")));
  auto &a = t.a, &b = t.b, &c = t.c;
  const Entry &x = t.x, &p = t.p, &w = t.w;
  auto& fut = t.fut;
  ASSERT_TRUE(server->Restart());  // from the snapshot: X is back
  ASSERT_EQ(server->CmdInt({"EXISTS", "dlock:{" + q + "}:e:" + x.id}), 1);
  std::this_thread::sleep_for(3s);  // reconnect, re-check
  ASSERT_EQ(fut.wait_for(0s), std::future_status::timeout) << "woken early";
  std::printf("A (owner of X) state before: %s\n", std::string(SessionStateName(a->state())).c_str());
  ASSERT_TRUE(b->remove(q, p.id, In(5s)).ok());  // P goes
  ASSERT_EQ(fut.wait_for(10s), std::future_status::ready);
  auto [st, intact] = fut.get();
  auto listed = c->list(q, {}, In(5s));
  ASSERT_TRUE(listed.ok());
  std::printf("queue after P went:");
  for (const auto& e : *listed) {
    std::printf(" %s%s", e.id == x.id ? "X" : e.id == w.id ? "W(own)" : e.id.c_str(), "");
  }
  std::printf("\nwait: %s own_intact=%d; A (owner of X): %s, C: %s\n", st.to_string().c_str(), int(intact),
              std::string(SessionStateName(a->state())).c_str(), std::string(SessionStateName(c->state())).c_str());
  EXPECT_TRUE(st.ok());
  EXPECT_FALSE(intact) << "vouched that every entry ahead is gone while X (a live entry of a connected "
                          "session) is first in the queue";
}

// The same through Mutex: X's holder never hears of the break (its
// subscriber's replies are held by a proxy), the server restarts from a
// snapshot that has X, so X's holder still holds (kHeld, its renewals see X).
// P then goes: the waiter behind it is granted without a look, while X holds.
TEST(RedisHandoff, TwoMutexHoldersAfterARollback) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  HoldingProxy proxy(server->port());
  proxy.HoldRepliesTo("SUBSCRIBE");  // A's notifications never arrive
  const std::string name = "review/mutex";
  Client ca = Client::connect(proxy.url("?ttl=10s&connect_timeout=1s"));
  Mutex ma(ca, name);
  auto hx = ma.acquire(5s);
  ASSERT_TRUE(hx);
  auto sb = MustOpen(server->url("?ttl=10s&connect_timeout=1s"));
  auto b = MustSession(*sb);
  auto p = b->append(name, Spec(), In(5s));
  ASSERT_TRUE(p.ok());
  Client cc = Client::connect(server->url("?ttl=10s&connect_timeout=1s"));
  Mutex mc(cc, name);
  auto fut = std::async(std::launch::async, [&] { return mc.acquire(20s); });
  Result<std::vector<Entry>> before = std::vector<Entry>{};
  ASSERT_TRUE(Eventually(
      [&] {
        before = b->list(name, {}, In(5s));
        return before.ok() && before->size() == 3u;
      },
      20s))
      << "the third waiter's entry never came";
  const std::string x_id = (*before)[0].id, w_id = (*before)[2].id;
  ASSERT_EQ(server->CmdStr({"SAVE"}), "OK");        // X, P, W
  ASSERT_TRUE(b->remove(name, x_id, In(5s)).ok());  // `dlock break` of X
  std::this_thread::sleep_for(200ms);
  ASSERT_TRUE(server->Restart());  // X is back
  std::this_thread::sleep_for(3s);
  std::printf("after the restart: X's hold %s; C granted yet: %d\n", std::string(HoldStateName(hx->state())).c_str(),
              int(fut.wait_for(0s) == std::future_status::ready));
  ASSERT_TRUE(b->remove(name, p->entry.id, In(5s)).ok());  // P goes
  const bool granted = fut.wait_for(5s) == std::future_status::ready;
  auto listed = b->list(name, {}, In(5s));
  std::printf("queue:");
  if (listed.ok()) {
    for (const auto& e : *listed) std::printf(" %s", e.id == x_id ? "X" : e.id == w_id ? "W" : e.id.c_str());
  }
  std::optional<Hold> hw = granted ? fut.get() : std::nullopt;
  std::printf("\nX's hold: %s token %llu; W granted: %d", std::string(HoldStateName(hx->state())).c_str(),
              static_cast<unsigned long long>(hx->fencing_token()), int(hw.has_value()));
  if (hw)
    std::printf(" state %s token %llu", std::string(HoldStateName(hw->state())).c_str(),
                static_cast<unsigned long long>(hw->fencing_token()));
  std::printf("\n");
  EXPECT_FALSE(hw && hx->state() == HoldState::kHeld && hw->state() == HoldState::kHeld) << "two holders";
  proxy.Release();
  if (!granted) fut.wait();
}

// The same rollback, but the waiter's subscriber does not notice it: its
// connection is half-open (the server's host lost power and came back; no
// FIN reached us), so there is no re-subscription, while the store's
// command connections, opened again, reach the restarted server. A check of
// the queue made then (here: for a second wait on it; else the fallback
// re-check, within a TTL) must not vouch on the strength of an entry ahead
// that a message of the old server told gone: X is back and first.
TEST(RedisHandoff, ACheckOnARestartedServerBeforeTheSubscriberNoticesDoesNotVouch) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  HoldingProxy proxy(server->port());
  const std::string q = "review/half-open";
  BrokenAhead t;  // the waiter's session through the proxy
  ASSERT_NO_FATAL_FAILURE(t.Start(*server, q, proxy.url("?ttl=10s&connect_timeout=1s")));
  auto &b = t.b, &c = t.c;
  const Entry &x = t.x, &p = t.p;
  auto& fut = t.fut;
  proxy.HalfOpenSubscribers();
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(server->Restart());  // from the snapshot: X is back
  ASSERT_EQ(server->CmdInt({"EXISTS", "dlock:{" + q + "}:e:" + x.id}), 1);
  ASSERT_TRUE(b->remove(q, p.id, In(5s)).ok());  // P goes, on the restarted server
  ASSERT_EQ(fut.wait_for(0s), std::future_status::timeout) << "woken while the subscription is silent";
  // A second wait on the queue: its first check reads every waiter's ids.
  auto other = c->async_wait_any_gone(q, std::vector<std::string>{x.id}, [](Status) {});
  std::optional<std::pair<Status, bool>> got;
  if (fut.wait_for(5s) == std::future_status::ready) got = fut.get();
  const bool x_there = server->CmdInt({"EXISTS", "dlock:{" + q + "}:e:" + x.id}) == 1;
  std::printf("woken: %d; %s own_intact=%d; X on the server: %d; C: %s\n", int(got.has_value()),
              got ? got->first.to_string().c_str() : "-", got ? int(got->second) : 0, int(x_there),
              std::string(SessionStateName(c->state())).c_str());
  EXPECT_TRUE(x_there);
  if (got) {
    EXPECT_FALSE(got->first.ok() && got->second)
        << "vouched that every entry ahead is gone while X (back from the snapshot) is first in the queue";
  }
  other.reset();
  t.handle.reset();
}

}  // namespace
}  // namespace dlock
