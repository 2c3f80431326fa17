// The file:// store: host-local, multi-process, no daemon. See layout.hpp
// for what lives where in the store directory.
//
// Liveness: an entry file is flock(LOCK_EX)ed by its owner (flock, not POSIX
// fcntl locks, which a process loses when it closes any fd of the file). It is
// created under a temporary name, locked, and only then renamed into place,
// so an entry whose lock can be taken by someone else has a dead owner: it
// counts as gone, and whoever sees that may delete it.
//
// Waking: a kernel lock release raises no event, so each entry has a FIFO
// that its owner holds open read-write (see layout.hpp). A waiter opens it
// read-only and polls: POLLHUP when the owner's fds close (release, or death
// of the process), POLLIN when a remover wrote a byte after unlinking the
// entry. Waiters arm the FIFOs first and test second, so no release is missed;
// a FIFO opened after its owner died shows no POLLHUP (a Linux rule), which
// the test after arming catches. That test takes the flock of the FIFO itself
// (its owner holds one on the FIFO's open file description as well as on the
// entry file): when a process dies, the kernel may release its files in any
// order and later than the exit (deferred fput), so the FIFO's writer could be
// gone while the entry file is still locked, and a waiter arming in that gap
// would sleep forever. Within one description the lock is dropped before the
// writer is, so "no writer" always implies "lock free". FIFOs were chosen over
// abstract unix sockets because every connect() to a listener that never
// accepts leaves a connection in its backlog until the listener closes, so a
// long-held entry would refuse waiters once its backlog filled. inotify is not
// needed (and its per-user instance limit, 128 by default, is low).
//
// Ordering: the counter file's exclusive flock is held from taking a token
// until the entry is renamed into place, so entries appear in token order;
// listings take it shared, so none of them sees a later entry without an
// earlier one.
#include "stores/file/file_store.hpp"

#include "core/dlock_thread.hpp"
#include "core/event_signal.hpp"
#include "core/listeners.hpp"
#include "core/random_id.hpp"
#include "core/system_clock.hpp"
#include "core/thread_annotations.hpp"
#include "core/unique_fd.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <stop_token>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "stores/blocking_wait.hpp"
#include "stores/entry_value.hpp"
#include "stores/file/layout.hpp"
#include "stores/one_outcome.hpp"

namespace dlock::internal {
namespace {

using file_store::EntryName;
using file_store::FormatEntryName;
using file_store::IsNonce;
using file_store::IsValidAttemptId;
using file_store::IsValidKind;
using file_store::kCounterFile;
using file_store::kHeadsDir;
using file_store::kPositionFile;
using file_store::kTempPrefix;
using file_store::kWakeDir;
using file_store::ParseEntryName;
using file_store::QueueDirName;

// The largest entry file we write: an owner record and a value, each at most
// 64 KiB before JSON escapes.
constexpr std::size_t kMaxEntryContent = 1024 * 1024;
// How often append starts over when its queue directory vanishes under it (a
// concurrent rmdir of the emptied queue) before giving up.
constexpr int kMaxAppendAttempts = 100;

std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

Status ErrnoStatus(int err, std::string_view action, const std::string& path) {
  std::string message = std::string(action) + " " + path + ": " + ErrnoText(err);
  switch (err) {
    case EACCES:
    case EPERM:
    case EROFS: return PermissionDeniedError(std::move(message));
    case ENOTDIR:
    case ELOOP:
    case ENAMETOOLONG: return InvalidArgumentError(std::move(message));
    default: return UnavailableError(std::move(message));
  }
}

// Retries `call` while it fails with EINTR.
template <typename F>
auto RetryOnEintr(F call) {
  decltype(call()) result;
  do {
    result = call();
  } while (result == -1 && errno == EINTR);
  return result;
}

std::string WakePath(std::string_view nonce) { return std::string(kWakeDir) + "/" + std::string(nonce); }

std::string EscapeUrlPath(const std::string& path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : path) {
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '/' || c == '.' ||
                 c == '_' || c == '-' || c == '~';
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  return out;
}

// The one thread of a store that waits for FIFOs (see "Waiting threads").
// Shared by the store, its sessions and their wait handles; the thread
// starts with the first wait and ends when the store and its sessions are
// gone (StoreDir's destructor calls stop()).
class FifoWatcher : public std::enable_shared_from_this<FifoWatcher> {
 public:
  FifoWatcher() = default;
  FifoWatcher(const FifoWatcher&) = delete;
  FifoWatcher& operator=(const FifoWatcher&) = delete;

  // Watches `fifos` for `session`'s wait; `outcome` gets OK from the thread
  // once one of them wakes. Returns the wait's key (never 0), or kUnavailable
  // when the thread or the epoll set cannot be had (out of descriptors,
  // threads or memory).
  Result<std::uint64_t> add(std::string session, std::vector<UniqueFd> fifos, std::shared_ptr<OneOutcome> outcome)
      DLOCK_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (stopping_) return UnavailableError("the store is closing");
    if (auto s = start(); !s.ok()) return s;
    const std::uint64_t key = next_key_++;
    for (std::size_t i = 0; i < fifos.size(); ++i) {
      // One-shot: a FIFO reports once (POLLHUP stays raised), and a wait
      // taken out by someone else is never reported again.
      epoll_event event{};
      event.events = EPOLLIN | EPOLLONESHOT;
      event.data.u64 = key;
      if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fifos[i].get(), &event) != 0) {
        int err = errno;
        for (std::size_t j = 0; j < i; ++j) epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fifos[j].get(), nullptr);
        return UnavailableError("cannot watch a FIFO (epoll_ctl): " + ErrnoText(err));
      }
    }
    // Added under mu_: the thread cannot take the wait out (and close its
    // FIFOs) before every one of them is in the set.
    waits_.emplace(key, Wait{std::move(session), std::move(fifos), std::move(outcome)});
    return key;
  }

  // Takes a wait out (its FIFOs closed); its outcome is the caller's.
  void remove(std::uint64_t key) DLOCK_EXCLUDES(mu_) {
    std::optional<Wait> taken;
    {
      MutexLock lock(mu_);
      auto it = waits_.find(key);
      if (it == waits_.end()) return;
      taken = std::move(it->second);
      waits_.erase(it);
    }
    unwatch(*taken);
  }

  // Ends every wait of `session` with kSessionLost, on this thread.
  void end_session(const std::string& session, const std::string& why) DLOCK_EXCLUDES(mu_) {
    std::vector<Wait> ended;
    {
      MutexLock lock(mu_);
      for (auto it = waits_.begin(); it != waits_.end();) {
        if (it->second.session != session) {
          ++it;
          continue;
        }
        ended.push_back(std::move(it->second));
        it = waits_.erase(it);
      }
    }
    for (Wait& w : ended) {
      unwatch(w);
      w.outcome->complete(SessionLostError(why));
    }
  }

  // Ends the thread; waits still pending (their sessions outlived by their
  // handles, against the contract) end with kSessionLost.
  void stop() DLOCK_EXCLUDES(mu_) {
    std::thread thread;
    bool ours = true;
    std::map<std::uint64_t, Wait> left;
    {
      MutexLock lock(mu_);
      stopping_ = true;
      thread = std::move(thread_);
      ours = started_by_ == getpid();
      left.swap(waits_);
      if (wake_) wake_->signal();
    }
    if (thread.joinable()) {
      // From a completion on the thread itself (it dropped the last session):
      // it sees stopping_ when it returns and ends on its own. In a child
      // forked without exec the thread does not exist: joining would hang.
      if (!ours || thread.get_id() == std::this_thread::get_id()) {
        thread.detach();
      } else {
        thread.join();
      }
    }
    if (!ours) return;  // the waits are the parent's, and so is the epoll set
    for (auto& [key, w] : left) {
      unwatch(w);
      w.outcome->complete(SessionLostError("the store was closed while waiting"));
    }
  }

 private:
  struct Wait {
    std::string session;
    std::vector<UniqueFd> fifos;
    std::shared_ptr<OneOutcome> outcome;
  };

  // Creates the epoll set and the thread, once.
  Status start() DLOCK_REQUIRES(mu_) {
    // A child forked without exec has the epoll set of its parent and not
    // its thread: an error, rather than a wait nobody serves.
    if (thread_.joinable() && started_by_ != getpid()) {
      return UnavailableError("this file store was opened before fork(); open it again in the child");
    }
    if (thread_.joinable()) return OkStatus();
    if (!epoll_.valid()) {
      epoll_ = UniqueFd(epoll_create1(EPOLL_CLOEXEC));
      if (!epoll_.valid()) return UnavailableError("cannot wait for FIFOs (epoll_create1): " + ErrnoText(errno));
    }
    if (!wake_) {
      auto signal = EventSignal::create();
      if (!signal.ok()) return signal.status();
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.u64 = 0;  // keys of waits start at 1
      if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, signal->fd(), &event) != 0) {
        return UnavailableError("cannot wait for FIFOs (epoll_ctl): " + ErrnoText(errno));
      }
      wake_.emplace(std::move(*signal));
    }
    try {
      // The thread keeps the watcher (and so the epoll set) alive until it ends.
      thread_ = std::thread([self = shared_from_this()] {
        MarkDlockThread("dlock-file-fifo");
        self->run();
      });
      started_by_ = getpid();
    } catch (const std::system_error& e) {
      return UnavailableError(std::string("cannot start the file store's waiting thread: ") + e.what());
    }
    return OkStatus();
  }

  void run() DLOCK_EXCLUDES(mu_) {
    int epoll_fd;
    {
      MutexLock lock(mu_);
      epoll_fd = epoll_.get();  // constant from here on: closed only with the watcher
    }
    std::array<epoll_event, 64> events{};
    for (;;) {
      int n = epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), -1);
      const int err = errno;
      if (n < 0 && err == EINTR) continue;
      std::vector<Wait> woken;
      std::map<std::uint64_t, Wait> failed;
      {
        MutexLock lock(mu_);
        if (stopping_) return;
        if (n < 0) {
          // Cannot happen with a valid set; end every wait rather than spin.
          stopping_ = true;
          failed.swap(waits_);
        }
        for (int i = 0; i < n; ++i) take(events[static_cast<std::size_t>(i)].data.u64, woken);
      }
      for (auto& [key, w] : failed) {
        unwatch(w);
        w.outcome->complete(UnavailableError("epoll_wait: " + ErrnoText(err)));
      }
      if (n < 0) return;
      // POLLHUP: an owner closed its FIFO (released, or its process died);
      // POLLIN: a remover deleted the entry and wrote a byte.
      for (Wait& w : woken) {
        unwatch(w);
        w.outcome->complete(OkStatus());
      }
    }
  }

  // Moves the wait an event names (if still there) into `woken`.
  void take(std::uint64_t key, std::vector<Wait>& woken) DLOCK_REQUIRES(mu_) {
    if (key == 0) {
      wake_->drain();
      return;
    }
    auto it = waits_.find(key);
    if (it == waits_.end()) return;  // cancelled or ended meanwhile
    woken.push_back(std::move(it->second));
    waits_.erase(it);
  }

  // Takes a wait's FIFOs out of the set before closing them: a registration
  // lives as long as its open file description, which a child forked
  // without exec may share.
  void unwatch(Wait& w) DLOCK_EXCLUDES(mu_) {
    int epoll_fd;
    {
      MutexLock lock(mu_);
      // Not in a child forked without exec: the set is its parent's.
      epoll_fd = started_by_ == getpid() ? epoll_.get() : -1;
    }
    if (epoll_fd >= 0) {
      for (UniqueFd& fd : w.fifos) epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd.get(), nullptr);
    }
    w.fifos.clear();
  }

  Mutex mu_;
  bool stopping_ DLOCK_GUARDED_BY(mu_) = false;
  UniqueFd epoll_ DLOCK_GUARDED_BY(mu_);
  std::optional<EventSignal> wake_ DLOCK_GUARDED_BY(mu_);
  std::thread thread_ DLOCK_GUARDED_BY(mu_);
  pid_t started_by_ DLOCK_GUARDED_BY(mu_) = 0;
  std::uint64_t next_key_ DLOCK_GUARDED_BY(mu_) = 1;
  std::map<std::uint64_t, Wait> waits_ DLOCK_GUARDED_BY(mu_);
};

