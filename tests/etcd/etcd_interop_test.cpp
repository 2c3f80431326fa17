// Interoperability with etcd's own lock clients, against a real etcd:
// `etcdctl lock` (Debian's etcd-client), which is Go's
// concurrency.NewMutex on a session of its own. dlock's entries are
// contenders for it and its key is one for dlock, in both orders; dlock's
// entry is exactly the key Go writes; dlock's nested names do not block each
// other, while a Go Mutex on a name sees every dlock reader, writer and
// permit holder under it.
//
// Runs on the first etcd:// URL of DLOCK_TEST_URLS (tests/servers/etcd.sh);
// without one, or without etcdctl, the tests skip. Every wait is bounded.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "dlock/dlock.hpp"
#include "support/interop_ledger.hpp"
#include "support/observation_reports.hpp"
#include "support/poll.hpp"
#include "support/status_matchers.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using testing::IsOk;

struct Target {
  std::string url;        // etcd://hosts/prefix?ttl=...
  std::string endpoints;  // http://h:p,... for etcdctl
  std::string prefix;     // the URL's path without slashes: "dlock-interop-1"
};

// The first etcd:// URL of DLOCK_TEST_URLS, with a prefix of this run.
std::optional<Target> TargetFromEnv() {
  const char* urls = std::getenv("DLOCK_TEST_URLS");
  if (urls == nullptr) return std::nullopt;
  std::istringstream in(urls);
  std::string url;
  while (in >> url) {
    if (url.rfind("etcd://", 0) != 0) continue;
    std::string hosts = url.substr(7);
    hosts = hosts.substr(0, hosts.find_first_of("/?"));
    Target t;
    std::istringstream each(hosts);
    std::string hp;
    while (std::getline(each, hp, ',')) t.endpoints += (t.endpoints.empty() ? "" : ",") + ("http://" + hp);
    t.prefix = "dlock-interop-" + std::to_string(::getpid());
    t.url = "etcd://" + hosts + "/" + t.prefix + "?ttl=3s";
    return t;
  }
  return std::nullopt;
}

bool HaveEtcdctl() { return std::system("command -v etcdctl >/dev/null 2>&1") == 0; }

