// The redis:// store when the server is less than perfect: it restarts from
// an older snapshot or append-only file, a lagging replica is promoted,
// requests and replies are late on the wire (holding_proxy.hpp), replicas do
// not acknowledge in time. And what the store keeps on the server, what it
// tells its subscribers, and when. Real servers only.
//
// What every data-loss case checks: fencing tokens handed out after the loss
// are larger than every token before it, and a holder whose entry the server
// lost is told kLost at its next renewal, never kConnected again.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <mutex>
#include <sstream>
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
using namespace testing;  // the helpers of redis_test_util.hpp
namespace fs = std::filesystem;

std::string Key(const std::string& queue, const std::string& rest) { return "dlock:{" + queue + "}:" + rest; }

// The server's keys matching `pattern` (SCAN), sorted.
std::vector<std::string> Keys(const RedisServer& server, const std::string& pattern = "*") {
  std::vector<std::string> out;
  std::string cursor = "0";
  do {
    auto r = server.Cmd({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) return {"<SCAN failed>"};
    cursor.assign(r->element[0]->str, r->element[0]->len);
    for (std::size_t i = 0; i < r->element[1]->elements; ++i) {
      out.emplace_back(r->element[1]->element[i]->str, r->element[1]->element[i]->len);
    }
  } while (cursor != "0");
  std::sort(out.begin(), out.end());
  return out;
}

// For messages: the first few, and how many.
std::string Joined(const std::vector<std::string>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size() && i < 8; ++i) out += (out.empty() ? "" : " ") + v[i];
  if (v.size() > 8) out += " ... (" + std::to_string(v.size()) + " in all)";
  return out;
}

std::string Names(const std::vector<SessionState>& states) {
  std::string out;
  for (SessionState s : states) out += (out.empty() ? "" : " ") + std::string(SessionStateName(s));
  return out;
}

// What a holder whose entry the server lost must report from the loss on:
// kLost, at its first renewal that reaches the server, and never kConnected.
// `log` holds only states reported since the loss.
void ExpectToldLost(StateLog& log, Session& holder) {
  ASSERT_TRUE(log.WaitFor(SessionState::kLost, 15s).has_value())
      << "the holder was not told; it reported: " << Names(log.states());
  auto states = log.states();
  EXPECT_EQ(std::count(states.begin(), states.end(), SessionState::kConnected), 0)
      << "a renewal succeeded although the holder's entry is gone: " << Names(states);
  EXPECT_EQ(states.back(), SessionState::kLost) << Names(states);
  EXPECT_EQ(holder.state(), SessionState::kLost);
}

// ---------------------------------------------------------------- data loss

// The server is killed and restarts from a snapshot taken before the
// holder's current entry: the holder's old entry, session and lease are
// back, its current entry and the counter's last steps are not.
TEST(RedisDataLoss, RestartFromAnOlderSnapshot) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  const std::string q = "loss/rdb";
  auto store = MustOpen(server->url("?ttl=3s&connect_timeout=1s"));
  auto a = MustSession(*store);
  ASSERT_TRUE(a);
  auto e1 = a->append(q, Spec(), In(5s));
  ASSERT_TRUE(e1.ok()) << e1.status().to_string();
  ASSERT_EQ(server->CmdStr({"SAVE"}), "OK");
  ASSERT_TRUE(a->remove(q, e1->entry.id, In(5s)).ok());
  auto e2 = a->append(q, Spec(), In(5s));
  ASSERT_TRUE(e2.ok()) << e2.status().to_string();
  StateLog log(*a);

  ASSERT_TRUE(server->Restart());
  ASSERT_EQ(server->CmdInt({"EXISTS", Key(q, "e:" + e1->entry.id)}), 1) << "the snapshot did not load";

  auto store_b = MustOpen(server->url("?ttl=3s&connect_timeout=1s"));
  auto b = MustSession(*store_b);
  ASSERT_TRUE(b);
  auto eb = b->append(q, Spec(), In(5s));
  ASSERT_TRUE(eb.ok()) << eb.status().to_string();
  EXPECT_GT(*eb->entry.token, *e2->entry.token) << "a token was handed out twice";
  ExpectToldLost(log, *a);
}

