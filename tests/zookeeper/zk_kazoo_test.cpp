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
  }
  std::string Path(const std::string& queue) const { return chroot_ + "/" + queue; }

  std::string hosts_, chroot_, url_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<Session> session_;
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
  std::this_thread::sleep_for(300ms);
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
  std::this_thread::sleep_for(300ms);
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
  std::this_thread::sleep_for(300ms);
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
  std::this_thread::sleep_for(300ms);
  m.unlock();
  std::string got = kazoo.read_line(20s);
  ASSERT_EQ(got.rfind("acquired ", 0), 0u) << got;

  // kazoo holds; dlock waits until kazoo releases. A thread-agnostic hold
  // (acquire) so that this thread can release what another thread got.
  EXPECT_FALSE(m.try_lock());
  EXPECT_FALSE(m.try_lock_for(300ms));
  std::optional<Hold> hold;
  std::thread t([&] { hold = m.acquire(20s); });
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(kazoo.call("release"), "released");
  t.join();
  ASSERT_TRUE(hold);
  EXPECT_TRUE(hold->fencing_token() > 0u);
  hold->release();
}

}  // namespace
}  // namespace dlock
