// The Session contract of the file:// store, including other processes that
// hold, release and die (see file_store_holder.cpp).
#include "stores/file/file_store.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/unique_fd.hpp"
#include "core/url.hpp"
#include "dlock/clock.hpp"
#include "dlock/dlock.hpp"
#include "dlock/store.hpp"
#include "stores/file/layout.hpp"
#include "support/child.hpp"
#include "support/poll.hpp"
#include "support/threads.hpp"

extern char** environ;

namespace dlock {

// So that gtest prints a Status readably (found by ADL).
void PrintTo(const Status& status, std::ostream* out) { *out << status.to_string(); }

namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// How long a test waits for something that should happen at once; never
// reached when the code is right.
constexpr auto kPrompt = 5s;
// How long a waiter must stay blocked to show that it blocks.
constexpr auto kStillBlocked = 100ms;

// A deadline for waits that must end at once: a failing test then reports
// kDeadlineExceeded instead of hanging.
Clock::time_point Soon() { return std::chrono::steady_clock::now() + kPrompt; }

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "dlock-file-test-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Result<std::shared_ptr<Store>> OpenUrl(const std::string& url, StoreOptions options = {}) {
  auto parsed = internal::ParseUrl(url);
  if (!parsed.ok()) return parsed.status();
  return internal::OpenFileStore(*parsed, options);
}

EntrySpec Spec(std::string kind = "lock", std::string attempt_id = "") {
  EntrySpec spec;
  spec.kind = std::move(kind);
  spec.attempt_id = std::move(attempt_id);
  spec.owner.host = "testhost";
  spec.owner.pid = getpid();
  spec.owner.thread = "main";
  spec.owner.label = "file_store_test";
  spec.owner.acquired_unix_ms = 1'700'000'000'000;
  return spec;
}

std::vector<std::string> Ids(const std::vector<Entry>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.id);
  return out;
}

// wait_any_gone on its own thread. Cancelled when destroyed, so that a test
// that fails never hangs on a wait that does not end.
class AsyncWait {
 public:
  AsyncWait(std::shared_ptr<Session> session, std::string queue, std::vector<std::string> ids,
            Clock::time_point deadline = kNoDeadline) {
    std::stop_token stop = stop_.get_token();
    result_ = std::async(std::launch::async, [=] { return session->wait_any_gone(queue, ids, deadline, stop); });
  }
  ~AsyncWait() { stop_.request_stop(); }
  AsyncWait(AsyncWait&&) = default;

  // True if the wait is still blocked a while later.
  bool Blocks() { return result_.wait_for(kStillBlocked) == std::future_status::timeout; }
  // The wait's result; kAborted if it does not end promptly.
  Status Result() {
    if (result_.wait_for(kPrompt) != std::future_status::ready) return AbortedError("the wait did not end");
    return result_.get();
  }
  void Cancel() { stop_.request_stop(); }

 private:
  std::stop_source stop_;
  std::future<Status> result_;
};

// The helper process, holding entries of one queue until it is killed or
// told to finish.
class Holder {
 public:
  struct HeldEntry {
    std::string id;
    std::uint64_t token = 0;
  };