// What every session of one store shares.
struct StoreDir {
  std::string path;  // absolute, for messages
  UniqueFd root;
  std::shared_ptr<Clock> clock;
  // The clock reads steady_clock (no hand-moved clock): a blocking wait may
  // then sleep in poll(2) with the deadline as its timeout.
  bool real_clock = false;
  std::atomic<std::uint64_t> sessions_opened{0};
  const std::shared_ptr<FifoWatcher> watcher = std::make_shared<FifoWatcher>();

  StoreDir() = default;
  StoreDir(const StoreDir&) = delete;
  StoreDir& operator=(const StoreDir&) = delete;
  ~StoreDir() { watcher->stop(); }

  std::string path_of(std::string_view relative) const {
    return path + (path.ends_with('/') ? "" : "/") + std::string(relative);
  }
};

// How long one request waits for the counter's flock before it reports
// kUnavailable. The lock is held for microseconds; only a process stopped (or
// starved) inside that step holds it longer, and then the caller must get
// back control to honour its own deadline and stop request.
constexpr auto kCounterWaitLimit = std::chrono::milliseconds(250);

// Takes the counter file's flock (LOCK_EX to hand out a token, LOCK_SH to
// read a queue). A new open file description each time: flock is per
// description, so threads sharing one fd would share one lock. flock has no
// timeout, so a busy lock is retried without blocking, 50 us apart doubling
// to 5 ms, until `deadline` (at least one try) or kCounterWaitLimit.
Result<UniqueFd> LockCounter(const StoreDir& dir, int operation, Clock::time_point deadline) {
  UniqueFd fd(openat(dir.root.get(), std::string(kCounterFile).c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return ErrnoStatus(errno, "cannot open", dir.path_of(kCounterFile));
  const auto give_up = std::chrono::steady_clock::now() + kCounterWaitLimit;
  auto pause = std::chrono::microseconds(50);
  while (true) {
    if (RetryOnEintr([&] { return flock(fd.get(), operation | LOCK_NB); }) == 0) return fd;
    if (errno != EWOULDBLOCK) return ErrnoStatus(errno, "cannot lock", dir.path_of(kCounterFile));
    if (dir.clock->now() >= deadline || std::chrono::steady_clock::now() >= give_up) {
      return UnavailableError("the counter " + dir.path_of(kCounterFile) +
                              " is locked by a process that does not let go (stopped?); try again");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(5));
  }
}

// The wall clock in microseconds: where a new counter starts, so that tokens
// keep growing when the store directory is deleted and made again (tmpfs at
// reboot, a cleaner), as long as the wall clock does not step back.
std::uint64_t WallClockMicros() {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch());
  return us.count() > 0 ? static_cast<std::uint64_t>(us.count()) : 0;
}

// Reads an 8-byte little-endian number at the start of `fd` (0 if empty).
// Never written short by us: a number of another length is damage, and
// restarting low would let tokens (or head positions) go back.
Result<std::uint64_t> ReadNumberFile(int fd, const std::string& shown_path) {
  unsigned char bytes[8] = {};
  ssize_t n = RetryOnEintr([&] { return pread(fd, bytes, sizeof bytes, 0); });
  if (n < 0) return ErrnoStatus(errno, "cannot read", shown_path);
  if (n != 0 && n != static_cast<ssize_t>(sizeof bytes)) {
    return InternalError(shown_path + " is " + std::to_string(n) + " bytes long, not 8; it was damaged");
  }
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < sizeof bytes; ++i) value |= std::uint64_t{bytes[i]} << (8 * i);
  return value;
}

Status WriteNumberFile(int fd, std::uint64_t value, const std::string& shown_path) {
  unsigned char bytes[8] = {};
  for (std::size_t i = 0; i < sizeof bytes; ++i) bytes[i] = static_cast<unsigned char>(value >> (8 * i));
  ssize_t n = RetryOnEintr([&] { return pwrite(fd, bytes, sizeof bytes, 0); });
  if (n != static_cast<ssize_t>(sizeof bytes)) return ErrnoStatus(n < 0 ? errno : EIO, "cannot write", shown_path);
  return OkStatus();
}

// The next fencing token: max(last + 1, wall clock in us). The caller holds
// the counter's exclusive lock.
Result<std::uint64_t> NextToken(const StoreDir& dir, int counter_fd) {
  auto last = ReadNumberFile(counter_fd, dir.path_of(kCounterFile));
  if (!last.ok()) return last.status();
  if (*last >= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return InternalError("fencing tokens of " + dir.path + " are exhausted");
  }
  std::uint64_t next = std::max(*last + 1, WallClockMicros());
  if (auto s = WriteNumberFile(counter_fd, next, dir.path_of(kCounterFile)); !s.ok()) return s;
  return next;
}

