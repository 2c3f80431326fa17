// The redis:// store against a real redis-server (tests/redis/redis_server.hpp
// starts private ones). No mocks: every test runs the scripts, the pub/sub
// connection and the keep-alive for real.
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "dlock/store.hpp"
#include "redis/redis_server.hpp"
#include "redis/redis_test_util.hpp"

#ifndef DLOCK_REDIS_HOLDER
#error "DLOCK_REDIS_HOLDER (path of dlock_redis_holder) must be defined"
#endif

namespace dlock {
namespace {

using namespace std::chrono_literals;
using namespace testing;  // the helpers of redis_test_util.hpp
using std::chrono::milliseconds;

// ---------------------------------------------------------------- URLs

TEST(RedisUrl, RejectsMalformedUrlsWithoutConnecting) {
  for (const char* url :
       {"redis://", "redis://a:1,b:2", "redis://127.0.0.1:1/x", "redis://127.0.0.1:1/-1",
        "redis://127.0.0.1:1?ttl=10ms", "redis://127.0.0.1:1?bogus=1", "redis://127.0.0.1:1?wait_replicas=-1",
        "redis://alice@127.0.0.1:1", "redis://127.0.0.1:1?ttl=abc", "redis://127.0.0.1:1?connect_timeout=0"}) {
    auto s = OpenStore(url);
    ASSERT_FALSE(s.ok()) << url;
    EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument) << url << ": " << s.status().to_string();
  }
}

// ---------------------------------------------------------------- connecting

TEST(RedisConnect, RefusedPortFailsFastWithUnavailable) {
  int port = testing::FreePort();
  auto t0 = Now();
  auto s = OpenStore("redis://127.0.0.1:" + std::to_string(port) + "?connect_timeout=2s");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kUnavailable) << s.status().to_string();
  EXPECT_LT(MsSince(t0), 1000);
}

TEST(RedisConnect, SilentServerFailsWithinConnectTimeout) {
  // A socket that accepts TCP connections (the kernel does) but never says a
  // word: what a hung server looks like.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  int port = ntohs(a.sin_port);
  auto t0 = Now();
  auto s = OpenStore("redis://127.0.0.1:" + std::to_string(port) + "?connect_timeout=400ms");
  long long took = MsSince(t0);
  ::close(fd);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kUnavailable) << s.status().to_string();
  EXPECT_GE(took, 350);
  EXPECT_LT(took, 1400);
}

TEST(RedisConnect, PasswordRightWrongAndMissing) {
  RedisServer::Options opt;
  opt.password = "s3cret";
  auto server = RedisServer::Start(opt);
  ASSERT_TRUE(server);
  std::string hp = "127.0.0.1:" + std::to_string(server->port());

  auto good = OpenStore("redis://:s3cret@" + hp);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ((*good)->url().find("s3cret"), std::string::npos) << (*good)->url();
  auto session = MustSession(**good);
  ASSERT_TRUE(session);
  EXPECT_TRUE(session->append("auth/q", Spec(), In(5s)).ok());

  auto wrong = OpenStore("redis://:nope@" + hp);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), ErrorCode::kUnauthenticated) << wrong.status().to_string();

  auto missing = OpenStore("redis://" + hp);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kUnauthenticated) << missing.status().to_string();

  // An ACL user (Redis 6+): user name and password.
  EXPECT_EQ(server->CmdStr({"ACL", "SETUSER", "alice", "on", ">alicepw", "~*", "&*", "+@all"}), "OK");
  auto alice = OpenStore("redis://alice:alicepw@" + hp);
  ASSERT_TRUE(alice.ok()) << alice.status().to_string();
  auto bad_alice = OpenStore("redis://alice:wrong@" + hp);
  ASSERT_FALSE(bad_alice.ok());
  EXPECT_EQ(bad_alice.status().code(), ErrorCode::kUnauthenticated) << bad_alice.status().to_string();
}

TEST(RedisConnect, ServerWithoutScriptsIsAClearError) {
  RedisServer::Options opt;
  opt.extra = {"--rename-command", "EVAL", "", "--rename-command", "EVALSHA", ""};
  auto server = RedisServer::Start(opt);
  ASSERT_TRUE(server);
  auto t0 = Now();
  auto s = OpenStore(server->url("?connect_timeout=2s"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kFailedPrecondition) << s.status().to_string();
  EXPECT_NE(s.status().message().find("scripts"), std::string::npos) << s.status().to_string();
  EXPECT_LT(MsSince(t0), 2000);
}

// ---------------------------------------------------------------- the contract

class RedisSessionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = RedisServer::Start().release(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr) << "could not start redis-server";
    queue_ = std::string("t/") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  std::string url(const std::string& params = "") const { return server_->url(params); }

  static RedisServer* server_;
  std::string queue_;
};
RedisServer* RedisSessionTest::server_ = nullptr;