// appendfsync everysec: a crash can lose the last second of writes. Here the
// server restarts from a copy of its append-only file taken a moment before.
TEST(RedisDataLoss, RestartFromAnAppendOnlyFileThatLostItsLastWrites) {
  RedisServer::Options opt;
  opt.extra = {"--appendonly", "yes", "--appendfsync", "everysec"};
  auto server = RedisServer::Start(opt);
  ASSERT_TRUE(server);
  const std::string q = "loss/aof";
  const fs::path aof = fs::path(server->dir()) / "appendonlydir";
  auto store = MustOpen(server->url("?ttl=3s&connect_timeout=1s"));
  auto a = MustSession(*store);
  ASSERT_TRUE(a);
  auto e1 = a->append(q, Spec(), In(5s));
  ASSERT_TRUE(e1.ok()) << e1.status().to_string();
  // Copy the files once they hold e1 (written before the reply, unless an
  // fsync was in progress: then a moment later).
  auto holds_e1 = [&] {
    for (const auto& f : fs::directory_iterator(aof)) {
      std::ifstream in(f.path(), std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (text.find(e1->entry.id) != std::string::npos) return true;
    }
    return false;
  };
  ASSERT_TRUE(Eventually(holds_e1, 5s)) << "e1 never reached " << aof;
  const fs::path older = fs::path(server->dir()) / "appendonlydir.older";
  fs::copy(aof, older, fs::copy_options::recursive);
  ASSERT_TRUE(a->remove(q, e1->entry.id, In(5s)).ok());
  auto e2 = a->append(q, Spec(), In(5s));
  ASSERT_TRUE(e2.ok()) << e2.status().to_string();
  StateLog log(*a);

  server->Kill();
  fs::remove_all(aof);
  fs::rename(older, aof);
  ASSERT_TRUE(server->Restart());
  ASSERT_EQ(server->CmdInt({"EXISTS", Key(q, "e:" + e1->entry.id)}), 1) << "the older file did not load";

  auto store_b = MustOpen(server->url("?ttl=3s&connect_timeout=1s"));
  auto b = MustSession(*store_b);
  ASSERT_TRUE(b);
  auto eb = b->append(q, Spec(), In(5s));
  ASSERT_TRUE(eb.ok()) << eb.status().to_string();
  EXPECT_GT(*eb->entry.token, *e2->entry.token) << "a token was handed out twice";
  ExpectToldLost(log, *a);
}

// Asynchronous replication: the replica stops receiving (frozen), the primary
// takes more writes and dies, the replica is promoted and the clients (behind
// a proxy, as behind a virtual IP) reach it instead.
TEST(RedisDataLoss, LaggingReplicaPromoted) {
  RedisServer::Options popt;
  popt.extra = {"--repl-diskless-sync-delay", "0"};
  auto primary = RedisServer::Start(popt);
  ASSERT_TRUE(primary);
  RedisServer::Options ropt;
  ropt.replica_of = primary->port();
  auto replica = RedisServer::Start(ropt);
  ASSERT_TRUE(replica);
  ASSERT_TRUE(primary->AwaitReplicas(1)) << "the replica never acknowledged";
  HoldingProxy proxy(primary->port());
  const std::string q = "loss/failover";
  auto store = MustOpen(proxy.url("?ttl=3s&connect_timeout=1s"));
  auto a = MustSession(*store);
  ASSERT_TRUE(a);
  auto e1 = a->append(q, Spec(), In(5s));
  ASSERT_TRUE(e1.ok()) << e1.status().to_string();
  ASSERT_TRUE(Eventually([&] { return replica->CmdInt({"EXISTS", Key(q, "e:" + e1->entry.id)}) == 1; }, 5s));
  // From here on the replica lags: frozen, and cut off by the primary (or it
  // would find the primary's later writes in its socket buffer on waking).
  replica->Freeze();
  ASSERT_GE(primary->CmdInt({"CLIENT", "KILL", "TYPE", "replica"}), 1);
  ASSERT_TRUE(a->remove(q, e1->entry.id, In(5s)).ok());
  auto e2 = a->append(q, Spec(), In(5s));
  ASSERT_TRUE(e2.ok()) << e2.status().to_string();
  StateLog log(*a);

  primary->Kill();
  replica->Thaw();
  ASSERT_EQ(replica->CmdStr({"REPLICAOF", "NO", "ONE"}), "OK");
  proxy.SetUpstream(replica->port());
  proxy.CutAll();

  auto store_b = MustOpen(proxy.url("?ttl=3s&connect_timeout=1s"));
  auto b = MustSession(*store_b);
  ASSERT_TRUE(b);
  auto eb = b->append(q, Spec(), In(5s));
  ASSERT_TRUE(eb.ok()) << eb.status().to_string();
  EXPECT_GT(*eb->entry.token, *e2->entry.token) << "a token was handed out twice";
  ExpectToldLost(log, *a);
}

// The reviewer's report, through the public API: hold, snapshot, release and
// take again, kill -9, restart from the snapshot. The second client must get
// a larger token, and only once the first was told its hold is lost (its old
// entry, back from the snapshot, is ahead of the second client until the
// first session's lease runs out).
TEST(RedisDataLoss, ReviewersReproOldEntryBackFromTheSnapshot) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  const std::string name = "loss/repro1";
  Client ca = Client::connect(server->url("?ttl=2s"));
  Mutex ma(ca, name);
  auto h1 = ma.acquire(5s);
  ASSERT_TRUE(h1);
  ASSERT_EQ(server->CmdStr({"SAVE"}), "OK");
  h1->release();
  auto h2 = ma.acquire(5s);
  ASSERT_TRUE(h2);
  ASSERT_TRUE(server->Restart());

  Client cb = Client::connect(server->url("?ttl=2s"));
  Mutex mb(cb, name);
  auto hb = mb.acquire(20s);
  ASSERT_TRUE(hb) << "the second client never got the lock";
  EXPECT_EQ(h2->state(), HoldState::kLost) << "two holders: the first was not told before the second got in";
  EXPECT_GT(hb->fencing_token(), h2->fencing_token());
}