  Holder(const std::string& dir, const std::string& queue, int count = 1) {
    int to_child[2];
    int from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) std::abort();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
    std::string count_text = std::to_string(count);
    std::vector<char*> argv = {const_cast<char*>(DLOCK_FILE_STORE_HOLDER), const_cast<char*>(dir.c_str()),
                               const_cast<char*>(queue.c_str()), count_text.data(), nullptr};
    int rc = posix_spawn(&pid_, DLOCK_FILE_STORE_HOLDER, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    to_child_ = to_child[1];
    from_child_ = from_child[0];
    if (rc != 0) {
      pid_ = -1;
      ADD_FAILURE() << "cannot start " << DLOCK_FILE_STORE_HOLDER;
      return;
    }
    std::string text;
    auto give_up = std::chrono::steady_clock::now() + kPrompt;
    while (static_cast<int>(entries_.size()) < count && std::chrono::steady_clock::now() < give_up) {
      pollfd p{from_child_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[512];
      ssize_t n = read(from_child_, buf, sizeof buf);
      if (n <= 0) break;
      text.append(buf, static_cast<std::size_t>(n));
      for (auto nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n')) {
        std::string line = text.substr(0, nl);
        text.erase(0, nl + 1);
        auto space = line.find(' ');
        entries_.push_back({line.substr(0, space), std::stoull(line.substr(space + 1))});
      }
    }
    EXPECT_EQ(static_cast<int>(entries_.size()), count) << "the holder did not report its entries";
  }

  ~Holder() {
    if (pid_ > 0) Kill();
    close(to_child_);
    close(from_child_);
  }

  const std::vector<HeldEntry>& entries() const { return entries_; }
  const HeldEntry& entry() const { return entries_.at(0); }

  void Kill() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // Lets the holder close its session and exit; returns its exit status.
  int Finish() {
    close(to_child_);
    to_child_ = -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::vector<HeldEntry> entries_;
};

class FileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { store_ = OpenStoreAt(dir_.path()); }

  std::shared_ptr<Store> OpenStoreAt(const std::string& path, StoreOptions options = {}) {
    auto store = OpenUrl("file://" + path, std::move(options));
    EXPECT_TRUE(store.ok()) << store.status().to_string();
    return store.ok() ? *store : nullptr;
  }

  std::shared_ptr<Session> NewSession(Store* store = nullptr) {
    auto session = (store ? store : store_.get())->open_session(kNoDeadline);
    EXPECT_TRUE(session.ok()) << session.status().to_string();
    return session.ok() ? *session : nullptr;
  }

  Entry Append(Session& session, const std::string& queue, EntrySpec spec = Spec()) {
    auto appended = session.append(queue, spec, kNoDeadline);
    EXPECT_TRUE(appended.ok()) << appended.status().to_string();
    return appended.ok() ? appended->entry : Entry{};
  }

  std::vector<Entry> List(Session& session, const std::string& queue, bool with_owners = false) {
    auto entries = session.list(queue, {.with_owners = with_owners}, kNoDeadline);
    EXPECT_TRUE(entries.ok()) << entries.status().to_string();
    return entries.ok() ? *entries : std::vector<Entry>{};
  }

  std::string QueuePath(const std::string& queue) const {
    return dir_.path() + "/" + internal::file_store::QueueDirName(queue);
  }

  TempDir dir_;
  std::shared_ptr<Store> store_;
};

// --- URLs and directories

TEST(FileStoreUrl, RejectsHostUserAndQueryParameters) {
  TempDir dir;
  auto with_host = OpenUrl("file://somehost" + dir.path());
  EXPECT_EQ(with_host.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(with_host.status().message(), HasSubstr("somehost"));
  EXPECT_THAT(with_host.status().message(), HasSubstr("file:///"));

  auto with_user = OpenUrl("file://me@" + dir.path());
  EXPECT_EQ(with_user.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(with_user.status().message(), HasSubstr("user"));

  auto with_query = OpenUrl("file://" + dir.path() + "?timeout=5s");
  EXPECT_EQ(with_query.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(with_query.status().message(), HasSubstr("timeout"));
}

TEST(FileStoreUrl, CreatesMissingDirectoriesPrivately) {
  TempDir dir;
  std::string path = dir.path() + "/a/b/c";
  auto store = OpenUrl("file://" + path + "/");
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_EQ((*store)->url(), "file://" + path);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 077, 0u);
}

TEST(FileStoreUrl, RejectsAPathThatIsNotADirectory) {
  TempDir dir;
  std::string file = dir.path() + "/plain";
  std::ofstream(file) << "x";
  auto store = OpenUrl("file://" + file);
  EXPECT_EQ(store.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(store.status().message(), HasSubstr(file));

  auto below = OpenUrl("file://" + file + "/sub");
  EXPECT_FALSE(below.ok());
  EXPECT_THAT(below.status().message(), HasSubstr(file));
}

TEST(FileStoreUrl, RejectsAnUnwritableDirectory) {
  TempDir dir;
  std::string locked = dir.path() + "/locked";
  ASSERT_EQ(mkdir(locked.c_str(), 0500), 0);
  if (geteuid() == 0) {
    // Root writes anywhere but in sysfs, which refuses new files even to root.
    locked = "/sys/kernel";
    if (!std::filesystem::is_directory(locked)) GTEST_SKIP() << "root, and no sysfs to try";
  }
  auto store = OpenUrl("file://" + locked);
  EXPECT_EQ(store.status().code(), ErrorCode::kPermissionDenied) << store.status().to_string();
  EXPECT_THAT(store.status().message(), HasSubstr(locked));
}

// Restores an environment variable at the end of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Item 4 of issue 11: a cron job (no XDG_RUNTIME_DIR) and a login shell of
// the same user must share one default directory.
TEST(FileStoreUrl, DefaultDirectoryDoesNotDependOnTheEnvironment) {
  TempDir runtime;
  std::string expected = internal::DefaultFileStoreDirectory();
  EXPECT_EQ(expected, "/tmp/dlock-" + std::to_string(geteuid()));
  bool existed = std::filesystem::exists(expected);
  std::string with_xdg, without_xdg;
  {
    ScopedEnv env("XDG_RUNTIME_DIR", runtime.path().c_str());
    auto store = OpenUrl("file://");
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    with_xdg = (*store)->url();
  }
  {
    ScopedEnv env("XDG_RUNTIME_DIR", nullptr);
    ScopedEnv tmpdir("TMPDIR", runtime.path().c_str());
    auto store = OpenUrl("file://");
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    without_xdg = (*store)->url();
  }
  EXPECT_EQ(with_xdg, without_xdg);
  EXPECT_EQ(with_xdg, "file://" + expected);
  struct stat st {};
  ASSERT_EQ(lstat(expected.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 077, 0u);
  if (!existed) {
    std::error_code ec;
    std::filesystem::remove_all(expected, ec);
  }
}

TEST(FileStoreUrl, DefaultDirectoryMustNotBeASymlink) {
  TempDir parent;
  TempDir elsewhere;
  const std::string planted = parent.path() + "/dlock-planted";
  ASSERT_EQ(symlink(elsewhere.path().c_str(), planted.c_str()), 0);
  auto fd = internal::OpenPrivateDirectory(planted);
  EXPECT_EQ(fd.status().code(), ErrorCode::kPermissionDenied);
  EXPECT_THAT(fd.status().message(), HasSubstr(planted));
}

TEST(FileStoreUrl, DefaultDirectoryIsMadePrivate) {
  TempDir parent;
  const std::string dir = parent.path() + "/dlock-open";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  auto fd = internal::OpenPrivateDirectory(dir);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  struct stat st {};
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);
}

// --- append and list

TEST_F(FileStoreTest, LongQueueNamesWork) {
  std::string base(300, 'x');
  auto s = NewSession();
  Entry one = Append(*s, base + "/1");
  Entry two = Append(*s, base + "/2");
  EXPECT_EQ(Ids(List(*s, base + "/1")), std::vector<std::string>{one.id});
  EXPECT_EQ(Ids(List(*s, base + "/2")), std::vector<std::string>{two.id});
}

TEST_F(FileStoreTest, TokensGrowAcrossStoresAndProcesses) {
  auto first = NewSession();
  std::uint64_t t1 = *Append(*first, "q").token;
  first->close();

  auto reopened = OpenStoreAt(dir_.path());
  auto second = NewSession(reopened.get());
  std::uint64_t t2 = *Append(*second, "other").token;
  EXPECT_GT(t2, t1);

  std::uint64_t t3;
  {
    Holder holder(dir_.path(), "q", 2);
    ASSERT_EQ(holder.entries().size(), 2u);
    EXPECT_GT(holder.entries()[0].token, t2);
    EXPECT_GT(holder.entries()[1].token, holder.entries()[0].token);
    t3 = holder.entries()[1].token;
    holder.Kill();  // a crash must not make the counter go back
  }
  std::uint64_t t4 = *Append(*second, "q").token;
  EXPECT_GT(t4, t3);
}

// Item 16 of issue 11: tmpfs at reboot, a logout or a cleaner may delete
// the whole store directory; tokens must still grow.
TEST_F(FileStoreTest, TokensGrowWhenTheStoreDirectoryIsRecreated) {
  TempDir parent;
  const std::string path = parent.path() + "/store";
  std::uint64_t before;
  {
    auto store = OpenStoreAt(path);
    auto s = NewSession(store.get());
    before = *Append(*s, "q").token;
  }
  std::filesystem::remove_all(path);
  auto store = OpenStoreAt(path);
  auto s = NewSession(store.get());
  EXPECT_GT(*Append(*s, "q").token, before);
}

// Item 9 of issue 11: the counter's flock is held only for microseconds,
// but a process stopped inside that step holds it indefinitely; waiting for
// it must honour the caller's deadline and stop request.
TEST_F(FileStoreTest, AStuckCounterLockDoesNotOutlastTheDeadline) {
  internal::UniqueFd counter(open((dir_.path() + "/.counter").c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(counter.valid());
  ASSERT_EQ(flock(counter.get(), LOCK_EX), 0);  // "a stopped process"
  auto client = Client::connect("file://" + dir_.path());
  Mutex m(client, "stuck");
  auto timed = std::async(std::launch::async, [&] { return m.try_lock_for(200ms); });
  ASSERT_EQ(timed.wait_for(kPrompt), std::future_status::ready) << "try_lock_for waited past its deadline";
  EXPECT_FALSE(timed.get());
  std::stop_source stop;
  auto cancelled = std::async(std::launch::async, [&] { return m.lock_for(kForever, stop.get_token()); });
  EXPECT_EQ(cancelled.wait_for(kStillBlocked), std::future_status::timeout);
  stop.request_stop();
  ASSERT_EQ(cancelled.wait_for(kPrompt), std::future_status::ready) << "lock_for ignored its stop request";
  EXPECT_FALSE(cancelled.get());
  flock(counter.get(), LOCK_UN);
  EXPECT_TRUE(m.try_lock_for(kPrompt)) << "works again once the counter is free";
  m.unlock();
  EXPECT_TRUE(List(*NewSession(), "stuck").empty()) << "the given-up attempts left entries";
}

TEST_F(FileStoreTest, AGarbledOwnerRecordIsLeftOut) {
  auto s = NewSession();
  Entry e = Append(*s, "garbled");
  std::ofstream(QueuePath("garbled") + "/" + e.id, std::ios::trunc) << "{not json";
  auto listed = List(*s, "garbled", /*with_owners=*/true);
  ASSERT_EQ(listed.size(), 1u);  // still alive: its lock is untouched
  EXPECT_EQ(listed[0].id, e.id);
  EXPECT_FALSE(listed[0].owner.has_value());
}

TEST_F(FileStoreTest, InvalidNamesAreRejected) {
  auto s = NewSession();
  EXPECT_EQ(s->append("a//b", Spec(), kNoDeadline).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s->append("../x", Spec(), kNoDeadline).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s->append("q", Spec("a.b"), kNoDeadline).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s->append("q", Spec("lock", "x/y"), kNoDeadline).status().code(), ErrorCode::kInvalidArgument);
  EntrySpec negative = Spec();
  negative.sequence = -1;
  EXPECT_EQ(s->append("q", negative, kNoDeadline).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s->list("/q", {}, kNoDeadline).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s->remove("q", "../../.counter", kNoDeadline).code(), ErrorCode::kInvalidArgument);
  std::vector<std::string> bad = {".wake"};
  EXPECT_EQ(s->wait_any_gone("q", bad, kNoDeadline, {}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s->wait_any_gone("q", {}, kNoDeadline, {}).code(), ErrorCode::kInvalidArgument);
}

TEST_F(FileStoreTest, AnEmptiedQueueLeavesNoDirectory) {
  auto s = NewSession();
  Entry one = Append(*s, "tidy");
  Entry two = Append(*s, "tidy");
  EXPECT_TRUE(std::filesystem::exists(QueuePath("tidy")));
  ASSERT_TRUE(s->remove("tidy", one.id, kNoDeadline).ok());
  EXPECT_TRUE(std::filesystem::exists(QueuePath("tidy")));
  ASSERT_TRUE(s->remove("tidy", two.id, kNoDeadline).ok());
  EXPECT_FALSE(std::filesystem::exists(QueuePath("tidy")));
  // Nor FIFOs: only the counter and the empty FIFO directory remain.
  EXPECT_TRUE(std::filesystem::is_empty(dir_.path() + "/.wake"));
  Append(*s, "tidy");  // the directory comes back
  EXPECT_EQ(List(*s, "tidy").size(), 1u);
}

TEST_F(FileStoreTest, AppendsSurviveTheQueueDirectoryComingAndGoing) {
  // A stress test: removing the last entry deletes the queue directory, which
  // other threads' appends may be about to use (the window is narrow, so a
  // run does not always hit it).
  std::atomic<int> failures{0};
  auto churn = [&](Session& session) {
    for (int i = 0; i < 250; ++i) {
      auto appended = session.append("churn", Spec(), kNoDeadline);
      if (!appended.ok()) {
        ++failures;
        continue;
      }
      if (!session.remove("churn", appended->entry.id, kNoDeadline).ok()) ++failures;
    }
  };
  std::vector<std::shared_ptr<Session>> sessions;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) sessions.push_back(NewSession());
  for (auto& session : sessions) threads.emplace_back([&churn, session] { churn(*session); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(List(*sessions[0], "churn").empty());
  EXPECT_FALSE(std::filesystem::exists(QueuePath("churn")));
}

TEST_F(FileStoreTest, ListingDeletesWhatACrashedAppendLeft) {
  auto s = NewSession();
  Entry e = Append(*s, "crash");
  const std::string nonce = "0123456789abcdef0123456789abcdef";
  std::ofstream(QueuePath("crash") + "/.tmp." + nonce) << "{}";  // nobody holds its lock
  ASSERT_EQ(mkfifo((dir_.path() + "/.wake/" + nonce).c_str(), 0600), 0);
  EXPECT_EQ(Ids(List(*s, "crash")), std::vector<std::string>{e.id});
  EXPECT_FALSE(std::filesystem::exists(QueuePath("crash") + "/.tmp." + nonce));
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/.wake/" + nonce));
  ASSERT_TRUE(s->remove("crash", e.id, kNoDeadline).ok());
  EXPECT_FALSE(std::filesystem::exists(QueuePath("crash")));
}

// --- sessions

TEST_F(FileStoreTest, DestroyingASessionReleasesItsEntries) {
  auto other = NewSession();
  {
    auto s = NewSession();
    Append(*s, "scoped");
    EXPECT_EQ(List(*other, "scoped").size(), 1u);
  }
  EXPECT_TRUE(List(*other, "scoped").empty());
}

// --- remove

// --- wait_any_gone

TEST_F(FileStoreTest, WaitWakesWhenTheOwnerReleasesTheEntry) {
  auto owner = NewSession();
  auto waiter = NewSession();
  Entry e = Append(*owner, "w");
  AsyncWait wait(waiter, "w", {e.id});
  ASSERT_TRUE(wait.Blocks());
  ASSERT_TRUE(owner->remove("w", e.id, kNoDeadline).ok());
  EXPECT_EQ(wait.Result(), OkStatus());
}

// A hold watches its own entry (a broken holder is told): the wait of a
// session on an entry of its own ends when another client removes the entry
// (`dlock break`), whether that came before the wait was armed or after.
TEST_F(FileStoreTest, AWaitOnOnesOwnEntryEndsWhenItIsBrokenBeforeOrAfter) {
  auto owner = NewSession();
  auto other_store = OpenStoreAt(dir_.path());
  auto breaker = NewSession(other_store.get());
  Entry before = Append(*owner, "own");
  ASSERT_TRUE(breaker->remove("own", before.id, kNoDeadline).ok());
  AsyncWait gone(owner, "own", {before.id});
  EXPECT_EQ(gone.Result(), OkStatus()) << "a wait armed after the break did not see it";

  Entry after = Append(*owner, "own");
  AsyncWait wait(owner, "own", {after.id});
  ASSERT_TRUE(wait.Blocks()) << "a wait on a live entry of one's own ended";
  ASSERT_TRUE(breaker->remove("own", after.id, kNoDeadline).ok());
  EXPECT_EQ(wait.Result(), OkStatus()) << "a break after the wait was armed did not end it";

  // Deleted by hand (or by a breaker that died before it wrote into the
  // FIFO): no byte to wake anyone, only the missing name.
  Entry by_hand = Append(*owner, "own");
  ASSERT_EQ(::unlink((QueuePath("own") + "/" + by_hand.id).c_str()), 0);
  AsyncWait deleted(owner, "own", {by_hand.id});
  EXPECT_EQ(deleted.Result(), OkStatus()) << "a wait armed after the entry file was deleted did not see it";
}

// The same for an entry file moved out of its queue by hand (into a trash
// folder, say): still linked, but gone from the queue (review finding: a
// check of the link count alone took it for alive).
TEST_F(FileStoreTest, AWaitOnOnesOwnEntryEndsWhenItWasRenamedAway) {
  auto owner = NewSession();
  Entry e = Append(*owner, "own");
  ASSERT_EQ(::rename((QueuePath("own") + "/" + e.id).c_str(), (dir_.path() + "/trashed").c_str()), 0);
  AsyncWait moved(owner, "own", {e.id});
  EXPECT_EQ(moved.Result(), OkStatus()) << "a wait armed after the entry file was moved away did not see it";
}

TEST_F(FileStoreTest, WaitWakesWhenTheOwnerProcessIsKilled) {
  Holder holder(dir_.path(), "w");
  ASSERT_EQ(holder.entries().size(), 1u);
  auto waiter = NewSession();
  EXPECT_EQ(Ids(List(*waiter, "w")), std::vector<std::string>{holder.entry().id});
  AsyncWait wait(waiter, "w", {holder.entry().id});
  ASSERT_TRUE(wait.Blocks());
  holder.Kill();
  EXPECT_EQ(wait.Result(), OkStatus());
  EXPECT_TRUE(List(*waiter, "w").empty());
}

TEST_F(FileStoreTest, WaitWakesWhenAnotherProcessReleases) {
  Holder holder(dir_.path(), "w");
  ASSERT_EQ(holder.entries().size(), 1u);
  auto waiter = NewSession();
  AsyncWait wait(waiter, "w", {holder.entry().id});
  ASSERT_TRUE(wait.Blocks());
  EXPECT_EQ(holder.Finish(), 0);
  EXPECT_EQ(wait.Result(), OkStatus());
}

TEST_F(FileStoreTest, WaitWakesWhenALiveProcesssEntryIsBroken) {
  Holder holder(dir_.path(), "w");
  ASSERT_EQ(holder.entries().size(), 1u);
  auto waiter = NewSession();
  auto breaker = NewSession();
  AsyncWait wait(waiter, "w", {holder.entry().id});
  ASSERT_TRUE(wait.Blocks());
  ASSERT_TRUE(breaker->remove("w", holder.entry().id, kNoDeadline).ok());
  EXPECT_EQ(wait.Result(), OkStatus());
  EXPECT_TRUE(List(*waiter, "w").empty());
  // A later waiter on the broken entry does not block either.
  std::vector<std::string> ids = {holder.entry().id};
  EXPECT_EQ(waiter->wait_any_gone("w", ids, Soon(), {}), OkStatus());
  EXPECT_EQ(holder.Finish(), 0);
}

TEST_F(FileStoreTest, ADeadProcesssEntriesAreGoneAtOnce) {
  Holder holder(dir_.path(), "dead", 3);
  ASSERT_EQ(holder.entries().size(), 3u);
  auto s = NewSession();
  Entry mine = Append(*s, "dead");
  EXPECT_EQ(List(*s, "dead").size(), 4u);
  holder.Kill();
  // Waiting on an entry of a process that is already dead returns at once
  // (its FIFO shows no POLLHUP to a reader that opens it now).
  std::vector<std::string> ids = {holder.entries()[1].id};
  EXPECT_EQ(s->wait_any_gone("dead", ids, Soon(), {}), OkStatus());
  EXPECT_EQ(Ids(List(*s, "dead")), std::vector<std::string>{mine.id});
  // The listing deleted what the dead process left: only our entry and FIFO remain.
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(QueuePath("dead"))) ++files;
  EXPECT_EQ(files, 1u);
  std::size_t fifos = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_.path() + "/.wake")) ++fifos;
  EXPECT_EQ(fifos, 1u);
}

TEST_F(FileStoreTest, ManyWaitersWakeTogether) {
  auto owner = NewSession();
  Entry e = Append(*owner, "w");
  std::vector<std::shared_ptr<Session>> waiters;
  std::vector<std::unique_ptr<AsyncWait>> waits;
  for (int i = 0; i < 8; ++i) {
    waiters.push_back(NewSession());
    waits.push_back(std::make_unique<AsyncWait>(waiters.back(), "w", std::vector<std::string>{e.id}));
  }
  for (auto& w : waits) ASSERT_TRUE(w->Blocks());
  owner->close();
  for (auto& w : waits) EXPECT_EQ(w->Result(), OkStatus());
}

// The blocking wait sleeps in the calling thread (poll(2) on the FIFOs), so
// a blocking acquire's wake-up reaches it without a store thread: the
// store's waiting thread is not started by it.
TEST_F(FileStoreTest, ABlockingWaitSleepsInTheCallingThread) {
  auto owner = NewSession();
  auto waiter = NewSession();
  Entry e = Append(*owner, "here");
  EXPECT_TRUE(waiter->waits_on_calling_thread());
  const int threads_before = testing::ThreadCount();
  AsyncWait wait(waiter, "here", {e.id});  // one thread of the test's own
  ASSERT_TRUE(wait.Blocks());
  EXPECT_LE(testing::ThreadCount(), threads_before + 1) << "the wait started the store's waiting thread";
  ASSERT_TRUE(owner->remove("here", e.id, kNoDeadline).ok());
  EXPECT_EQ(wait.Result(), OkStatus());
}

// ... and ends by itself at its deadline, at a stop request (also one made
// before it began) and when its own session is closed under it.
TEST_F(FileStoreTest, ABlockingWaitEndsAtItsDeadlineItsStopAndItsSessionsClose) {
  auto owner = NewSession();
  auto waiter = NewSession();
  Entry e = Append(*owner, "ends");
  std::vector<std::string> ids = {e.id};
  EXPECT_EQ(waiter->wait_any_gone("ends", ids, std::chrono::steady_clock::now() + 50ms, {}).code(),
            ErrorCode::kDeadlineExceeded);
  EXPECT_EQ(waiter->wait_any_gone("ends", ids, std::chrono::steady_clock::now() - 1s, {}).code(),
            ErrorCode::kDeadlineExceeded);

  std::stop_source stopped;
  stopped.request_stop();
  EXPECT_EQ(waiter->wait_any_gone("ends", ids, Soon(), stopped.get_token()).code(), ErrorCode::kCancelled);

  AsyncWait cancelled(waiter, "ends", ids);
  ASSERT_TRUE(cancelled.Blocks());
  cancelled.Cancel();
  EXPECT_EQ(cancelled.Result().code(), ErrorCode::kCancelled);

  AsyncWait closed(waiter, "ends", ids);
  ASSERT_TRUE(closed.Blocks());
  waiter->close();
  EXPECT_EQ(closed.Result().code(), ErrorCode::kSessionLost) << "the close did not wake the wait";
  EXPECT_EQ(waiter->wait_any_gone("ends", ids, Soon(), {}).code(), ErrorCode::kSessionLost);
  // The entry waited for is still there: nothing but the close ended the wait.
  EXPECT_EQ(Ids(List(*owner, "ends")), ids);
}

// With a hand-moved clock a deadline must follow the clock, not poll's
// timeout: that store keeps the asynchronous wait.
TEST_F(FileStoreTest, AHandMovedClockKeepsTheAsynchronousWait) {
  auto clock = std::make_shared<ManualClock>();
  auto store = OpenStoreAt(dir_.path(), {.clock = clock});
  auto owner = NewSession(store.get());
  auto waiter = NewSession(store.get());
  EXPECT_FALSE(waiter->waits_on_calling_thread());
  Entry e = Append(*owner, "manual");
  AsyncWait wait(waiter, "manual", {e.id}, clock->now() + 1h);
  ASSERT_TRUE(wait.Blocks());
  clock->advance(2h);
  EXPECT_EQ(wait.Result().code(), ErrorCode::kDeadlineExceeded);
}

// A client on a hand-moved clock over a store on the real one: its
// deadlines are on its own clock, so its blocking acquires keep the
// asynchronous wait, which its timer cuts short (review finding: the
// store's poll took the hand-moved deadline for real time and gave up at
// once).
TEST_F(FileStoreTest, AClientOnAHandMovedClockKeepsItsDeadlinesOverARealClockStore) {
  auto clock = std::make_shared<ManualClock>();
  Client holder = Client::with_store(store_);
  ClientOptions on_clock;
  on_clock.clock = clock;
  Client waiter = Client::with_store(store_, on_clock);
  Mutex held(holder, "clocks");
  Mutex wanted(waiter, "clocks");
  std::optional<Hold> hold = held.acquire(5s);
  ASSERT_TRUE(hold);
  auto got = std::async(std::launch::async, [&] {
    const bool locked = wanted.try_lock_for(1h);
    if (locked) wanted.unlock();
    return locked;
  });
  // Waiting (its entry is second), so its deadline is set on the clock.
  ASSERT_TRUE(testing::Eventually([&] { return holder.list_entries("clocks", false).value().size() == 2; }, kPrompt))
      << "the acquire never queued";
  EXPECT_EQ(got.wait_for(kStillBlocked), std::future_status::timeout)
      << "the acquire ended before its deadline on the client's clock";
  clock->advance(2h);
  EXPECT_EQ(got.wait_for(kPrompt), std::future_status::ready) << "the client's clock did not end the acquire";
  hold.reset();
  EXPECT_FALSE(got.get());
}

// --- asynchronous waits

using testing::ThreadCount;

// Counts the outcomes of many async waits.
class Outcomes {
 public:
  std::function<void(Status)> Callback(int index) {
    return [this, index](Status s) {
      std::lock_guard<std::mutex> g(mu_);
      got_.emplace_back(index, std::move(s));
      cv_.notify_all();
    };
  }
  // Waits (boundedly) until `count` outcomes arrived; returns all so far.
  std::vector<std::pair<int, Status>> AtLeast(std::size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, kPrompt, [&] { return got_.size() >= count; });
    return got_;
  }
  std::size_t Count() {
    std::lock_guard<std::mutex> g(mu_);
    return got_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<int, Status>> got_;
};

// The waits of a store share one thread, whatever their number (issue 14:
// at most 3 threads of a store's own), and it wakes each for its entry.
TEST_F(FileStoreTest, FiveHundredAsyncWaitsAddAtMostOneThread) {
  constexpr int kEntries = 10;
  constexpr int kWaits = 500;
  auto holder = NewSession();
  auto waiter = NewSession();
  std::vector<Entry> entries;
  for (int i = 0; i < kEntries; ++i) entries.push_back(Append(*holder, "many"));
  const int threads_before = ThreadCount();
  Outcomes done;
  std::vector<std::shared_ptr<void>> handles;
  for (int i = 0; i < kWaits; ++i) {
    std::vector<std::string> ids{entries[static_cast<std::size_t>(i % kEntries)].id};
    handles.push_back(waiter->async_wait_any_gone("many", ids, done.Callback(i)));
  }
  EXPECT_LE(ThreadCount(), threads_before + 1) << "the waits took threads of their own";
  std::this_thread::sleep_for(kStillBlocked);
  EXPECT_EQ(done.Count(), 0u);
  ASSERT_TRUE(holder->remove("many", entries[0].id, kNoDeadline).ok());
  auto got = done.AtLeast(kWaits / kEntries);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(kWaits / kEntries));
  for (const auto& [index, status] : got) {
    EXPECT_EQ(index % kEntries, 0) << index;
    EXPECT_EQ(status, OkStatus()) << index;
  }
  EXPECT_LE(ThreadCount(), threads_before + 1);
  handles.clear();
  EXPECT_EQ(done.Count(), static_cast<std::size_t>(kWaits)) << "every cancelled wait heard kCancelled";
  // Blocking waits use the same thread.
  std::vector<std::string> ids{entries[1].id};
  EXPECT_EQ(waiter->wait_any_gone("many", ids, std::chrono::steady_clock::now() + 10ms, {}).code(),
            ErrorCode::kDeadlineExceeded);
  EXPECT_LE(ThreadCount(), threads_before + 1);
}

// The store's thread starts with its first wait and ends with the store and
// its sessions.
TEST_F(FileStoreTest, TheWaitingThreadEndsWithTheStoreAndItsSessions) {
  auto holder = NewSession();
  Entry e = Append(*holder, "thread");
  const int threads_before = ThreadCount();
  auto other = OpenStoreAt(dir_.path());
  auto waiter = NewSession(other.get());
  Outcomes done;
  std::vector<std::string> ids{e.id};
  auto handle = waiter->async_wait_any_gone("thread", ids, done.Callback(0));
  EXPECT_EQ(ThreadCount(), threads_before + 1);
  other.reset();  // the session keeps the thread
  EXPECT_EQ(ThreadCount(), threads_before + 1);
  handle.reset();
  EXPECT_EQ(done.Count(), 1u);
  waiter.reset();
  EXPECT_TRUE(testing::Eventually([&] { return ThreadCount() == threads_before; }));
}

// A child forked without exec has the store's epoll set but not its thread:
// a wait there fails at once instead of hanging, and what the child drops
// leaves the parent's waits alone.
TEST_F(FileStoreTest, AForkedChildsWaitFailsAndLeavesTheParentsWaits) {
  auto holder = NewSession();
  auto waiter = NewSession();
  Entry e = Append(*holder, "fork");
  std::vector<std::string> ids{e.id};
  Outcomes done;
  auto handle = waiter->async_wait_any_gone("fork", ids, done.Callback(0));
  // Fork once the store's new thread is idle in epoll_wait, not while it is
  // starting (holding locks of the runtime, which the child would inherit held).
  std::this_thread::sleep_for(kStillBlocked);
  auto result = testing::RunInChild(
      [&]() -> int {
        Outcomes in_child;
        auto mine = waiter->async_wait_any_gone("fork", ids, in_child.Callback(1));
        auto got = in_child.AtLeast(1);
        if (got.size() != 1 || got[0].second.code() != ErrorCode::kUnavailable) return 3;
        handle.reset();  // the child's copy of the parent's wait
        waiter.reset();
        return 0;
      },
      std::chrono::seconds(30));
  EXPECT_EQ(result, "exit 0");
  std::this_thread::sleep_for(kStillBlocked);
  EXPECT_EQ(done.Count(), 0u);
  ASSERT_TRUE(holder->remove("fork", e.id, kNoDeadline).ok());
  auto got = done.AtLeast(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].second, OkStatus());
}

// The same for the blocking wait (review finding: the session's closing
// signal is an eventfd, which a child forked without exec shares; its
// close() of its copy ended every blocking wait of the parent with
// kSessionLost, for good). The child's blocking wait fails, as its
// asynchronous one does, and its close() of a copy leaves the parent's
// waits alone.
TEST_F(FileStoreTest, AForkedChildsCopyOfASessionLeavesTheParentsBlockingWaits) {
  auto holder = NewSession();
  auto waiter = NewSession();
  Entry e = Append(*holder, "fork");
  std::vector<std::string> ids{e.id};
  // A first blocking wait makes the session's closing signal.
  EXPECT_EQ(waiter->wait_any_gone("fork", ids, std::chrono::steady_clock::now() + 20ms, {}).code(),
            ErrorCode::kDeadlineExceeded);
  auto result = testing::RunInChild(
      [&]() -> int {
        const bool failed = waiter->wait_any_gone("fork", ids, Soon(), {}).code() == ErrorCode::kUnavailable;
        waiter.reset();  // the child's copy: close() runs in the child
        return failed ? 0 : 3;
      },
      std::chrono::seconds(30));
  EXPECT_EQ(result, "exit 0");
  EXPECT_EQ(waiter->state(), SessionState::kConnected);
  AsyncWait wait(waiter, "fork", ids);
  EXPECT_TRUE(wait.Blocks()) << "the parent's blocking wait ended after the child closed its copy";
  ASSERT_TRUE(holder->remove("fork", e.id, kNoDeadline).ok());
  EXPECT_EQ(wait.Result(), OkStatus());
}

// The same under a blocking acquire: with the defect above, each pass saw
// kSessionLost from a session still connected, took its entry for gone
// with it and appended another, until the deadline (hundreds of entries
// left behind, and nobody got the lock while that session lived).
TEST_F(FileStoreTest, AForkedChildClosingItsCopyOfASessionLeavesTheParentsAcquiresAlone) {
  Client a = Client::with_store(store_);
  Client h = Client::with_store(store_);
  Mutex ma(a, "fork-acquire");
  Mutex mh(h, "fork-acquire");
  std::optional<Hold> held = mh.acquire(5s);
  ASSERT_TRUE(held);
  EXPECT_FALSE(ma.acquire(20ms));  // makes a's session's closing signal
  std::shared_ptr<Session> session = a.session().value();
  EXPECT_EQ(testing::RunInChild(
                [&]() -> int {
                  session->close();  // in the child only
                  return 0;
                },
                std::chrono::seconds(30)),
            "exit 0");
  ASSERT_EQ(session->state(), SessionState::kConnected);
  EXPECT_FALSE(ma.acquire(300ms));
  EXPECT_EQ(h.list_entries("fork-acquire", false).value().size(), 1u) << "the timed-out acquire left entries";
  held.reset();
  EXPECT_TRUE(ma.acquire(5s)) << "the lock stayed out of reach after its holder let go";
}

// Each pending wait holds a descriptor per entry it waits for. Out of
// descriptors, a new wait ends at once with kUnavailable (it never hangs or
// spins), and waits work again once descriptors are back.
TEST_F(FileStoreTest, OutOfDescriptorsAWaitEndsWithUnavailable) {
  auto holder = NewSession();
  Entry e = Append(*holder, "fds");
  const std::string dir = dir_.path();
  auto result = testing::RunInChild(
      [&]() -> int {
        auto store = OpenUrl("file://" + dir);
        if (!store.ok()) return 10;
        auto waiter = (*store)->open_session(kNoDeadline);
        if (!waiter.ok()) return 11;
        std::vector<std::string> ids{e.id};
        // Starts the store's thread, so that it is not what runs short.
        std::vector<std::shared_ptr<void>> handles;
        std::atomic<int> ok{0}, unavailable{0}, other{0};
        auto count = [&](Status s) {
          if (s.ok()) {
            ++ok;
          } else if (s.code() == ErrorCode::kUnavailable) {
            ++unavailable;
          } else if (s.code() != ErrorCode::kCancelled) {
            ++other;
          }
        };
        handles.push_back((*waiter)->async_wait_any_gone("fds", ids, count));
        rlimit low{};
        getrlimit(RLIMIT_NOFILE, &low);
        int highest = 0;
        for (int fd = 0; fd < 4096; ++fd) {
          if (fcntl(fd, F_GETFD) != -1) highest = fd;
        }
        low.rlim_cur = static_cast<rlim_t>(highest + 20);
        if (setrlimit(RLIMIT_NOFILE, &low) != 0) return 12;
        // The limit bounds descriptor numbers: the free ones below it go first.
        for (int i = 0; i < 5000 && unavailable.load() == 0; ++i) {
          handles.push_back((*waiter)->async_wait_any_gone("fds", ids, count));
        }
        if (unavailable.load() == 0) return 13;  // never ran out
        if (ok.load() != 0 || other.load() != 0) return 14;
        if ((*waiter)->wait_any_gone("fds", ids, kNoDeadline, {}).code() != ErrorCode::kUnavailable) return 15;
        const int pending = static_cast<int>(handles.size()) - unavailable.load();
        handles.clear();  // gives the descriptors back
        Outcomes done;
        auto again = (*waiter)->async_wait_any_gone("fds", ids, done.Callback(0));
        if (done.Count() != 0) return 16;  // not an error this time: it waits
        again.reset();
        return pending > 0 ? 0 : 17;
      },
      std::chrono::seconds(60));
  EXPECT_EQ(result, "exit 0");
  // The entry is still there and still waitable here.
  EXPECT_EQ(Ids(List(*holder, "fds")), std::vector<std::string>{e.id});
}

// --- published values and head watches (elections)

Result<Head> ReadHead(Session& session, const std::string& queue) {
  std::optional<Result<Head>> read;
  session.async_read_head(queue, {}, Soon(), [&](Result<Head> head) { read = std::move(head); });
  return read ? std::move(*read) : Result<Head>(InternalError("read_head did not answer inline"));
}

// The value joins the owner record in the entry file; both come back whole,
// also at the largest value size, in characters that JSON keeps as they are.
TEST_F(FileStoreTest, AValueAndTheOwnerRecordShareTheEntryFile) {
  auto s = NewSession();
  std::string value;
  while (value.size() + 2 <= 64 * 1024) value += "\xc3\xa9";  // U+00E9
  EntrySpec spec = Spec(std::string(entry_kind::kCandidate));
  spec.value = value;
  Entry e = Append(*s, "v", spec);
  auto listed = s->list("v", {.with_owners = true, .with_values = true}, kNoDeadline);
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].value, std::optional<std::string>(value));
  ASSERT_TRUE((*listed)[0].owner.has_value()) << "a 64 KiB value must not push the owner record out";
  EXPECT_EQ((*listed)[0].owner->label, "file_store_test");
  std::ifstream file(QueuePath("v") + "/" + e.id);
  std::string content((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_THAT(content, HasSubstr("\"label\":\"file_store_test\"")) << "readable by hand, as before";
}

TEST_F(FileStoreTest, AHeadWatchWakesWhenTheHeadsProcessIsKilled) {
  Holder holder(dir_.path(), "e");
  ASSERT_EQ(holder.entries().size(), 1u);
  auto watcher = NewSession();
  auto seen = ReadHead(*watcher, "e");
  ASSERT_TRUE(seen.ok()) << seen.status().to_string();
  ASSERT_TRUE(seen->entry.has_value());
  EXPECT_EQ(seen->entry->id, holder.entry().id);
  Outcomes fired;
  auto handle = watcher->async_watch_head("e", *seen, fired.Callback(0));
  std::this_thread::sleep_for(kStillBlocked);
  EXPECT_EQ(fired.Count(), 0u);
  holder.Kill();
  auto got = fired.AtLeast(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].second, OkStatus());
  auto after = ReadHead(*watcher, "e");
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->entry.has_value());
}

// Every way a watch ends takes its FIFO with it, and a FIFO whose watcher
// died is deleted by the next change; only the queue's position file stays.
TEST_F(FileStoreTest, HeadWatchFifosGoWithTheirWatches) {
  auto s = NewSession();
  auto watcher = NewSession();
  const std::string heads = dir_.path() + "/.heads/" + internal::file_store::QueueDirName("h");
  auto names = [&] {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(heads)) out.insert(e.path().filename().string());
    return out;
  };
  auto seen = ReadHead(*watcher, "h");
  ASSERT_TRUE(seen.ok());
  Outcomes outcomes;
  constexpr int kWatches = 20;
  std::vector<std::shared_ptr<void>> woken;
  for (int i = 0; i < kWatches; ++i) woken.push_back(watcher->async_watch_head("h", *seen, outcomes.Callback(i)));
  auto cancelled = watcher->async_watch_head("h", *seen, outcomes.Callback(kWatches));
  EXPECT_EQ(names().size(), static_cast<std::size_t>(kWatches + 2));
  std::this_thread::sleep_for(kStillBlocked);
  EXPECT_EQ(outcomes.Count(), 0u) << "nothing changed yet";
  // A watcher that died with its watch armed: a FIFO nobody has open.
  const std::string dead = heads + "/" + std::string(internal::file_store::kNonceLength, 'a');
  ASSERT_EQ(mkfifo(dead.c_str(), 0600), 0);
  cancelled.reset();
  Append(*s, "h");  // a head for an empty queue: wakes every watch at once
  auto got = outcomes.AtLeast(kWatches + 1);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(kWatches + 1));
  for (const auto& [index, status] : got) {
    EXPECT_EQ(status.code(), index == kWatches ? ErrorCode::kCancelled : ErrorCode::kOk) << index;
  }
  woken.clear();
  EXPECT_EQ(names(), std::set<std::string>{".position"});

  seen = ReadHead(*watcher, "h");
  ASSERT_TRUE(seen.ok());
  auto ended = watcher->async_watch_head("h", *seen, outcomes.Callback(kWatches + 1));
  EXPECT_EQ(names().size(), 2u);
  watcher->close();
  got = outcomes.AtLeast(kWatches + 2);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(kWatches + 2));
  EXPECT_EQ(got.back().second.code(), ErrorCode::kSessionLost);
  ended.reset();
  EXPECT_EQ(names(), std::set<std::string>{".position"});
}