TEST_F(RedisSessionTest, AppendListOrderTokensAndOwners) {
  auto store = MustOpen(url());
  ASSERT_TRUE(store);
  auto a = MustSession(*store), b = MustSession(*store), c = MustSession(*store);
  ASSERT_TRUE(a && b && c);
  std::vector<Appended> got;
  for (Session* s : {a.get(), b.get(), c.get(), a.get()}) {
    auto r = s->append(queue_, Spec(s == b.get() ? "read" : "lock"), In(5s));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_TRUE(r->entry.token.has_value());
    ASSERT_TRUE(r->queue.has_value());
    got.push_back(*r);
  }
  for (std::size_t i = 1; i < got.size(); ++i) {
    EXPECT_GT(got[i].entry.sequence, got[i - 1].entry.sequence);
    EXPECT_GT(*got[i].entry.token, *got[i - 1].entry.token);
    EXPECT_EQ(got[i].queue->size(), i + 1);  // the queue as it was right after this append
    EXPECT_EQ(got[i].queue->back().id, got[i].entry.id);
  }
  auto listed = a->list(queue_, {}, In(5s));
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  ASSERT_EQ(listed->size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ((*listed)[i].id, got[i].entry.id);
    EXPECT_EQ((*listed)[i].sequence, got[i].entry.sequence);
    EXPECT_EQ((*listed)[i].token, got[i].entry.token);
    EXPECT_EQ((*listed)[i].attempt_id, got[i].entry.attempt_id);
    EXPECT_FALSE((*listed)[i].owner.has_value());
  }
  EXPECT_EQ((*listed)[1].kind, "read");
  EXPECT_EQ((*listed)[0].kind, "lock");
  auto with = b->list(queue_, {.with_owners = true}, In(5s));
  ASSERT_TRUE(with.ok());
  ASSERT_EQ(with->size(), 4u);
  ASSERT_TRUE((*with)[2].owner.has_value());
  EXPECT_EQ((*with)[2].owner->host, "testhost");
  EXPECT_EQ((*with)[2].owner->pid, ::getpid());
  EXPECT_EQ((*with)[2].owner->label, "redis_store_test");
  EXPECT_EQ((*with)[2].owner->acquired_unix_ms, 1700000000000);
  // The key layout the scripts promise: one hash tag per queue.
  EXPECT_EQ(server_->CmdInt({"ZCARD", "dlock:{" + queue_ + "}:q"}), 4);
  EXPECT_EQ(server_->CmdInt({"EXISTS", "dlock:session:" + a->id()}), 1);
  EXPECT_EQ(server_->CmdInt({"EXISTS", "dlock:{" + queue_ + "}:s:" + a->id()}), 1);
}

TEST_F(RedisSessionTest, TokensKeepGrowingAfterTheQueueEmptied) {
  auto store = MustOpen(url());
  auto s = MustSession(*store);
  ASSERT_TRUE(s);
  std::uint64_t last = 0;
  for (int round = 0; round < 3; ++round) {
    auto r = s->append(queue_, Spec(), In(5s));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_GT(*r->entry.token, last);
    last = *r->entry.token;
    ASSERT_TRUE(s->remove(queue_, r->entry.id, In(5s)).ok());
    auto listed = s->list(queue_, {}, In(5s));
    ASSERT_TRUE(listed.ok());
    EXPECT_TRUE(listed->empty());
    // Nothing is kept for an empty queue, its counter included: the next
    // token comes from the server's clock, which has moved on.
    EXPECT_EQ(server_->CmdInt({"EXISTS", "dlock:{" + queue_ + "}:q"}), 0);
    EXPECT_EQ(server_->CmdInt({"EXISTS", "dlock:{" + queue_ + "}:n"}), 0);
    EXPECT_EQ(server_->CmdInt({"EXISTS", "dlock:{" + queue_ + "}:s:" + s->id()}), 0);
  }
}

TEST_F(RedisSessionTest, DowngradeTakesTheGivenSequence) {
  auto store = MustOpen(url());
  auto a = MustSession(*store), b = MustSession(*store);
  auto w = a->append(queue_, Spec("write"), In(5s));
  auto other = b->append(queue_, Spec("read"), In(5s));
  ASSERT_TRUE(w.ok() && other.ok());
  EntrySpec down = Spec("read");
  down.sequence = w->entry.sequence;
  auto r = a->append(queue_, down, In(5s));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->entry.sequence, w->entry.sequence);
  EXPECT_GT(*r->entry.token, *other->entry.token);
  ASSERT_TRUE(a->remove(queue_, w->entry.id, In(5s)).ok());
  auto listed = b->list(queue_, {}, In(5s));
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(Ids(*listed), (std::vector<std::string>{r->entry.id, other->entry.id}));
  EntrySpec bad = Spec();
  bad.sequence = 0;
  EXPECT_EQ(a->append(queue_, bad, In(5s)).status().code(), ErrorCode::kInvalidArgument);
}

