// Interoperability with kazoo (python3-kazoo), against a real server: kazoo's
// lock nodes are contenders in dlock's listing, dlock's Curator-style nodes
// are contenders for kazoo (given extra_lock_patterns), in both orders, at
// the store level and with dlock's recipes.
#include <gtest/gtest.h>

#include "zookeeper/zk_test_support.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using zktest::Kazoo;
using zktest::SharedServer;
using zktest::SteadyClock;

Clock::time_point In(Clock::duration d) { return Clock::system()->now() + d; }

EntrySpec Spec(std::string kind) {
  static std::atomic<int> n{0};
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016x%016x", static_cast<unsigned>(::getpid()), static_cast<unsigned>(++n));
  EntrySpec s;
  s.kind = std::move(kind);
  s.attempt_id = buf;
  s.owner.host = "dlock-test";
  return s;
}

class ZkKazooTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DLOCK_REQUIRE_ZK_SERVER();
    if (std::string(DLOCK_PYTHON_KAZOO).empty()) GTEST_SKIP() << "needs python3-kazoo";
    hosts_ = SharedServer();
    zktest::EnsureTestRoot(hosts_);
    chroot_ = zktest::UniqueChroot(::testing::UnitTest::GetInstance()->current_test_info()->name());
    url_ = "zk://" + hosts_ + chroot_;
    auto store = OpenStore(url_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = *store;
    auto s = store_->open_session(In(20s));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    session_ = *s;
    raw_ = std::make_unique<zktest::RawZk>(hosts_);
    ASSERT_TRUE(raw_->connected());
  }
  std::string Path(const std::string& queue) const { return chroot_ + "/" + queue; }
  // Waits (bounded) until the queue has exactly `n` children: the observable
  // sign that a waiter has queued, or that a timed-out one has cleaned up.
  bool AwaitChildren(const std::string& queue, std::size_t n, std::chrono::milliseconds limit = 10s) {
    return zktest::WaitFor([&] { return raw_->children(Path(queue)).size() == n; }, limit);
  }
  std::size_t Children(const std::string& queue) { return raw_->children(Path(queue)).size(); }

  std::string hosts_, chroot_, url_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<Session> session_;
  std::unique_ptr<zktest::RawZk> raw_;
};

TEST_F(ZkKazooTest, KazooHolderIsListedAndDlockQueuesBehindIt) {
  Kazoo kazoo(hosts_);
  ASSERT_TRUE(kazoo.ready());
  std::string got = kazoo.call("lock lock " + Path("q") + " 10");
  ASSERT_EQ(got.rfind("acquired ", 0), 0u) << got;
  std::string node = got.substr(9);

  auto a = session_->append("q", Spec("lock"), In(10s));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(a->queue);
  ASSERT_EQ(a->queue->size(), 2u);
  const Entry& first = (*a->queue)[0];
  EXPECT_EQ(first.id, node);
  EXPECT_EQ(first.kind, "lock");
  EXPECT_EQ(first.attempt_id, "");
  EXPECT_LT(first.sequence, a->entry.sequence);
  EXPECT_EQ((*a->queue)[1].id, a->entry.id);

  // dlock waits for kazoo's node, and wakes when kazoo releases.
  Status waited;
  std::thread t([&] {
    std::vector<std::string> ids{node};
    waited = session_->wait_any_gone("q", ids, In(30s), {});
  });
  // dlock's getData watch on kazoo's node, as the server lists it (wchp).
  EXPECT_TRUE(zktest::WaitFor([&] { return zktest::FourLetters(hosts_, "wchp").find(node) != std::string::npos; }));
  EXPECT_EQ(kazoo.call("release"), "released");
  t.join();
  EXPECT_TRUE(waited.ok()) << waited.ToString();
}

TEST_F(ZkKazooTest, DlockEntryBlocksKazooUntilRemoved) {
  auto a = session_->append("q", Spec("lock"), In(10s));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  Kazoo kazoo(hosts_);
  ASSERT_TRUE(kazoo.ready());
  // kazoo with extra_lock_patterns=["-lock-"] sees our _c_<uuid>-lock- node.
  EXPECT_EQ(kazoo.call("lock lock " + Path("q") + " 1"), "timeout");
  kazoo.send("lock lock " + Path("q") + " 20");
  ASSERT_TRUE(AwaitChildren("q", 2));
  // kazoo is now queued behind us.
  auto listed = session_->list("q", {.with_owners = true}, In(10s));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].id, a->entry.id);
  EXPECT_EQ((*listed)[1].kind, "lock");
  ASSERT_TRUE(session_->remove("q", a->entry.id, In(10s)).ok());
  std::string got = kazoo.read_line(20s);
  EXPECT_EQ(got.rfind("acquired ", 0), 0u) << got;
}

