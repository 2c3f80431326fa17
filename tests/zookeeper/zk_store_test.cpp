// The zk:// store against a real ZooKeeper server: the Session contract of
// dlock/store.hpp, Curator's node layout, auth, and what happens when the
// connection or the server goes away.
#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <map>
#include <regex>

#include "stores/zookeeper/zk_names.hpp"
#include "support/state_log.hpp"
#include "support/status_matchers.hpp"
#include "support/threads.hpp"
#include "zookeeper/zk_test_support.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using testing::Eventually;
using testing::IsOk;
using testing::StatusIs;
using zktest::RawZk;
using zktest::SharedServer;
using zktest::SteadyClock;

Clock::time_point In(Clock::duration d) { return Clock::system()->now() + d; }

std::string NewAttempt() {
  static std::atomic<std::uint64_t> n{0};
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(::getpid()),
                static_cast<unsigned long long>(++n));
  return buf;
}

EntrySpec Spec(std::string kind, std::string label = "test") {
  EntrySpec s;
  s.kind = std::move(kind);
  s.attempt_id = NewAttempt();
  s.owner.host = "testhost";
  s.owner.pid = ::getpid();
  s.owner.thread = "main";
  s.owner.label = std::move(label);
  s.owner.acquired_unix_ms = 1700000000000;
  return s;
}

using testing::StateLog;

class ZkStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DLOCK_REQUIRE_ZK_SERVER();
    hosts_ = SharedServer();
    zktest::EnsureTestRoot(hosts_);
    chroot_ = zktest::UniqueChroot(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }

  std::string Url(const std::string& query = "", const std::string& hosts = "", const std::string& auth = "") {
    return "zk://" + auth + (hosts.empty() ? hosts_ : hosts) + chroot_ + (query.empty() ? "" : "?" + query);
  }
  std::shared_ptr<Store> OpenStoreOk(const std::string& url, StoreOptions options = {}) {
    auto store = OpenStore(url, options);
    EXPECT_THAT(store.status(), IsOk());
    return store.ok() ? *store : nullptr;
  }
  std::shared_ptr<Session> NewSession(const std::string& query = "", const std::string& hosts = "") {
    auto store = OpenStoreOk(Url(query, hosts));
    if (!store) return nullptr;
    stores_.push_back(store);
    auto s = store->open_session(In(20s));
    EXPECT_THAT(s.status(), IsOk());
    return s.ok() ? *s : nullptr;
  }

  std::string hosts_, chroot_;
  std::vector<std::shared_ptr<Store>> stores_;
};

// ---------------------------------------------------------------- basics

TEST_F(ZkStoreTest, AppendListOrderAndTokens) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->state(), SessionState::kConnected);
  EXPECT_TRUE(std::regex_match(s->id(), std::regex("0x[0-9a-f]+"))) << s->id();

  std::vector<Appended> made;
  for (const char* kind : {"lock", "write", "read", "lease"}) {
    auto spec = Spec(kind);
    auto a = s->append("q/one", spec, In(10s));
    ASSERT_THAT(a.status(), IsOk());
    EXPECT_EQ(a->entry.kind, kind);
    EXPECT_EQ(a->entry.attempt_id, spec.attempt_id);
    ASSERT_TRUE(a->entry.token);
    // Curator's protected name: _c_<uuid>-<tag><10 digits>.
    std::string uuid = *internal::zk::AttemptIdToUuid(spec.attempt_id);
    std::string tag = *internal::zk::KindTag(kind);
    EXPECT_TRUE(std::regex_match(a->entry.id, std::regex("_c_" + uuid + "-" + tag + "[0-9]{10}"))) << a->entry.id;
    // The snapshot of the same round trip includes the new entry.
    ASSERT_TRUE(a->queue);
    EXPECT_EQ(a->queue->size(), made.size() + 1);
    EXPECT_EQ(a->queue->back().id, a->entry.id);
    made.push_back(*a);
  }
  for (std::size_t i = 1; i < made.size(); ++i) {
    EXPECT_GT(made[i].entry.sequence, made[i - 1].entry.sequence);
    EXPECT_GT(*made[i].entry.token, *made[i - 1].entry.token);  // czxids only grow
  }
  auto listed = s->list("q/one", {}, In(10s));
  ASSERT_THAT(listed.status(), IsOk());
  ASSERT_EQ(listed->size(), made.size());
  for (std::size_t i = 0; i < made.size(); ++i) {
    EXPECT_EQ((*listed)[i].id, made[i].entry.id);
    EXPECT_EQ((*listed)[i].kind, made[i].entry.kind);
    EXPECT_EQ((*listed)[i].sequence, made[i].entry.sequence);
    EXPECT_EQ((*listed)[i].attempt_id, made[i].entry.attempt_id);
    EXPECT_FALSE((*listed)[i].owner);
  }
  // The znodes themselves: ephemeral, owned by the session, owner record as data.
  RawZk raw(hosts_);
  ASSERT_TRUE(raw.connected());
  Stat st{};
  auto data = raw.get(chroot_ + "/q/one/" + made[0].entry.id, &st);
  ASSERT_TRUE(data);
  EXPECT_EQ(static_cast<std::uint64_t>(st.czxid), *made[0].entry.token);
  EXPECT_EQ(internal::zk::UuidToAttemptId(""), std::nullopt);
  EXPECT_EQ(*data, EncodeOwnerRecord(Spec("lock").owner));
  EXPECT_EQ(std::to_string(st.ephemeralOwner), std::to_string(std::stoll(s->id(), nullptr, 16)));
  // Tokens keep growing across queues: they are store-wide.
  auto other = s->append("q/two", Spec("lock"), In(10s));
  ASSERT_TRUE(other.ok());
  EXPECT_GT(*other->entry.token, *made.back().entry.token);
}

TEST_F(ZkStoreTest, ListWithOwnersAndForeignChildren) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  auto a = s->append("q", Spec("lock", "first"), In(10s));
  ASSERT_THAT(a.status(), IsOk());
  RawZk raw(hosts_);
  ASSERT_TRUE(raw.connected());
  std::string base = chroot_ + "/q";
  // Children another client might leave: kazoo's lock, ZooKeeper's own
  // recipe's node with garbage data, and a node without a sequence.
  std::string kazoo =
      raw.create(base + "/0123456789abcdef0123456789abcdef__lock__", "kazoo-id", ZOO_EPHEMERAL_SEQUENTIAL);
  std::string zkrecipe = raw.create(base + "/x-1234-", "\x12\x34", ZOO_EPHEMERAL_SEQUENTIAL);
  ASSERT_FALSE(raw.create(base + "/plain", "", ZOO_EPHEMERAL).empty());
  ASSERT_FALSE(kazoo.empty());
  ASSERT_FALSE(zkrecipe.empty());

  auto listed = s->list("q", {.with_owners = true}, In(10s));
  ASSERT_THAT(listed.status(), IsOk());
  ASSERT_EQ(listed->size(), 3u);  // "plain" is not an entry
  EXPECT_EQ((*listed)[0].id, a->entry.id);
  ASSERT_TRUE((*listed)[0].owner);
  EXPECT_EQ((*listed)[0].owner->label, "first");
  EXPECT_EQ((*listed)[0].owner->host, "testhost");
  EXPECT_EQ((*listed)[0].token, a->entry.token);
  EXPECT_EQ((*listed)[1].kind, "lock");  // kazoo's Lock
  EXPECT_EQ((*listed)[1].attempt_id, "");
  ASSERT_TRUE((*listed)[1].owner);
  EXPECT_EQ((*listed)[1].owner->host, "");  // not an owner record: empty
  EXPECT_TRUE((*listed)[1].token);
  EXPECT_EQ((*listed)[2].kind, "foreign");
  EXPECT_EQ((*listed)[2].sequence, (*listed)[1].sequence + 1);
}