TEST_F(RedisSessionTest, FindOwnSeesOnlyThisSessionsEntry) {
  auto store = MustOpen(url());
  auto a = MustSession(*store), b = MustSession(*store);
  EntrySpec spec = Spec();
  auto r = a->append(queue_, spec, In(5s));
  ASSERT_TRUE(r.ok());
  auto mine = a->find_own(queue_, spec.attempt_id, In(5s));
  ASSERT_TRUE(mine.ok()) << mine.status().to_string();
  ASSERT_TRUE(mine->has_value());
  EXPECT_EQ((*mine)->id, r->entry.id);
  EXPECT_EQ((*mine)->token, r->entry.token);
  auto theirs = b->find_own(queue_, spec.attempt_id, In(5s));
  ASSERT_TRUE(theirs.ok());
  EXPECT_FALSE(theirs->has_value());
  auto unknown = a->find_own(queue_, Hex(32), In(5s));
  ASSERT_TRUE(unknown.ok());
  EXPECT_FALSE(unknown->has_value());
  ASSERT_TRUE(a->remove(queue_, r->entry.id, In(5s)).ok());
  auto after = a->find_own(queue_, spec.attempt_id, In(5s));
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->has_value());
}

TEST_F(RedisSessionTest, RemoveTakesAnyonesEntryAndIsIdempotent) {
  auto store = MustOpen(url());
  auto a = MustSession(*store), b = MustSession(*store);
  auto r = a->append(queue_, Spec(), In(5s));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(b->remove(queue_, r->entry.id, In(5s)).ok());  // the operator's break
  EXPECT_TRUE(b->remove(queue_, r->entry.id, In(5s)).ok());  // already gone: OK
  EXPECT_TRUE(a->remove(queue_, r->entry.id, In(5s)).ok());
  auto listed = a->list(queue_, {}, In(5s));
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
}

TEST_F(RedisSessionTest, ScriptCacheFlushFallsBackToEval) {
  auto store = MustOpen(url());
  auto s = MustSession(*store);
  auto before = server_->CommandCalls();
  ASSERT_EQ(server_->CmdStr({"SCRIPT", "FLUSH"}), "OK");
  auto r = s->append(queue_, Spec(), In(5s));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto listed = s->list(queue_, {}, In(5s));
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 1u);
  auto after = server_->CommandCalls();
  EXPECT_GE(after["eval"] - before["eval"], 2);  // NOSCRIPT, then the source
}

TEST_F(RedisSessionTest, WaitReturnsAtOnceForAGoneEntry) {
  auto store = MustOpen(url());
  auto s = MustSession(*store);
  std::vector<std::string> ids = {Hex(32)};
  auto t0 = Now();
  EXPECT_TRUE(s->wait_any_gone(queue_, ids, In(5s), {}).ok());
  EXPECT_LT(MsSince(t0), 1000);
}

TEST_F(RedisSessionTest, WaitIsWokenByReleaseThroughPubSub) {
  auto store = MustOpen(url("?ttl=60s"));
  auto a = MustSession(*store), b = MustSession(*store);
  auto held = a->append(queue_, Spec(), In(5s));
  ASSERT_TRUE(held.ok());
  std::vector<std::string> ids = {held->entry.id};
  auto waiter = WaitInBackground(*b, queue_, ids, In(30s));
  ASSERT_TRUE(Eventually([&] { return server_->NumSub(Channel(queue_)) == 1; }));
  EXPECT_EQ(waiter.wait_for(300ms), std::future_status::timeout);  // still waiting
  auto t0 = Now();
  ASSERT_TRUE(a->remove(queue_, held->entry.id, In(5s)).ok());
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  long long woke_after = MsSince(t0);
  EXPECT_TRUE(waiter.get().ok());
  EXPECT_LT(woke_after, 250) << "a release must wake a waiter at once";
  std::printf("[ measure ] release -> waiter woken: %lld ms\n", woke_after);
}