// A child process with its stdout on a pipe (and its stdin, for a driver
// that takes commands); killed and reaped when dropped.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv, bool with_stdin = false) {
    int fds[2], in[2] = {-1, -1};
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    if (with_stdin && ::pipe2(in, O_CLOEXEC) != 0) return;
    // Everything the child needs is made before the fork: between fork and
    // exec, a child of this multi-threaded process may not allocate (a
    // malloc lock held by another thread at the fork is never released in
    // the child). It once hung there under ASan, before exec, for 150 s
    // (CI: "the Go driver did not start").
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    static char etcdctl_api[] = "ETCDCTL_API=3";
    std::vector<char*> env{etcdctl_api};
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::string_view(*e).rfind("ETCDCTL_API=", 0) != 0) env.push_back(*e);
    }
    env.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      if (with_stdin) ::dup2(in[0], 0);
      ::execvpe(args[0], args.data(), env.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
    if (with_stdin) {
      ::close(in[0]);
      in_ = in[1];
    }
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
    if (in_ >= 0) ::close(in_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // One line of output, or "" if none came within `limit`.
  std::string read_line(std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "";
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[512];
      const ssize_t n = ::read(out_, chunk, sizeof chunk);
      if (n <= 0) return "";
      buf_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  void send(const std::string& line) {
    const std::string l = line + "\n";
    [[maybe_unused]] auto n = ::write(in_, l.data(), l.size());
  }
  std::string call(const std::string& line, std::chrono::milliseconds limit) {
    send(line);
    return read_line(limit);
  }
  pid_t pid() const { return pid_; }

  // The exit status, once the child exits by itself (-1 if it was killed).
  int wait_exit() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // SIGINT (etcdctl lock then unlocks and exits), and the exit status.
  int interrupt_and_wait() {
    ::kill(pid_, SIGINT);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  int in_ = -1;
  std::string buf_;
};

class EtcdInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = TargetFromEnv();
    if (!t) GTEST_SKIP() << "no etcd:// URL in DLOCK_TEST_URLS (tests/servers/etcd.sh run DIR CMD)";
    if (!HaveEtcdctl()) GTEST_SKIP() << "etcdctl not found (apt-get install etcd-client)";
    target_ = *t;
    client_ = Client::connect(target_.url);
  }

  // `etcdctl lock NAME` (Go's Mutex on NAME), holding until interrupted.
  std::unique_ptr<Child> GoLock(const std::string& name) {
    return std::make_unique<Child>(std::vector<std::string>{"etcdctl", "--endpoints=" + target_.endpoints, "lock",
                                                            "--ttl=5", target_.prefix + "/" + name});
  }
  // What `etcdctl get --prefix` prints for `dir`: key and value lines.
  std::vector<std::string> GoGetPrefix(const std::string& dir) {
    Child get({"etcdctl", "--endpoints=" + target_.endpoints, "get", "--prefix", target_.prefix + "/" + dir});
    std::vector<std::string> lines;
    for (std::string l; !(l = get.read_line(5s)).empty() || lines.size() % 2 == 1;) {
      lines.push_back(l);
      if (lines.size() > 100) break;
    }
    return lines;
  }

  // A driver of Go's concurrency.Mutex itself (go_mutex_driver.go) on a
  // session with a `ttl_s` lease, ready for commands; skips without Go.
  std::unique_ptr<Child> GoDriver(int ttl_s = 3) {
    // The driver says "ready" or exits within 60 s (go_mutex_driver.go); a
    // driver that could not connect is replaced once.
    for (int attempt = 1;; ++attempt) {
      auto go = std::make_unique<Child>(
          std::vector<std::string>{DLOCK_GO_MUTEX_DRIVER, target_.endpoints, std::to_string(ttl_s)}, true);
      const std::string ready = go->read_line(90s);
      if (ready == "ready") return go;
      if (attempt == 2) {
        ADD_FAILURE() << "the Go driver did not start, twice: '" << ready << "'";
        return nullptr;
      }
      std::fprintf(stderr, "the Go driver did not start ('%s'): starting another\n", ready.c_str());
    }
  }
  std::string GoName(const std::string& name) const { return target_.prefix + "/" + name; }

  Target target_;
  std::optional<Client> client_;
};

TEST_F(EtcdInterop, AGoHolderKeepsDlockOutUntilItUnlocks) {
  auto go = GoLock("held-by-go");
  const std::string key = go->read_line(20s);
  ASSERT_EQ(key.rfind(target_.prefix + "/held-by-go/", 0), 0u) << "etcdctl lock printed: " << key;
  Mutex m(*client_, "held-by-go");
  EXPECT_FALSE(m.try_lock_for(300ms)) << "dlock got a lock that etcdctl holds";
  EXPECT_EQ(go->interrupt_and_wait(), 0);
  EXPECT_TRUE(m.try_lock_for(20s));
  m.unlock();
}

TEST_F(EtcdInterop, ADlockHolderKeepsGoWaitingUntilItUnlocks) {
  Mutex m(*client_, "held-by-dlock");
  ASSERT_TRUE(m.try_lock_for(20s));
  auto go = GoLock("held-by-dlock");
  EXPECT_EQ(go->read_line(1500ms), "") << "etcdctl got a lock that dlock holds";
  m.unlock();
  const std::string key = go->read_line(20s);
  EXPECT_EQ(key.rfind(target_.prefix + "/held-by-dlock/", 0), 0u) << "etcdctl lock printed: " << key;
  EXPECT_EQ(go->interrupt_and_wait(), 0);
}

TEST_F(EtcdInterop, DlocksEntryIsTheKeyGosMutexWrites) {
  auto store = OpenStore(target_.url);
  ASSERT_THAT(store.status(), IsOk());
  auto session = (*store)->open_session(Clock::system()->now() + 20s);
  ASSERT_THAT(session.status(), IsOk());
  EntrySpec spec;
  spec.kind = "lock";
  spec.attempt_id = "0123456789abcdef0123456789abcdef";
  auto appended = (*session)->append("layout", spec, Clock::system()->now() + 20s);
  ASSERT_THAT(appended.status(), IsOk());
  // <prefix>/<name>/<lease ID in lower-case hex>, empty value: nothing else under <name>/.
  EXPECT_EQ(GoGetPrefix("layout/"), (std::vector<std::string>{target_.prefix + "/layout/" + (*session)->id(), ""}));
  (*session)->close();
}

// ------------------------------------- Go's Election (issue 16, step 5)

Result<Head> ReadHead(Session& s, const std::string& queue) {
  std::promise<Result<Head>> read;
  s.async_read_head(queue, {}, Clock::system()->now() + 20s, [&](Result<Head> h) { read.set_value(std::move(h)); });
  return read.get_future().get();
}

// A dlock candidate is the key Go's Election writes (value = proposal):
// `etcdctl elect` waits behind it, `etcdctl elect -l` prints its key and its
// value and every proclaimed one, and dlock reads Go's candidate with its
// proposal and watches it go.
TEST_F(EtcdInterop, CandidatesAreGoElectionKeysBothWays) {
  auto go = std::make_unique<Child>(
      std::vector<std::string>{"etcdctl", "--endpoints=" + target_.endpoints, "elect", GoName("vote"), "go-proposal"});
  const std::string go_key = go->read_line(20s);
  ASSERT_EQ(go_key.rfind(GoName("vote") + "/", 0), 0u) << "etcdctl elect printed: " << go_key;
  EXPECT_EQ(go->read_line(5s), "go-proposal");

  auto store = OpenStore(target_.url);
  ASSERT_THAT(store.status(), IsOk());
  auto session = (*store)->open_session(Clock::system()->now() + 20s);
  ASSERT_THAT(session.status(), IsOk());
  auto head = ReadHead(**session, "vote");
  ASSERT_THAT(head.status(), IsOk());
  ASSERT_TRUE(head->entry.has_value());
  EXPECT_EQ(head->entry->value, std::optional<std::string>("go-proposal")) << "Go's leader, as dlock reads it";
  EntrySpec spec;
  spec.kind = std::string(entry_kind::kCandidate);
  spec.attempt_id = "0123456789abcdef0123456789abcdef";
  spec.value = "dlock-proposal";
  auto mine = (*session)->append("vote", spec, Clock::system()->now() + 20s);
  ASSERT_THAT(mine.status(), IsOk());
  head = ReadHead(**session, "vote");
  ASSERT_THAT(head.status(), IsOk());
  std::promise<Status> fired;
  auto watch = (*session)->async_watch_head("vote", *head, [&](Status s) { fired.set_value(std::move(s)); });
  EXPECT_EQ(go->interrupt_and_wait(), 0) << "etcdctl elect resigns on SIGINT";
  auto fired_future = fired.get_future();
  ASSERT_EQ(fired_future.wait_for(20s), std::future_status::ready) << "Go's leader resigned unseen";
  EXPECT_THAT(fired_future.get(), IsOk());
  head = ReadHead(**session, "vote");
  ASSERT_THAT(head.status(), IsOk());
  ASSERT_TRUE(head->entry.has_value());
  EXPECT_EQ(head->entry->id, mine->entry.id) << "dlock's candidate leads now";

  Child observer({"etcdctl", "--endpoints=" + target_.endpoints, "elect", "-l", GoName("vote")});
  EXPECT_EQ(observer.read_line(20s), GoName("vote") + "/" + (*session)->id());
  EXPECT_EQ(observer.read_line(5s), "dlock-proposal");
  auto proclaimed = (*session)->update_entry(
      "vote", mine->entry.id, {.value = "dlock-proclaimed", .owner = std::nullopt}, Clock::system()->now() + 20s);
  ASSERT_THAT(proclaimed.status(), IsOk());
  EXPECT_EQ(proclaimed->token, mine->entry.token) << "a proclaim keeps the term (Go's leaderRev)";
  EXPECT_EQ(observer.read_line(20s), GoName("vote") + "/" + (*session)->id());
  EXPECT_EQ(observer.read_line(5s), "dlock-proclaimed");

  auto go2 = std::make_unique<Child>(
      std::vector<std::string>{"etcdctl", "--endpoints=" + target_.endpoints, "elect", GoName("vote"), "go-2"});
  EXPECT_EQ(go2->read_line(1500ms), "") << "etcdctl elect won while dlock's candidate leads";
  ASSERT_THAT((*session)->remove("vote", mine->entry.id, Clock::system()->now() + 20s), IsOk());
  EXPECT_EQ(go2->read_line(20s).rfind(GoName("vote") + "/", 0), 0u) << "dlock's resignation did not hand over to Go";
  EXPECT_EQ(go2->read_line(5s), "go-2");
  EXPECT_EQ(go2->interrupt_and_wait(), 0);
  (*session)->close();
}

// The Election recipe and `etcdctl elect` elect one leader together; an
// observer reports Go's leader with its proposal, and terms grow across both
// (issue 16).
TEST_F(EtcdInterop, DlockElectionAndEtcdctlElectOneLeaderTogether) {
  Election election(*client_, "together");
  testing::ObservationReports reports;
  std::shared_ptr<void> observing = election.observe(reports.fn());
  auto reported = [&](std::size_t n) { return reports.at_least(n, 20s).size() >= n; };
  ASSERT_TRUE(reported(1)) << "the first report: no leader";
  std::optional<Leadership> first = election.campaign("dlock-a", 20s);
  ASSERT_TRUE(first.has_value());
  auto go = std::make_unique<Child>(
      std::vector<std::string>{"etcdctl", "--endpoints=" + target_.endpoints, "elect", GoName("together"), "go-b"});
  EXPECT_EQ(go->read_line(1500ms), "") << "etcdctl elect won while dlock's leader leads";
  ASSERT_TRUE(reported(2));
  first->resign();
  EXPECT_EQ(go->read_line(20s).rfind(GoName("together") + "/", 0), 0u) << "dlock's resignation did not hand over";
  EXPECT_EQ(go->read_line(5s), "go-b");
  auto now = election.leader();
  ASSERT_TRUE(now.ok() && now->has_value()) << now.status().to_string();
  EXPECT_EQ((*now)->value, "go-b");
  EXPECT_GT((*now)->term, first->term());
  ASSERT_TRUE(reported(3));

  auto second = election.campaign_future("dlock-c", 60s);
  EXPECT_EQ(second.wait_for(1s), std::future_status::timeout) << "dlock leads beside Go's leader";
  EXPECT_EQ(go->interrupt_and_wait(), 0) << "etcdctl elect resigns on SIGINT";
  std::optional<Leadership> next = second.get();
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(next->term(), (*now)->term);
  ASSERT_TRUE(reported(4));
  std::vector<Observation> seen = reports.all();
  ASSERT_GE(seen.size(), 4u);
  EXPECT_EQ(seen[0].state, LeaderState::kNoLeader);
  EXPECT_EQ(seen[1].leader->value, "dlock-a");
  EXPECT_EQ(seen[2].leader->value, "go-b") << "Go's leader, with its proposal";
  EXPECT_EQ(seen[3].leader->value, "dlock-c");
}

TEST_F(EtcdInterop, DlockNamesNestWithoutBlockingEachOther) {
  auto go = GoLock("outer/inner");
  ASSERT_FALSE(go->read_line(20s).empty());
  Mutex outer(*client_, "outer");
  EXPECT_TRUE(outer.try_lock_for(5s)) << "a lock on outer/inner blocked dlock's lock on outer";
  outer.unlock();
  EXPECT_EQ(go->interrupt_and_wait(), 0);
}

TEST_F(EtcdInterop, AGoMutexSeesDlockReadersAndWritersAsContenders) {
  ReadWriteLock rw(*client_, "shared");
  {
    auto read = rw.reader().acquire(20s);
    ASSERT_TRUE(read.has_value());
    auto go = GoLock("shared");
    EXPECT_EQ(go->read_line(1500ms), "") << "etcdctl got a lock that a dlock reader holds";
    read->release();
    EXPECT_FALSE(go->read_line(20s).empty());
    // Now Go holds it: a dlock writer waits.
    EXPECT_FALSE(rw.writer().acquire(300ms).has_value());
    EXPECT_EQ(go->interrupt_and_wait(), 0);
  }
  auto write = rw.writer().acquire(20s);
  ASSERT_TRUE(write.has_value());
  auto go = GoLock("shared");
  EXPECT_EQ(go->read_line(1500ms), "") << "etcdctl got a lock that a dlock writer holds";
  write->release();
  EXPECT_FALSE(go->read_line(20s).empty());
  EXPECT_EQ(go->interrupt_and_wait(), 0);
}

// ------------------------------------- Go's Mutex itself, taking turns

// The Go driver's tests need Go and Debian's golang-etcd-server-dev at build
// time (scripts/install-deps.sh installs them); without them they skip.
class EtcdGoInterop : public EtcdInterop {
 protected:
  void SetUp() override {
    EtcdInterop::SetUp();
    if (!IsSkipped() && std::string(DLOCK_GO_MUTEX_DRIVER).empty())
      GTEST_SKIP() << "the Go Mutex driver was not built (apt-get install golang-go golang-etcd-server-dev)";
  }
};

constexpr int kRounds = 30;

// Two Go Mutexes (two processes, a session each) and two dlock threads
// sharing one Mutex take turns: never two inside, every holder's fencing
// token (Go: its key's create revision, what IsOwner compares) larger than
// the previous one's, whichever client it is, and no key left behind.
TEST_F(EtcdGoInterop, GoAndDlockHoldersNeverOverlapAndTheirTokensGrow) {
  testing::Ledger ledger;
  Mutex m(*client_, "turns");
  auto go1 = GoDriver(), go2 = GoDriver();
  ASSERT_TRUE(go1 && go2);
  go1->send("cycles " + GoName("turns") + " " + std::to_string(kRounds) + " " + ledger.path() + " go-1");
  go2->send("cycles " + GoName("turns") + " " + std::to_string(kRounds) + " " + ledger.path() + " go-2");
  std::vector<std::jthread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      ledger.cycles(
          kRounds, "lock", "dlock-" + std::to_string(i), [&] { return m.acquire(60s); },
          /*with_token=*/true);
    });
  }
  threads.clear();
  EXPECT_EQ(go1->read_line(180s), "done " + std::to_string(kRounds));
  EXPECT_EQ(go2->read_line(180s), "done " + std::to_string(kRounds));
  std::size_t entries = 0, handoffs = 0;
  EXPECT_EQ(testing::CheckLedger(ledger.path(), &entries, &handoffs), "");
  EXPECT_EQ(entries, 4u * kRounds);
  EXPECT_GT(handoffs, 0u);  // the clients took turns, not one after the other
  EXPECT_EQ(GoGetPrefix("turns/"), std::vector<std::string>{});
}