// The same with the snapshot taken between release and re-acquire: the queue
// comes back empty, so the second client gets in at once. It must get a
// larger token, and the first must be told at its next renewal.
TEST(RedisDataLoss, ReviewersReproEmptyQueueInTheSnapshot) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  const std::string name = "loss/repro2";
  Client ca = Client::connect(server->url("?ttl=2s"));
  Mutex ma(ca, name);
  auto h1 = ma.acquire(5s);
  ASSERT_TRUE(h1);
  h1->release();
  ASSERT_EQ(server->CmdStr({"SAVE"}), "OK");
  auto h2 = ma.acquire(5s);
  ASSERT_TRUE(h2);
  ASSERT_TRUE(server->Restart());

  Client cb = Client::connect(server->url("?ttl=2s"));
  Mutex mb(cb, name);
  auto hb = mb.acquire(20s);
  ASSERT_TRUE(hb);
  EXPECT_GT(hb->fencing_token(), h2->fencing_token()) << "a token was handed out twice";
  EXPECT_TRUE(Eventually([&] { return h2->state() == HoldState::kLost; }, 10s))
      << "the first holder still says " << HoldStateName(h2->state());
}

// ---------------------------------------------------------------- late requests

// A renewal held on the wire past the end of the lease reaches the server
// after the lease ran out there (and after the client said kLost). It must
// not bring the lease back: the entry stays dead.
TEST(RedisLateRequests, ALateRenewalDoesNotBringBackAnExpiredLease) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  HoldingProxy proxy(server->port());
  const std::string q = "late/renewal";
  auto store = MustOpen(proxy.url("?ttl=1s&connect_timeout=2s"));
  auto a = MustSession(*store);
  ASSERT_TRUE(a);
  StateLog log(*a);
  auto e1 = a->append(q, Spec(), In(5s));
  ASSERT_TRUE(e1.ok()) << e1.status().to_string();
  proxy.HoldRequestsWith("dlock:session:" + a->id());  // the keep-alive's renewals
  ASSERT_TRUE(log.WaitFor(SessionState::kLost, 10s).has_value());
  // The lease in the queue ran out on the server; nobody looked at the queue
  // since, so the entry itself is still stored.
  ASSERT_TRUE(Eventually([&] { return server->CmdInt({"EXISTS", Key(q, "s:" + a->id())}) == 0; }, 5s));
  ASSERT_EQ(server->CmdInt({"EXISTS", Key(q, "e:" + e1->entry.id)}), 1);
  ASSERT_GE(proxy.held_requests(), 1);

  proxy.Release();
  ASSERT_TRUE(Eventually([&] { return proxy.answered_after_release() >= 1; }, 5s));
  EXPECT_EQ(server->CmdInt({"EXISTS", Key(q, "s:" + a->id())}), 0) << "the late renewal made the lease again";
  auto store_b = MustOpen(server->url());
  auto b = MustSession(*store_b);
  ASSERT_TRUE(b);
  auto listed = b->list(q, {}, In(5s));
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  EXPECT_TRUE(listed->empty()) << "a dead entry is back: " << Joined(Ids(*listed));
}