// docs/election.md §2.1: a candidate is a LeaderLatch node whose data is
// the bare value; a value on another kind is its data too; other clients'
// data lists as a value unless it is an owner record.
TEST_F(ZkStoreTest, ValuesAreNodeDataInCuratorsLayout) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->keeps_values());
  EXPECT_FALSE(s->keeps_owners_beside_values());
  EntrySpec candidate = Spec("candidate");
  candidate.value = "10.0.0.7:8080 \xc3\xa9";
  auto c = s->append("q", candidate, In(10s));
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->entry.id.rfind("_c_" + *internal::zk::AttemptIdToUuid(candidate.attempt_id) + "-latch-", 0), 0u)
      << c->entry.id;
  EXPECT_EQ(c->entry.value, candidate.value);
  EXPECT_FALSE(c->entry.owner.has_value());
  auto quiet = s->append("q", Spec("candidate"), In(10s));  // no value: empty data (Curator's default id)
  EntrySpec valued_lock = Spec("lock");
  valued_lock.value = "lock-value";
  auto l = s->append("q", valued_lock, In(10s));
  auto plain = s->append("q", Spec("lock", "plain"), In(10s));
  ASSERT_TRUE(quiet.ok() && l.ok() && plain.ok());
  RawZk raw(hosts_);
  ASSERT_TRUE(raw.connected());
  const std::string base = chroot_ + "/q";
  Stat stat{};
  EXPECT_EQ(raw.get(base + "/" + c->entry.id, &stat), candidate.value);
  EXPECT_EQ(static_cast<std::uint64_t>(stat.czxid), c->entry.token);
  EXPECT_EQ(raw.get(base + "/" + quiet->entry.id), std::optional<std::string>(""));
  EXPECT_EQ(raw.get(base + "/" + l->entry.id), std::optional<std::string>("lock-value"));
  // Curator's LeaderSelector (a mutex node whose data is its id), kazoo's
  // identifier, an ephemeral latch node of an unprotected client.
  std::string selector =
      raw.create(base + "/_c_0123456789abcdef0123456789abcdef-lock-", "selector-id", ZOO_EPHEMERAL_SEQUENTIAL);
  std::string kazoo = raw.create(base + "/0123456789abcdef0123456789abcdef__lock__", "", ZOO_EPHEMERAL_SEQUENTIAL);
  std::string bare = raw.create(base + "/x-latch-", "{\"host\":\"h\"}", ZOO_EPHEMERAL_SEQUENTIAL);
  ASSERT_FALSE(selector.empty() || kazoo.empty() || bare.empty());

  auto listed = s->list("q", {.with_owners = true, .with_values = true}, In(10s));
  ASSERT_THAT(listed.status(), IsOk());
  ASSERT_EQ(listed->size(), 7u);
  std::vector<std::string> kinds;
  for (const auto& e : *listed) kinds.push_back(e.kind);
  EXPECT_EQ(kinds, (std::vector<std::string>{"candidate", "candidate", "lock", "lock", "lock", "lock", "candidate"}));
  EXPECT_EQ((*listed)[0].value, candidate.value);
  EXPECT_FALSE((*listed)[0].owner.has_value()) << "a latch node has no owner record";
  EXPECT_FALSE((*listed)[1].value.has_value()) << "empty data: no value";
  EXPECT_EQ((*listed)[2].value, std::optional<std::string>("lock-value"));
  EXPECT_FALSE((*listed)[3].value.has_value());
  ASSERT_TRUE((*listed)[3].owner.has_value());
  EXPECT_EQ((*listed)[3].owner->label, "plain");
  EXPECT_EQ((*listed)[4].value, std::optional<std::string>("selector-id"));
  EXPECT_FALSE((*listed)[5].value.has_value());
  EXPECT_EQ((*listed)[6].value, std::optional<std::string>("{\"host\":\"h\"}")) << "a latch node's data is a value";

  // An update is a setData: the same node, a new data version.
  auto updated = s->update_entry("q", c->entry.id, {.value = "10.0.0.8:8080", .owner = std::nullopt}, In(10s));
  ASSERT_THAT(updated.status(), IsOk());
  EXPECT_EQ(raw.get(base + "/" + c->entry.id, &stat), std::optional<std::string>("10.0.0.8:8080"));
  EXPECT_EQ(static_cast<std::uint64_t>(stat.version), updated->value_version);
  EXPECT_EQ(static_cast<std::uint64_t>(stat.czxid), updated->token);
  // An owner update of an entry without a value rewrites its record.
  OwnerRecord elected = Spec("lock", "elected").owner;
  ASSERT_THAT(s->update_entry("q", plain->entry.id, {.value = std::nullopt, .owner = elected}, In(10s)).status(),
              IsOk());
  auto record = DecodeOwnerRecord(raw.get(base + "/" + plain->entry.id).value_or(""));
  ASSERT_THAT(record.status(), IsOk());
  EXPECT_EQ(record->label, "elected");
  EntrySpec placed = Spec("candidate");
  placed.sequence = 1;
  EXPECT_THAT(s->append("q", placed, In(10s)).status(), StatusIs(ErrorCode::kFailedPrecondition))
      << "a candidate takes no chosen sequence";
}

TEST_F(ZkStoreTest, BadArgumentsAreRejected) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->append("/abs", Spec("lock"), In(5s)).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s->append("q", Spec("semaphore"), In(5s)).status().code(), ErrorCode::kInvalidArgument);
  auto bad = Spec("lock");
  bad.attempt_id = "xyz";
  EXPECT_EQ(s->append("q", bad, In(5s)).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s->remove("q", "a/b", In(5s)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s->wait_any_gone("q", {}, In(5s), {}).code(), ErrorCode::kInvalidArgument);
}

TEST_F(ZkStoreTest, ContainerParentsVanishWhenEmpty) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  auto a = s->append("deep/er/queue", Spec("lock"), In(10s));
  ASSERT_THAT(a.status(), IsOk());
  RawZk raw(hosts_);
  ASSERT_TRUE(raw.connected());
  Stat st{};
  ASSERT_TRUE(raw.exists(chroot_ + "/deep/er/queue", &st));
  EXPECT_EQ(st.ephemeralOwner, 0);
  // Containers, not persistent nodes: the server reaps them once empty.
  ASSERT_TRUE(s->remove("deep/er/queue", a->entry.id, In(10s)).ok());
  EXPECT_TRUE(Eventually([&] { return !raw.exists(chroot_ + "/deep"); }, 20s)) << "the empty lock directory stayed";
  // Appending again re-creates the parents.
  auto again = s->append("deep/er/queue", Spec("lock"), In(10s));
  ASSERT_THAT(again.status(), IsOk());
}

TEST_F(ZkStoreTest, AppendSurvivesParentsVanishingUnderIt) {
  // Many appends and removes racing the container reaper on one directory.
  auto s = NewSession();
  ASSERT_TRUE(s);
  for (int i = 0; i < 30; ++i) {
    auto a = s->append("churn/q", Spec("lock"), In(10s));
    ASSERT_THAT(a.status(), IsOk()) << i << ": ";
    ASSERT_TRUE(s->remove("churn/q", a->entry.id, In(10s)).ok());
    if (i % 5 == 0) std::this_thread::sleep_for(250ms);  // let the reaper run
  }
}