TEST_F(RedisSessionTest, WaitingDoesNotPoll) {
  // 8 waiters on one queue: one SUBSCRIBE, one first check each, and then no
  // command at all while nothing happens. A release costs one script.
  auto store = MustOpen(url("?ttl=60s"));
  auto a = MustSession(*store), b = MustSession(*store);
  auto held = a->append(queue_, Spec(), In(5s));
  ASSERT_TRUE(held.ok());
  std::vector<std::string> ids = {held->entry.id};
  auto before = server_->CommandCalls();
  std::vector<std::future<Status>> waiters;
  for (int i = 0; i < 8; ++i) {
    waiters.push_back(WaitInBackground(*b, queue_, ids, In(60s)));
  }
  ASSERT_TRUE(Eventually([&] { return server_->CommandCalls()["evalsha"] - before["evalsha"] >= 8; }));
  auto settled = server_->CommandCalls();
  EXPECT_EQ(settled["subscribe"] - before["subscribe"], 1);
  EXPECT_EQ(settled["evalsha"] - before["evalsha"], 8);
  std::this_thread::sleep_for(2s);  // measuring that nothing happens
  auto idle = server_->CommandCalls();
  long long during = 0;
  for (auto& [cmd, calls] : idle) {
    if (cmd != "info") during += calls - settled[cmd];
  }
  EXPECT_EQ(during, 0) << "commands sent while 8 waits sat idle for 2s";
  ASSERT_TRUE(a->remove(queue_, held->entry.id, In(5s)).ok());
  for (auto& w : waiters) {
    ASSERT_EQ(w.wait_for(5s), std::future_status::ready);
    EXPECT_TRUE(w.get().ok());
  }
  auto done = server_->CommandCalls();
  EXPECT_EQ(done["evalsha"] - idle["evalsha"], 1);  // the remove; the waiters checked nothing more
  std::printf("[ measure ] 8 waits: %lld SUBSCRIBE, %lld scripts to settle, %lld commands idle for 2s\n",
              settled["subscribe"] - before["subscribe"], settled["evalsha"] - before["evalsha"], during);
}

TEST_F(RedisSessionTest, WaitDeadlineAndStop) {
  auto store = MustOpen(url());
  auto a = MustSession(*store), b = MustSession(*store);
  auto held = a->append(queue_, Spec(), In(5s));
  ASSERT_TRUE(held.ok());
  std::vector<std::string> ids = {held->entry.id};

  auto t0 = Now();
  Status s = b->wait_any_gone(queue_, ids, In(300ms), {});
  long long took = MsSince(t0);
  EXPECT_EQ(s.code(), ErrorCode::kDeadlineExceeded) << s.to_string();
  EXPECT_GE(took, 290);
  EXPECT_LT(took, 800);

  std::stop_source stop;
  auto waiter = WaitInBackground(*b, queue_, ids, kNoDeadline, stop.get_token());
  ASSERT_TRUE(Eventually([&] { return server_->NumSub(Channel(queue_)) == 1; }));
  EXPECT_EQ(waiter.wait_for(200ms), std::future_status::timeout);
  auto t1 = Now();
  stop.request_stop();
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  EXPECT_LT(MsSince(t1), 100);
  EXPECT_EQ(waiter.get().code(), ErrorCode::kCancelled);

  // A stop requested before the call.
  EXPECT_EQ(b->wait_any_gone(queue_, ids, kNoDeadline, stop.get_token()).code(), ErrorCode::kCancelled);
}

TEST_F(RedisSessionTest, ClosingTheWaitingSessionEndsItsWait) {
  auto store = MustOpen(url());
  auto a = MustSession(*store), b = MustSession(*store);
  auto held = a->append(queue_, Spec(), In(5s));
  ASSERT_TRUE(held.ok());
  std::vector<std::string> ids = {held->entry.id};
  auto waiter = WaitInBackground(*b, queue_, ids, In(30s));
  ASSERT_TRUE(Eventually([&] { return server_->NumSub(Channel(queue_)) == 1; }));
  auto t0 = Now();
  b->close();
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  EXPECT_LT(MsSince(t0), 500);
  EXPECT_EQ(waiter.get().code(), ErrorCode::kSessionLost);
  EXPECT_EQ(b->state(), SessionState::kClosed);
  EXPECT_EQ(b->append(queue_, Spec(), In(1s)).status().code(), ErrorCode::kSessionLost);
}

TEST_F(RedisSessionTest, CloseRemovesEntriesAndSessionKeyAndWakesWaiters) {
  auto store = MustOpen(url());
  auto a = MustSession(*store), b = MustSession(*store);
  std::string q2 = queue_ + "/other";
  auto e1 = a->append(queue_, Spec(), In(5s));
  auto e2 = a->append(q2, Spec(), In(5s));
  ASSERT_TRUE(e1.ok() && e2.ok());
  std::vector<std::string> ids = {e1->entry.id};
  auto waiter = WaitInBackground(*b, queue_, ids, In(30s));
  ASSERT_TRUE(Eventually([&] { return server_->NumSub(Channel(queue_)) == 1; }));
  StateLog log(*a);
  std::string sid = a->id();
  a->close();
  a->close();  // idempotent
  EXPECT_EQ(log.states(), std::vector<SessionState>{SessionState::kClosed});
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(waiter.get().ok());
  EXPECT_EQ(server_->CmdInt({"EXISTS", "dlock:session:" + sid}), 0);
  EXPECT_EQ(server_->CmdInt({"EXISTS", "dlock:{" + q2 + "}:s:" + sid}), 0);
  EXPECT_TRUE(b->list(queue_, {}, In(5s))->empty());
  EXPECT_TRUE(b->list(q2, {}, In(5s))->empty());
}