// Leaves exactly `free_count` descriptor numbers free below a lowered
// RLIMIT_NOFILE; the destructor gives everything back.
//
// Under UBSan, the first check of an object's dynamic type tests its memory
// through a pipe (sanitizer_common's IsAccessibleMemoryRange): with no
// descriptor free it fails and reports a false "invalid vptr". So the tests
// below count k down, the first rounds (enough descriptors, every step
// succeeds) meeting each type once, and make an error Status before.
class ScarceDescriptors {
 public:
  explicit ScarceDescriptors(int free_count) {
    getrlimit(RLIMIT_NOFILE, &old_);
    int highest = 0;
    for (int fd = 0; fd < 4096; ++fd) {
      if (fcntl(fd, F_GETFD) != -1) highest = fd;
    }
    rlimit low = old_;
    low.rlim_cur = static_cast<rlim_t>(highest + 64);
    setrlimit(RLIMIT_NOFILE, &low);
    for (int i = 0; i < 4096; ++i) {
      int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd < 0) break;
      fillers_.push_back(fd);
    }
    for (int i = 0; i < free_count && !fillers_.empty(); ++i) {
      close(fillers_.back());
      fillers_.pop_back();
    }
  }
  ~ScarceDescriptors() {
    for (int fd : fillers_) close(fd);
    setrlimit(RLIMIT_NOFILE, &old_);
  }

 private:
  rlimit old_{};
  std::vector<int> fillers_;
};