// An append held on the wire until its client timed out and asked find_own,
// which said "not there": when it reaches the server it must make nothing.
TEST(RedisLateRequests, AnAppendThatArrivesAfterFindOwnMakesNothing) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  HoldingProxy proxy(server->port());
  const std::string q = "late/append";
  auto store = MustOpen(proxy.url("?ttl=5s&connect_timeout=500ms"));
  auto a = MustSession(*store);
  ASSERT_TRUE(a);
  // Another entry of the session in the queue: its renewals keep the
  // session's lease there alive, and with it whatever the session owns there.
  auto e0 = a->append(q, Spec(), In(5s));
  ASSERT_TRUE(e0.ok()) << e0.status().to_string();

  EntrySpec late = Spec();
  late.owner.label = "late-" + Hex(16);
  proxy.HoldRequestsWith(late.owner.label);
  auto r = a->append(q, late, In(5s));
  ASSERT_FALSE(r.ok()) << "the append went through the proxy";
  EXPECT_EQ(r.status().code(), ErrorCode::kUnavailable) << r.status().to_string();
  ASSERT_EQ(proxy.held_requests(), 1);
  auto own = a->find_own(q, late.attempt_id, In(5s));
  ASSERT_TRUE(own.ok()) << own.status().to_string();
  EXPECT_FALSE(own->has_value());

  proxy.Release();
  ASSERT_TRUE(Eventually([&] { return proxy.answered_after_release() >= 1; }, 5s));
  auto store_b = MustOpen(server->url());
  auto b = MustSession(*store_b);
  ASSERT_TRUE(b);
  auto listed = b->list(q, {}, In(5s));
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  EXPECT_EQ(Ids(*listed), std::vector<std::string>{e0->entry.id}) << "the late append made an orphan";
  auto again = a->find_own(q, late.attempt_id, In(5s));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_FALSE(again->has_value());
  EXPECT_EQ(Keys(*server, Key(q, "e:*")), std::vector<std::string>{Key(q, "e:" + e0->entry.id)});
}