TEST_F(RedisSessionTest, WaitIsWokenWhenACrashedHoldersLeaseRunsOut) {
  // A holder in another process, with a 1s lease, is killed with SIGKILL: it
  // never releases. The waiter learns it from the lease's expiry.
  const std::string holder_url = url("?ttl=1s");
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    ::execl(DLOCK_REDIS_HOLDER, DLOCK_REDIS_HOLDER, holder_url.c_str(), queue_.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_GT(child, 0);
  ::close(out[1]);
  std::string line;
  pollfd p{out[0], POLLIN, 0};
  while (line.find('\n') == std::string::npos && ::poll(&p, 1, 5000) > 0) {
    char buf[128];
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    line.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  ASSERT_NE(line.find(' '), std::string::npos) << "holder said: " << line;
  std::string held = line.substr(0, line.find(' '));

  auto store = MustOpen(url("?ttl=60s"));
  auto b = MustSession(*store);
  std::vector<std::string> ids = {held};
  auto listed = b->list(queue_, {}, In(5s));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(Ids(*listed), ids);
  auto before = server_->CommandCalls();
  auto waiter = WaitInBackground(*b, queue_, ids, In(20s));
  ASSERT_TRUE(Eventually([&] { return server_->NumSub(Channel(queue_)) == 1; }));
  EXPECT_EQ(waiter.wait_for(200ms), std::future_status::timeout);
  auto killed = Now();
  ::kill(child, SIGKILL);
  int st = 0;
  ::waitpid(child, &st, 0);
  ASSERT_EQ(waiter.wait_for(10s), std::future_status::ready);
  long long after_kill = MsSince(killed);
  EXPECT_TRUE(waiter.get().ok());
  // The lease had at most 1s left; the re-check runs just after it can end.
  EXPECT_LT(after_kill, 1600);
  auto after = server_->CommandCalls();
  long long scripts = after["evalsha"] - before["evalsha"];
  EXPECT_LE(scripts, 6) << "checks while waiting ~1s for a crashed holder";
  std::printf("[ measure ] crashed holder (ttl 1s) -> waiter woken %lld ms after SIGKILL, %lld scripts\n", after_kill,
              scripts);
  auto now_listed = b->list(queue_, {}, In(5s));
  ASSERT_TRUE(now_listed.ok());
  EXPECT_TRUE(now_listed->empty());
}

TEST_F(RedisSessionTest, FallbackRecheckRunsAboutOncePerLeaseForAllWaiters) {
  // A live holder with a 1s lease, 4 waiters: pub/sub cannot announce a
  // crash, so the queue is re-checked when the holder's lease could run out
  // -- once for all 4 waiters, about once per lease period, not per waiter.
  auto holder_store = MustOpen(url("?ttl=1s"));
  auto holder = MustSession(*holder_store);
  auto held = holder->append(queue_, Spec(), In(5s));
  ASSERT_TRUE(held.ok());
  auto store = MustOpen(url("?ttl=60s"));
  auto b = MustSession(*store);
  std::vector<std::string> ids = {held->entry.id};
  auto before = server_->CommandCalls();
  std::vector<std::future<Status>> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.push_back(WaitInBackground(*b, queue_, ids, In(60s)));
  }
  // Checks, counted by the one ZRANGE each check script runs (commandstats
  // counts the commands scripts call; the holder's renewals run none).
  auto scripts_since = [&](std::map<std::string, long long>& from) {
    return server_->CommandCalls()["zrange"] - from["zrange"];
  };
  ASSERT_TRUE(Eventually([&] { return scripts_since(before) >= 4; }));
  auto settled = server_->CommandCalls();
  std::this_thread::sleep_for(3s);  // measuring how often the queue is re-checked
  long long checks = scripts_since(settled);
  auto idle = server_->CommandCalls();
  EXPECT_GE(checks, 2);
  EXPECT_LE(checks, 6);
  EXPECT_EQ(idle["subscribe"] - before["subscribe"], 1);
  for (auto& w : waiters) EXPECT_EQ(w.wait_for(0s), std::future_status::timeout);
  std::printf("[ measure ] 4 waiters, holder lease 1s: %lld shared re-checks in 3s\n", checks);
  ASSERT_TRUE(holder->remove(queue_, held->entry.id, In(5s)).ok());
  for (auto& w : waiters) {
    ASSERT_EQ(w.wait_for(5s), std::future_status::ready);
    EXPECT_TRUE(w.get().ok());
  }
}

TEST_F(RedisSessionTest, KilledCommandConnectionsAreReplacedWithoutErrors) {
  auto store = MustOpen(url("?ttl=1500ms"));
  auto s = MustSession(*store);
  StateLog log(*s);
  auto e = s->append(queue_, Spec(), In(5s));
  ASSERT_TRUE(e.ok());
  // Once the keep-alive has its connection, kill it and the pool's (not the
  // one asking).
  long long before = server_->CommandCalls()["pexpire"];
  ASSERT_TRUE(Eventually([&] { return server_->CommandCalls()["pexpire"] > before; }));
  EXPECT_GE(server_->CmdInt({"CLIENT", "KILL", "TYPE", "normal"}), 2);
  auto listed = s->list(queue_, {}, In(5s));
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  EXPECT_EQ(Ids(*listed), std::vector<std::string>{e->entry.id});
  // Two renewals later, the session never noticed.
  long long renewals = server_->CommandCalls()["pexpire"];
  ASSERT_TRUE(Eventually([&] { return server_->CommandCalls()["pexpire"] >= renewals + 2; }));
  EXPECT_EQ(s->state(), SessionState::kConnected);
  EXPECT_TRUE(log.states().empty());
}

TEST_F(RedisSessionTest, SubscriberRecoversFromAKilledConnection) {
  auto store = MustOpen(url("?ttl=60s"));
  auto a = MustSession(*store), b = MustSession(*store);
  auto held = a->append(queue_, Spec(), In(5s));
  ASSERT_TRUE(held.ok());
  std::vector<std::string> ids = {held->entry.id};
  auto waiter = WaitInBackground(*b, queue_, ids, In(30s));
  ASSERT_TRUE(Eventually([&] { return server_->NumSub(Channel(queue_)) == 1; }));
  // Cut the subscriber's connection, then release at once: the message may
  // well be lost. The re-subscription re-checks the queue.
  EXPECT_GE(server_->CmdInt({"CLIENT", "KILL", "TYPE", "pubsub"}), 1);
  ASSERT_TRUE(a->remove(queue_, held->entry.id, In(5s)).ok());
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(waiter.get().ok());
}

TEST_F(RedisSessionTest, LocksExcludeEachOtherUnderContention) {
  // A minimal lock recipe over the store, from 4 threads on 2 stores: the
  // queue head holds the lock; others wait for their predecessor to go.
  auto s1 = MustOpen(url()), s2 = MustOpen(url());
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::mutex mu;
  std::vector<std::uint64_t> grant_tokens;
  auto worker = [&](Store& store, int rounds) {
    auto session = MustSession(store);
    if (!session) return;
    for (int i = 0; i < rounds; ++i) {
      auto mine = session->append(queue_, Spec(), In(10s));
      ASSERT_TRUE(mine.ok()) << mine.status().to_string();
      std::vector<Entry> q = *mine->queue;
      for (int guard = 0; guard < 1000; ++guard) {
        auto it = std::find_if(q.begin(), q.end(), [&](const Entry& e) { return e.id == mine->entry.id; });
        ASSERT_NE(it, q.end());
        if (it == q.begin()) break;
        std::vector<std::string> pred = {std::prev(it)->id};
        Status w = session->wait_any_gone(queue_, pred, In(10s), {});
        ASSERT_TRUE(w.ok()) << w.to_string();
        auto l = session->list(queue_, {}, In(10s));
        ASSERT_TRUE(l.ok());
        q = *l;
      }
      if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
      {
        std::lock_guard<std::mutex> g(mu);
        grant_tokens.push_back(*mine->entry.token);
      }
      std::this_thread::yield();
      inside.fetch_sub(1);
      ASSERT_TRUE(session->remove(queue_, mine->entry.id, In(10s)).ok());
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, std::ref(t % 2 ? *s1 : *s2), 15);
  for (auto& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  ASSERT_EQ(grant_tokens.size(), 60u);
  for (std::size_t i = 1; i < grant_tokens.size(); ++i) {
    EXPECT_GT(grant_tokens[i], grant_tokens[i - 1]) << "grants must follow token order";
  }
}

TEST_F(RedisSessionTest, DatabaseNumberSelectsTheDatabase) {
  auto store = MustOpen(url("/3"));
  auto s = MustSession(*store);
  ASSERT_TRUE(s);
  auto r = s->append(queue_, Spec(), In(5s));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(server_->CmdInt({"EXISTS", "dlock:{" + queue_ + "}:q"}, 3), 1);
  EXPECT_EQ(server_->CmdInt({"EXISTS", "dlock:{" + queue_ + "}:q"}, 0), 0);
  // A waiter on the same database hears the release (its channel names db 3).
  auto b = MustSession(*store);
  std::vector<std::string> ids = {r->entry.id};
  auto waiter = WaitInBackground(*b, queue_, ids, In(30s));
  ASSERT_TRUE(Eventually([&] { return server_->NumSub(Channel(queue_) + ":3") == 1; }));
  ASSERT_TRUE(s->remove(queue_, r->entry.id, In(5s)).ok());
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(waiter.get().ok());
}

// ---------------------------------------------------------------- faults

// Waits on `id` in `waiter` until it is subscribed, removes the entry
// through `remover`, and expects the wait to end OK: waits work.
void ExpectRemoveWakesWait(RedisServer& server, Session& waiter, Session& remover, const std::string& queue,
                           const std::string& id) {
  std::vector<std::string> ids = {id};
  auto wait = WaitInBackground(waiter, queue, ids, In(30s));
  ASSERT_TRUE(Eventually([&] { return server.NumSub(Channel(queue)) == 1; }));
  ASSERT_TRUE(remover.remove(queue, id, In(5s)).ok());
  ASSERT_EQ(wait.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(wait.get().ok());
}

TEST(RedisFaults, LostIsDeclaredBeforeTheServerLeaseEndsWhenTheServerFreezes) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  auto store = MustOpen(server->url("?ttl=2s&connect_timeout=1s"));
  auto s = MustSession(*store);
  ASSERT_TRUE(s);
  StateLog log(*s);
  auto e = s->append("frozen/q", Spec(), In(5s));
  ASSERT_TRUE(e.ok());
  // Let a renewal happen, then read how long the server will keep the lease.
  ASSERT_TRUE(Eventually([&] { return server->CommandCalls()["pexpire"] >= 1; }, 3s));
  auto t_q = Now();
  long long pttl_key = server->CmdInt({"PTTL", "dlock:session:" + s->id()});
  long long pttl_mirror = server->CmdInt({"PTTL", "dlock:{frozen/q}:s:" + s->id()});
  auto rtt = MsSince(t_q);
  ASSERT_GT(pttl_key, 0);
  ASSERT_GT(pttl_mirror, 0);
  // The earliest the server could let the lease go, by the test's clock.
  SteadyTime server_end = t_q + milliseconds(std::min(pttl_key, pttl_mirror) - rtt);
  server->Freeze();
  auto suspended = log.WaitFor(SessionState::kSuspended, 5s);
  ASSERT_TRUE(suspended.has_value()) << "no kSuspended while the server is frozen";
  // While suspended, requests fail fast instead of hanging.
  auto t_a = Now();
  EXPECT_EQ(s->append("frozen/q", Spec(), In(5s)).status().code(), ErrorCode::kUnavailable);
  EXPECT_LT(MsSince(t_a), 100);
  auto lost = log.WaitFor(SessionState::kLost, 5s);
  ASSERT_TRUE(lost.has_value()) << "no kLost while the server is frozen";
  long long ahead = std::chrono::duration_cast<milliseconds>(server_end - *lost).count();
  EXPECT_GT(ahead, 0) << "kLost must come before the server can end the lease";
  EXPECT_LT(ahead, 1000) << "kLost came too early";
  std::printf(
      "[ measure ] ttl 2s, server frozen: kSuspended after renewal failed, kLost %lld ms before the "
      "server-side lease could end\n",
      ahead);
  EXPECT_EQ(s->state(), SessionState::kLost);
  server->Thaw();
  // Back: the session stays lost, its lease ends on the server, and a new
  // session works.
  EXPECT_TRUE(Eventually([&] { return server->CmdInt({"EXISTS", "dlock:session:" + s->id()}) == 0; }, 5s));
  auto s2 = MustSession(*store);
  ASSERT_TRUE(s2);
  EXPECT_NE(s2->id(), s->id());
  auto e2 = s2->append("frozen/q", Spec(), In(5s));
  ASSERT_TRUE(e2.ok()) << e2.status().to_string();
  EXPECT_GT(*e2->entry.token, *e->entry.token);
  auto listed = s2->list("frozen/q", {}, In(5s));
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(Ids(*listed), std::vector<std::string>{e2->entry.id});  // the lost session's entry is gone
  EXPECT_EQ(s->append("frozen/q", Spec(), In(1s)).status().code(), ErrorCode::kSessionLost);
  EXPECT_EQ(s->state(), SessionState::kLost);
  auto states = log.states();
  ASSERT_FALSE(states.empty());
  EXPECT_EQ(states.back(), SessionState::kLost) << "a lost session never reports connected again";
  EXPECT_EQ(std::count(states.begin(), states.end(), SessionState::kLost), 1);
}

TEST(RedisFaults, AShortOutageSuspendsAndRecovers) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  auto store = MustOpen(server->url("?ttl=3s&connect_timeout=500ms"));
  auto a = MustSession(*store), b = MustSession(*store);
  ASSERT_TRUE(a && b);
  StateLog log(*a), log_b(*b);
  auto e = a->append("outage/q", Spec(), In(5s));
  ASSERT_TRUE(e.ok());
  server->Freeze();
  auto suspended = log.WaitFor(SessionState::kSuspended, 3s);
  server->Thaw();
  ASSERT_TRUE(suspended.has_value());
  auto connected = log.WaitFor(SessionState::kConnected, 3s);
  ASSERT_TRUE(connected.has_value()) << "the session must come back when the server does";
  EXPECT_EQ(log.states(), (std::vector<SessionState>{SessionState::kSuspended, SessionState::kConnected}));
  EXPECT_EQ(a->state(), SessionState::kConnected);
  // b went through the same (or renewed on either side of the freeze).
  if (log_b.WaitFor(SessionState::kSuspended, 0ms)) {
    ASSERT_TRUE(log_b.WaitFor(SessionState::kConnected, 3s).has_value());
  }
  EXPECT_EQ(b->state(), SessionState::kConnected);
  // Its entry survived, and waits on it still work.
  auto listed = b->list("outage/q", {}, In(5s));
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  ASSERT_EQ(Ids(*listed), std::vector<std::string>{e->entry.id});
  EXPECT_EQ((*listed)[0].token, e->entry.token);
  ExpectRemoveWakesWait(*server, *b, *a, "outage/q", e->entry.id);
}

TEST(RedisFaults, ServerRestartWithoutDataLosesSessionsAndThenWorks) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  auto store = MustOpen(server->url("?ttl=3s&connect_timeout=1s"));
  auto a = MustSession(*store), b = MustSession(*store);
  ASSERT_TRUE(a && b);
  StateLog la(*a);
  auto held = a->append("restart/q", Spec(), In(5s));
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(b->append("restart/q", Spec(), In(5s)).ok());  // b queues behind a, as a lock would
  std::vector<std::string> ids = {held->entry.id};
  auto waiter = WaitInBackground(*b, "restart/q", ids, In(30s));
  ASSERT_TRUE(Eventually([&] { return server->NumSub(Channel("restart/q")) == 1; }));

  server->Kill();
  ASSERT_TRUE(la.WaitFor(SessionState::kSuspended, 5s).has_value());
  auto t0 = Now();
  EXPECT_EQ(a->list("restart/q", {}, In(5s)).status().code(), ErrorCode::kUnavailable);
  EXPECT_LT(MsSince(t0), 1500);
  EXPECT_EQ(waiter.wait_for(100ms), std::future_status::timeout) << "a wait keeps waiting through a suspension";

  ASSERT_TRUE(server->Restart());
  // The session keys are gone with the data: both sessions are lost, the
  // wait ends with kSessionLost, nothing hangs.
  ASSERT_TRUE(la.WaitFor(SessionState::kLost, 5s).has_value());
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(waiter.get().code(), ErrorCode::kSessionLost);
  auto c = MustSession(*store);
  ASSERT_TRUE(c);
  auto e = c->append("restart/q", Spec(), In(5s));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_GT(*e->entry.token, *held->entry.token) << "tokens must keep growing across a restart that lost data";
  auto listed = c->list("restart/q", {}, In(5s));
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(Ids(*listed), std::vector<std::string>{e->entry.id});
  // Waits work again too (the subscriber reconnected).
  auto d = MustSession(*store);
  ExpectRemoveWakesWait(*server, *d, *c, "restart/q", e->entry.id);
}

TEST(RedisFaults, OpenSessionOnADownServerIsUnavailable) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server);
  auto store = MustOpen(server->url("?connect_timeout=1s"));
  server->Kill();
  auto t0 = Now();
  auto s = store->open_session(In(5s));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kUnavailable) << s.status().to_string();
  EXPECT_LT(MsSince(t0), 1500);
}