// store.hpp: queues whose names nest are unrelated. The queue "tenants" is the
// parent znode of the queue "tenants/acct-123456789", whose last segment ends
// like a (negative) sequence number; "jobs/run0000000001" ends like a positive
// one. Neither child queue may show up as an entry of its parent, while it is
// held nor after (its empty container stays until the server reaps it).
TEST_F(ZkStoreTest, NestedQueuesAreUnrelated) {
  auto s = NewSession();
  auto other = NewSession();
  ASSERT_TRUE(s && other);
  auto client = Client::connect(Url());
  for (std::string child : {"tenants/acct-123456789", "jobs/run0000000001"}) {
    const std::string parent = child.substr(0, child.find('/'));
    auto held = s->append(child, Spec("lock"), In(10s));
    ASSERT_THAT(held.status(), IsOk());
    auto listed = other->list(parent, {}, In(10s));
    ASSERT_THAT(listed.status(), IsOk());
    EXPECT_TRUE(listed->empty()) << parent << " lists " << (listed->empty() ? "" : (*listed)[0].id);
    // The parent's own lock is free: its first entry is first, and a Mutex gets in.
    auto mine = other->append(parent, Spec("lock"), In(10s));
    ASSERT_THAT(mine.status(), IsOk());
    ASSERT_TRUE(mine->queue);
    EXPECT_EQ(mine->queue->front().id, mine->entry.id) << parent;
    ASSERT_TRUE(other->remove(parent, mine->entry.id, In(10s)).ok());
    Mutex m(client, parent);
    {
      auto hold = m.acquire(5s);
      EXPECT_TRUE(hold) << "Mutex(\"" << parent << "\") waited for " << child;
    }
    // Released: the child's container is empty, and still no entry.
    ASSERT_TRUE(s->remove(child, held->entry.id, In(10s)).ok());
    listed = other->list(parent, {}, In(10s));
    ASSERT_TRUE(listed.ok());
    EXPECT_TRUE(listed->empty()) << parent << " lists " << (listed->empty() ? "" : (*listed)[0].id);
  }

  // Another client's ephemeral sequential child of unknown shape still
  // counts (ZooKeeper's own lock recipe); a persistent one is not an entry.
  RawZk raw(hosts_);
  ASSERT_TRUE(raw.connected());
  ASSERT_FALSE(raw.create(chroot_ + "/tenants/x-1234-", "", ZOO_EPHEMERAL_SEQUENTIAL).empty());
  ASSERT_FALSE(raw.create(chroot_ + "/tenants/y-", "", ZOO_PERSISTENT_SEQUENTIAL).empty());
  auto listed = other->list("tenants", {}, In(10s));
  ASSERT_THAT(listed.status(), IsOk());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].kind, "foreign");
  EXPECT_EQ((*listed)[0].id.rfind("x-1234-", 0), 0u) << (*listed)[0].id;
  auto behind = other->append("tenants", Spec("lock"), In(10s));
  ASSERT_THAT(behind.status(), IsOk());
  ASSERT_TRUE(behind->queue);
  ASSERT_EQ(behind->queue->size(), 2u);
  EXPECT_EQ(behind->queue->front().id, (*listed)[0].id);

  // Names the store would mistake for entries of their parent are refused.
  const std::string uuid = *internal::zk::AttemptIdToUuid(NewAttempt());
  for (const std::string& bad : std::vector<std::string>{"a/_c_" + uuid + "-lock-0000000001",
                                                         "a/0123456789abcdef0123456789abcdef__lock__0000000001",
                                                         "_c_0123456789abcdef0123456789abcdef-lease-0000000007/b"}) {
    EXPECT_EQ(s->append(bad, Spec("lock"), In(5s)).status().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(s->list(bad, {}, In(5s)).status().code(), ErrorCode::kInvalidArgument) << bad;
  }
}

TEST_F(ZkStoreTest, DowngradeTakesTheWritersSequence) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  auto w = s->append("rw", Spec("write"), In(10s));
  ASSERT_THAT(w.status(), IsOk());
  auto behind = s->append("rw", Spec("write"), In(10s));
  ASSERT_TRUE(behind.ok());
  auto rspec = Spec("read");
  rspec.sequence = w->entry.sequence;
  auto r = s->append("rw", rspec, In(10s));
  ASSERT_THAT(r.status(), IsOk());
  // Curator's CURATOR-621 fix: _c_<uuid>-__READ__<writer's seq>, plain EPHEMERAL.
  EXPECT_EQ(r->entry.id, "_c_" + *internal::zk::AttemptIdToUuid(rspec.attempt_id) + "-__READ__" +
                             internal::zk::FormatSequence(static_cast<std::int32_t>(w->entry.sequence)));
  EXPECT_EQ(r->entry.sequence, w->entry.sequence);
  ASSERT_TRUE(s->remove("rw", w->entry.id, In(10s)).ok());
  auto listed = s->list("rw", {}, In(10s));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].id, r->entry.id);  // still ahead of the writer queued behind
  EXPECT_EQ((*listed)[1].id, behind->entry.id);
  // A retried append of the same downgrade adopts its own entry.
  auto again = s->append("rw", rspec, In(10s));
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->entry.id, r->entry.id);
  EXPECT_EQ(again->entry.token, r->entry.token);
}

// ------------------------------------------------------------------ waiting

TEST_F(ZkStoreTest, WaitIgnoresDataChangesAndManyWaitersWake) {
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  auto a = holder->append("q", Spec("lock"), In(10s));
  ASSERT_TRUE(a.ok());
  std::vector<std::string> ids{a->entry.id};
  constexpr int kWaiters = 16;
  std::atomic<int> woke{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&] {
      if (waiter->wait_any_gone("q", ids, In(30s), {}).ok()) ++woke;
    });
  }
  std::this_thread::sleep_for(300ms);
  // Curator's revoker writes data into the lock node: that is not a release.
  RawZk raw(hosts_);
  ASSERT_TRUE(raw.connected());
  ASSERT_EQ(raw.set(chroot_ + "/q/" + a->entry.id, "__REVOKE__"), ZOK);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(woke.load(), 0);
  ASSERT_TRUE(holder->remove("q", a->entry.id, In(10s)).ok());
  for (auto& t : threads) t.join();
  EXPECT_EQ(woke.load(), kWaiters);
}

TEST_F(ZkStoreTest, WaitWakesWhenTheOwnerSessionExpires) {
  if (std::string(DLOCK_PYTHON_KAZOO).empty()) GTEST_SKIP() << "needs python3-kazoo";
  auto waiter = NewSession();
  ASSERT_TRUE(waiter);
  // The owner: another process (kazoo), whose session the server expires
  // after we freeze it.
  zktest::PeerClient owner(zktest::PeerKind::kKazoo, hosts_, 1.0);
  ASSERT_TRUE(owner.ready());
  std::string created = owner.call("ephemeral " + chroot_ + "/q/" + "x-");
  ASSERT_EQ(created.rfind("created ", 0), 0u) << created;
  std::string id = created.substr(created.rfind('/') + 1);
  auto listed = waiter->list("q", {}, In(10s));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].kind, "foreign");
  ::kill(owner.pid(), SIGSTOP);
  auto frozen = SteadyClock::now();
  std::vector<std::string> ids{id};
  Status st = waiter->wait_any_gone("q", ids, In(30s), {});
  auto took = SteadyClock::now() - frozen;
  ::kill(owner.pid(), SIGCONT);
  EXPECT_THAT(st, IsOk());
  std::printf("[   INFO   ] owner's entry gone %.2f s after its process froze (session timeout 1 s)\n",
              zktest::Seconds(took));
  // No upper bound on `took` but the wait's own 30 s deadline: a loaded
  // machine may take its time (bounded work, not bounded time).
}

using dlock::testing::ThreadCount;

// Waits cost no thread: the C client's two and the session thread serve any
// number (the default async_wait_any_gone took a thread each).
TEST_F(ZkStoreTest, FiveHundredAsyncWaitsOnOneSessionAddNoThreads) {
  constexpr int kEntries = 100, kWaitsPerEntry = 5;
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  std::vector<Entry> entries;
  for (int i = 0; i < kEntries; ++i) {
    auto a = holder->append("many/" + std::to_string(i % 10), Spec("lock"), In(20s));
    ASSERT_TRUE(a.ok()) << a.status().message();
    entries.push_back(a->entry);
  }
  const int before = ThreadCount();
  std::mutex mu;
  std::vector<int> outcomes(kEntries * kWaitsPerEntry, 0);
  std::atomic<int> ok{0};
  std::vector<std::shared_ptr<void>> handles;
  for (int i = 0; i < kEntries * kWaitsPerEntry; ++i) {
    const Entry& e = entries[static_cast<std::size_t>(i % kEntries)];
    std::vector<std::string> ids{e.id};
    handles.push_back(waiter->async_wait_any_gone("many/" + std::to_string(i % kEntries % 10), ids, [&, i](Status s) {
      std::lock_guard<std::mutex> g(mu);
      ++outcomes[static_cast<std::size_t>(i)];
      if (s.ok()) ++ok;
    }));
  }
  // Every watch is set once a wait on the last entry wakes on its removal.
  ASSERT_TRUE(holder->remove("many/" + std::to_string((kEntries - 1) % 10), entries.back().id, In(20s)).ok());
  ASSERT_TRUE(Eventually([&] { return ok.load() >= kWaitsPerEntry; }));
  EXPECT_LE(ThreadCount(), before + 2) << "threads started for waits";
  for (int i = 0; i + 1 < kEntries; ++i) {
    ASSERT_TRUE(
        holder->remove("many/" + std::to_string(i % 10), entries[static_cast<std::size_t>(i)].id, In(20s)).ok());
  }
  ASSERT_TRUE(Eventually([&] { return ok.load() == kEntries * kWaitsPerEntry; }));
  EXPECT_LE(ThreadCount(), before + 2);
  handles.clear();  // after the outcomes: no second one
  std::lock_guard<std::mutex> g(mu);
  for (int n : outcomes) EXPECT_EQ(n, 1);
}

