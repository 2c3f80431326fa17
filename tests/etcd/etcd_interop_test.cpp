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
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dlock/dlock.hpp"
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

// A child process with its stdout on a pipe; killed and reaped when dropped.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::setenv("ETCDCTL_API", "3", 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
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

}  // namespace
}  // namespace dlock