// A Go Mutex takes turns with a dlock writer and a dlock reader of one
// name: it is never inside with either (readers are shared entries of the
// ledger).
TEST_F(EtcdGoInterop, GoMutexTakesTurnsWithDlockReadersAndWriters) {
  auto go = GoDriver();
  ASSERT_TRUE(go);
  testing::Ledger ledger;
  ReadWriteLock rw(*client_, "mixed");
  go->send("cycles " + GoName("mixed") + " " + std::to_string(kRounds) + " " + ledger.path() + " go-1");
  std::vector<std::jthread> threads;
  threads.emplace_back([&] { ledger.cycles(kRounds, "read", "dlock-r", [&] { return rw.reader().acquire(60s); }); });
  threads.emplace_back([&] { ledger.cycles(kRounds, "write", "dlock-w", [&] { return rw.writer().acquire(60s); }); });
  threads.clear();
  EXPECT_EQ(go->read_line(180s), "done " + std::to_string(kRounds));
  std::size_t entries = 0;
  EXPECT_EQ(testing::CheckLedger(ledger.path(), &entries), "");
  EXPECT_EQ(entries, 3u * kRounds);
  EXPECT_EQ(GoGetPrefix("mixed/"), std::vector<std::string>{});
}

// A Go Mutex on a Semaphore's name waits for the permit holders that came
// before it (their entries are under the name). The converse does not hold
// (README: the semaphore's queues are names of their own, nested under it),
// so the two do not exclude each other and must not share a name.
TEST_F(EtcdGoInterop, AGoMutexWaitsForEarlierPermitHolders) {
  auto go = GoDriver();
  ASSERT_TRUE(go);
  Semaphore permits(*client_, "permits", 2);
  std::optional<Lease> lease = permits.acquire(1, 20s);
  ASSERT_TRUE(lease);
  EXPECT_EQ(go->call("lock " + GoName("permits") + " 1", 30s), "timeout");
  lease->release();
  EXPECT_EQ(go->call("lock " + GoName("permits") + " 20", 30s).rfind("acquired ", 0), 0u);
  EXPECT_EQ(go->call("release", 30s), "released");
  EXPECT_EQ(GoGetPrefix("permits/"), std::vector<std::string>{});
}