TEST(RedisFaults, WaitReplicasRequiresAcknowledgements) {
  RedisServer::Options popt;
  popt.extra = {"--repl-diskless-sync-delay", "0"};  // let the replica sync at once
  auto primary = RedisServer::Start(popt);
  ASSERT_TRUE(primary);
  RedisServer::Options opt;
  opt.replica_of = primary->port();
  auto replica = RedisServer::Start(opt);
  ASSERT_TRUE(replica);
  ASSERT_TRUE(primary->AwaitReplicas(1)) << "the replica never acknowledged";
  auto one = MustOpen(primary->url("?wait_replicas=1"));
  auto s1 = MustSession(*one);
  auto ok = s1->append("wait/q", Spec(), In(5s));
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_TRUE(s1->remove("wait/q", ok->entry.id, In(5s)).ok());

  auto two = MustOpen(primary->url("?wait_replicas=2&wait_timeout=200ms"));
  auto s2 = MustSession(*two);
  auto t0 = Now();
  auto r = s2->append("wait/q", Spec(), In(5s));
  long long took = MsSince(t0);
  ASSERT_FALSE(r.ok());
  // The store took the entry back: kAborted (not "maybe there").
  EXPECT_EQ(r.status().code(), ErrorCode::kAborted);
  EXPECT_NE(r.status().message().find("1 of 2"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(primary->CmdInt({"EXISTS", "dlock:{wait/q}:q"}), 0);
  EXPECT_GE(took, 190);
  EXPECT_LT(took, 1000);
}

}  // namespace
}  // namespace dlock