// A renewal that reaches the server after the session's own remove of an
// entry (whose reply is still on its way) finds the entry gone: that is the
// remove, not lost data, and the session stays connected.
TEST(RedisLateRequests, ARenewalThatCrossesTheSessionsOwnRemoveIsNoLoss) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  HoldingProxy proxy(server->port());
  const std::string q = "late/own-remove";
  auto store = MustOpen(proxy.url("?ttl=3s&connect_timeout=5s"));
  auto a = MustSession(*store);
  ASSERT_TRUE(a);
  StateLog log(*a);
  auto e1 = a->append(q, Spec(), In(5s));
  ASSERT_TRUE(e1.ok()) << e1.status().to_string();
  // 1. The next renewal leaves the client and is held on the wire.
  proxy.HoldRequestsWith("dlock:session:" + a->id());
  ASSERT_TRUE(Eventually([&] { return proxy.held_requests() == 1; }, 5s));
  // 2. The remove reaches the server; its reply is held.
  proxy.HoldRepliesTo(Channel(q));
  auto removed = std::async(std::launch::async, [&] { return a->remove(q, e1->entry.id, In(10s)); });
  ASSERT_TRUE(Eventually([&] { return server->CmdInt({"EXISTS", Key(q, "e:" + e1->entry.id)}) == 0; }, 5s));
  // 3. The renewal runs now, finds the entry gone, and its reply is read
  //    (the keep-alive has sent the next renewal once it has).
  long long renewals = server->CommandCalls()["pexpire"];
  proxy.ReleaseRequests();
  ASSERT_TRUE(
      Eventually([&] { return server->CommandCalls()["pexpire"] >= renewals + 2 || !log.states().empty(); }, 5s));
  EXPECT_EQ(a->state(), SessionState::kConnected);
  EXPECT_TRUE(log.states().empty()) << "the session reported: " << Names(log.states());
  proxy.Release();
  ASSERT_EQ(removed.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(removed.get().ok());
  EXPECT_EQ(a->state(), SessionState::kConnected);
}

// ---------------------------------------------------------------- replicas (WAIT)

TEST(RedisReplicas, AnAppendTooFewReplicasAcknowledgedIsAbortedAndUndone) {
  auto server = RedisServer::Start();  // no replica at all
  ASSERT_TRUE(server);
  const std::string q = "wait/append";
  auto store = MustOpen(server->url("?wait_replicas=1&wait_timeout=100ms"));
  auto s = MustSession(*store);
  ASSERT_TRUE(s);
  auto r = s->append(q, Spec(), In(5s));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kAborted) << r.status().to_string();
  EXPECT_NE(r.status().message().find("0 of 1"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(Keys(*server, Key(q, "*")), std::vector<std::string>{});
}

// The append's reply is lost after the server made the entry (and WAIT
// found no replica): find_own must not hand out that entry as if it were
// durable; it undoes it and says kAborted.
TEST(RedisReplicas, FindOwnDoesNotAdoptAnEntryTooFewReplicasAcknowledged) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  HoldingProxy proxy(server->port());
  const std::string q = "wait/find_own";
  auto store = MustOpen(proxy.url("?wait_replicas=1&wait_timeout=100ms&connect_timeout=500ms"));
  auto s = MustSession(*store);
  ASSERT_TRUE(s);
  EntrySpec spec = Spec();
  spec.owner.label = "reply-lost-" + Hex(16);
  proxy.HoldRepliesTo(spec.owner.label);
  auto r = s->append(q, spec, In(5s));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnavailable) << r.status().to_string();
  EXPECT_EQ(server->CmdInt({"ZCARD", Key(q, "q")}), 1) << "the server did not make the entry";
  proxy.Release();

  auto own = s->find_own(q, spec.attempt_id, In(5s));
  ASSERT_FALSE(own.ok()) << "find_own adopted an entry no replica acknowledged";
  EXPECT_EQ(own.status().code(), ErrorCode::kAborted) << own.status().to_string();
  EXPECT_EQ(server->CmdInt({"ZCARD", Key(q, "q")}), 0);
  EXPECT_EQ(Keys(*server, Key(q, "e:*")), std::vector<std::string>{});
}