// Review finding: an append that made a new head succeeded in a process
// short of descriptors although it could not open .heads/ or the watch
// FIFOs, and a watch armed before it never fired. Now the append fails
// (undone) or every watch hears it.
TEST_F(FileStoreTest, AHeadAppendedShortOfDescriptorsWakesArmedWatchesOrFails) {
  const std::string dir = dir_.path();
  auto result = testing::RunInChild(
      [&]() -> int {
        auto store = OpenUrl("file://" + dir);
        if (!store.ok()) return 10;
        auto watcher = (*store)->open_session(kNoDeadline);
        auto appender = (*store)->open_session(kNoDeadline);
        if (!watcher.ok() || !appender.ok()) return 11;
        int missed = 0;
        static_cast<void>(UnavailableError("a first error, with descriptors to spare (see ScarceDescriptors)"));
        for (int k = 16; k >= 1; --k) {
          const std::string queue = "fds" + std::to_string(k);
          auto seen = ReadHead(**watcher, queue);
          if (!seen.ok() || seen->entry) return 12;
          Outcomes fired;
          auto handle = (*watcher)->async_watch_head(queue, *seen, fired.Callback(0));
          if (fired.Count() != 0) return 13;
          std::optional<Result<Appended>> appended;
          {
            ScarceDescriptors scarce(k);
            appended = (*appender)->append(queue, Spec(), kNoDeadline);
          }
          if (!appended->ok()) {
            fprintf(stderr, "k=%d: append failed (%s)\n", k, appended->status().to_string().c_str());
            continue;
          }
          auto got = fired.AtLeast(1);  // at most kPrompt
          auto now = ReadHead(**watcher, queue);
          fprintf(stderr, "k=%d: append OK, head now %s, watch: %s\n", k,
                  now.ok() && now->entry ? "the new entry" : "?",
                  got.empty() ? "NEVER FIRED" : got[0].second.to_string().c_str());
          if (got.empty()) ++missed;
          handle.reset();
          static_cast<void>((*appender)->remove(queue, (*appended)->entry.id, kNoDeadline));
        }
        return missed == 0 ? 0 : 20 + missed;
      },
      std::chrono::seconds(120));
  EXPECT_EQ(result, "exit 0") << "exit 2N: N appends made a new head that an armed watch never heard of";
}