// Found by the async-footprint benchmark: a burst of thousands of
// asynchronous requests on one session queued its heartbeats (syncs, which
// the server answers in order) behind all of them, the lost-timer ran out,
// and the session declared itself lost while the server still had it. The
// session now keeps at most a few hundred requests in flight; the rest wait
// in order on the client. Bounded work: the server answers every request.
TEST_F(ZkStoreTest, ABurstOfAsyncRequestsDoesNotLoseTheSession) {
  constexpr int kAppends = 6000;
  auto session = NewSession("session_timeout=4s");
  ASSERT_TRUE(session);
  const std::string id = session->id();
  struct Tally {  // shared: a late reply after a failed wait must find it
    std::mutex mu;
    std::condition_variable cv;
    int done = 0, failed = 0;
    std::string first_error;
  };
  auto tally = std::make_shared<Tally>();
  for (int i = 0; i < kAppends; ++i) {
    session->async_append("burst/" + std::to_string(i % 50), Spec("lock"), In(120s), [tally](Result<Appended> r) {
      std::lock_guard<std::mutex> g(tally->mu);
      ++tally->done;
      if (!r.ok() && tally->failed++ == 0) tally->first_error = r.status().message();
      tally->cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(tally->mu);
    ASSERT_TRUE(tally->cv.wait_for(lock, 180s, [&] { return tally->done == kAppends; }))
        << tally->done << " of " << kAppends << " answered";
    EXPECT_EQ(tally->failed, 0) << "first error: " << tally->first_error;
  }
  if (session->state() != SessionState::kConnected) {
    auto why = session->list("burst/0", {}, In(5s));  // its error says why the session ended
    ADD_FAILURE() << "the burst lost the session: " << why.status().message();
  }
  EXPECT_EQ(session->id(), id);
}

// An asynchronous request holds no thread, so the session thread keeps its
// reply deadline, on the session's clock: here the connection stays up but
// silent, and the clock passes the deadline long before the C client gives
// the connection up (two thirds of the session timeout, in real time).
TEST_F(ZkStoreTest, AsyncRequestsEndAtTheirDeadlineOnTheSessionsClock) {
  testing::TcpProxy proxy(std::stoi(hosts_.substr(hosts_.rfind(':') + 1)));
  auto clock = std::make_shared<ManualClock>();
  auto store = OpenStoreOk(Url("session_timeout=12s", proxy.hosts()), {clock, std::chrono::milliseconds(10'000)});
  ASSERT_TRUE(store);
  auto s = store->open_session(kNoDeadline);
  ASSERT_THAT(s.status(), IsOk());
  std::this_thread::sleep_for(200ms);
  proxy.partition();
  std::mutex mu;
  std::vector<Status> outcomes;
  std::vector<SessionState> states;  // the session's state when each came
  auto record = [&](Status st) {
    SessionState now = (*s)->state();
    std::lock_guard<std::mutex> g(mu);
    outcomes.push_back(std::move(st));
    states.push_back(now);
  };
  auto count = [&] {
    std::lock_guard<std::mutex> g(mu);
    return outcomes.size();
  };
  (*s)->async_list("q", {}, clock->now(), [&](Result<std::vector<Entry>> r) { record(r.status()); });
  (*s)->async_remove("q", "lock-0000000001", clock->now(), record);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(count(), 0u) << "a deadline on a clock that stands still passed";
  clock->advance(4100ms);  // past the reply deadline: a third of the session timeout
  ASSERT_TRUE(Eventually([&] { return count() == 2; }, 5s));
  {
    std::lock_guard<std::mutex> g(mu);
    for (const Status& st : outcomes) EXPECT_THAT(st, StatusIs(ErrorCode::kUnavailable));
    for (SessionState st : states) EXPECT_EQ(st, SessionState::kConnected) << "the C client gave up first";
  }
  proxy.heal();
  proxy.reset();  // late replies, if any, make no second outcome
  std::this_thread::sleep_for(300ms);
  (*s)->close();
  EXPECT_EQ(count(), 2u);
}

// The session thread sets the watches of waits; a subscriber (which runs on
// it) that waits must not wait for itself.
TEST_F(ZkStoreTest, ASubscriberMayWaitOnItsOwnSession) {
  testing::TcpProxy proxy(std::stoi(hosts_.substr(hosts_.rfind(':') + 1)));
  auto s = NewSession("session_timeout=8s", proxy.hosts());
  ASSERT_TRUE(s);
  auto a = s->append("q", Spec("lock"), In(10s));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(s->remove("q", a->entry.id, In(10s)).ok());
  std::promise<Status> waited;
  std::atomic<bool> once{false};
  auto sub = s->subscribe([&](SessionState state) {
    if (state != SessionState::kConnected || once.exchange(true)) return;
    std::vector<std::string> ids{a->entry.id};
    waited.set_value(s->wait_any_gone("q", ids, In(30s), {}));  // gone already: OK at once
  });
  proxy.reset();  // the connection drops and comes back: kSuspended, kConnected
  auto f = waited.get_future();
  ASSERT_EQ(f.wait_for(20s), std::future_status::ready);
  EXPECT_THAT(f.get(), IsOk());
}

// ----------------------------------------------------------------- sessions

TEST_F(ZkStoreTest, ConcurrentUseOfOneSession) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  constexpr int kThreads = 8, kRounds = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::string q = "conc/" + std::to_string(t % 3);
      for (int i = 0; i < kRounds; ++i) {
        auto a = s->append(q, Spec(i % 2 ? "read" : "lock"), In(20s));
        if (!a.ok()) {
          ++failures;
          continue;
        }
        auto l = s->list(q, {.with_owners = (i % 3 == 0)}, In(20s));
        if (!l.ok()) ++failures;
        std::vector<std::string> ids{a->entry.id};
        if (!s->remove(q, a->entry.id, In(20s)).ok()) ++failures;
        if (!s->wait_any_gone(q, ids, In(20s), {}).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// ---------------------------------------------------------- connecting, auth

TEST_F(ZkStoreTest, UnreachableServerFailsWithinConnectTimeout) {
  // A port nobody listens on (refused at once), and a "server" that accepts
  // connections but never answers (a blackhole), each with a 1 s timeout.
  int closed_port;
  {
    testing::TcpProxy probe(1);  // borrow a free port, then let it go
    closed_port = probe.port();
  }
  testing::TcpProxy hole(hosts_.empty() ? 1 : std::stoi(hosts_.substr(hosts_.rfind(':') + 1)));
  hole.partition();
  for (std::string hosts : {"127.0.0.1:" + std::to_string(closed_port), hole.hosts()}) {
    auto store = OpenStoreOk("zk://" + hosts + "/x?connect_timeout=1s");
    ASSERT_TRUE(store);
    auto t0 = SteadyClock::now();
    auto s = store->open_session(In(60s));
    auto took = SteadyClock::now() - t0;
    ASSERT_FALSE(s.ok()) << hosts;
    EXPECT_THAT(s.status(), StatusIs(ErrorCode::kUnavailable));
    EXPECT_NE(s.status().message().find(hosts), std::string::npos) << s.status().message();
    // The connect timeout ended it, not the caller's 60 s deadline (the
    // bounds are far apart, so that a loaded machine cannot blur them).
    EXPECT_GE(took, 900ms);
    EXPECT_LT(took, 30s) << hosts;
    // The caller's own deadline, if earlier, wins: 200 ms against a 60 s
    // connect timeout.
    auto patient = OpenStoreOk("zk://" + hosts + "/x?connect_timeout=60s");
    ASSERT_TRUE(patient);
    t0 = SteadyClock::now();
    s = patient->open_session(In(200ms));
    EXPECT_THAT(s.status(), StatusIs(ErrorCode::kUnavailable));
    EXPECT_LT(SteadyClock::now() - t0, 30s);
  }
  // StoreOptions::connect_timeout is the default.
  auto store = OpenStoreOk("zk://127.0.0.1:" + std::to_string(closed_port), {nullptr, 700ms});
  auto t0 = SteadyClock::now();
  EXPECT_THAT(store->open_session(In(60s)).status(), StatusIs(ErrorCode::kUnavailable));
  EXPECT_LT(SteadyClock::now() - t0, 30s);  // 700 ms, not the 60 s deadline
}

TEST_F(ZkStoreTest, UnresolvableHostFailsClearly) {
  auto store = OpenStoreOk("zk://no-such-host.invalid:2181?connect_timeout=2s");
  ASSERT_TRUE(store);
  auto t0 = SteadyClock::now();
  auto s = store->open_session(In(60s));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status(), ::testing::AnyOf(StatusIs(ErrorCode::kUnavailable), StatusIs(ErrorCode::kInvalidArgument)));
  EXPECT_NE(s.status().message().find("no-such-host.invalid"), std::string::npos) << s.status().message();
  EXPECT_LT(SteadyClock::now() - t0, 30s);  // the 2 s connect timeout at most, not the 60 s deadline
}

TEST_F(ZkStoreTest, DigestAuthAndCreatorAcl) {
  {  // An open chroot, so that others may connect (see UnreadableChrootFailsAtOpen).
    RawZk setup(hosts_);
    ASSERT_FALSE(setup.create(chroot_).empty());
  }
  auto alice = OpenStoreOk(Url("acl=creator", "", "alice:secret@"));
  auto mallory = OpenStoreOk(Url("", "", "alice:wrong@"));
  auto anonymous = OpenStoreOk(Url());
  ASSERT_TRUE(alice && mallory && anonymous);
  auto as = alice->open_session(In(20s));
  ASSERT_THAT(as.status(), IsOk());
  auto a = (*as)->append("secret/q", Spec("lock"), In(10s));
  ASSERT_THAT(a.status(), IsOk());

  RawZk raw(hosts_, 10000, "alice:secret");  // getACL needs READ
  ASSERT_TRUE(raw.connected());
  auto acl = raw.acl(chroot_ + "/secret/q/" + a->entry.id);
  ASSERT_EQ(acl.size(), 1u);
  EXPECT_EQ(acl[0].rfind("digest:alice:", 0), 0u) << acl[0];
  EXPECT_EQ(raw.acl(chroot_ + "/secret/q"), acl);  // parents too

  // A wrong password is not refused by ZooKeeper's digest scheme (it is just
  // another identity), but it gets nothing done: every request names the path.
  for (auto* store : {mallory.get(), anonymous.get()}) {
    auto s = store->open_session(In(20s));
    ASSERT_THAT(s.status(), IsOk());  // the chroot itself is open
    auto l = (*s)->list("secret/q", {}, In(10s));
    EXPECT_THAT(l.status(), StatusIs(ErrorCode::kPermissionDenied));
    EXPECT_NE(l.status().message().find(chroot_ + "/secret/q"), std::string::npos) << l.status().message();
    EXPECT_EQ((*s)->remove("secret/q", a->entry.id, In(10s)).code(), ErrorCode::kPermissionDenied);
    EXPECT_EQ((*s)->append("secret/q", Spec("lock"), In(10s)).status().code(), ErrorCode::kPermissionDenied);
  }
  // The right password from another session works.
  auto again = OpenStoreOk(Url("acl=creator", "", "alice:secret@"));
  auto s2 = again->open_session(In(20s));
  ASSERT_TRUE(s2.ok());
  auto l = (*s2)->list("secret/q", {.with_owners = true}, In(10s));
  ASSERT_THAT(l.status(), IsOk());
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].owner->label, "test");
}

TEST_F(ZkStoreTest, CreatorReadAclLetsOthersLookButNotTouch) {
  auto alice = OpenStoreOk(Url("acl=creator-read", "", "alice:secret@"));
  auto bob = OpenStoreOk(Url("", "", "bob:pw@"));
  auto as = alice->open_session(In(20s));
  auto bs = bob->open_session(In(20s));
  ASSERT_TRUE(as.ok() && bs.ok());
  auto a = (*as)->append("shared", Spec("lock", "alice's"), In(10s));
  ASSERT_THAT(a.status(), IsOk());
  auto l = (*bs)->list("shared", {.with_owners = true}, In(10s));
  ASSERT_THAT(l.status(), IsOk());
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].owner->label, "alice's");
  std::vector<std::string> ids{a->entry.id};
  EXPECT_EQ((*bs)->wait_any_gone("shared", ids, In(300ms), {}).code(), ErrorCode::kDeadlineExceeded);
  EXPECT_EQ((*bs)->remove("shared", a->entry.id, In(10s)).code(), ErrorCode::kPermissionDenied);
  EXPECT_EQ((*bs)->append("shared", Spec("lock"), In(10s)).status().code(), ErrorCode::kPermissionDenied);
}

TEST_F(ZkStoreTest, UnreadableChrootFailsAtOpen) {
  // The chroot exists and only alice may read it: bob learns at open time.
  RawZk raw(hosts_, 10000, "alice:secret");
  ASSERT_TRUE(raw.connected());
  ASSERT_FALSE(raw.create(chroot_, "", 0, &ZOO_CREATOR_ALL_ACL).empty()) << zerror(raw.last_rc);
  for (std::string auth : {std::string("bob:pw@"), std::string()}) {
    auto store = OpenStoreOk(Url("connect_timeout=5s", "", auth));
    auto t0 = SteadyClock::now();
    auto s = store->open_session(In(60s));
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(s.status(), StatusIs(ErrorCode::kUnauthenticated));
    EXPECT_NE(s.status().message().find(chroot_), std::string::npos) << s.status().message();
    EXPECT_LT(SteadyClock::now() - t0, 30s);  // not the 60 s deadline
  }
  auto ok = OpenStoreOk(Url("", "", "alice:secret@"));
  EXPECT_TRUE(ok->open_session(In(20s)).ok());
}

// ------------------------------------------------- connection trouble, loss

TEST_F(ZkStoreTest, SuspendedWhileCutOffThenReconnected) {
  testing::TcpProxy proxy(std::stoi(hosts_.substr(hosts_.rfind(':') + 1)));
  auto s = NewSession("session_timeout=10s", proxy.hosts());
  ASSERT_TRUE(s);
  StateLog log;
  log.attach(*s);
  auto a = s->append("q", Spec("lock"), In(10s));
  ASSERT_TRUE(a.ok());
  std::string id = s->id();
  proxy.reset();  // the connection drops; the session lives on the server
  ASSERT_TRUE(Eventually([&] { return log.when(SessionState::kConnected).has_value(); }, 15s)) << "never reconnected";
  EXPECT_EQ(log.states().front(), SessionState::kSuspended);
  EXPECT_EQ(s->state(), SessionState::kConnected);
  EXPECT_EQ(s->id(), id);
  auto listed = s->list("q", {}, In(10s));  // the entry survived
  ASSERT_THAT(listed.status(), IsOk());
  ASSERT_EQ(listed->size(), 1u);
}

TEST_F(ZkStoreTest, RemoveAndWaitThroughADroppedConnection) {
  testing::TcpProxy proxy(std::stoi(hosts_.substr(hosts_.rfind(':') + 1)));
  auto s = NewSession("session_timeout=8s", proxy.hosts());
  auto other = NewSession();
  ASSERT_TRUE(s && other);
  StateLog log;
  log.attach(*s);
  auto mine = s->append("q", Spec("lock"), In(10s));
  auto theirs = other->append("q", Spec("lock"), In(10s));
  ASSERT_TRUE(mine.ok() && theirs.ok());

  // A waiter keeps waiting through the suspension; the watch survives.
  Status waited;
  std::thread waiter([&] {
    std::vector<std::string> ids{theirs->entry.id};
    waited = s->wait_any_gone("q", ids, In(30s), {});
  });
  std::this_thread::sleep_for(200ms);
  proxy.partition();
  proxy.reset();  // the connection drops; reconnecting hangs in the partition
  ASSERT_TRUE(Eventually([&] { return s->state() == SessionState::kSuspended; }, 15s));
  // Requests fail fast and say so; the removal is the caller's to retry.
  auto t0 = SteadyClock::now();
  Status removed = s->remove("q", mine->entry.id, In(10s));
  EXPECT_THAT(removed, StatusIs(ErrorCode::kUnavailable));
  EXPECT_LT(SteadyClock::now() - t0, 5s);  // well before the 10 s deadline
  EXPECT_EQ(s->list("q", {}, In(10s)).status().code(), ErrorCode::kUnavailable);
  // Meanwhile the entry it waits for goes.
  ASSERT_TRUE(other->remove("q", theirs->entry.id, In(10s)).ok());
  proxy.heal();
  proxy.reset();  // the held connections are dead: make the client redial
  ASSERT_TRUE(Eventually([&] { return s->state() == SessionState::kConnected; }, 15s));
  waiter.join();
  EXPECT_THAT(waited, IsOk());
  EXPECT_TRUE(s->remove("q", mine->entry.id, In(10s)).ok());
  auto listed = other->list("q", {}, In(10s));
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(log.states(), (std::vector<SessionState>{SessionState::kSuspended, SessionState::kConnected}));
}

// async_wait_turn vouches from the order of one connection's watch events.
// Removals made while the session is cut off come back on the next
// connection, replayed in no particular order: the own entry's removal may
// come after the one waited for, so a wait that reconnected never vouches.
TEST_F(ZkStoreTest, AWaitTurnNeverVouchesAcrossAReconnect) {
  testing::TcpProxy proxy(std::stoi(hosts_.substr(hosts_.rfind(':') + 1)));
  for (int round = 0; round < 4; ++round) {
    auto s = NewSession("session_timeout=8s", proxy.hosts());
    auto other = NewSession();
    ASSERT_TRUE(s && other);
    const std::string q = "turn-reconnect-" + std::to_string(round);
    auto ahead = other->append(q, Spec("lock"), In(10s));
    auto own = s->append(q, Spec("lock"), In(10s));
    ASSERT_TRUE(ahead.ok() && own.ok());
    std::promise<std::pair<Status, bool>> came;
    std::vector<std::string> ids{ahead->entry.id};
    auto handle = s->async_wait_turn(q, ids, ids, own->entry.id, [&came](Status st, bool intact) {
      came.set_value({std::move(st), intact});
    });
    std::this_thread::sleep_for(300ms);  // both watches set
    proxy.partition();
    proxy.reset();
    ASSERT_TRUE(Eventually([&] { return s->state() == SessionState::kSuspended; }, 15s));
    // While cut off: our own entry goes first (`dlock break`), then the one
    // ahead.
    ASSERT_TRUE(other->remove(q, own->entry.id, In(10s)).ok());
    ASSERT_TRUE(other->remove(q, ahead->entry.id, In(10s)).ok());
    proxy.heal();
    proxy.reset();
    auto f = came.get_future();
    ASSERT_EQ(f.wait_for(30s), std::future_status::ready) << "round " << round;
    auto [st, intact] = f.get();
    EXPECT_THAT(st, IsOk());
    EXPECT_FALSE(intact) << "round " << round << ": vouched for an own entry removed before the one ahead";
    handle.reset();
  }
}

// A downgrade's read entry takes the write entry's sequence, and sorts first
// when its name does (attempt ids chosen so here): the head changes with no
// event on the write entry's node, so a head watch on a write entry also
// watches the queue's children.
TEST_F(ZkStoreTest, AHeadWatchOnAWriteEntrySeesADowngradeSortFirst) {
  auto s = NewSession();
  auto watcher = NewSession();
  ASSERT_TRUE(s && watcher);
  EntrySpec write = Spec("write");
  write.attempt_id = std::string(32, 'f');
  auto w = s->append("q", write, In(10s));
  ASSERT_THAT(w.status(), IsOk());
  std::promise<Result<Head>> read;
  watcher->async_read_head("q", {}, In(10s), [&read](Result<Head> h) { read.set_value(std::move(h)); });
  Result<Head> seen = read.get_future().get();
  ASSERT_THAT(seen.status(), IsOk());
  ASSERT_TRUE(seen->entry.has_value());
  ASSERT_EQ(seen->entry->id, w->entry.id);
  std::promise<Status> fired;
  auto handle = watcher->async_watch_head("q", *seen, [&fired](Status st) { fired.set_value(std::move(st)); });
  std::this_thread::sleep_for(200ms);  // armed (a round trip)
  EntrySpec downgrade = Spec("read");
  downgrade.attempt_id = std::string(32, '0');
  downgrade.sequence = w->entry.sequence;
  auto r = s->append("q", downgrade, In(10s));
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_TRUE(r->queue.has_value());
  ASSERT_EQ(r->queue->front().id, r->entry.id) << "the read entry sorts first";
  auto f = fired.get_future();
  ASSERT_EQ(f.wait_for(20s), std::future_status::ready) << "the head changed and the watch did not fire";
  EXPECT_THAT(f.get(), IsOk());
}

// An empty queue whose znode stays (a nested queue's entry keeps it): an
// entry that came and went between the reading and the watch leaves the
// queue as empty as it was, and only its pzxid tells.
TEST_F(ZkStoreTest, AHeadWatchOnAnEmptyQueueSeesAnEntryThatCameAndWent) {
  auto s = NewSession();
  auto watcher = NewSession();
  ASSERT_TRUE(s && watcher);
  ASSERT_THAT(s->append("q/keep", Spec("lock"), In(10s)).status(), IsOk());
  std::promise<Result<Head>> read;
  watcher->async_read_head("q", {}, In(10s), [&read](Result<Head> h) { read.set_value(std::move(h)); });
  Result<Head> seen = read.get_future().get();
  ASSERT_THAT(seen.status(), IsOk());
  ASSERT_FALSE(seen->entry.has_value());
  ASSERT_NE(seen->position, 0) << "the queue's znode exists";
  EntrySpec brief = Spec("candidate");
  brief.value = "brief";
  auto b = s->append("q", brief, In(10s));
  ASSERT_THAT(b.status(), IsOk());
  ASSERT_THAT(s->remove("q", b->entry.id, In(10s)), IsOk());
  std::promise<Status> fired;
  auto handle = watcher->async_watch_head("q", *seen, [&fired](Status st) { fired.set_value(std::move(st)); });
  auto f = fired.get_future();
  ASSERT_EQ(f.wait_for(20s), std::future_status::ready) << "a head that came and went after the reading was missed";
  EXPECT_THAT(f.get(), IsOk());
}

// Head watches keep waiting through a suspension, as waits do: changes made
// while the session is cut off (a value update, an append to an empty queue,
// the head's removal) fire them once it is back, also a watch made during
// the suspension from a reading made before.
TEST_F(ZkStoreTest, HeadWatchesFireForChangesMadeWhileCutOff) {
  testing::TcpProxy proxy(std::stoi(hosts_.substr(hosts_.rfind(':') + 1)));
  auto s = NewSession("session_timeout=8s", proxy.hosts());
  auto other = NewSession();
  ASSERT_TRUE(s && other);
  EntrySpec spec = Spec("candidate");
  spec.value = "v1";
  auto updated = other->append("updated", spec, In(10s));
  auto removed = other->append("removed", spec, In(10s));
  auto late = other->append("late", spec, In(10s));
  ASSERT_TRUE(updated.ok() && removed.ok() && late.ok());
  auto read = [&](const std::string& q) {
    std::promise<Result<Head>> p;
    s->async_read_head(q, {}, In(10s), [&p](Result<Head> h) { p.set_value(std::move(h)); });
    return p.get_future().get();
  };
  struct Watch {
    std::string queue;
    std::promise<Status> fired;
    std::future<Status> result = fired.get_future();
    std::shared_ptr<void> handle;
  };
  std::vector<std::unique_ptr<Watch>> watches;
  auto watch = [&](const std::string& q, const Head& seen) {
    auto w = std::make_unique<Watch>();
    w->queue = q;
    Watch* raw = w.get();
    w->handle = s->async_watch_head(q, seen, [raw](Status st) { raw->fired.set_value(std::move(st)); });
    watches.push_back(std::move(w));
  };
  std::map<std::string, Head> seen;
  for (const std::string q : {"updated", "removed", "empty", "late"}) {
    auto h = read(q);
    ASSERT_THAT(h.status(), IsOk()) << q;
    seen[q] = *h;
  }
  ASSERT_FALSE(seen["empty"].entry.has_value());
  for (const std::string q : {"updated", "removed", "empty"}) watch(q, seen[q]);
  std::this_thread::sleep_for(300ms);  // the watches set
  proxy.partition();
  proxy.reset();
  ASSERT_TRUE(Eventually([&] { return s->state() == SessionState::kSuspended; }, 15s));
  ASSERT_THAT(
      other->update_entry("updated", updated->entry.id, {.value = "v2", .owner = std::nullopt}, In(10s)).status(),
      IsOk());
  ASSERT_THAT(other->remove("removed", removed->entry.id, In(10s)), IsOk());
  ASSERT_THAT(other->append("empty", spec, In(10s)).status(), IsOk());
  ASSERT_THAT(other->update_entry("late", late->entry.id, {.value = "v2", .owner = std::nullopt}, In(10s)).status(),
              IsOk());
  watch("late", seen["late"]);  // armed only once the connection is back
  for (auto& w : watches) {
    EXPECT_EQ(w->result.wait_for(300ms), std::future_status::timeout) << w->queue << ": while cut off";
  }
  proxy.heal();
  proxy.reset();
  ASSERT_TRUE(Eventually([&] { return s->state() == SessionState::kConnected; }, 15s));
  for (auto& w : watches) {
    ASSERT_EQ(w->result.wait_for(20s), std::future_status::ready) << w->queue << ": missed";
    EXPECT_THAT(w->result.get(), IsOk()) << w->queue;
  }
}

// Review of 508e2cb: Core::on_armed records every path whose getData said
// ZOK as "watched, not fired" when the whole batch is answered. If the
// entry goes between its own reply and the batch's last reply, its event
// has already fired (and erased nothing), so the record stays with no watch
// behind it: a later wait of the same session on that path shares the dead
// watch, sends no request, and is never woken (the entry is already gone).
TEST_F(ZkStoreTest, ReviewAWatchThatFiredInsideItsBatchIsNotSharedAfterwards) {
  auto s = NewSession();
  auto other = NewSession();
  ASSERT_TRUE(s && other);
  constexpr int kRounds = 12;
  constexpr int kBehind = 300;  // a long batch: a wide window between its first and last reply
  int stuck = 0, hit_rounds = 0;
  for (int round = 0; round < kRounds && stuck == 0; ++round) {
    const std::string q = "fired-in-batch-" + std::to_string(round);
    auto first = other->append(q, Spec("lock"), In(10s));
    ASSERT_TRUE(first.ok());
    std::vector<std::string> ids{first->entry.id};
    for (int i = 0; i < kBehind; ++i) {
      auto e = other->append(q, Spec("lock"), In(10s));
      ASSERT_TRUE(e.ok());
      ids.push_back(e->entry.id);
    }
    std::promise<Status> came;
    auto h1 = s->async_wait_any_gone(q, ids, [&came](Status st) { came.set_value(std::move(st)); });
    std::this_thread::sleep_for(std::chrono::microseconds(500 * round));
    ASSERT_TRUE(other->remove(q, first->entry.id, In(10s)).ok());
    auto f = came.get_future();
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
    EXPECT_THAT(f.get(), IsOk());
    h1.reset();
    std::this_thread::sleep_for(200ms);  // the batch's last replies are in
    // The first entry is gone: a wait for it must end at once.
    std::promise<Status> came2;
    std::vector<std::string> gone{first->entry.id};
    auto h2 = s->async_wait_any_gone(q, gone, [&came2](Status st) { came2.set_value(std::move(st)); });
    auto f2 = came2.get_future();
    if (f2.wait_for(3s) != std::future_status::ready) {
      ++stuck;
      ADD_FAILURE() << "round " << round << ": a wait for an entry already gone never ended (stale Core::watched_)";
    } else {
      ++hit_rounds;
    }
    h2.reset();  // cancels, if still waiting
  }
  std::printf("rounds ok %d, stuck %d\n", hit_rounds, stuck);
}

// Not a pass/fail test: what one request costs on this machine.
TEST_F(ZkStoreTest, TimingRoundTrips) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  constexpr int kRounds = 200;
  SteadyClock::duration append{}, remove{}, list{};
  for (int i = 0; i < kRounds; ++i) {
    auto t0 = SteadyClock::now();
    auto a = s->append("rt", Spec("lock"), In(10s));
    auto t1 = SteadyClock::now();
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(s->list("rt", {}, In(10s)).ok());
    auto t2 = SteadyClock::now();
    ASSERT_TRUE(s->remove("rt", a->entry.id, In(10s)).ok());
    auto t3 = SteadyClock::now();
    append += t1 - t0;
    list += t2 - t1;
    remove += t3 - t2;
  }
  auto client = Client::connect(Url());
  Mutex m(client, "rt-mutex");
  m.lock();  // warm up: session and parents
  m.unlock();
  auto t0 = SteadyClock::now();
  for (int i = 0; i < kRounds; ++i) {
    m.lock();
    m.unlock();
  }
  auto mutex = SteadyClock::now() - t0;
  auto us = [](SteadyClock::duration d) { return std::chrono::duration<double, std::micro>(d).count() / kRounds; };
  std::printf(
      "[   INFO   ] mean over %d: append+snapshot %.0f us, list %.0f us, remove %.0f us, "
      "Mutex lock+unlock %.0f us\n",
      kRounds, us(append), us(list), us(remove), us(mutex));
}

// The safety property: cut off from the server, the holder hears kLost from
// its own timer before the server expires the session and hands the lock on.
TEST_F(ZkStoreTest, TimingLostBeforeTheServerGivesTheLockAway) {
  testing::TcpProxy proxy(std::stoi(hosts_.substr(hosts_.rfind(':') + 1)));
  constexpr auto kTimeout = 2s;
  auto holder = NewSession("session_timeout=2s", proxy.hosts());
  auto next = NewSession();
  ASSERT_TRUE(holder && next);
  StateLog log;
  log.attach(*holder);
  auto held = holder->append("lock", Spec("lock"), In(10s));
  ASSERT_TRUE(held.ok());
  std::vector<std::string> ids{held->entry.id};
  Status waited;
  SteadyClock::time_point granted;
  SessionState holder_when_granted = SessionState::kConnected;
  std::thread successor([&] {
    waited = next->wait_any_gone("lock", ids, In(60s), {});
    granted = SteadyClock::now();
    holder_when_granted = holder->state();
  });
  std::this_thread::sleep_for(500ms);
  auto cut = SteadyClock::now();
  proxy.partition();
  successor.join();
  ASSERT_THAT(waited, IsOk());
  auto lost = log.when(SessionState::kLost);
  auto suspended = log.when(SessionState::kSuspended);
  ASSERT_TRUE(lost) << "the holder never heard kLost";
  // kSuspended comes first if the C client notices the silence before the
  // session's own deadline passes; then it is not told at all.
  std::printf(
      "[   INFO   ] cut off at 0: kSuspended at %s, kLost at %.3f s, the server gave the lock away "
      "at %.3f s (session timeout %.1f s)\n",
      suspended ? (std::to_string(zktest::Seconds(*suspended - cut)) + " s").c_str() : "never",
      zktest::Seconds(*lost - cut), zktest::Seconds(granted - cut), zktest::Seconds(kTimeout));
  // The promise is state(): it reads kLost before the server can give the
  // lock away. The subscriber's call may come later on a loaded machine
  // (the times above are printed, not asserted).
  EXPECT_EQ(holder_when_granted, SessionState::kLost);
  EXPECT_EQ(holder->state(), SessionState::kLost);
  EXPECT_EQ(holder->append("lock", Spec("lock"), In(1s)).status().code(), ErrorCode::kSessionLost);
  proxy.heal();
  proxy.reset();
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(holder->state(), SessionState::kLost);  // never connected again
}

TEST_F(ZkStoreTest, TimingLostByOwnTimerWhenTheServerFreezes) {
  zktest::PrivateServer server;
  ASSERT_TRUE(server.ok());
  constexpr auto kTimeout = 2s;
  auto store = OpenStoreOk("zk://" + server.hosts() + "/frozen?session_timeout=2s");
  auto s = store->open_session(In(20s));
  ASSERT_THAT(s.status(), IsOk());
  StateLog log;
  log.attach(**s);
  auto a = (*s)->append("q", Spec("lock"), In(10s));
  ASSERT_TRUE(a.ok());
  // A waiter blocked on another entry hears the loss too.
  auto b = (*s)->append("q", Spec("lock"), In(10s));
  ASSERT_TRUE(b.ok());
  Status waited;
  std::thread waiter([&] {
    std::vector<std::string> ids{a->entry.id};
    waited = (*s)->wait_any_gone("q", ids, kNoDeadline, {});
  });
  std::this_thread::sleep_for(500ms);
  server.freeze();
  auto frozen = SteadyClock::now();
  // The session's own clock says kLost within the session timeout of the
  // last contact, which was before the freeze: state() folds it in, however
  // late the subscriber's call comes on a loaded machine.
  std::this_thread::sleep_until(frozen + kTimeout);
  EXPECT_EQ((*s)->state(), SessionState::kLost);
  ASSERT_TRUE(Eventually([&] { return log.when(SessionState::kLost).has_value(); }, 10s));
  waiter.join();
  auto lost = *log.when(SessionState::kLost) - frozen;
  auto suspended = log.when(SessionState::kSuspended);
  std::printf("[   INFO   ] server frozen at 0: kSuspended at %s, kLost at %.3f s (session timeout %.1f s)\n",
              suspended ? (std::to_string(zktest::Seconds(*suspended - frozen)) + " s").c_str() : "never",
              zktest::Seconds(lost), zktest::Seconds(kTimeout));
  EXPECT_THAT(waited, StatusIs(ErrorCode::kSessionLost));
  server.thaw();
  // The store opens a new session; the old one's entries go with its expiry.
  auto fresh = store->open_session(In(20s));
  ASSERT_THAT(fresh.status(), IsOk());
  EXPECT_NE((*fresh)->id(), (*s)->id());
  EXPECT_TRUE(Eventually(
      [&] {
        auto l = (*fresh)->list("q", {}, In(5s));
        return l.ok() && l->empty();
      },
      15s));
}

TEST_F(ZkStoreTest, SessionSurvivesAServerRestartWithinTheTimeout) {
  zktest::PrivateServer server;
  ASSERT_TRUE(server.ok());
  auto store = OpenStoreOk("zk://" + server.hosts() + "/restart?session_timeout=20s");
  auto s = store->open_session(In(20s));
  ASSERT_TRUE(s.ok());
  StateLog log;
  log.attach(**s);
  auto a = (*s)->append("q", Spec("lock"), In(10s));
  ASSERT_TRUE(a.ok());
  server.crash();
  ASSERT_TRUE(Eventually([&] { return (*s)->state() == SessionState::kSuspended; }, 10s));
  EXPECT_EQ((*s)->remove("q", a->entry.id, In(5s)).code(), ErrorCode::kUnavailable);
  ASSERT_TRUE(server.restart());
  ASSERT_TRUE(Eventually([&] { return (*s)->state() == SessionState::kConnected; }, 20s)) << "did not reconnect";
  EXPECT_TRUE((*s)->remove("q", a->entry.id, In(10s)).ok());
  auto l = (*s)->list("q", {}, In(10s));
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->empty());
}