TEST(RedisReplicas, ARemoveTooFewReplicasAcknowledgedIsStillDone) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  const std::string q = "wait/remove";
  auto plain = MustOpen(server->url());
  auto s = MustSession(*plain);
  ASSERT_TRUE(s);
  auto e = s->append(q, Spec(), In(5s));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  auto waiting = MustOpen(server->url("?wait_replicas=1&wait_timeout=100ms"));
  auto w = MustSession(*waiting);
  ASSERT_TRUE(w);
  Status removed = w->remove(q, e->entry.id, In(5s));
  EXPECT_TRUE(removed.ok()) << removed.to_string();
  EXPECT_EQ(server->CmdInt({"ZCARD", Key(q, "q")}), 0);
}

TEST(RedisReplicas, LockingWithTooFewReplicasFailsAndLeavesNothing) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  const std::string name = "wait/lock";
  Client c = Client::connect(server->url("?wait_replicas=1&wait_timeout=100ms"));
  Mutex m(c, name);
  try {
    bool got = m.try_lock_for(5s);
    ADD_FAILURE() << "try_lock_for returned " << got << " with no replica to acknowledge";
    if (got) m.unlock();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable) << e.what();
    EXPECT_NE(std::string(e.what()).find("0 of 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(Keys(*server, Key(name, "*")), std::vector<std::string>{});
  // Nothing in the way of a client that does not wait for replicas.
  Client plain = Client::connect(server->url());
  Mutex m2(plain, name);
  auto h = m2.acquire(5s);
  EXPECT_TRUE(h.has_value());
}

// Releasing while the replica does not acknowledge: the removal happened on
// the primary; nothing is retried in the background.
TEST(RedisReplicas, UnlockingWhileTheReplicaLagsIsNotRetriedForever) {
  RedisServer::Options popt;
  popt.extra = {"--repl-diskless-sync-delay", "0"};
  auto primary = RedisServer::Start(popt);
  ASSERT_TRUE(primary);
  RedisServer::Options ropt;
  ropt.replica_of = primary->port();
  auto replica = RedisServer::Start(ropt);
  ASSERT_TRUE(replica);
  ASSERT_TRUE(primary->AwaitReplicas(1)) << "the replica never acknowledged";
  const std::string name = "wait/unlock";
  std::mutex mu;
  std::vector<std::string> background;
  ClientOptions options;
  options.on_background_error = [&](const Status& s) {
    std::lock_guard<std::mutex> g(mu);
    background.push_back(s.to_string());
  };
  {
    Client c = Client::connect(primary->url("?wait_replicas=1&wait_timeout=500ms"), options);
    Mutex m(c, name);
    ASSERT_TRUE(m.try_lock_for(5s));
    replica->Freeze();
    long long waits = primary->CommandCalls()["wait"];
    m.unlock();
    EXPECT_EQ(primary->CmdInt({"ZCARD", Key(name, "q")}), 0);
    // One WAIT for the removal, and no more: watch for a retry a while.
    EXPECT_FALSE(Eventually([&] { return primary->CommandCalls()["wait"] > waits + 1; }, 3s))
        << "the removal is being retried";
    replica->Thaw();
  }
  std::lock_guard<std::mutex> g(mu);
  EXPECT_TRUE(background.empty()) << Joined(background);
}

// ---------------------------------------------------------------- keys kept

// Hundreds of names, each locked once: once released and the sessions
// closed, the server holds nothing of dlock's.
TEST(RedisKeys, NothingIsKeptPerNameOnceItsQueueIsEmptyAndItsSessionsClosed) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  {
    Client a = Client::connect(server->url());
    Client b = Client::connect(server->url());
    for (int i = 0; i < 300; ++i) {
      Mutex m(a, "many/" + std::to_string(i));
      m.lock();
      m.unlock();
    }
    // Some contention, and the other recipes.
    Mutex ma(a, "many/contended"), mb(b, "many/contended");
    auto held = ma.acquire(5s);
    ASSERT_TRUE(held);
    auto waiter = std::async(std::launch::async, [&] { return mb.acquire(20s); });
    ASSERT_TRUE(Eventually([&] { return server->CmdInt({"ZCARD", Key("many/contended", "q")}) == 2; }));
    held->release();
    auto got = waiter.get();
    ASSERT_TRUE(got);
    got->release();
    ReadWriteLock rw(a, "many/rw");
    auto r = rw.acquire_read(5s);
    ASSERT_TRUE(r);
    r->release();
    Semaphore sem(b, "many/sem", 2);
    auto lease = sem.acquire(2, 5s);
    ASSERT_TRUE(lease);
    lease->release();
    auto kept = Keys(*server, "dlock:{*");
    EXPECT_TRUE(kept.empty()) << "kept for names nobody holds: " << Joined(kept);
    a.close_session();
    b.close_session();
  }
  EXPECT_TRUE(Eventually([&] { return server->CmdInt({"DBSIZE"}) == 0; }, 5s)) << Joined(Keys(*server));
}