// Unlinks `name` in `dir_fd` if it is still the file `fd` has open.
void UnlinkIfSame(int dir_fd, const std::string& name, int fd) noexcept {
  struct stat open_file {};
  struct stat named {};
  if (fstat(fd, &open_file) != 0 || fstatat(dir_fd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (open_file.st_dev == named.st_dev && open_file.st_ino == named.st_ino) unlinkat(dir_fd, name.c_str(), 0);
}

// Writes a byte into an entry's FIFO so that its waiters wake (POLLIN) even
// though its owner lives on. Nobody reads it; the FIFO goes with its owner.
void PokeWaiters(const StoreDir& dir, std::string_view nonce) noexcept {
  UniqueFd fd(openat(dir.root.get(), WakePath(nonce).c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return;  // ENXIO: no reader, so nobody to wake; ENOENT: gone
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || !S_ISFIFO(st.st_mode)) return;
  [[maybe_unused]] ssize_t n = write(fd.get(), "x", 1);
}

void RemoveQueueDirIfEmpty(const StoreDir& dir, const std::string& qdir) noexcept {
  unlinkat(dir.root.get(), qdir.c_str(), AT_REMOVEDIR);  // ENOTEMPTY is the common case
}

enum class Liveness { kAlive, kGone };

struct Probe {
  Liveness liveness = Liveness::kGone;
  UniqueFd fd;  // open while kAlive
};

// Tests the entry (or temporary) file `name` in `qdir_fd`. A file nobody
// holds locked belongs to a dead process: it is deleted, with its FIFO.
Result<Probe> ProbeFile(const StoreDir& dir, int qdir_fd, const std::string& name, std::string_view nonce,
                        const std::string& shown_path) {
  Probe out;
  out.fd = UniqueFd(openat(qdir_fd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!out.fd.valid()) {
    if (errno == ENOENT) return out;
    return ErrnoStatus(errno, "cannot open", shown_path);
  }
  if (flock(out.fd.get(), LOCK_SH | LOCK_NB) == 0) {
    UnlinkIfSame(qdir_fd, name, out.fd.get());
    unlinkat(dir.root.get(), WakePath(nonce).c_str(), 0);
    out.fd.reset();
    return out;
  }
  if (errno != EWOULDBLOCK) return ErrnoStatus(errno, "cannot test the lock of", shown_path);
  out.liveness = Liveness::kAlive;
  return out;
}

// What an entry file holds. Its owner record is a JSON object; a published
// value joins it as two more fields, which older readers ignore.
struct EntryContent {
  std::optional<OwnerRecord> owner;
  std::optional<std::string> value;
  std::uint64_t value_version = 1;
};

std::string EncodeEntryContent(const OwnerRecord& owner, const std::optional<std::string>& value,
                               std::uint64_t value_version) {
  std::string record = EncodeOwnerRecord(owner);
  if (!value) return record;
  nlohmann::json j = nlohmann::json::parse(record, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) j = nlohmann::json::object();
  j["value"] = *value;  // UTF-8: CheckEntryValue
  j["vv"] = value_version;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

EntryContent DecodeEntryContent(std::string_view data) {
  EntryContent out;
  nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return out;
  if (auto it = j.find("value"); it != j.end() && it->is_string()) out.value = it->get<std::string>();
  if (auto it = j.find("vv"); it != j.end() && it->is_number_unsigned()) out.value_version = it->get<std::uint64_t>();
  // The owner record alone (its decoder limits it to 64 KiB, which a value
  // of 64 KiB would pass).
  j.erase("value");
  j.erase("vv");
  if (auto owner = DecodeOwnerRecord(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)); owner.ok()) {
    out.owner = *owner;
  }
  return out;
}

// Reads a whole entry file (nothing if it is larger than any we write).
EntryContent ReadContent(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < 0 || static_cast<std::size_t>(st.st_size) > kMaxEntryContent) return {};
  std::string data(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t size = 0;
  while (size < data.size()) {
    ssize_t n =
        RetryOnEintr([&] { return pread(fd, data.data() + size, data.size() - size, static_cast<off_t>(size)); });
    if (n <= 0) break;
    size += static_cast<std::size_t>(n);
  }
  data.resize(size);
  return DecodeEntryContent(data);
}

Result<UniqueFd> OpenQueueDir(const StoreDir& dir, const std::string& qdir) {
  UniqueFd fd(openat(dir.root.get(), qdir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid() && errno != ENOENT) return ErrnoStatus(errno, "cannot open", dir.path_of(qdir));
  return fd;  // invalid: the queue is empty
}

// How much of a queue ReadQueue reads.
struct QueueReading {
  ListOptions options;
  std::string_view held;   // an entry the caller holds locked: alive without a probe
  bool head_only = false;  // stop at the first live entry
};

// The live entries of a queue, sorted; deletes what dead processes left
// (behind the head too, unless `head_only`).
Result<std::vector<Entry>> ReadQueue(const StoreDir& dir, const std::string& qdir, const QueueReading& reading) {
  std::vector<Entry> out;
  auto qdir_fd = OpenQueueDir(dir, qdir);
  if (!qdir_fd.ok()) return qdir_fd.status();
  if (!qdir_fd->valid()) return out;
  std::unique_ptr<DIR, int (*)(DIR*)> stream(fdopendir(qdir_fd->get()), &closedir);
  if (!stream) return ErrnoStatus(errno, "cannot read", dir.path_of(qdir));
  static_cast<void>(qdir_fd->release());  // closedir() closes it now; dirfd() lends it back
  const int qfd = dirfd(stream.get());
  std::vector<std::string> names;
  errno = 0;
  while (dirent* d = readdir(stream.get())) names.emplace_back(d->d_name);
  if (errno != 0) return ErrnoStatus(errno, "cannot read", dir.path_of(qdir));
  std::vector<std::pair<std::string, EntryName>> entries;
  for (std::string& name : names) {
    if (std::string_view(name).starts_with(kTempPrefix)) {
      std::string_view nonce = std::string_view(name).substr(kTempPrefix.size());
      if (!IsNonce(nonce)) continue;
      // Deletes a dead append's leftovers.
      auto probe = ProbeFile(dir, qfd, name, nonce, dir.path_of(qdir + "/" + name));
      if (!probe.ok()) return probe.status();
      continue;
    }
    auto parsed = ParseEntryName(name);
    if (!parsed) continue;  // not ours ("." and "..", stray files)
    entries.emplace_back(std::move(name), std::move(*parsed));
  }
  // Queue order (QueueOrder: sequence, then id), so that a head reading can
  // stop at the first live entry.
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.second.sequence != b.second.sequence ? a.second.sequence < b.second.sequence : a.first < b.first;
  });
  const bool read_content = reading.options.with_owners || reading.options.with_values;
  for (auto& [name, parsed] : entries) {
    Result<Probe> probe = Probe{Liveness::kAlive, UniqueFd()};
    if (name != reading.held || read_content) {
      probe = ProbeFile(dir, qfd, name, parsed.nonce, dir.path_of(qdir + "/" + name));
    }
    if (!probe.ok()) return probe.status();
    if (probe->liveness == Liveness::kGone) continue;
    Entry entry;
    entry.id = name;
    entry.kind = parsed.kind;
    entry.sequence = parsed.sequence;
    entry.token = parsed.token;
    entry.attempt_id = parsed.attempt_id;
    if (read_content) {
      EntryContent content = ReadContent(probe->fd.get());
      if (reading.options.with_owners) entry.owner = std::move(content.owner);
      if (reading.options.with_values) {
        entry.value = std::move(content.value);
        entry.value_version = content.value_version;
      }
    }
    out.push_back(std::move(entry));
    if (reading.head_only) break;
  }
  if (out.empty()) RemoveQueueDirIfEmpty(dir, qdir);
  return out;
}

// An entry this process owns: the open files are what keep it alive.
struct OwnedEntry {
  std::string queue;
  std::string qdir;
  std::string nonce;
  Entry entry;    // with token and owner
  UniqueFd file;  // holds the entry's flock
  UniqueFd wake;  // its FIFO, open read-write
};

// Ends an owned entry: delete it, wake its waiters, close its files.
void ReleaseEntry(const StoreDir& dir, OwnedEntry& owned) noexcept {
  // By name: an operator may have deleted it already, and names are never reused.
  unlinkat(dir.root.get(), (owned.qdir + "/" + owned.entry.id).c_str(), 0);
  // Closing the FIFO raises POLLHUP, but not while a child forked without
  // exec still holds it; the byte wakes waiters in any case.
  if (owned.wake.valid()) {
    [[maybe_unused]] ssize_t n = write(owned.wake.get(), "x", 1);
  }
  unlinkat(dir.root.get(), WakePath(owned.nonce).c_str(), 0);
  owned.file.reset();
  owned.wake.reset();
  RemoveQueueDirIfEmpty(dir, owned.qdir);
}

// Replaces an entry file's content with `entry`'s owner record and value.
// The space is reserved first, so a full file system fails it before any
// byte changes; a failure after that is put back by the caller.
Status RewriteEntryFile(int fd, const Entry& entry, const std::string& shown_path) {
  const std::string content = EncodeEntryContent(entry.owner.value_or(OwnerRecord{}), entry.value, entry.value_version);
  const auto size = static_cast<off_t>(content.size());
  if (int err = posix_fallocate(fd, 0, size); err != 0) return ErrnoStatus(err, "cannot write", shown_path);
  ssize_t n = RetryOnEintr([&] { return pwrite(fd, content.data(), content.size(), 0); });
  if (n != static_cast<ssize_t>(content.size())) return ErrnoStatus(n < 0 ? errno : EIO, "cannot write", shown_path);
  if (RetryOnEintr([&] { return ftruncate(fd, size); }) != 0) return ErrnoStatus(errno, "cannot write", shown_path);
  return OkStatus();
}

// ------------------------------------------------------------- head watches
//
// A head watch (Session::async_watch_head) must see every change of a
// queue's head after the reading it starts from. The head's removal wakes it
// through the head entry's FIFO, as it wakes waiters. A new head (an entry
// appended to an empty queue, or ahead of the head) and a new value of the
// head have no FIFO of their own: they write a byte into every watch FIFO of
// the queue (.heads/QUEUE/NONCE, layout.hpp). A head that came and went
// between the reading and the watch leaves nothing in the queue to compare,
// so the append that made it records its token in .heads/QUEUE/.position,
// and a watch fires at once if that is past the counter value its reading
// saw. Only queues that have been watched have the directory: for the others
// an append pays one failed openat.

std::string HeadsDirPath(const std::string& qdir) { return std::string(kHeadsDir) + "/" + qdir; }

// Tells the head watches of `qdir` that its head changed: records `token`,
// if given (an append made the head), and writes a byte into every watch
// FIFO. A FIFO that nobody has open is a crashed watcher's, and so is a
// half-made one (watchers make theirs under the counter's lock): deleted.
// An error means a watch may not have heard: the caller undoes its change.
// The caller holds the counter's exclusive lock.
Status NoteHeadChange(const StoreDir& dir, const std::string& qdir, std::optional<std::uint64_t> token) {
  const std::string heads = HeadsDirPath(qdir);
  UniqueFd heads_fd(openat(dir.root.get(), heads.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (!heads_fd.valid()) {
    if (errno == ENOENT) return OkStatus();  // never watched: the common case
    return ErrnoStatus(errno, "cannot open", dir.path_of(heads));
  }
  if (token) {
    const std::string position_file(kPositionFile);
    UniqueFd position(openat(heads_fd.get(), position_file.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
    // Not written: without the file, the next watch takes the queue as
    // changed (it makes the file anew at the counter's value).
    if (!position.valid() || !WriteNumberFile(position.get(), *token, dir.path_of(heads)).ok()) {
      unlinkat(heads_fd.get(), position_file.c_str(), 0);
    }
  }
  std::unique_ptr<DIR, int (*)(DIR*)> stream(fdopendir(heads_fd.get()), &closedir);
  if (!stream) return ErrnoStatus(errno, "cannot read", dir.path_of(heads));
  static_cast<void>(heads_fd.release());  // closedir() closes it
  const int hfd = dirfd(stream.get());
  std::vector<std::string> watches;
  std::vector<std::string> half_made;
  errno = 0;
  while (dirent* d = readdir(stream.get())) {
    std::string_view name = d->d_name;
    if (IsNonce(name)) {
      watches.emplace_back(name);
    } else if (name.starts_with(kTempPrefix) && IsNonce(name.substr(kTempPrefix.size()))) {
      half_made.emplace_back(name);
    }
  }
  if (errno != 0) return ErrnoStatus(errno, "cannot read", dir.path_of(heads));
  for (const std::string& name : half_made) unlinkat(hfd, name.c_str(), 0);
  Status status;
  for (const std::string& name : watches) {
    UniqueFd fd(openat(hfd, name.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.valid()) {
      if (errno == ENXIO) {
        unlinkat(hfd, name.c_str(), 0);  // no reader: its watcher died
      } else if (errno != ENOENT && status.ok()) {
        status = ErrnoStatus(errno, "cannot wake the head watch", dir.path_of(heads + "/" + name));
      }
      continue;
    }
    struct stat st {};
    if (fstat(fd.get(), &st) != 0 || !S_ISFIFO(st.st_mode)) continue;
    [[maybe_unused]] ssize_t n = write(fd.get(), "x", 1);  // EAGAIN: full, so woken already
  }
  return status;
}

// The position of `qdir`'s head watches: the largest token recorded by
// NoteHeadChange, made (at the counter's value `counter`) where missing or
// never written. The caller holds the counter's exclusive lock.
Result<std::uint64_t> HeadPosition(const StoreDir& dir, const std::string& qdir, std::uint64_t counter) {
  const std::string path = HeadsDirPath(qdir) + "/" + std::string(kPositionFile);
  UniqueFd fd(openat(dir.root.get(), path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return ErrnoStatus(errno, "cannot open", dir.path_of(path));
  auto position = ReadNumberFile(fd.get(), dir.path_of(path));
  if (!position.ok()) return position.status();
  if (*position != 0) return *position;
  if (auto s = WriteNumberFile(fd.get(), counter, dir.path_of(path)); !s.ok()) return s;
  return counter;
}

// Makes a head watch's FIFO, .heads/QDIR/NONCE, open read-write (a writer
// never blocks and it never reports POLLHUP; a byte is its only event). The
// caller holds the counter's exclusive lock, under which NoteHeadChange
// runs: it never sees the FIFO before it is open and named, and takes a
// half-made one (of a watcher that died making it) for a dead watcher's.
Result<UniqueFd> MakeHeadWatchFifo(const StoreDir& dir, const std::string& qdir, const std::string& nonce) {
  const std::string heads = HeadsDirPath(qdir);
  for (const std::string& made : {std::string(kHeadsDir), heads}) {
    if (mkdirat(dir.root.get(), made.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, "cannot create", dir.path_of(made));
    }
  }
  const std::string temp = heads + "/" + std::string(kTempPrefix) + nonce;
  const std::string path = heads + "/" + nonce;
  if (mkfifoat(dir.root.get(), temp.c_str(), 0600) != 0) return ErrnoStatus(errno, "cannot create", dir.path_of(temp));
  UniqueFd fd(openat(dir.root.get(), temp.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid() || renameat(dir.root.get(), temp.c_str(), dir.root.get(), path.c_str()) != 0) {
    Status status = ErrnoStatus(errno, "cannot create", dir.path_of(path));
    unlinkat(dir.root.get(), temp.c_str(), 0);
    return status;
  }
  return fd;
}

struct TempEntry {
  std::string nonce;
  UniqueFd file;  // locked
};

// Creates QDIR/.tmp.NONCE and locks it. The file keeps the queue directory
// from being removed under the append.
Result<TempEntry> CreateLockedTemp(const StoreDir& dir, const std::string& qdir) {
  for (int attempt = 0; attempt < kMaxAppendAttempts; ++attempt) {
    const std::string nonce = RandomHex(file_store::kNonceLength / 2);
    if (mkdirat(dir.root.get(), qdir.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, "cannot create queue directory", dir.path_of(qdir));
    }
    std::string temp = qdir + "/" + std::string(kTempPrefix) + nonce;
    UniqueFd fd(openat(dir.root.get(), temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd.valid()) {
      if (errno == ENOENT || errno == EEXIST) continue;  // directory just removed as empty
      return ErrnoStatus(errno, "cannot create", dir.path_of(temp));
    }
    if (RetryOnEintr([&] { return flock(fd.get(), LOCK_EX); }) != 0) {
      int err = errno;
      unlinkat(dir.root.get(), temp.c_str(), 0);
      return ErrnoStatus(err, "cannot lock", dir.path_of(temp));
    }
    // A lister that opened the file before we locked it took it for a dead
    // append and deleted it: start over.
    struct stat st {};
    if (fstat(fd.get(), &st) != 0 || st.st_nlink == 0) continue;
    return TempEntry{nonce, std::move(fd)};
  }
  return UnavailableError("cannot create an entry in " + dir.path_of(qdir) + ": the directory keeps vanishing");
}

Status WriteAll(int fd, std::string_view data, const std::string& shown_path) {
  while (!data.empty()) {
    ssize_t n = RetryOnEintr([&] { return write(fd, data.data(), data.size()); });
    if (n < 0) return ErrnoStatus(errno, "cannot write", shown_path);
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return OkStatus();
}

Status CheckQueueName(std::string_view queue) {
  if (auto s = ValidateLockName(queue); !s.ok()) return InvalidArgumentError("queue: " + s.message());
  return OkStatus();
}

Result<EntryName> ParseId(std::string_view id) {
  auto parsed = ParseEntryName(id);
  if (!parsed) return InvalidArgumentError("'" + std::string(id) + "' is not an entry id of the file store");
  return std::move(*parsed);
}

class FileSession final : public Session {
 public:
  FileSession(std::shared_ptr<StoreDir> dir, std::string id) : dir_(std::move(dir)), id_(std::move(id)) {}
  ~FileSession() override { close(); }

  std::string id() const override { return id_; }
  SessionState state() const noexcept override { return state_.load(); }

  std::shared_ptr<void> subscribe(std::function<void(SessionState)> fn) override {
    return subscribers_.add(std::move(fn));
  }

  Result<Appended> append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline) override
      DLOCK_EXCLUDES(mu_) {
    // Every step is local and short; only the counter's lock can take long
    // (see LockCounter), and it is tried at least once whatever the deadline.
    if (auto s = CheckQueueName(queue); !s.ok()) return s;
    if (!IsValidKind(spec.kind)) {
      return InvalidArgumentError("entry kind '" + spec.kind + "' must be 1-64 of [A-Za-z0-9_-]");
    }
    if (!IsValidAttemptId(spec.attempt_id)) {
      return InvalidArgumentError("attempt id '" + spec.attempt_id + "' must be 0-64 of [A-Za-z0-9_-]");
    }
    if (spec.sequence && *spec.sequence < 0) return InvalidArgumentError("entry sequence must not be negative");
    if (auto s = CheckEntryValue(spec.value); !s.ok()) return s;
    if (closed()) return closed_error();

    const StoreDir& dir = *dir_;
    std::string qdir = QueueDirName(queue);
    auto temp = CreateLockedTemp(dir, qdir);
    if (!temp.ok()) return temp.status();
    std::string temp_path = qdir + "/" + std::string(kTempPrefix) + temp->nonce;
    std::string wake_path = WakePath(temp->nonce);
    // Until the rename, a failure deletes what was made (the temporary last:
    // it keeps the queue directory in place).
    auto abandon = [&](Status status) -> Status {
      unlinkat(dir.root.get(), wake_path.c_str(), 0);
      unlinkat(dir.root.get(), temp_path.c_str(), 0);
      RemoveQueueDirIfEmpty(dir, qdir);
      return status;
    };

    const OwnerRecord& owner = spec.owner;
    if (auto s = WriteAll(temp->file.get(), EncodeEntryContent(owner, spec.value, 1), dir.path_of(temp_path));
        !s.ok()) {
      return abandon(s);
    }
    if (mkfifoat(dir.root.get(), wake_path.c_str(), 0600) != 0) {
      return abandon(ErrnoStatus(errno, "cannot create", dir.path_of(wake_path)));
    }
    // Read-write: opening never blocks, and the FIFO always has a writer (for
    // POLLHUP when it goes) and a reader (so that a remover can write).
    UniqueFd wake(openat(dir.root.get(), wake_path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW));
    if (!wake.valid()) return abandon(ErrnoStatus(errno, "cannot open", dir.path_of(wake_path)));
    // The FIFO is locked too, for waiters: see "Waking" at the top.
    if (RetryOnEintr([&] { return flock(wake.get(), LOCK_EX); }) != 0) {
      return abandon(ErrnoStatus(errno, "cannot lock", dir.path_of(wake_path)));
    }

    auto counter = LockCounter(dir, LOCK_EX, deadline);
    if (!counter.ok()) return abandon(counter.status());
    auto token = NextToken(dir, counter->get());
    if (!token.ok()) return abandon(token.status());

    auto owned = std::make_unique<OwnedEntry>();
    owned->queue = std::string(queue);
    owned->qdir = qdir;
    owned->nonce = temp->nonce;
    owned->entry.kind = spec.kind;
    owned->entry.sequence = spec.sequence.value_or(static_cast<std::int64_t>(*token));
    owned->entry.token = *token;
    owned->entry.attempt_id = spec.attempt_id;
    owned->entry.owner = owner;
    owned->entry.value = spec.value;
    owned->entry.value_version = 1;
    owned->entry.id = FormatEntryName({owned->entry.sequence, *token, spec.kind, spec.attempt_id, temp->nonce});
    owned->file = std::move(temp->file);
    owned->wake = std::move(wake);
    std::string entry_path = qdir + "/" + owned->entry.id;
    if (renameat(dir.root.get(), temp_path.c_str(), dir.root.get(), entry_path.c_str()) != 0) {
      return abandon(ErrnoStatus(errno, "cannot create", dir.path_of(entry_path)));
    }

    Appended out;
    out.entry = owned->entry;
    {
      MutexLock lock(mu_);
      if (closed_) {
        lock.unlock();
        ReleaseEntry(dir, *owned);
        return closed_error();
      }
      std::string id = owned->entry.id;
      entries_.emplace(std::move(id), std::move(owned));
    }
    // Still under the counter lock: the queue as it is right after the append.
    // If reading it fails, the append stands; the caller can list again.
    auto queue_now = ReadQueue(dir, qdir, {.options = {}, .held = out.entry.id, .head_only = false});
    // A new head (or perhaps one: the reading failed) for head watches. If
    // they cannot all be told (out of descriptors), the append is undone
    // while nobody can have read it (the counter's lock is still held).
    if (!queue_now.ok() || (!queue_now->empty() && queue_now->front().id == out.entry.id)) {
      if (Status told = NoteHeadChange(dir, qdir, *token); !told.ok()) {
        std::unique_ptr<OwnedEntry> undone;
        {
          MutexLock lock(mu_);
          auto it = entries_.find(out.entry.id);
          if (it != entries_.end()) {
            undone = std::move(it->second);
            entries_.erase(it);
          }
        }
        if (undone) ReleaseEntry(dir, *undone);
        return told;
      }
    }
    if (queue_now.ok()) out.queue = std::move(*queue_now);
    return out;
  }

  Result<std::vector<Entry>> list(std::string_view queue, const ListOptions& options,
                                  Clock::time_point deadline) override {
    if (auto s = CheckQueueName(queue); !s.ok()) return s;
    if (closed()) return closed_error();
    auto counter = LockCounter(*dir_, LOCK_SH, deadline);
    if (!counter.ok()) return counter.status();
    return ReadQueue(*dir_, QueueDirName(queue), {.options = options, .held = {}, .head_only = false});
  }

  // With the real clock, on the calling thread (wait_here); a hand-moved
  // clock needs the asynchronous wait and its on_advance.
  Status wait_any_gone(std::string_view queue, std::span<const std::string> ids, Clock::time_point deadline,
                       std::stop_token stop) override {
    if (dir_->real_clock) return wait_here(queue, ids, deadline, stop);
    return AwaitAsyncWait(*dir_->clock, queue, deadline, std::move(stop), [&](std::function<void(Status)> done) {
      return async_wait_any_gone(queue, ids, std::move(done));
    });
  }

  // Arms the entries' FIFOs and hands them to the store's FifoWatcher; an
  // outcome known at once (gone already, an error) is delivered here.
  std::shared_ptr<void> async_wait_any_gone(std::string_view queue, std::span<const std::string> ids,
                                            std::function<void(Status)> done) override {
    auto outcome = std::make_shared<OneOutcome>(std::move(done));
    std::uint64_t key = 0;
    if (Status s = start_wait(queue, ids, outcome, key); key == 0) outcome->complete(std::move(s));
    return std::shared_ptr<void>(nullptr, [watcher = dir_->watcher, key, outcome](void*) {
      if (key != 0) watcher->remove(key);
      outcome->cancel();
    });
  }

  Status remove(std::string_view queue, std::string_view id, Clock::time_point) override DLOCK_EXCLUDES(mu_) {
    if (auto s = CheckQueueName(queue); !s.ok()) return s;
    auto name = ParseId(id);
    if (!name.ok()) return name.status();
    std::unique_ptr<OwnedEntry> mine;
    {
      MutexLock lock(mu_);
      if (closed_) return closed_error();
      auto it = entries_.find(std::string(id));
      if (it != entries_.end() && it->second->queue == queue) {
        mine = std::move(it->second);
        entries_.erase(it);
      }
    }
    const StoreDir& dir = *dir_;
    if (mine) {
      ReleaseEntry(dir, *mine);
      return OkStatus();
    }
    // Someone else's entry (`dlock break`, or a dead process's).
    std::string qdir = QueueDirName(queue);
    auto qdir_fd = OpenQueueDir(dir, qdir);
    if (!qdir_fd.ok()) return qdir_fd.status();
    if (!qdir_fd->valid()) return OkStatus();
    std::string entry(id);
    std::string shown = dir.path_of(qdir + "/" + entry);
    UniqueFd fd(openat(qdir_fd->get(), entry.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!fd.valid()) {
      if (errno == ENOENT) return OkStatus();
      return ErrnoStatus(errno, "cannot open", shown);
    }
    bool owner_dead = flock(fd.get(), LOCK_SH | LOCK_NB) == 0;
    if (unlinkat(qdir_fd->get(), entry.c_str(), 0) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, "cannot delete", shown);
    }
    PokeWaiters(dir, name->nonce);
    // A live owner deletes its FIFO when it lets go of the entry.
    if (owner_dead) unlinkat(dir.root.get(), WakePath(name->nonce).c_str(), 0);
    RemoveQueueDirIfEmpty(dir, qdir);
    return OkStatus();
  }

  Result<std::optional<Entry>> find_own(std::string_view queue, std::string_view attempt_id, Clock::time_point) override
      DLOCK_EXCLUDES(mu_) {
    if (auto s = CheckQueueName(queue); !s.ok()) return s;
    MutexLock lock(mu_);
    if (closed_) return closed_error();
    for (const auto& [id, owned] : entries_) {
      if (owned->queue != queue || owned->entry.attempt_id != attempt_id) continue;
      // An operator may have deleted it: then it is not ours any more.
      struct stat st {};
      if (fstat(owned->file.get(), &st) != 0 || st.st_nlink == 0) continue;
      return std::optional<Entry>(owned->entry);
    }
    return std::optional<Entry>();
  }

  bool waits_on_calling_thread() const noexcept override { return dir_->real_clock; }

  bool keeps_values() const noexcept override { return true; }

  // Rewrites the entry file in place (under the counter's exclusive lock, so
  // no reading sees it half written): a rename would lose the owner's flock.
  Result<Entry> update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                             Clock::time_point deadline) override DLOCK_EXCLUDES(mu_) {
    if (auto s = CheckQueueName(queue); !s.ok()) return s;
    if (auto s = CheckEntryValue(update.value); !s.ok()) return s;
    if (closed()) return closed_error();
    const StoreDir& dir = *dir_;
    auto counter = LockCounter(dir, LOCK_EX, deadline);
    if (!counter.ok()) return counter.status();
    // Held throughout: remove() and close() cannot close the file meanwhile.
    MutexLock lock(mu_);
    if (closed_) return closed_error();
    auto it = entries_.find(std::string(id));
    struct stat st {};
    if (it == entries_.end() || it->second->queue != queue || fstat(it->second->file.get(), &st) != 0 ||
        st.st_nlink == 0) {  // not ours, or deleted under us (`dlock break`)
      return FailedPreconditionError("no entry " + std::string(id) + " of session " + id_ + " in " +
                                     std::string(queue));
    }
    OwnedEntry& owned = *it->second;
    Entry changed = owned.entry;
    if (update.owner) changed.owner = *update.owner;
    if (update.value) {
      changed.value = *update.value;
      ++changed.value_version;
    }
    const std::string shown = dir.path_of(owned.qdir + "/" + owned.entry.id);
    if (auto s = RewriteEntryFile(owned.file.get(), changed, shown); !s.ok()) {
      static_cast<void>(RewriteEntryFile(owned.file.get(), owned.entry, shown));  // fits: it did before
      return s;
    }
    if (update.value) {
      // A new value of the head, for head watches; undone if they cannot
      // all be told (nobody can have read it: the counter's lock is held).
      auto head = ReadQueue(dir, owned.qdir, {.options = {}, .held = owned.entry.id, .head_only = true});
      Status told = head.status();
      if (!head.ok() || (!head->empty() && head->front().id == owned.entry.id)) {
        if (told.ok()) told = NoteHeadChange(dir, owned.qdir, std::nullopt);
        if (!told.ok()) {
          static_cast<void>(RewriteEntryFile(owned.file.get(), owned.entry, shown));
          return told;
        }
      }
    }
    owned.entry = changed;
    return changed;
  }

  void async_read_head(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                       std::function<void(Result<Head>)> done) override {
    done(read_head(queue, options, deadline));
  }

  // Arms the watch's own FIFO and the head entry's, then checks the queue
  // against `seen` (see "head watches" above); the store's FifoWatcher waits.
  std::shared_ptr<void> async_watch_head(std::string_view queue, const Head& seen,
                                         std::function<void(Status)> done) override {
    const std::string nonce = RandomHex(file_store::kNonceLength / 2);
    // The FIFO goes with the watch's outcome, whoever delivers it.
    auto outcome = std::make_shared<OneOutcome>([weak_dir = std::weak_ptr<StoreDir>(dir_),
                                                 fifo = HeadsDirPath(QueueDirName(queue)) + "/" + nonce,
                                                 done = std::move(done)](Status s) {
      // Weak: a pending watch must not keep the store (and its thread) alive.
      if (auto dir = weak_dir.lock()) unlinkat(dir->root.get(), fifo.c_str(), 0);
      done(std::move(s));
    });
    std::uint64_t key = 0;
    if (Status s = start_head_watch(queue, seen, nonce, outcome, key); key == 0) outcome->complete(std::move(s));
    return std::shared_ptr<void>(nullptr, [watcher = dir_->watcher, key, outcome](void*) {
      if (key != 0) watcher->remove(key);
      outcome->cancel();
    });
  }

  // Tells the subscribers, so never under mu_.
  void close() noexcept override DLOCK_EXCLUDES(mu_) {
    std::map<std::string, std::unique_ptr<OwnedEntry>> doomed;
    {
      MutexLock lock(mu_);
      if (closed_) return;  // also when a subscriber closes again from inside the call below
      closed_ = true;
      state_ = SessionState::kClosed;
      doomed.swap(entries_);
    }
    // Holders first, entries second: nobody may see an entry gone before its
    // holder has been told (store.hpp). No lock is held while they hear it.
    subscribers_.notify(SessionState::kClosed);
    // Waits in wait_here() (closing_ is never reset once made). Not from a
    // child forked without exec closing its copy: the eventfd is one for
    // both processes, and the parent's session lives on. (Its entries are
    // shared too: such a close removes them, as it always did; README.)
    if (!forked_copy()) {
      if (const EventSignal* closing = closing_signal()) closing->signal();
    }
    for (auto& [id, owned] : doomed) ReleaseEntry(*dir_, *owned);
    dir_->watcher->end_session(id_, "session " + id_ + " of " + dir_->path + " was closed while waiting");
  }

 private:
  // Opens every entry's wake FIFO into `fifos`. false: one is missing, so
  // its entry is gone.
  Result<bool> arm(const std::vector<EntryName>& names, std::vector<UniqueFd>& fifos) const {
    for (const EntryName& name : names) {
      std::string wake_path = WakePath(name.nonce);
      UniqueFd fd(openat(dir_->root.get(), wake_path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW));
      if (!fd.valid()) {
        if (errno == ENOENT) return false;
        return ErrnoStatus(errno, "cannot open", dir_->path_of(wake_path));
      }
      fifos.push_back(std::move(fd));
    }
    return true;
  }

  // Whether one of the entries is gone already: its file, or its owner.
  Result<bool> any_gone_now(const std::string& qdir, std::span<const std::string> ids,
                            const std::vector<EntryName>& names, const std::vector<UniqueFd>& fifos) const
      DLOCK_EXCLUDES(mu_) {
    // This session's own entries (a hold watching its own) need no probe:
    // we hold their locks, so one lives while its name still leads to the
    // file we hold (an entry renamed away or deleted, even beside a second
    // hard link, does not); a breaker unlinks one, then writes into its
    // FIFO (remove()), and `fifos` are armed already, so a later break
    // wakes the wait.
    std::vector<std::size_t> others;
    {
      MutexLock lock(mu_);
      for (std::size_t i = 0; i < ids.size(); ++i) {
        auto it = entries_.find(ids[i]);
        if (it == entries_.end() || it->second->qdir != qdir) {
          others.push_back(i);
          continue;
        }
        struct stat held {};
        struct stat named {};
        if (fstat(it->second->file.get(), &held) != 0) {
          return ErrnoStatus(errno, "cannot test", dir_->path_of(qdir + "/" + ids[i]));
        }
        const std::string path = qdir + "/" + ids[i];
        if (fstatat(dir_->root.get(), path.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0) {
          if (errno == ENOENT) return true;
          return ErrnoStatus(errno, "cannot test", dir_->path_of(path));
        }
        if (named.st_dev != held.st_dev || named.st_ino != held.st_ino) return true;
      }
    }
    if (others.empty()) return false;
    const StoreDir& dir = *dir_;
    auto qdir_fd = OpenQueueDir(dir, qdir);
    if (!qdir_fd.ok()) return qdir_fd.status();
    if (!qdir_fd->valid()) return true;
    for (std::size_t i : others) {
      auto probe = ProbeFile(dir, qdir_fd->get(), ids[i], names[i].nonce, dir.path_of(qdir + "/" + ids[i]));
      if (!probe.ok()) return probe.status();
      if (probe->liveness == Liveness::kGone) return true;
      // The FIFO's own lock: free means its owner is gone (see "Waking").
      if (flock(fifos[i].get(), LOCK_SH | LOCK_NB) == 0) return true;
      if (errno != EWOULDBLOCK) {
        return ErrnoStatus(errno, "cannot test the lock of", dir.path_of(WakePath(names[i].nonce)));
      }
    }
    return false;
  }

  // The first half of every wait: arms the entries' FIFOs into `fifos`,
  // then tests, so that an entry that goes after its FIFO is open wakes the
  // wait, and one that went before shows in the test. OK with `fifos` empty:
  // one is gone already; an error: the wait's outcome.
  Status arm_wait(std::string_view queue, std::span<const std::string> ids, std::vector<UniqueFd>& fifos) const
      DLOCK_EXCLUDES(mu_) {
    if (auto s = CheckQueueName(queue); !s.ok()) return s;
    if (ids.empty()) return InvalidArgumentError("wait_any_gone needs at least one entry id");
    std::vector<EntryName> names;
    for (const std::string& id : ids) {
      auto parsed = ParseId(id);
      if (!parsed.ok()) return parsed.status();
      names.push_back(std::move(*parsed));
    }
    if (closed()) return closed_error();
    auto armed = arm(names, fifos);  // EMFILE/ENFILE: kUnavailable, never a wait without its FIFOs
    if (!armed.ok() || !*armed) {    // an error, or one is gone already
      fifos.clear();
      return armed.status();
    }
    auto gone = any_gone_now(QueueDirName(queue), ids, names, fifos);
    if (!gone.ok() || *gone) fifos.clear();
    return gone.status();
  }

  // Registers a wait with the store's FifoWatcher (`key` set), or returns
  // its outcome if it has one at once (`key` stays 0).
  Status start_wait(std::string_view queue, std::span<const std::string> ids,
                    const std::shared_ptr<OneOutcome>& outcome, std::uint64_t& key) DLOCK_EXCLUDES(mu_) {
    std::vector<UniqueFd> fifos;
    if (Status s = arm_wait(queue, ids, fifos); !s.ok() || fifos.empty()) return s;
    // Under mu_, so that close() (which sets closed_ first) ends this wait
    // if it comes after.
    MutexLock lock(mu_);
    if (closed_) return closed_error();
    auto added = dir_->watcher->add(id_, std::move(fifos), outcome);
    if (!added.ok()) return added.status();
    key = *added;
    return OkStatus();
  }

  // The blocking wait on the calling thread, without the FifoWatcher: poll(2)
  // on the entries' FIFOs (POLLHUP: the owner let go or died; POLLIN: a
  // remover's byte), on the session's closing signal, and on a signal of
  // its own for `stop` (only if a stop can be requested). The deadline is
  // poll's timeout: real clock only.
  Status wait_here(std::string_view queue, std::span<const std::string> ids, Clock::time_point deadline,
                   const std::stop_token& stop) DLOCK_EXCLUDES(mu_) {
    // As the FifoWatcher says: closing_ would be the parent's.
    if (forked_copy()) return UnavailableError("this file store was opened before fork(); open it again in the child");
    std::vector<UniqueFd> fifos;
    if (Status s = arm_wait(queue, ids, fifos); !s.ok() || fifos.empty()) return s;
    std::vector<pollfd> polled;
    polled.reserve(fifos.size() + 2);
    for (const UniqueFd& fd : fifos) polled.push_back({fd.get(), POLLIN, 0});
    {
      // Made under mu_, so that a close() after this line signals it.
      MutexLock lock(mu_);
      if (closed_) return closed_error();
      if (!closing_) {
        auto made = EventSignal::create();
        if (!made.ok()) return made.status();
        closing_.emplace(std::move(*made));
      }
      polled.push_back({closing_->fd(), POLLIN, 0});
    }
    std::optional<EventSignal> stopping;
    std::optional<std::stop_callback<std::function<void()>>> on_stop;
    if (stop.stop_possible()) {
      auto made = EventSignal::create();
      if (!made.ok()) return made.status();
      stopping.emplace(std::move(*made));
      polled.push_back({stopping->fd(), POLLIN, 0});
      on_stop.emplace(stop, [&stopping] { stopping->signal(); });  // at once if requested already
    }
    const std::size_t closing_at = fifos.size();
    for (;;) {
      int timeout_ms = -1;
      if (deadline != kNoDeadline) {
        const Clock::duration left = deadline - dir_->clock->now();
        if (left <= Clock::duration::zero()) break;
        // Rounded up: a wake-up just before the deadline would only poll again.
        const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
        timeout_ms = static_cast<int>(std::min<std::int64_t>(ms, std::numeric_limits<int>::max()));
      }
      const int n = poll(polled.data(), polled.size(), timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        return UnavailableError("waiting in queue " + std::string(queue) + " (poll): " + ErrnoText(errno));
      }
      if (polled[closing_at].revents != 0) return closed_error();
      for (std::size_t i = 0; i < closing_at; ++i) {
        if (polled[i].revents != 0) return OkStatus();
      }
      if (stopping && polled.back().revents != 0) {
        return CancelledError("waiting in queue " + std::string(queue) + " was cancelled");
      }
    }
    return DeadlineExceededError("deadline passed waiting for an entry of queue " + std::string(queue) + " to go");
  }

  const EventSignal* closing_signal() const DLOCK_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return closing_ ? &*closing_ : nullptr;
  }

  // One reading of the queue's head; its position is the counter's value
  // (read under the same shared lock, so every later append has a larger
  // token).
  Result<Head> read_head(std::string_view queue, const ListOptions& options, Clock::time_point deadline) {
    if (auto s = CheckQueueName(queue); !s.ok()) return s;
    if (closed()) return closed_error();
    auto counter = LockCounter(*dir_, LOCK_SH, deadline);
    if (!counter.ok()) return counter.status();
    auto position = ReadNumberFile(counter->get(), dir_->path_of(kCounterFile));
    if (!position.ok()) return position.status();
    ListOptions with_values = options;
    with_values.with_values = true;
    auto read = ReadQueue(*dir_, QueueDirName(queue), {.options = with_values, .held = {}, .head_only = true});
    if (!read.ok()) return read.status();
    Head head;
    if (!read->empty()) head.entry = std::move(read->front());
    head.position = static_cast<std::int64_t>(*position);
    return head;
  }

  // Whether the head of `qdir` may differ from `seen`, with `fifos` armed
  // (the watch's, then the head entry's if `seen` has one). The caller holds
  // the counter's exclusive lock (`counter_fd`).
  Result<bool> head_changed_since(const std::string& qdir, const Head& seen, int counter_fd,
                                  const std::vector<UniqueFd>& fifos) const {
    const StoreDir& dir = *dir_;
    auto counter = ReadNumberFile(counter_fd, dir.path_of(kCounterFile));
    if (!counter.ok()) return counter.status();
    auto position = HeadPosition(dir, qdir, *counter);
    if (!position.ok()) return position.status();
    // A head was appended after the reading (perhaps gone again by now).
    if (*position > static_cast<std::uint64_t>(std::max<std::int64_t>(seen.position, 0))) return true;
    auto now =
        ReadQueue(dir, qdir, {.options = {.with_owners = false, .with_values = true}, .held = {}, .head_only = true});
    if (!now.ok()) return now.status();
    if (now->empty() != !seen.entry.has_value()) return true;
    if (now->empty()) return false;
    if (now->front().id != seen.entry->id || now->front().value_version != seen.entry->value_version) return true;
    // The head's FIFO lock: free means its owner is gone (see "Waking").
    if (flock(fifos.back().get(), LOCK_SH | LOCK_NB) == 0) return true;
    if (errno != EWOULDBLOCK) return ErrnoStatus(errno, "cannot test the FIFO lock of", seen.entry->id);
    return false;
  }

  // Registers a head watch (`key` set), or returns its outcome if it has one
  // at once (`key` stays 0): arm first, then check, as start_wait does.
  Status start_head_watch(std::string_view queue, const Head& seen, const std::string& nonce,
                          const std::shared_ptr<OneOutcome>& outcome, std::uint64_t& key) DLOCK_EXCLUDES(mu_) {
    if (auto s = CheckQueueName(queue); !s.ok()) return s;
    std::optional<EntryName> head_name;
    if (seen.entry) {
      auto parsed = ParseId(seen.entry->id);
      if (!parsed.ok()) return parsed.status();
      head_name = std::move(*parsed);
    }
    if (closed()) return closed_error();
    const std::string qdir = QueueDirName(queue);
    // Under the counter's exclusive lock, as every NoteHeadChange: none can
    // come between arming and checking, or see a half-made FIFO.
    auto counter = LockCounter(*dir_, LOCK_EX, dir_->clock->now() + kCounterWaitLimit);
    if (!counter.ok()) return counter.status();
    std::vector<UniqueFd> fifos;
    auto own = MakeHeadWatchFifo(*dir_, qdir, nonce);
    if (!own.ok()) return own.status();
    fifos.push_back(std::move(*own));
    if (head_name) {
      auto armed = arm({*head_name}, fifos);
      if (!armed.ok() || !*armed) return armed.status();  // an error, or the head is gone already
    }
    auto changed = head_changed_since(qdir, seen, counter->get(), fifos);
    if (!changed.ok() || *changed) return changed.status();
    counter->reset();
    MutexLock lock(mu_);  // as in start_wait: close() after this ends the watch
    if (closed_) return closed_error();
    auto added = dir_->watcher->add(id_, std::move(fifos), outcome);
    if (!added.ok()) return added.status();
    key = *added;
    return OkStatus();
  }

  bool closed() const DLOCK_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return closed_;
  }
  Status closed_error() const { return SessionLostError("session " + id_ + " of " + dir_->path + " is closed"); }

  // Whether this is a copy of the session in a child forked without exec.
  bool forked_copy() const noexcept { return getpid() != opened_by_; }

  const std::shared_ptr<StoreDir> dir_;
  const std::string id_;
  const pid_t opened_by_ = getpid();
  // Atomic: read without mu_ by state(); written under mu_ by close().
  std::atomic<SessionState> state_{SessionState::kConnected};
  ListenerList<SessionState> subscribers_;  // locks itself
  mutable Mutex mu_;
  bool closed_ DLOCK_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<OwnedEntry>> entries_ DLOCK_GUARDED_BY(mu_);  // by id
  // Signalled by close() for waits in wait_here(); made by the first of
  // them, kept until the session goes (a wait may poll it after close()).
  std::optional<EventSignal> closing_ DLOCK_GUARDED_BY(mu_);
};

class FileStore final : public Store {
 public:
  explicit FileStore(std::shared_ptr<StoreDir> dir) : dir_(std::move(dir)) {}

  std::string url() const override { return "file://" + EscapeUrlPath(dir_->path); }

  Result<std::shared_ptr<Session>> open_session(Clock::time_point) override {
    std::string id = "pid " + std::to_string(getpid()) + " #" + std::to_string(++dir_->sessions_opened);
    return std::shared_ptr<Session>(std::make_shared<FileSession>(dir_, std::move(id)));
  }

 private:
  std::shared_ptr<StoreDir> dir_;
};

// mkdir -p, new directories with mode 0700.
Status MakeDirectories(const std::string& path) {
  for (std::size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    std::string prefix = path.substr(0, slash);
    if (mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, "cannot create store directory", prefix);
    }
    if (slash == std::string::npos) return OkStatus();
  }
}

}  // namespace

// /tmp/dlock-<uid>, chosen from the uid alone: every process of a user must
// find the same directory, whatever its environment. Not $XDG_RUNTIME_DIR or
// /run/user/<uid>: a cron job or a service has neither the variable nor
// (when the user is not logged in) the directory, and logind deletes
// /run/user/<uid> at logout, under holders still running. Not $TMPDIR either.
// /run/lock is a 5 MiB tmpfs on Debian: too small for many entries.
std::string DefaultFileStoreDirectory() { return "/tmp/dlock-" + std::to_string(geteuid()); }

// Opens (creating if need be) the default directory. It is in a shared
// place, so it must be a real directory of ours: not a symlink someone
// planted, not another user's.
Result<UniqueFd> OpenPrivateDirectory(const std::string& path) {
  if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "cannot create store directory", path);
  }
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ELOOP || errno == ENOTDIR) {
      return PermissionDeniedError("default store directory " + path +
                                   " is a symlink or not a directory; remove it, or give file:///some/dir");
    }
    return ErrnoStatus(errno, "cannot open store directory", path);
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "cannot stat store directory", path);
  if (st.st_uid != geteuid()) {
    return PermissionDeniedError("default store directory " + path + " belongs to uid " + std::to_string(st.st_uid) +
                                 ", not to this user (uid " + std::to_string(geteuid()) + "); give file:///some/dir");
  }
  if ((st.st_mode & 077) != 0 && fchmod(fd.get(), 0700) != 0) {
    return ErrnoStatus(errno, "cannot make private", path);
  }
  return fd;
}

namespace {

Result<UniqueFd> OpenGivenDirectory(const std::string& path) {
  if (auto s = MakeDirectories(path); !s.ok()) return s;
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOTDIR) return InvalidArgumentError("store path " + path + " is not a directory");
    return ErrnoStatus(errno, "cannot open store directory", path);
  }
  return fd;
}

// Network file systems emulate flock with POSIX record locks (lost when the
// owner closes any fd of the file, which listing its own queue does), and
// their FIFOs reach no other host anyway.
Status CheckLocalFileSystem(const StoreDir& dir) {
  struct statfs fs {};
  if (fstatfs(dir.root.get(), &fs) != 0) return ErrnoStatus(errno, "cannot stat the file system of", dir.path);
  constexpr std::uint32_t kNfs = 0x6969, kSmb = 0x517b, kCifs = 0xff534d42, kSmb2 = 0xfe534d42, kCeph = 0x00c36400;
  auto type = static_cast<std::uint32_t>(fs.f_type);  // magic numbers are 32-bit
  if (type == kNfs || type == kSmb || type == kCifs || type == kSmb2 || type == kCeph) {
    return InvalidArgumentError("store directory " + dir.path +
                                " is on a network file system; the file:// store needs a local one (e.g. "
                                "under /run or /tmp)");
  }
  return OkStatus();
}

// Creates the counter file and the FIFO directory if missing; this is also
// where an unwritable store directory shows.
Status InitializeDirectory(const StoreDir& dir) {
  if (auto s = CheckLocalFileSystem(dir); !s.ok()) return s;
  // While any process has the store open, systemd-tmpfiles' age-based clean
  // up of /tmp skips the whole directory: it leaves alone directories
  // locked with flock (systemd.io/TEMPORARY_DIRECTORIES). An entry held for
  // longer than the age limit would otherwise be deleted under its holder.
  // Best effort: the lock is shared, and nothing else locks the directory.
  static_cast<void>(flock(dir.root.get(), LOCK_SH | LOCK_NB));
  UniqueFd counter(
      openat(dir.root.get(), std::string(kCounterFile).c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!counter.valid()) {
    if (errno == EACCES || errno == EROFS || errno == EPERM) {
      return PermissionDeniedError("store directory " + dir.path + " is not writable: " + ErrnoText(errno));
    }
    return ErrnoStatus(errno, "cannot open", dir.path_of(kCounterFile));
  }
  struct stat st {};
  if (fstat(counter.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return InvalidArgumentError(dir.path_of(kCounterFile) + " is not a regular file; is " + dir.path +
                                " a dlock store directory?");
  }
  std::string wake_dir(kWakeDir);
  if (mkdirat(dir.root.get(), wake_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "cannot create", dir.path_of(kWakeDir));
  }
  UniqueFd wake(openat(dir.root.get(), wake_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!wake.valid()) return ErrnoStatus(errno, "cannot open", dir.path_of(kWakeDir));
  return OkStatus();
}

}  // namespace

Result<std::shared_ptr<Store>> OpenFileStore(const ParsedUrl& url, const StoreOptions& options) {
  if (!url.hosts.empty()) {
    return InvalidArgumentError("file:// URL names host '" + url.hosts.front().host +
                                "', but the file store is host-local: use file:///absolute/dir (three slashes) "
                                "or file:// for the default directory");
  }
  if (url.user) return InvalidArgumentError("file:// URL must not name a user");
  if (auto s = CheckQueryKeys(url, {}); !s.ok()) return s;

  auto dir = std::make_shared<StoreDir>();
  dir->clock = options.clock ? options.clock : Clock::system();
  dir->real_clock = IsSystemClock(*dir->clock);
  bool use_default = url.path.empty();
  dir->path = use_default ? DefaultFileStoreDirectory() : url.path;
  while (dir->path.size() > 1 && dir->path.back() == '/') dir->path.pop_back();
  auto root = use_default ? OpenPrivateDirectory(dir->path) : OpenGivenDirectory(dir->path);
  if (!root.ok()) return root.status();
  dir->root = std::move(*root);
  if (auto s = InitializeDirectory(*dir); !s.ok()) return s;
  return std::shared_ptr<Store>(std::make_shared<FileStore>(std::move(dir)));
}

}  // namespace dlock::internal