// Review finding: the same for a new value of the head (update_entry).
TEST_F(FileStoreTest, AHeadValueUpdatedShortOfDescriptorsWakesArmedWatchesOrFails) {
  const std::string dir = dir_.path();
  auto result = testing::RunInChild(
      [&]() -> int {
        auto store = OpenUrl("file://" + dir);
        if (!store.ok()) return 10;
        auto watcher = (*store)->open_session(kNoDeadline);
        auto owner = (*store)->open_session(kNoDeadline);
        if (!watcher.ok() || !owner.ok()) return 11;
        int missed = 0;
        static_cast<void>(UnavailableError("a first error, with descriptors to spare (see ScarceDescriptors)"));
        for (int k = 16; k >= 1; --k) {
          const std::string queue = "upd" + std::to_string(k);
          EntrySpec spec = Spec(std::string(entry_kind::kCandidate));
          spec.value = "v1";
          auto appended = (*owner)->append(queue, spec, kNoDeadline);
          if (!appended.ok()) return 12;
          auto seen = ReadHead(**watcher, queue);
          if (!seen.ok() || !seen->entry) return 13;
          Outcomes fired;
          auto handle = (*watcher)->async_watch_head(queue, *seen, fired.Callback(0));
          std::this_thread::sleep_for(kStillBlocked);
          if (fired.Count() != 0) return 14;
          std::optional<Result<Entry>> updated;
          {
            ScarceDescriptors scarce(k);
            updated =
                (*owner)->update_entry(queue, appended->entry.id, {.value = "v2", .owner = std::nullopt}, kNoDeadline);
          }
          if (!updated->ok()) {
            fprintf(stderr, "k=%d: update failed (%s)\n", k, updated->status().to_string().c_str());
          } else {
            auto got = fired.AtLeast(1);  // at most kPrompt
            auto now = ReadHead(**watcher, queue);
            fprintf(stderr, "k=%d: update OK, head value now %s (vv %llu), watch: %s\n", k,
                    now.ok() && now->entry && now->entry->value ? now->entry->value->c_str() : "?",
                    now.ok() && now->entry ? static_cast<unsigned long long>(now->entry->value_version) : 0ull,
                    got.empty() ? "NEVER FIRED" : got[0].second.to_string().c_str());
            if (got.empty()) ++missed;
          }
          handle.reset();
          static_cast<void>((*owner)->remove(queue, appended->entry.id, kNoDeadline));
        }
        return missed == 0 ? 0 : 20 + missed;
      },
      std::chrono::seconds(120));
  EXPECT_EQ(result, "exit 0") << "exit 2N: N new values of the head that an armed watch never heard of";
}