TEST_F(ZkKazooTest, ReadWriteKindsAcrossClients) {
  Kazoo writer(hosts_), reader(hosts_);
  ASSERT_TRUE(writer.ready() && reader.ready());
  // kazoo's ReadLock takes a shared lock alongside dlock's read entry...
  auto r = session_->append("rw", Spec("read"), In(10s));
  ASSERT_TRUE(r.ok());
  std::string got = reader.call("lock read " + Path("rw") + " 5");
  ASSERT_EQ(got.rfind("acquired ", 0), 0u) << got;
  // ...while kazoo's WriteLock must wait for both (it sees __READ__ nodes).
  EXPECT_EQ(writer.call("lock write " + Path("rw") + " 1"), "timeout");
  auto listed = session_->list("rw", {}, In(10s));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].kind, "read");
  EXPECT_EQ((*listed)[1].kind, "read");  // kazoo's __rlock__
  writer.send("lock write " + Path("rw") + " 20");
  ASSERT_TRUE(AwaitChildren("rw", 3));
  listed = session_->list("rw", {}, In(10s));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_EQ((*listed)[2].kind, "lock");  // kazoo's WriteLock writes __lock__: exclusive
  ASSERT_TRUE(session_->remove("rw", r->entry.id, In(10s)).ok());
  EXPECT_EQ(reader.call("release"), "released");
  got = writer.read_line(20s);
  EXPECT_EQ(got.rfind("acquired ", 0), 0u) << got;
  // A dlock writer now queues behind kazoo's writer.
  auto w = session_->append("rw", Spec("write"), In(10s));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->queue);
  ASSERT_EQ(w->queue->size(), 2u);
  EXPECT_EQ((*w->queue)[0].kind, "lock");
  EXPECT_EQ((*w->queue)[1].id, w->entry.id);
}

// Recipe level: dlock::Mutex and kazoo's Lock exclude each other both ways.
TEST_F(ZkKazooTest, MutexAndKazooLockExcludeEachOther) {
  auto client = Client::connect(url_);
  Mutex m(client, "recipe");
  Kazoo kazoo(hosts_);
  ASSERT_TRUE(kazoo.ready());

  // dlock holds; kazoo waits until dlock unlocks.
  m.lock();
  EXPECT_EQ(kazoo.call("lock lock " + Path("recipe") + " 1"), "timeout");
  kazoo.send("lock lock " + Path("recipe") + " 20");
  ASSERT_TRUE(AwaitChildren("recipe", 2));
  m.unlock();
  std::string got = kazoo.read_line(20s);
  ASSERT_EQ(got.rfind("acquired ", 0), 0u) << got;

  // kazoo holds; dlock waits until kazoo releases. A thread-agnostic hold
  // (acquire) so that this thread can release what another thread got.
  EXPECT_FALSE(m.try_lock());
  EXPECT_FALSE(m.try_lock_for(300ms));
  ASSERT_TRUE(AwaitChildren("recipe", 1));  // the timed-out entry is gone
  std::optional<Hold> hold;
  std::thread t([&] { hold = m.acquire(20s); });
  EXPECT_TRUE(AwaitChildren("recipe", 2));
  EXPECT_EQ(kazoo.call("release"), "released");
  t.join();
  ASSERT_TRUE(hold);
  EXPECT_TRUE(hold->fencing_token() > 0u);
  hold->release();
}

// Recipe level, ReadWriteLock against kazoo's ReadLock / WriteLock. Each
// kazoo process holds at most one lock, so each role gets its own process.
// A "timeout" answer from kazoo means its acquire waited the full time.
bool Acquired(const std::string& answer) { return answer.rfind("acquired ", 0) == 0; }

TEST_F(ZkKazooTest, DlockWriterExcludesKazooReadAndWriteLocks) {
  auto client = Client::connect(url_);
  ReadWriteLock rw(client, "rw");
  Kazoo reader(hosts_), writer(hosts_);
  ASSERT_TRUE(reader.ready() && writer.ready());

  auto w = rw.acquire_write(10s);
  ASSERT_TRUE(w);
  EXPECT_EQ(reader.call("lock read " + Path("rw") + " 1"), "timeout");
  EXPECT_EQ(writer.call("lock write " + Path("rw") + " 1"), "timeout");
  ASSERT_TRUE(AwaitChildren("rw", 1));  // kazoo cleaned up after its timeouts

  // Each waits behind the dlock writer and gets in once it is released. (One
  // at a time: kazoo 2.8's ReadLock waits for the *last* exclusive node, even
  // one queued after it, so a kazoo reader and writer queued together behind
  // anything deadlock until a timeout; kazoo alone does the same.)
  reader.send("lock read " + Path("rw") + " 20");
  ASSERT_TRUE(AwaitChildren("rw", 2));
  EXPECT_EQ(reader.read_line(500ms), "");  // still waiting
  w->release();
  std::string got = reader.read_line(20s);
  ASSERT_TRUE(Acquired(got)) << got;
  EXPECT_EQ(reader.call("release"), "released");

  w = rw.acquire_write(10s);
  ASSERT_TRUE(w);
  writer.send("lock write " + Path("rw") + " 20");
  ASSERT_TRUE(AwaitChildren("rw", 2));
  EXPECT_EQ(writer.read_line(500ms), "");  // still waiting
  w->release();
  got = writer.read_line(20s);
  ASSERT_TRUE(Acquired(got)) << got;
  EXPECT_EQ(writer.call("release"), "released");
}