// A queue emptied by pruning (its only session's lease ran out) keeps no
// counter either, and the next token is still larger.
TEST(RedisKeys, APrunedQueueKeepsNoCounterAndTokensStillGrow) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  const std::string q = "keys/pruned";
  auto store = MustOpen(server->url("?ttl=60s"));
  auto a = MustSession(*store), b = MustSession(*store);
  ASSERT_TRUE(a && b);
  auto e = a->append(q, Spec(), In(5s));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_EQ(server->CmdInt({"DEL", Key(q, "s:" + a->id())}), 1);  // as if a's lease there ran out
  auto listed = b->list(q, {}, In(5s));
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(Keys(*server, Key(q, "*")), std::vector<std::string>{});
  auto next = b->append(q, Spec(), In(5s));
  ASSERT_TRUE(next.ok());
  EXPECT_GT(*next->entry.token, *e->entry.token);
}

// ---------------------------------------------------------------- what subscribers hear

TEST(RedisNotices, CloseTellsSubscribersBeforeTheEntriesGo) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  const std::string q = "notice/close";
  auto store = MustOpen(server->url());
  auto a = MustSession(*store);
  ASSERT_TRUE(a);
  auto e = a->append(q, Spec(), In(5s));
  ASSERT_TRUE(e.ok());
  std::atomic<long long> stored_when_told{-1};
  auto sub = a->subscribe([&](SessionState s) {
    if (s == SessionState::kClosed) stored_when_told = server->CmdInt({"ZCARD", Key(q, "q")});
  });
  a->close();
  EXPECT_EQ(stored_when_told.load(), 1) << "the entry went before the subscriber heard kClosed";
  EXPECT_EQ(server->CmdInt({"ZCARD", Key(q, "q")}), 0) << "close() returned with the entry still there";
}

// A subscriber that closes the session when told it is lost: no deadlock, no
// nested call, and every subscriber hears kLost before kClosed.
TEST(RedisNotices, ASubscriberMayCloseTheSessionFromItsCallback) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  const std::string q = "notice/reentrant";
  auto store = MustOpen(server->url("?ttl=1s"));
  auto a = MustSession(*store);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->append(q, Spec(), In(5s)).ok());
  std::mutex mu;
  std::vector<std::pair<int, SessionState>> heard;
  std::atomic<int> depth{0}, deepest{0};
  Session* session = a.get();
  auto record = [&](int who, SessionState s) {
    std::lock_guard<std::mutex> g(mu);
    heard.emplace_back(who, s);
  };
  auto first = a->subscribe([&, session](SessionState s) {
    int d = ++depth;
    deepest = std::max(deepest.load(), d);
    record(1, s);
    if (s == SessionState::kLost) session->close();
    --depth;
  });
  auto second = a->subscribe([&](SessionState s) { record(2, s); });
  ASSERT_EQ(server->CmdInt({"DEL", "dlock:session:" + a->id()}), 1);  // lost at the next renewal
  ASSERT_TRUE(Eventually(
      [&] {
        std::lock_guard<std::mutex> g(mu);
        return heard.size() >= 4;
      },
      10s));
  {
    std::lock_guard<std::mutex> g(mu);
    std::vector<std::pair<int, SessionState>> want = {
        {1, SessionState::kLost}, {2, SessionState::kLost}, {1, SessionState::kClosed}, {2, SessionState::kClosed}};
    EXPECT_EQ(heard, want);
  }
  EXPECT_EQ(deepest.load(), 1) << "a subscriber was called from inside itself";
  EXPECT_EQ(a->state(), SessionState::kClosed);
  EXPECT_TRUE(Eventually([&] { return server->CmdInt({"ZCARD", Key(q, "q")}) == 0; }));
  a->close();  // idempotent
}