// Review finding: update_entry that could not write all of the new content
// (a full file system; RLIMIT_FSIZE stands in for ENOSPC here) left the
// entry file half new, half old: readers lost the value and the owner, and
// value_version went back to 1.
TEST_F(FileStoreTest, AFailedUpdateLeavesTheOldValue) {
  const std::string dir = dir_.path();
  auto result = testing::RunInChild(
      [&]() -> int {
        signal(SIGXFSZ, SIG_IGN);
        auto store = OpenUrl("file://" + dir);
        if (!store.ok()) return 10;
        auto s = (*store)->open_session(kNoDeadline);
        auto reader = (*store)->open_session(kNoDeadline);
        if (!s.ok() || !reader.ok()) return 11;
        EntrySpec spec = Spec(std::string(entry_kind::kCandidate));
        spec.value = "old";
        auto appended = (*s)->append("torn", spec, kNoDeadline);
        if (!appended.ok()) return 12;
        const std::string path = dir + "/" + internal::file_store::QueueDirName("torn") + "/" + appended->entry.id;
        struct stat st {};
        if (stat(path.c_str(), &st) != 0) return 13;
        rlimit old{};
        getrlimit(RLIMIT_FSIZE, &old);
        rlimit low = old;
        low.rlim_cur = static_cast<rlim_t>(st.st_size + 16);
        if (setrlimit(RLIMIT_FSIZE, &low) != 0) return 14;
        auto updated = (*s)->update_entry("torn", appended->entry.id,
                                          {.value = std::string(2000, 'n'), .owner = std::nullopt}, kNoDeadline);
        setrlimit(RLIMIT_FSIZE, &old);
        fprintf(stderr, "update_entry: %s\n", updated.status().to_string().c_str());
        if (updated.ok()) return 15;  // it fit after all
        auto listed = (*reader)->list("torn", {.with_owners = true, .with_values = true}, kNoDeadline);
        if (!listed.ok() || listed->size() != 1) return 16;
        const Entry& e = listed->front();
        fprintf(stderr, "read back: value %s, value_version %llu, owner %s\n",
                e.value ? ("\"" + e.value->substr(0, 10) + "...\"").c_str() : "none",
                static_cast<unsigned long long>(e.value_version), e.owner ? "present" : "none");
        if (e.value != std::optional<std::string>("old")) return 20;
        if (!e.owner) return 21;
        return 0;
      },
      std::chrono::seconds(60));
  EXPECT_EQ(result, "exit 0");
}

// Review finding: a watcher killed between making its FIFO and naming it
// left a FIFO nothing deleted. Watchers make theirs under the counter's
// lock now, so a half-made one seen by a change is a dead watcher's.
TEST_F(FileStoreTest, ADeadWatchersHalfMadeFifoGoesWithTheNextChange) {
  auto s = NewSession();
  auto watcher = NewSession();
  auto seen = ReadHead(*watcher, "k");
  ASSERT_TRUE(seen.ok());
  Outcomes fired;
  auto handle = watcher->async_watch_head("k", *seen, fired.Callback(0));  // makes .heads/q.k
  const std::string heads = dir_.path() + "/.heads/" + internal::file_store::QueueDirName("k");
  const std::string half_made = heads + "/.tmp." + std::string(internal::file_store::kNonceLength, 'b');
  ASSERT_EQ(mkfifo(half_made.c_str(), 0600), 0);
  Append(*s, "k");
  EXPECT_EQ(fired.AtLeast(1).size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(half_made)) << "a dead watcher's half-made FIFO outlived a change of the head";
}

}  // namespace
}  // namespace dlock