// A Go waiter that gives up (its context's deadline) deletes its key: the
// dlock holder's successor is not stuck behind it. A dlock waiter that
// gives up leaves nothing either: Go's next Lock takes the lock at once.
TEST_F(EtcdGoInterop, WaitersThatGiveUpLeaveNothingBehindForTheOtherClient) {
  Mutex m(*client_, "give-up");
  ASSERT_TRUE(m.try_lock_for(20s));
  auto go = GoDriver();
  ASSERT_TRUE(go);
  EXPECT_EQ(go->call("lock " + GoName("give-up") + " 0.5", 30s), "timeout");
  m.unlock();
  EXPECT_TRUE(m.try_lock_for(0ms)) << "a dlock try behind nobody failed: the Go waiter's key is still there";
  m.unlock();

  const std::string acquired = go->call("lock " + GoName("give-up") + " 20", 30s);
  ASSERT_EQ(acquired.rfind("acquired " + GoName("give-up") + "/", 0), 0u) << acquired;
  Mutex other(*client_, "give-up");
  EXPECT_FALSE(other.try_lock_for(300ms));
  EXPECT_EQ(go->call("release", 30s), "released");
  EXPECT_EQ(go->call("lock " + GoName("give-up") + " 5", 30s).rfind("acquired ", 0), 0u)
      << "Go waited: dlock's timed-out waiter left its key";
  EXPECT_EQ(go->call("release", 30s), "released");
}