// state() reads the session's own clock: once the lease can have run out it
// says kLost, even while the keep-alive thread is busy (here, in a slow
// subscriber) and nobody has been told yet.
TEST(RedisNotices, StateFoldsTheClockBeforeAnyoneIsTold) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  HoldingProxy proxy(server->port());
  auto store = MustOpen(proxy.url("?ttl=1s&connect_timeout=5s"));
  auto a = MustSession(*store);
  ASSERT_TRUE(a);
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  std::atomic<bool> blocked{false};
  std::atomic<bool> told_lost{false};
  auto sub = a->subscribe([&, released](SessionState s) {
    if (s == SessionState::kLost) told_lost = true;
    if (s == SessionState::kSuspended && !blocked.exchange(true)) released.wait_for(20s);
  });
  proxy.HoldRequestsWith("dlock:session:" + a->id());
  ASSERT_TRUE(Eventually([&] { return blocked.load(); }, 5s)) << "the renewal did not fail";
  EXPECT_TRUE(Eventually([&] { return a->state() == SessionState::kLost; }, 5s));
  EXPECT_FALSE(told_lost.load());
  go.set_value();
  EXPECT_TRUE(Eventually([&] { return told_lost.load(); }, 5s));
  proxy.Release();
  a->close();
}

// ---------------------------------------------------------------- names

TEST(RedisNames, QueueNamesAreLockNames) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  auto store = MustOpen(server->url());
  auto s = MustSession(*store);
  ASSERT_TRUE(s);
  std::vector<std::string> one = {Hex(32)};
  for (const std::string& bad :
       {std::string(), std::string("a}b"), std::string("a{b}"), std::string("a:b"), std::string("/a"),
        std::string("a/"), std::string("a//b"), std::string("a/../b"), std::string("sp ace"), std::string(513, 'a')}) {
    EXPECT_EQ(s->append(bad, Spec(), In(5s)).status().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(s->list(bad, {}, In(5s)).status().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(s->remove(bad, Hex(32), In(5s)).code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(s->find_own(bad, Hex(32), In(5s)).status().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(s->wait_any_gone(bad, one, In(5s), {}).code(), ErrorCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(server->CmdInt({"DBSIZE"}), 1) << Joined(Keys(*server));  // the session key only
}

TEST(RedisNames, NestedQueuesAreUnrelated) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  auto store = MustOpen(server->url());
  auto a = MustSession(*store), b = MustSession(*store);
  ASSERT_TRUE(a && b);
  auto outer = a->append("nest", Spec(), In(5s));
  auto inner = a->append("nest/a", Spec(), In(5s));
  ASSERT_TRUE(outer.ok() && inner.ok());
  auto lo = b->list("nest", {}, In(5s));
  auto li = b->list("nest/a", {}, In(5s));
  ASSERT_TRUE(lo.ok() && li.ok());
  EXPECT_EQ(Ids(*lo), std::vector<std::string>{outer->entry.id});
  EXPECT_EQ(Ids(*li), std::vector<std::string>{inner->entry.id});
  // Removing the inner entry does not count as gone in the outer queue.
  std::vector<std::string> ids = {outer->entry.id};
  ASSERT_TRUE(a->remove("nest/a", inner->entry.id, In(5s)).ok());
  EXPECT_EQ(b->wait_any_gone("nest", ids, In(300ms), {}).code(), ErrorCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace dlock