TEST_F(ZkKazooTest, DlockReaderSharesWithKazooReadLockAndExcludesWriteLock) {
  auto client = Client::connect(url_);
  ReadWriteLock rw(client, "rw");
  Kazoo reader(hosts_), writer(hosts_);
  ASSERT_TRUE(reader.ready() && writer.ready());

  auto r = rw.acquire_read(10s);
  ASSERT_TRUE(r);
  std::string got = reader.call("lock read " + Path("rw") + " 5");
  ASSERT_TRUE(Acquired(got)) << got;  // shared
  EXPECT_EQ(writer.call("lock write " + Path("rw") + " 1"), "timeout");
  ASSERT_TRUE(AwaitChildren("rw", 2));
  writer.send("lock write " + Path("rw") + " 20");
  ASSERT_TRUE(AwaitChildren("rw", 3));
  // kazoo's writer needs both readers gone, dlock's included.
  EXPECT_EQ(reader.call("release"), "released");
  EXPECT_EQ(writer.read_line(500ms), "");
  r->release();
  got = writer.read_line(20s);
  ASSERT_TRUE(Acquired(got)) << got;
  EXPECT_EQ(writer.call("release"), "released");
}

TEST_F(ZkKazooTest, KazooWriteLockExcludesDlockReaderAndWriter) {
  auto client = Client::connect(url_);
  ReadWriteLock rw(client, "rw");
  Kazoo writer(hosts_);
  ASSERT_TRUE(writer.ready());

  for (bool dlock_reads : {true, false}) {
    SCOPED_TRACE(dlock_reads ? "dlock reader" : "dlock writer");
    std::string got = writer.call("lock write " + Path("rw") + " 5");
    ASSERT_TRUE(Acquired(got)) << got;
    auto t0 = SteadyClock::now();
    EXPECT_FALSE(rw.acquire_read(300ms));
    EXPECT_FALSE(rw.acquire_write(300ms));
    EXPECT_GE(SteadyClock::now() - t0, 600ms);  // both timeouts ran out
    ASSERT_TRUE(AwaitChildren("rw", 1));        // dlock's timed-out entries are gone
    std::optional<Hold> hold;
    std::atomic<bool> returned{false};
    std::thread t([&] {
      hold = dlock_reads ? rw.acquire_read(20s) : rw.acquire_write(20s);
      returned = true;
    });
    EXPECT_TRUE(AwaitChildren("rw", 2));  // queued behind kazoo
    std::this_thread::sleep_for(200ms);
    EXPECT_FALSE(returned);  // and still waiting
    EXPECT_EQ(writer.call("release"), "released");
    t.join();
    ASSERT_TRUE(hold);
    EXPECT_EQ(hold->state(), HoldState::kHeld);
    hold->release();
    ASSERT_TRUE(AwaitChildren("rw", 0));
  }
}

TEST_F(ZkKazooTest, KazooReadLockAdmitsDlockReaderAndExcludesWriter) {
  auto client = Client::connect(url_);
  ReadWriteLock rw(client, "rw");
  Kazoo reader(hosts_);
  ASSERT_TRUE(reader.ready());

  std::string got = reader.call("lock read " + Path("rw") + " 5");
  ASSERT_TRUE(Acquired(got)) << got;
  auto r = rw.acquire_read(5s);  // shared: gets in at once
  ASSERT_TRUE(r);
  r->release();
  auto t0 = SteadyClock::now();
  EXPECT_FALSE(rw.acquire_write(300ms));
  EXPECT_GE(SteadyClock::now() - t0, 300ms);
  ASSERT_TRUE(AwaitChildren("rw", 1));
  std::optional<Hold> w;
  std::atomic<bool> returned{false};
  std::thread t([&] {
    w = rw.acquire_write(20s);
    returned = true;
  });
  EXPECT_TRUE(AwaitChildren("rw", 2));
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(returned);  // still waiting
  EXPECT_EQ(reader.call("release"), "released");
  t.join();
  ASSERT_TRUE(w);
  EXPECT_EQ(w->state(), HoldState::kHeld);
  w->release();
}

}  // namespace
}  // namespace dlock