TEST_F(ZkStoreTest, InjectedClockDrivesTheLostTimer) {
  auto clock = std::make_shared<ManualClock>();
  auto store = OpenStoreOk(Url("session_timeout=4s"), {clock, std::chrono::milliseconds(10'000)});
  ASSERT_TRUE(store);
  // open_session waits on the injected clock: its deadline is "never" here.
  auto s = store->open_session(kNoDeadline);
  ASSERT_THAT(s.status(), IsOk());
  auto observer = NewSession();
  ASSERT_TRUE(observer);
  StateLog log;
  log.attach(**s);
  auto a = (*s)->append("q", Spec("lock"), kNoDeadline);
  ASSERT_TRUE(a.ok());
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ((*s)->state(), SessionState::kConnected);
  // Idle for most of the timeout: the session thread's heartbeat, answered
  // by the server, keeps it alive.
  clock->advance(3s);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ((*s)->state(), SessionState::kConnected);
  EXPECT_FALSE(log.when(SessionState::kLost));
  clock->advance(4s);  // no answer for the whole timeout, as far as the clock says
  ASSERT_TRUE(Eventually([&] { return log.when(SessionState::kLost).has_value(); }, 5s));
  // Declaring the session lost closed its handle: the entry is gone now.
  std::vector<std::string> ids{a->entry.id};
  EXPECT_TRUE(observer->wait_any_gone("q", ids, In(10s), {}).ok());
}

// store.hpp, state(): once the session's own lost deadline has passed, state()
// says kLost at once, even while the session thread is busy elsewhere. Here it
// is held inside a subscriber (told kSuspended after a dropped connection)
// while the injected clock jumps past the deadline.
TEST_F(ZkStoreTest, StateFoldsTheLostDeadlineWhileTheSessionThreadIsBusy) {
  testing::TcpProxy proxy(std::stoi(hosts_.substr(hosts_.rfind(':') + 1)));
  auto clock = std::make_shared<ManualClock>();
  auto store = OpenStoreOk(Url("session_timeout=4s", proxy.hosts()), {clock, std::chrono::milliseconds(10'000)});
  ASSERT_TRUE(store);
  auto s = store->open_session(kNoDeadline);
  ASSERT_THAT(s.status(), IsOk());
  auto a = (*s)->append("q", Spec("lock"), kNoDeadline);
  ASSERT_THAT(a.status(), IsOk());

  // The subscriber keeps the session thread until the test lets it go (or,
  // bounded, after 30 s), and records what it heard.
  std::mutex mu;
  std::condition_variable cv;
  bool inside = false, let_go = false;
  std::vector<SessionState> heard;
  auto sub = (*s)->subscribe([&](SessionState st) {
    std::unique_lock<std::mutex> lk(mu);
    heard.push_back(st);
    if (st != SessionState::kSuspended || inside) return;
    inside = true;
    cv.notify_all();
    cv.wait_for(lk, 30s, [&] { return let_go; });
  });
  struct LetGo {  // also on a failed assertion: never leave the thread stuck
    std::mutex& mu;
    std::condition_variable& cv;
    bool& let_go;
    ~LetGo() {
      std::lock_guard<std::mutex> g(mu);
      let_go = true;
      cv.notify_all();
    }
  } let_go_guard{mu, cv, let_go};

  proxy.reset();  // the connection drops: kSuspended reaches the subscriber
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, 20s, [&] { return inside; })) << "kSuspended never arrived";
  }
  EXPECT_NE((*s)->state(), SessionState::kLost);
  clock->advance(10s);  // well past the lost deadline; the session thread is still held
  EXPECT_EQ((*s)->state(), SessionState::kLost);
  EXPECT_EQ((*s)->append("q", Spec("lock"), kNoDeadline).status().code(), ErrorCode::kSessionLost);
  {
    std::lock_guard<std::mutex> g(mu);
    let_go = true;
    cv.notify_all();
  }
  // Subscribers still hear it, in order, once the thread is free.
  EXPECT_TRUE(Eventually(
      [&] {
        std::lock_guard<std::mutex> g(mu);
        return !heard.empty() && heard.back() == SessionState::kLost;
      },
      20s));
  EXPECT_EQ((*s)->state(), SessionState::kLost);  // and it stays lost
}

}  // namespace
}  // namespace dlock