// A Go holder whose process dies (SIGKILL: no unlock, no revoke) keeps the
// lock until its lease expires; then the dlock waiter gets it, with a
// larger token than the Go holder's create revision.
TEST_F(EtcdGoInterop, ADeadGoHoldersLeaseExpiresAndTheDlockWaiterTakesOver) {
  auto go = GoDriver(/*ttl_s=*/2);
  ASSERT_TRUE(go);
  const std::string acquired = go->call("lock " + GoName("dies") + " 20", 30s);
  ASSERT_EQ(acquired.rfind("acquired ", 0), 0u) << acquired;
  const std::uint64_t go_token = std::stoull(acquired.substr(acquired.rfind(' ') + 1));
  ::kill(go->pid(), SIGKILL);
  Mutex m(*client_, "dies");
  std::optional<Hold> hold = m.acquire(30s);  // the lease's TTL, and etcd's lease checks (about 0.5 s)
  ASSERT_TRUE(hold) << "the dead Go holder's lease never expired";
  EXPECT_GT(hold->fencing_token(), go_token);
  EXPECT_EQ(GoGetPrefix("dies/").size(), 2u);  // dlock's own entry only
}

// `dlock run` against Go's Mutex on one name, both ways: a Go holder keeps
// `dlock run` waiting (exit 3 when its --timeout passes); once Go released,
// `dlock run` runs its command with a fencing token larger than the Go
// key's revision, and keeps Go's Lock waiting until the command ends.
TEST_F(EtcdGoInterop, DlockRunAndGosMutexExcludeEachOther) {
  auto go = GoDriver();
  ASSERT_TRUE(go);
  const std::string acquired = go->call("lock " + GoName("run") + " 20", 30s);
  ASSERT_EQ(acquired.rfind("acquired ", 0), 0u) << acquired;
  const std::uint64_t go_token = std::stoull(acquired.substr(acquired.rfind(' ') + 1));
  Child waiting({DLOCK_CLI, "run", "--url", target_.url, "--timeout", "500ms", "run", "--", "true"});
  EXPECT_EQ(waiting.wait_exit(), 3) << "dlock run did not time out behind Go's holder";
  EXPECT_EQ(go->call("release", 30s), "released");

  Child run({DLOCK_CLI, "run", "--url", target_.url, "--timeout", "20s", "run", "--", "sh", "-c",
             "echo $DLOCK_FENCING_TOKEN; exec sleep 30"});
  const std::string token = run.read_line(30s);
  ASSERT_FALSE(token.empty()) << "dlock run never ran its command";
  EXPECT_GT(std::stoull(token), go_token);
  EXPECT_EQ(go->call("lock " + GoName("run") + " 1", 30s), "timeout") << "Go got the lock dlock run holds";
  EXPECT_EQ(run.interrupt_and_wait(), 128 + SIGINT);  // the command's status; the lock is released
  EXPECT_EQ(go->call("lock " + GoName("run") + " 20", 30s).rfind("acquired ", 0), 0u);
  EXPECT_EQ(go->call("release", 30s), "released");
}

}  // namespace
}  // namespace dlock
