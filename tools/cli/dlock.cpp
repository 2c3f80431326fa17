// dlock: run a command under a distributed lock, see who holds what, break a
// stuck lock. A thin layer over the public library: everything it knows
// about stores and recipes comes from <dlock/dlock.hpp>.
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/event_signal.hpp"  // header-only descriptor owners
#include "core/unique_fd.hpp"
#include "dlock/dlock.hpp"

extern char** environ;

namespace {

// Exit statuses of dlock itself (a command's own status passes through).
enum Exit : int {
  kUsage = 2,
  kTimedOut = 3,
  kLockLost = 4,
  kStoreFailed = 5,
  kCannotStart = 6,
};

// The one source of the texts that --help, the man page (dlock --man, run
// at build time into dlock.1) and the bash completion (dlock
// --bash-completion) show, besides the options that CLI11 knows.
struct Doc {
  const char* term;
  const char* text;
};

constexpr Doc kExitStatuses[] = {
    {"0",
     "run, elect: the command exited 0; status: shown; leader: there is a leader (--watch: stopped by "
     "a signal); break: removed"},
    {"1", "leader: no leader; break: nothing to remove (or the command's own status 1)"},
    {"2", "usage error: a bad option, name, duration or URL; break: several holders, name the ENTRY"},
    {"3", "run, elect: timed out waiting for the lock or leadership (--timeout)"},
    {"4",
     "run, elect: the lock or leadership was lost while the command ran (it was sent SIGTERM, then SIGKILL "
     "after --kill-after), or before it could start"},
    {"5", "the store is unreachable (it never answered before the deadline) or refused the request"},
    {"6", "run, elect: the command could not be started"},
    {"128+N",
     "run, elect: the command was killed by signal N; or dlock got signal N while still waiting (nothing is "
     "left in the store)"},
};
constexpr const char* kExitIntro = "run and elect exit with the command's own status; otherwise:";

constexpr Doc kEnvironment[] = {
    {"DLOCK_URL", "the store, when --url is not given; else file://, the directory /tmp/dlock-UID"},
    {"DLOCK_ZK_LOG", "1: print the ZooKeeper C client's log on stderr (zk:// stores)"},
    {"COLUMNS",
     "the width that status fits its table into (default: the terminal's; no limit when not a "
     "terminal)"},
};
constexpr Doc kRunEnvironment[] = {
    {"DLOCK_NAME", "the lock name"},
    {"DLOCK_URL", "the store URL, password removed"},
    {"DLOCK_FENCING_TOKEN", "the hold's fencing token: pass it to resources that refuse stale holders"},
};
constexpr Doc kElectEnvironment[] = {
    {"DLOCK_NAME", "the election's name"},
    {"DLOCK_URL", "the store URL, password removed"},
    {"DLOCK_TERM",
     "the leader's term: it grows with every new leader; pass it to resources that refuse a "
     "deposed leader"},
    {"DLOCK_FENCING_TOKEN", "the same number, for scripts written for dlock run"},
};
constexpr Doc kStatusColumns[] = {
    {"ROLE", "holder (has the lock, a shared hold or a permit) or waiter; holders first, each in queue order"},
    {"KIND",
     "lock (a mutex: dlock run, dlock::Mutex), read or write (the sides of a read-write lock: dlock run "
     "--shared takes read), lease (a semaphore permit: dlock run --permits), foreign (another client's "
     "entry of an unknown kind)"},
    {"TOKEN", "the entry's fencing token (- if the store does not list it)"},
    {"ENTRY",
     "the entry's id in the store; a long id is shortened in the middle (...) to fit the terminal: "
     "--wide or --json print it whole, and break takes it either way"},
    {"QUEUE",
     "main: the queue of NAME itself (mutexes, read-write locks); leases: a semaphore's permits held "
     "(NAME/leases); locks: a semaphore's waiting acquirers (NAME/locks)"},
    {"HOST", "the host of the process that made the entry (- for another client's entry)"},
    {"PID", "that process's id"},
    {"SINCE", "how long ago the entry was made, by the wall clock of that host"},
};
constexpr const char* kDurationForms = "a number and a unit: 250ms, 10s, 2m, 1h (also us)";

std::string Indented(const Doc* begin, const Doc* end, std::size_t width) {
  std::string out;
  for (const Doc* d = begin; d != end; ++d) {
    std::string term = d->term;
    out += "  " + term + std::string(term.size() < width ? width - term.size() : 1, ' ') + d->text + "\n";
  }
  return out;
}
template <std::size_t N>
std::string Indented(const Doc (&docs)[N], std::size_t width) {
  return Indented(docs, docs + N, width);
}

std::string ExitHelp() { return std::string("Exit status: ") + kExitIntro + "\n" + Indented(kExitStatuses, 8); }

// Says why and returns `code`: for the paths that still own a Client, which
// must be destroyed (its threads joined) before the process exits.
int Report(int code, const std::string& message) {
  std::fprintf(stderr, "dlock: %s\n", message.c_str());
  return code;
}

[[noreturn]] void Die(int code, const std::string& message) {
  std::fprintf(stderr, "dlock: %s\n", message.c_str());
  std::exit(code);
}

int ExitFor(const dlock::Status& s) {
  switch (s.code()) {
    case dlock::ErrorCode::kInvalidArgument: return kUsage;
    default: return kStoreFailed;
  }
}

// `dlock elect`'s default value: this host and dlock's pid.
std::string DefaultCandidateValue() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  return std::string(host) + ":" + std::to_string(::getpid());
}

std::string DefaultUrl() {
  const char* env = std::getenv("DLOCK_URL");
  return env && *env ? env : "file://";
}

dlock::Client ConnectOrDie(const std::string& url) {
  auto client = dlock::Client::open(url);
  if (!client.ok()) Die(ExitFor(client.status()), client.status().to_string() + " (store " + url + ")");
  return std::move(client).value();
}

std::chrono::milliseconds DurationOrDie(const std::string& text, const char* what) {
  auto d = dlock::ParseDuration(text);
  if (!d.ok()) Die(kUsage, std::string(what) + ": " + d.status().message());
  return *d;
}

// A duration as a person writes it, in its largest exact unit: "10s", "2m",
// "1500ms".
std::string FormatDuration(std::chrono::milliseconds d) {
  const auto ms = d.count();
  if (ms != 0 && ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms != 0 && ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
  if (ms != 0 && ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

std::string HumanDuration(std::int64_t ms) {
  if (ms < 0) return "?";
  if (ms < 10'000) return std::to_string(ms) + "ms";
  if (ms < 600'000) return std::to_string(ms / 1000) + "s";
  if (ms < 36'000'000) return std::to_string(ms / 60'000) + "m";
  return std::to_string(ms / 3'600'000) + "h";
}

std::int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Describe(const dlock::EntryInfo& e) {
  std::string who;
  if (e.entry.owner) {
    who = e.entry.owner->host + " pid " + std::to_string(e.entry.owner->pid);
    if (e.entry.owner->acquired_unix_ms > 0) {
      who += ", for " + HumanDuration(NowUnixMs() - e.entry.owner->acquired_unix_ms);
    }
  } else {
    who = "another client";
  }
  return who;
}

// ------------------------------------------------------------------- run

struct RunOptions {
  std::string url;
  std::string name;
  std::string timeout;
  std::string kill_after = "5s";
  unsigned permits = 0;
  bool shared = false;
  std::vector<std::string> command;
  // dlock elect: campaign with `value` instead of taking a lock.
  bool elect = false;
  std::string value;
};

// What `run` and `elect` hold while the command runs: a Hold or a
// Leadership, which have the same states (dlock/election.hpp).
class Grant {
 public:
  template <class Held>
  explicit Grant(Held held) : held_(std::make_shared<Model<Held>>(std::move(held))) {}
  dlock::HoldState state() const { return held_->state(); }
  std::uint64_t token() const { return held_->token(); }
  std::shared_ptr<void> on_state_change(std::function<void(dlock::HoldState)> fn) const {
    return held_->on_state_change(std::move(fn));
  }
  void release() const { held_->release(); }

 private:
  struct Concept {
    virtual ~Concept() = default;
    virtual dlock::HoldState state() const = 0;
    virtual std::uint64_t token() const = 0;
    virtual std::shared_ptr<void> on_state_change(std::function<void(dlock::HoldState)> fn) const = 0;
    virtual void release() = 0;
  };
  template <class Held>
  struct Model final : Concept {
    explicit Model(Held h) : held(std::move(h)) {}
    dlock::HoldState state() const override { return held.state(); }
    std::uint64_t token() const override { return held.fencing_token(); }
    std::shared_ptr<void> on_state_change(std::function<void(dlock::HoldState)> fn) const override {
      return held.on_state_change(std::move(fn));
    }
    void release() override { release_held(held); }
    static void release_held(dlock::Hold& h) { h.release(); }
    static void release_held(dlock::Leadership& l) { l.resign(); }
    Held held;
  };
  std::shared_ptr<Concept> held_;
};

// One line on a terminal, rewritten in place.
class StatusLine {
 public:
  explicit StatusLine(bool enabled) : enabled_(enabled) {}
  void show(const std::string& text) {
    if (!enabled_) return;
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    std::fflush(stderr);
    shown_ = true;
  }
  void clear() {
    if (enabled_ && shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }
  // How often to redraw; -1 (never) when there is no terminal.
  int refresh_ms() const { return enabled_ ? 500 : -1; }

 private:
  bool enabled_;
  bool shown_ = false;
};

std::string CampaigningText(const dlock::Client& client, const RunOptions& o) {
  dlock::Election election(client, o.name);
  auto all = election.participants();
  std::string text = "dlock: campaigning for " + o.name;
  if (!all.ok() || all->empty()) return text;
  std::size_t ahead = 0;
  for (const auto& p : *all) {
    if (p.owner && p.owner->pid == ::getpid()) break;
    ++ahead;
  }
  if (ahead < all->size()) text += ", " + std::to_string(ahead) + " ahead";
  const dlock::LeaderInfo& leader = all->front();
  text +=
      "; leader: " + (leader.value.empty() ? std::string("-") : leader.value) + " (term " + std::to_string(leader.term);
  if (leader.owner) text += ", " + leader.owner->host + " pid " + std::to_string(leader.owner->pid);
  return text + ")";
}

std::string WaitingText(const dlock::Client& client, const RunOptions& o) {
  if (o.elect) return CampaigningText(client, o);
  auto entries = dlock::Inspect(client, o.name);
  if (!entries.ok()) return "dlock: waiting for " + o.name;
  const dlock::EntryInfo* holder = nullptr;
  std::size_t ahead = 0;
  bool found_me = false;
  for (const auto& e : *entries) {
    if (e.holds && !holder) holder = &e;
    bool mine = e.entry.owner && e.entry.owner->pid == ::getpid();
    if (mine && (e.queue == o.name || e.queue == o.name + "/locks")) found_me = true;
    if (!found_me && !e.holds && (e.queue == o.name || e.queue == o.name + "/locks")) ++ahead;
  }
  std::string text = "dlock: waiting for " + o.name;
  if (found_me) text += ", " + std::to_string(ahead) + " ahead";
  if (holder) text += "; held by " + Describe(*holder);
  return text;
}

// The command line of `dlock run`, checked, with its durations parsed.
struct RunPlan {
  RunOptions options;
  std::optional<std::chrono::milliseconds> timeout;  // none: wait forever
  std::chrono::milliseconds kill_after;
};

RunPlan PlanOrDie(const RunOptions& o) {
  if (o.command.empty()) {
    Die(kUsage, o.elect ? "elect: no command given (dlock elect NAME -- COMMAND [ARG...])"
                        : "run: no command given (dlock run NAME -- COMMAND [ARG...])");
  }
  if (o.shared && o.permits) Die(kUsage, "run: --shared and --permits cannot be combined");
  if (auto s = dlock::ValidateLockName(o.name); !s.ok()) Die(kUsage, s.message());
  RunPlan plan{o, std::nullopt, DurationOrDie(o.kill_after, "--kill-after")};
  if (!o.timeout.empty()) plan.timeout = DurationOrDie(o.timeout, "--timeout");
  return plan;
}

// Writes an eventfd from any thread (a dlock callback, the acquirer).
void Signal(const dlock::internal::EventSignal& event) { event.signal(); }

// `dlock run`: waits for the lock while it watches for stop signals, runs the
// command under it, forwards signals to it, and stops it if the lock is lost.
//
// Signals are read from a signalfd. They are blocked before the client starts
// any thread, so that every thread (dlock's included) inherits the mask; the
// command gets the original mask back.
class LockedCommand {
 public:
  explicit LockedCommand(RunPlan plan) : plan_(std::move(plan)), name_(plan_.options.name) {
    sigemptyset(&handled_);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&handled_, sig);
    pthread_sigmask(SIG_BLOCK, &handled_, &original_);
    signals_.reset(signalfd(-1, &handled_, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!signals_.valid()) Die(kStoreFailed, std::string("signalfd: ") + std::strerror(errno));
  }

  int run() {
    dlock::Client client = ConnectOrDie(plan_.options.url);
    if (auto stopped = wait_for_lock(client)) return *stopped;
    return run_command(client);
  }

 private:
  // 1. Waits for the lock on a helper thread while this one watches signals;
  //    nullopt with the lock held, or the exit status without it.
  std::optional<int> wait_for_lock(dlock::Client& client) {
    auto made = dlock::internal::EventSignal::create();
    if (!made.ok()) return Report(kStoreFailed, made.status().to_string());
    const dlock::internal::EventSignal acquired = std::move(*made);
    std::stop_source cancel;
    std::optional<dlock::Status> failure;
    std::jthread acquirer([&] {
      try {
        hold_ = acquire(client, cancel.get_token());
      } catch (const dlock::Error& e) {
        failure = e.status();
      }
      Signal(acquired);
    });
    StatusLine line(::isatty(STDERR_FILENO));
    while (true) {
      pollfd fds[2] = {{signals_.get(), POLLIN, 0}, {acquired.fd(), POLLIN, 0}};
      if (::poll(fds, 2, line.refresh_ms()) < 0 && errno != EINTR) break;
      if (fds[0].revents && read_stop_signals()) cancel.request_stop();  // before the grant: a stop wins
      if (fds[1].revents) break;
      if (!fds[0].revents) line.show(WaitingText(client, plan_.options));
    }
    acquirer.join();
    line.clear();
    read_stop_signals();  // any that came while the acquirer finished
    if (failure) return Report(ExitFor(*failure), failure->to_string());
    if (hold_ && !cancelled_by_) return std::nullopt;
    if (hold_) hold_->release();  // told to stop: never start the command
    if (cancelled_by_) return stopped("while waiting for " + name_);
    return without_lock(client);
  }

  std::optional<Grant> acquire(dlock::Client& client, std::stop_token stop) const {
    const RunOptions& o = plan_.options;
    const auto timeout = plan_.timeout ? dlock::ToTimeout(*plan_.timeout) : dlock::kForever;
    if (o.elect) return granted(dlock::Election(client, o.name).campaign(o.value, timeout, std::move(stop)));
    if (o.permits) return granted(dlock::Semaphore(client, o.name, o.permits).acquire(1, timeout, std::move(stop)));
    if (o.shared) return granted(dlock::ReadWriteLock(client, o.name).acquire_read(timeout, std::move(stop)));
    return granted(dlock::Mutex(client, o.name).acquire(timeout, std::move(stop)));
  }
  template <class Held>
  static std::optional<Grant> granted(std::optional<Held> held) {
    if (!held) return std::nullopt;
    return Grant(std::move(*held));
  }

  // "the lock NAME" or "the leadership of NAME", for messages.
  std::string what() const { return (plan_.options.elect ? "the leadership of " : "the lock ") + name_; }

  // Reads every queued signal; true if one of them is the first stop signal.
  bool read_stop_signals() {
    bool first_stop = false;
    signalfd_siginfo info{};
    while (::read(signals_.get(), &info, sizeof info) == sizeof info) {
      if (info.ssi_signo != SIGCHLD && !cancelled_by_) {
        cancelled_by_ = static_cast<int>(info.ssi_signo);
        first_stop = true;
      }
    }
    return first_stop;
  }

  // The exit status after a stop signal, as a shell reports a signal.
  int stopped(const std::string& when) const {
    std::fprintf(stderr, "dlock: stopped by signal %d %s\n", cancelled_by_, when.c_str());
    return 128 + cancelled_by_;
  }

  // No lock by the deadline: a store that never answered is not a lock held
  // by someone else (no session could be opened before the deadline; Redis
  // fails this way at connect already).
  int without_lock(const dlock::Client& client) const {
    if (client.session_state() == dlock::SessionState::kClosed) {
      const std::string within = plan_.timeout ? " within " + FormatDuration(*plan_.timeout) : "";
      return Report(kStoreFailed,
                    "store unreachable: " + client.url() + " did not answer" + within + " (nothing was acquired)");
    }
    const std::string after = plan_.timeout ? " after " + FormatDuration(*plan_.timeout) : "";
    return Report(kTimedOut, "timed out" + after + " waiting for " + (plan_.options.elect ? what() : name_));
  }

  // The last moment to decide not to start: told to stop, or the lock is no
  // longer certainly ours (the process may have been paused since the grant
  // while another holder got it: starting now would run two commands).
  // nullopt to go on, or the exit status.
  std::optional<int> refuse_to_start_unless_held() {
    read_stop_signals();
    if (cancelled_by_) {
      hold_->release();
      return stopped("before starting the command");
    }
    if (hold_->state() != dlock::HoldState::kHeld) {
      hold_->release();
      return Report(kLockLost, what() + " was lost before the command could start (its store session ended)");
    }
    return std::nullopt;
  }

  // 2. Runs the command with the lock's environment until it exits; stops it
  //    if the lock is lost.
  int run_command(const dlock::Client& client) {
    auto made = dlock::internal::EventSignal::create();
    if (!made.ok()) {  // out of descriptors: no way to stop the command if the lock goes
      hold_->release();
      return Report(kStoreFailed, made.status().to_string());
    }
    auto lost = std::make_shared<dlock::internal::EventSignal>(std::move(*made));
    auto subscription = hold_->on_state_change([lost](dlock::HoldState s) {
      if (s == dlock::HoldState::kLost) Signal(*lost);
    });
    if (hold_->state() == dlock::HoldState::kLost) Signal(*lost);  // lost before we listened
    if (auto stopped = refuse_to_start_unless_held()) return *stopped;
    int error = 0;
    const pid_t child = spawn(client, error);
    if (child < 0) {
      hold_->release();
      return Report(kCannotStart, "cannot run '" + plan_.options.command[0] + "': " + std::strerror(error));
    }
    const bool was_lost = supervise(child, *lost);
    subscription.reset();
    hold_->release();
    if (was_lost) return kLockLost;
    if (WIFEXITED(child_status_)) return WEXITSTATUS(child_status_);
    if (WIFSIGNALED(child_status_)) return 128 + WTERMSIG(child_status_);
    return 1;
  }

  // The environment with DLOCK_NAME, DLOCK_URL and DLOCK_FENCING_TOKEN of
  // this hold, and DLOCK_TERM for elect (replacing inherited ones).
  std::vector<std::string> environment(const dlock::Client& client) const {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string var(*e);
      bool ours = var.rfind("DLOCK_NAME=", 0) == 0 || var.rfind("DLOCK_URL=", 0) == 0 ||
                  var.rfind("DLOCK_FENCING_TOKEN=", 0) == 0 || var.rfind("DLOCK_TERM=", 0) == 0;
      if (!ours) env.push_back(std::move(var));
    }
    env.push_back("DLOCK_NAME=" + name_);
    env.push_back("DLOCK_URL=" + client.url());
    env.push_back("DLOCK_FENCING_TOKEN=" + std::to_string(hold_->token()));
    if (plan_.options.elect) env.push_back("DLOCK_TERM=" + std::to_string(hold_->token()));
    return env;
  }

  // The child's pid, or -1 with posix_spawnp's error number in `error`.
  pid_t spawn(const dlock::Client& client, int& error) {
    std::vector<std::string> env = environment(client);
    std::vector<std::string> args = plan_.options.command;
    auto pointers = [](std::vector<std::string>& strings) {
      std::vector<char*> out;
      for (auto& text : strings) out.push_back(text.data());
      out.push_back(nullptr);
      return out;
    };
    std::vector<char*> envp = pointers(env);
    std::vector<char*> argv = pointers(args);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, &original_);
    posix_spawnattr_setsigdefault(&attr, &handled_);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t child = 0;
    int rc = posix_spawnp(&child, argv[0], nullptr, &attr, argv.data(), envp.data());
    posix_spawnattr_destroy(&attr);
    error = rc;
    return rc == 0 ? child : -1;
  }

  // Until the child exits: forwards signals to it; when the lock is lost,
  // sends it SIGTERM, and SIGKILL after --kill-after. True if it was lost.
  bool supervise(pid_t child, const dlock::internal::EventSignal& lost) {
    dlock::internal::UniqueFd kill_timer(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
    bool was_lost = false;
    while (true) {
      pollfd fds[3] = {{signals_.get(), POLLIN, 0}, {lost.fd(), POLLIN, 0}, {kill_timer.get(), POLLIN, 0}};
      if (::poll(fds, 3, -1) < 0 && errno != EINTR) return was_lost;
      if (fds[0].revents && forward_signals(child)) return was_lost;
      if (fds[1].revents && !was_lost) {
        was_lost = true;
        lost.drain();
        std::fprintf(stderr,
                     "dlock: %s was lost (its store session ended, or its entry was removed); stopping the command\n",
                     what().c_str());
        ::kill(child, SIGTERM);
        arm_timer(kill_timer.get(), plan_.kill_after);
      }
      if (fds[2].revents) {
        std::uint64_t expirations;
        [[maybe_unused]] ssize_t n = ::read(kill_timer.get(), &expirations, sizeof expirations);
        ::kill(child, SIGKILL);
      }
    }
  }

  // Passes every queued signal but SIGCHLD on to the child; true once the
  // child has exited (its status in child_status_).
  bool forward_signals(pid_t child) {
    bool exited = false;
    signalfd_siginfo info{};
    while (::read(signals_.get(), &info, sizeof info) == sizeof info) {
      if (info.ssi_signo == SIGCHLD) {
        exited = exited || ::waitpid(child, &child_status_, WNOHANG) == child;
      } else {
        ::kill(child, static_cast<int>(info.ssi_signo));
      }
    }
    return exited;
  }

  static void arm_timer(int timer, std::chrono::milliseconds after) {
    itimerspec when{};
    when.it_value.tv_sec = after.count() / 1000;
    when.it_value.tv_nsec = (after.count() % 1000) * 1'000'000 + 1;  // +1 ns: zero would disarm it
    timerfd_settime(timer, 0, &when, nullptr);
  }

  const RunPlan plan_;
  const std::string name_;
  sigset_t handled_;
  sigset_t original_;
  dlock::internal::UniqueFd signals_;
  std::optional<Grant> hold_;
  int cancelled_by_ = 0;  // the first stop signal
  int child_status_ = 0;
};

int Run(const RunOptions& o) { return LockedCommand(PlanOrDie(o)).run(); }

// ---------------------------------------------------------------- status

nlohmann::json EntryJson(const dlock::EntryInfo& e) {
  nlohmann::json j = {{"entry", e.entry.id},
                      {"queue", e.queue},
                      {"kind", e.entry.kind},
                      {"position", e.position},
                      {"role", e.holds ? "holder" : "waiter"}};
  j["token"] = e.entry.token ? nlohmann::json(*e.entry.token) : nlohmann::json(nullptr);
  if (e.entry.value) j["value"] = *e.entry.value;  // an election candidate's
  if (e.entry.owner) {
    j["host"] = e.entry.owner->host;
    j["pid"] = e.entry.owner->pid;
    j["thread"] = e.entry.owner->thread;
    if (!e.entry.owner->label.empty()) j["label"] = e.entry.owner->label;
    j["since_unix_ms"] = e.entry.owner->acquired_unix_ms;
  } else {
    j["host"] = nullptr;
    j["pid"] = nullptr;
    j["since_unix_ms"] = nullptr;
  }
  return j;
}

// The width to fit the table into: $COLUMNS, else the terminal's, else 0
// (no limit: a pipe or a file gets whole ids).
std::size_t OutputWidth() {
  if (const char* env = std::getenv("COLUMNS"); env && *env) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (*end == '\0' && v > 0) return static_cast<std::size_t>(v);
  }
  winsize ws{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 0;
}

// "head...tail" in at most `width` characters.
std::string ShortenMiddle(const std::string& s, std::size_t width) {
  if (s.size() <= width || width < 5) return s;
  const std::size_t keep = width - 3;
  return s.substr(0, (keep + 1) / 2) + "..." + s.substr(s.size() - keep / 2);
}

// The QUEUE column: which of the name's queues the entry is in.
std::string QueueLabel(const std::string& queue, const std::string& name) {
  return queue == name ? "main" : queue.substr(name.size() + 1);
}

enum StatusColumn { kRole, kKind, kToken, kEntry, kQueue, kHost, kPid, kSince, kColumns };
using StatusRow = std::array<std::string, kColumns>;

void PrintStatusJson(const dlock::Client& client, const std::string& name,
                     const std::vector<dlock::EntryInfo>& entries) {
  nlohmann::json out = {{"name", name},
                        {"url", client.url()},
                        {"holders", nlohmann::json::array()},
                        {"waiters", nlohmann::json::array()}};
  for (const auto& e : entries) out[e.holds ? "holders" : "waiters"].push_back(EntryJson(e));
  std::printf("%s\n", out.dump(2).c_str());
}

StatusRow StatusRowOf(const dlock::EntryInfo& e, const std::string& name) {
  const auto& owner = e.entry.owner;
  const bool since_known = owner && owner->acquired_unix_ms > 0;
  return {e.holds ? "holder" : "waiter",
          e.entry.kind,
          e.entry.token ? std::to_string(*e.entry.token) : "-",
          e.entry.id,
          QueueLabel(e.queue, name),
          owner ? owner->host : "-",
          owner ? std::to_string(owner->pid) : "-",
          since_known ? HumanDuration(NowUnixMs() - owner->acquired_unix_ms) + " ago" : "-"};
}

// Column widths that fit `limit` characters (0: no limit): the entry ids
// give way first (down to 20 characters), then host names (down to 8).
std::array<std::size_t, kColumns> FittedWidths(const std::vector<StatusRow>& rows, std::size_t limit) {
  std::array<std::size_t, kColumns> widths{};
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < kColumns; ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::size_t total = kColumns - 1;
  for (auto w : widths) total += w;
  for (auto [column, floor] : {std::pair<int, std::size_t>{kEntry, 20}, {kHost, 8}}) {
    if (limit == 0 || total <= limit || widths[column] <= floor) continue;
    const std::size_t cut = std::min(total - limit, widths[column] - floor);
    widths[column] -= cut;
    total -= cut;
  }
  return widths;
}

void PrintStatusTable(const std::string& name, const std::vector<dlock::EntryInfo>& entries, bool wide) {
  std::vector<StatusRow> rows;
  StatusRow header;
  for (std::size_t c = 0; c < kColumns; ++c) header[c] = kStatusColumns[c].term;
  rows.push_back(header);
  for (bool holders : {true, false}) {  // holders first, each group in queue order
    for (const auto& e : entries) {
      if (e.holds == holders) rows.push_back(StatusRowOf(e, name));
    }
  }
  const auto widths = FittedWidths(rows, wide ? 0 : OutputWidth());
  for (auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < kColumns; ++c) {
      std::string cell = ShortenMiddle(row[c], widths[c]);
      if (c + 1 < kColumns) cell.resize(std::max(cell.size(), widths[c]), ' ');
      line += (c ? " " : "") + cell;
    }
    std::printf("%s\n", line.c_str());
  }
}

int Status(const std::string& url, const std::string& name, bool json, bool wide) {
  if (auto s = dlock::ValidateLockName(name); !s.ok()) Die(kUsage, s.message());
  auto client = ConnectOrDie(url);
  auto entries = dlock::Inspect(client, name);
  if (!entries.ok()) return Report(ExitFor(entries.status()), entries.status().to_string());
  if (json) {
    PrintStatusJson(client, name, *entries);
  } else if (entries->empty()) {
    std::printf("%s: free (no holders, no waiters) on %s\n", name.c_str(), client.url().c_str());
  } else {
    PrintStatusTable(name, *entries, wide);
  }
  return 0;
}

// ---------------------------------------------------------------- leader

std::string Iso8601(std::int64_t unix_ms) {
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char out[32];
  std::strftime(out, sizeof out, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return out;
}

// "VALUE  term T  host H  pid P  since 2026-11-25T03:50:00Z (12m ago)".
std::string LeaderLine(const dlock::LeaderInfo& l) {
  std::string line = (l.value.empty() ? std::string("-") : l.value) + "  term " + std::to_string(l.term);
  line += "  host " + (l.owner ? l.owner->host : std::string("-"));
  line += "  pid " + (l.owner ? std::to_string(l.owner->pid) : std::string("-"));
  if (l.elected_unix_ms) {
    line += "  since " + Iso8601(*l.elected_unix_ms) + " (" + HumanDuration(NowUnixMs() - *l.elected_unix_ms) + " ago)";
  } else if (l.candidate_since_unix_ms) {
    line += "  candidate since " + Iso8601(*l.candidate_since_unix_ms) + " (" +
            HumanDuration(NowUnixMs() - *l.candidate_since_unix_ms) + " ago)";
  } else {
    line += "  since -";
  }
  return line;
}

nlohmann::json LeaderJson(const dlock::LeaderInfo& l) {
  auto optional = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  return {{"value", l.value},
          {"term", l.term},
          {"entry", l.entry},
          {"host", l.owner ? nlohmann::json(l.owner->host) : nlohmann::json(nullptr)},
          {"pid", l.owner ? nlohmann::json(l.owner->pid) : nlohmann::json(nullptr)},
          {"elected_unix_ms", optional(l.elected_unix_ms)},
          {"candidate_since_unix_ms", optional(l.candidate_since_unix_ms)}};
}

std::string ObservationLine(const dlock::Observation& o) {
  switch (o.state) {
    case dlock::LeaderState::kLeader: return LeaderLine(*o.leader);
    case dlock::LeaderState::kNoLeader: return "no leader";
    case dlock::LeaderState::kUnknown: break;
  }
  std::string line = "unknown (contact with the store lost";
  if (o.leader) line += "; last leader " + o.leader->value + " term " + std::to_string(o.leader->term);
  return line + ")";
}

nlohmann::json ObservationJson(const std::string& name, const std::string& url, const dlock::Observation& o) {
  return {{"name", name},
          {"url", url},
          {"state", std::string(dlock::LeaderStateName(o.state))},
          {"leader", o.leader ? LeaderJson(*o.leader) : nlohmann::json(nullptr)}};
}

// `dlock leader --watch`: one line (or JSON object) per report until INT,
// TERM or HUP. The signals are blocked before the client starts a thread,
// and taken with sigwait.
int WatchLeader(const dlock::Client& client, const std::string& name, bool json, const sigset_t& stop) {
  dlock::Election election(client, name);
  std::shared_ptr<void> observing;
  try {
    // By value: a report already running when the handle goes may finish
    // after this function has returned (a review finding).
    observing = election.observe([json, name, url = client.url()](const dlock::Observation& o) {
      if (json) {
        nlohmann::json j = ObservationJson(name, url, o);
        j["number"] = o.number;
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%s\n", ObservationLine(o).c_str());
      }
      std::fflush(stdout);
    });
  } catch (const dlock::Error& e) {
    return Report(ExitFor(e.status()), e.status().to_string());
  }
  int sig = 0;
  sigwait(&stop, &sig);
  observing.reset();
  return 0;
}

int Leader(const std::string& url, const std::string& name, bool json, bool watch) {
  if (auto s = dlock::ValidateLockName(name); !s.ok()) Die(kUsage, s.message());
  sigset_t stop;
  sigemptyset(&stop);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, sig);
  if (watch) pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  auto client = ConnectOrDie(url);
  // One reading first: a store that cannot be read is exit 5, also with --watch.
  auto leader = dlock::Election(client, name).leader();
  if (!leader.ok()) return Report(ExitFor(leader.status()), leader.status().to_string());
  if (watch) return WatchLeader(client, name, json, stop);
  if (json) {
    dlock::Observation now;
    now.state = leader->has_value() ? dlock::LeaderState::kLeader : dlock::LeaderState::kNoLeader;
    now.leader = *leader;
    std::printf("%s\n", ObservationJson(name, client.url(), now).dump(2).c_str());
  } else if (leader->has_value()) {
    std::printf("%s\n", LeaderLine(**leader).c_str());
  } else {
    std::printf("%s: no leader on %s\n", name.c_str(), client.url().c_str());
  }
  return leader->has_value() ? 0 : 1;
}

// ----------------------------------------------------------------- break

int Break(const std::string& url, const std::string& name, const std::string& entry_id) {
  if (auto s = dlock::ValidateLockName(name); !s.ok()) Die(kUsage, s.message());
  auto client = ConnectOrDie(url);
  auto entries = dlock::Inspect(client, name);
  if (!entries.ok()) return Report(ExitFor(entries.status()), entries.status().to_string());
  // ENTRY as status shows it: the whole id, the id shortened in the middle
  // ("head...tail"), or a prefix of it; it must name one entry.
  std::vector<const dlock::EntryInfo*> targets;
  const auto dots = entry_id.find("...");
  for (const auto& e : *entries) {
    const std::string& id = e.entry.id;
    if (!entry_id.empty() && id == entry_id) {
      targets.assign(1, &e);
      break;
    }
    bool match = false;
    if (entry_id.empty()) {
      match = e.holds;
    } else if (dots != std::string::npos) {
      const std::string head = entry_id.substr(0, dots), tail = entry_id.substr(dots + 3);
      match = id.size() >= head.size() + tail.size() && id.starts_with(head) && id.ends_with(tail);
    } else {
      match = id.starts_with(entry_id);
    }
    if (match) targets.push_back(&e);
  }
  if (targets.empty()) {
    return Report(1, entry_id.empty() ? name + " has no holder" : "no entry " + entry_id + " in " + name);
  }
  if (targets.size() > 1 && !entry_id.empty()) {
    std::string ids;
    for (auto* t : targets) ids += "\n  " + t->entry.id;
    return Report(kUsage, "ENTRY " + entry_id + " matches " + std::to_string(targets.size()) + " entries of " + name +
                              "; give more of it:" + ids);
  }
  if (targets.size() > 1) {
    std::string ids;
    for (auto* t : targets) ids += "\n  " + t->entry.id + " (" + t->entry.kind + ", " + Describe(*t) + ")";
    return Report(kUsage, name + " has " + std::to_string(targets.size()) + " holders; name the entry to break:" + ids);
  }
  const auto& t = *targets.front();
  if (auto s = client.remove_entry(t.queue, t.entry.id); !s.ok()) return Report(ExitFor(s), s.to_string());
  std::printf("removed %s entry %s of %s (token %s, %s)\n", t.holds ? "holder" : "waiter", t.entry.id.c_str(),
              t.queue.c_str(), t.entry.token ? std::to_string(*t.entry.token).c_str() : "-", Describe(t).c_str());
  return 0;
}

// ------------------------------------------------ man page and completion

// roff text: backslashes, and a leading . or ' that would start a request.
std::string Roff(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\') {
      out += "\\e";
    } else if (c == '-') {
      out += "\\-";
    } else {
      if ((c == '.' || c == '\'') && (i == 0 || text[i - 1] == '\n')) out += "\\&";
      out += c;
    }
  }
  return out;
}

std::string OptionSynopsis(const CLI::Option* o) {
  std::string names;
  for (const auto& n : o->get_snames()) names += (names.empty() ? "-" : ", -") + n;
  for (const auto& n : o->get_lnames()) names += (names.empty() ? "--" : ", --") + n;
  if (o->get_positional()) names = o->get_name(true);
  return names;
}

// " DURATION" for --timeout: the value's name, as --help shows it.
std::string OptionValue(const CLI::Option* o) {
  if (o->get_positional() || o->get_expected_max() == 0) return "";
  std::string type = o->get_type_name();
  return " " + type.substr(0, type.find(':'));
}

// Options in --help order, the help flag last.
std::vector<const CLI::Option*> VisibleOptions(const CLI::App* app, bool positional) {
  std::vector<const CLI::Option*> out;
  for (const CLI::Option* o : app->get_options()) {
    if (o->get_group().empty() || o->get_positional() != positional) continue;
    out.push_back(o);
  }
  return out;
}

void PrintDocsRoff(const Doc* begin, const Doc* end) {
  for (const Doc* d = begin; d != end; ++d) {
    std::printf(".TP\n.B %s\n%s\n", Roff(d->term).c_str(), Roff(d->text).c_str());
  }
}
template <std::size_t N>
void PrintDocsRoff(const Doc (&docs)[N]) {
  PrintDocsRoff(docs, docs + N);
}

// dlock(1), from the same definitions as --help.
void PrintManPage(const CLI::App& app, const std::vector<CLI::App*>& commands, const char* app_text) {
  std::printf(".\\\" Generated by `dlock --man` at build time: edit tools/cli/dlock.cpp, not this file.\n");
  std::printf(".TH DLOCK 1 \"\" \"dlock %s\" \"User Commands\"\n", DLOCK_VERSION_STRING);
  std::printf(".SH NAME\ndlock \\- run commands under a distributed lock, show and break locks\n");
  std::printf(".SH SYNOPSIS\n");
  for (const CLI::App* c : commands) {
    std::printf(".B dlock %s\n", c->get_name().c_str());
    for (const CLI::Option* o : VisibleOptions(c, false)) {
      if (o->get_lnames() == std::vector<std::string>{"help"}) continue;
      std::printf("[\\fB%s\\fR%s]\n", Roff(OptionSynopsis(o)).c_str(), Roff(OptionValue(o)).c_str());
    }
    for (const CLI::Option* o : VisibleOptions(c, true)) {
      const std::string n = o->get_name(true);
      const std::string shown = n == "COMMAND" ? "\\-\\- COMMAND [ARG...]" : Roff(n);
      std::printf(o->get_required() ? "\\fI%s\\fR\n" : "[\\fI%s\\fR]\n", shown.c_str());
    }
    std::printf(".br\n");
  }
  std::printf(".B dlock\n\\fB\\-\\-version\\fR | \\fB\\-\\-help\\fR\n");
  std::printf(".SH DESCRIPTION\n%s\n", Roff(app_text).c_str());
  std::printf(".PP\nDurations are %s.\n", Roff(kDurationForms).c_str());
  std::printf(".SH COMMANDS\n");
  for (const CLI::App* c : commands) {
    std::printf(".SS \"dlock %s\"\n%s\n", c->get_name().c_str(), Roff(c->get_description()).c_str());
    for (const CLI::Option* o : VisibleOptions(c, true)) {
      std::printf(".TP\n.I %s\n%s\n", Roff(o->get_name(true)).c_str(), Roff(o->get_description()).c_str());
    }
    for (const CLI::Option* o : VisibleOptions(c, false)) {
      std::string text = o->get_description();
      if (!o->get_default_str().empty()) text += " (default: " + o->get_default_str() + ")";
      std::printf(".TP\n.BR \"%s\"%s\n%s\n", Roff(OptionSynopsis(o)).c_str(),
                  OptionValue(o).empty() ? "" : (" \" " + Roff(OptionValue(o).substr(1)) + "\"").c_str(),
                  Roff(text).c_str());
    }
    if (c->get_name() == "run") {
      std::printf(".PP\nThe command gets in its environment:\n");
      PrintDocsRoff(kRunEnvironment);
      std::printf(
          ".PP\nINT, TERM and HUP go to the command; while dlock still waits they cancel the wait, "
          "leaving nothing in the store.\n");
    }
    if (c->get_name() == "status") {
      std::printf(".PP\nThe columns of the table:\n");
      PrintDocsRoff(kStatusColumns);
    }
  }
  std::printf(".SH OPTIONS\n");
  for (const CLI::Option* o : VisibleOptions(&app, false)) {
    std::printf(".TP\n.B %s\n%s\n", Roff(OptionSynopsis(o)).c_str(), Roff(o->get_description()).c_str());
  }
  std::printf(".SH ENVIRONMENT\n");
  PrintDocsRoff(kEnvironment);
  std::printf(".SH EXIT STATUS\n%s\n", Roff(kExitIntro).c_str());
  PrintDocsRoff(kExitStatuses);
  std::printf(".SH EXAMPLES\n.nf\n%s\n.fi\n",
              Roff("dlock run cron/backup -- /usr/local/bin/backup\n"
                   "DLOCK_URL=zk://zk1:2181,zk2:2181/locks dlock run --timeout 10m deploy/prod -- ./deploy.sh\n"
                   "dlock run --permits 3 --url redis://cache:6379 slots/migrate -- ./migrate-one.sh\n"
                   "dlock status --json deploy/prod | jq '.holders[0].pid'")
                  .c_str());
  std::printf(
      ".SH FILES\n.TP\n.I /tmp/dlock\\-UID\nthe default store (file://): one directory per user, mode "
      "0700\n");
  std::printf(".SH SEE ALSO\nflock(1), timeout(1); /usr/share/doc/dlock/README.md\n");
}

// A bash completion for the subcommands and options --help lists.
void PrintBashCompletion(const CLI::App& app, const std::vector<CLI::App*>& commands) {
  std::string top, cases, takes_value, schemes;
  for (const CLI::Option* o : VisibleOptions(&app, false)) {
    for (const auto& n : o->get_lnames()) top += " --" + n;
  }
  for (const auto& scheme : dlock::SupportedSchemes()) schemes += (schemes.empty() ? "" : " ") + scheme + "://";
  for (const CLI::App* c : commands) {
    top += " " + c->get_name();
    std::string words;
    for (const CLI::Option* o : VisibleOptions(c, false)) {
      for (const auto& n : o->get_lnames()) {
        words += " --" + n;
        const std::string alt = "--" + n;
        const bool listed = ("|" + takes_value + "|").find("|" + alt + "|") != std::string::npos;
        if (o->get_expected_max() != 0 && n != "url" && !listed) {
          takes_value += (takes_value.empty() ? "" : "|") + alt;
        }
      }
      for (const auto& n : o->get_snames()) words += " -" + n;
    }
    cases += "    " + c->get_name() + ") COMPREPLY=($(compgen -W \"" + words.substr(1) + "\" -- \"$cur\")) ;;\n";
  }
  std::string names;
  for (const CLI::App* c : commands) names += (names.empty() ? "" : "|") + c->get_name();
  std::printf(
      "# bash completion for dlock. Generated by `dlock --bash-completion` at build time:\n"
      "# edit tools/cli/dlock.cpp, not this file.\n"
      "_dlock() {\n"
      "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} sub='' i\n"
      "  COMPREPLY=()\n"
      "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
      "    case ${COMP_WORDS[i]} in\n"
      "      --) [[ $sub == run ]] && COMPREPLY=($(compgen -c -- \"$cur\")); return 0 ;;\n"
      "      %s) [[ -z $sub ]] && sub=${COMP_WORDS[i]} ;;\n"
      "    esac\n"
      "  done\n"
      "  case $prev in\n"
      "    --url) COMPREPLY=($(compgen -W \"%s\" -- \"$cur\")); return 0 ;;\n"
      "    %s) return 0 ;;\n"
      "  esac\n"
      "  case $sub in\n"
      "    '') COMPREPLY=($(compgen -W \"%s\" -- \"$cur\")) ;;\n"
      "%s"
      "  esac\n"
      "  return 0\n"
      "}\n"
      "complete -F _dlock dlock\n",
      names.c_str(), schemes.c_str(), takes_value.c_str(), top.substr(1).c_str(), cases.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const char* app_text =
      "dlock runs a command while it holds a distributed lock (run) or leads an election (elect), shows the "
      "leader of an election (leader), shows who holds and who waits for a lock (status), and removes a "
      "wedged holder's entry (break). The store is --url, else $DLOCK_URL, "
      "else the embedded file:// store: a directory per user on this host.";
  CLI::App app{
      "dlock: distributed locks from the shell.\n"
      "The store is --url, else $DLOCK_URL, else the embedded file:// store.\n"
      "Durations are " +
      std::string(kDurationForms) + "."};
  const std::string exit_help = ExitHelp();
  app.footer("Environment:\n" + Indented(kEnvironment, 14) + "\n" + exit_help);
  app.require_subcommand(0, 1);
  bool version = false, man = false, completion = false;
  app.add_flag("--version", version, "print the version and the stores compiled in, and exit");
  // Build-time generators (hidden: no group).
  app.add_flag("--man", man, "print the man page dlock(1) in roff")->group("");
  app.add_flag("--bash-completion", completion, "print the bash completion script")->group("");
  std::string url = DefaultUrl();

  RunOptions run;
  auto* run_cmd = app.add_subcommand("run", "Wait for the lock NAME, run COMMAND while holding it, release it.");
  run_cmd->add_option("--url", url, "store URL (default: $DLOCK_URL, else file://)")->type_name("URL");
  run_cmd->add_option("--timeout", run.timeout, "give up waiting after this long (exit 3); 0s: one try")
      ->type_name("DURATION");
  run_cmd->add_option("--permits", run.permits, "take one of N permits of a semaphore instead of the mutex")
      ->check(CLI::Range(1u, 1'000'000u))
      ->type_name("N");
  run_cmd->add_flag("--shared", run.shared, "take a shared hold: shared holders run together, excluding plain runs");
  run_cmd->add_option("--kill-after", run.kill_after, "if the lock is lost: SIGKILL this long after SIGTERM")
      ->capture_default_str()
      ->type_name("DURATION");
  run_cmd->add_option("NAME", run.name, "lock name, e.g. cron/backup")->required();
  run_cmd->add_option("COMMAND", run.command, "the command and its arguments, after --")->required();
  run_cmd->footer("The command gets in its environment:\n" + Indented(kRunEnvironment, 21) +
                  "INT, TERM and HUP go to the command; while still waiting they cancel the wait.\n\n" + exit_help);

  RunOptions elect;
  elect.elect = true;
  auto* elect_cmd = app.add_subcommand(
      "elect", "Campaign to lead the election NAME, run COMMAND while leader, resign when it exits.");
  elect_cmd->add_option("--url", url, "store URL (default: $DLOCK_URL, else file://)")->type_name("URL");
  elect_cmd->add_option("--value", elect.value, "the value to publish while leader (default: HOST:PID)")
      ->type_name("V");
  elect_cmd->add_option("--timeout", elect.timeout, "give up campaigning after this long (exit 3); 0s: one try")
      ->type_name("DURATION");
  elect_cmd->add_option("--kill-after", elect.kill_after, "if leadership is lost: SIGKILL this long after SIGTERM")
      ->capture_default_str()
      ->type_name("DURATION");
  elect_cmd->add_option("NAME", elect.name, "election name, e.g. billing/scheduler")->required();
  elect_cmd->add_option("COMMAND", elect.command, "the command and its arguments, after --")->required();
  elect_cmd->footer("The command gets in its environment:\n" + Indented(kElectEnvironment, 21) +
                    "INT, TERM and HUP go to the command; while still campaigning they cancel the campaign.\n\n" +
                    exit_help);

  std::string leader_name;
  bool leader_json = false, leader_watch = false;
  auto* leader_cmd = app.add_subcommand("leader", "Show the leader of the election NAME (exit 1 if none).");
  leader_cmd->add_option("--url", url, "store URL (default: $DLOCK_URL, else file://)")->type_name("URL");
  leader_cmd->add_flag("--json", leader_json,
                       "one JSON object: {name, url, state: leader|none|unknown, leader: {value, term, entry, host, "
                       "pid, elected_unix_ms, candidate_since_unix_ms} or null}; one per line with --watch");
  leader_cmd->add_flag("--watch", leader_watch,
                       "print the current state, then every change, until INT, TERM or HUP (then exit 0)");
  leader_cmd->add_option("NAME", leader_name, "election name")->required();
  leader_cmd->footer(exit_help);

  std::string status_name;
  bool json = false, wide = false;
  auto* status_cmd = app.add_subcommand("status", "Show who holds and who waits for NAME, in queue order.");
  status_cmd->add_option("--url", url, "store URL (default: $DLOCK_URL, else file://)")->type_name("URL");
  status_cmd->add_flag("--json", json, "one JSON object: {name, url, holders: [...], waiters: [...]}, ids whole");
  status_cmd->add_flag("--wide", wide, "do not shorten entry ids or host names to fit the terminal");
  status_cmd->add_option("NAME", status_name, "lock name")->required();
  status_cmd->footer("Columns:\n" + Indented(kStatusColumns, 8) + "\n" + exit_help);

  std::string break_name, break_entry;
  auto* break_cmd =
      app.add_subcommand("break", "Remove the holder's entry of NAME (or the entry ENTRY): for a wedged holder.");
  break_cmd->add_option("--url", url, "store URL (default: $DLOCK_URL, else file://)")->type_name("URL");
  break_cmd->add_option("NAME", break_name, "lock name")->required();
  break_cmd->add_option("ENTRY", break_entry,
                        "the entry to remove, as status shows it (whole, shortened with ..., or a unique prefix)");
  break_cmd->footer(exit_help);
  const std::vector<CLI::App*> commands = {run_cmd, elect_cmd, leader_cmd, status_cmd, break_cmd};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kUsage;
  }
  if (version) {
    std::printf("%s\n", dlock::Version().c_str());
    return 0;
  }
  if (man) {
    PrintManPage(app, commands, app_text);
    return 0;
  }
  if (completion) {
    PrintBashCompletion(app, commands);
    return 0;
  }
  if (*run_cmd) {
    run.url = url;
    return Run(run);
  }
  if (*elect_cmd) {
    elect.url = url;
    if (elect.value.empty()) elect.value = DefaultCandidateValue();
    return Run(elect);
  }
  if (*leader_cmd) return Leader(url, leader_name, leader_json, leader_watch);
  if (*status_cmd) return Status(url, status_name, json, wide);
  if (*break_cmd) return Break(url, break_name, break_entry);
  std::fprintf(stderr, "%s\ndlock: a command is required (run, elect, leader, status or break)\n", app.help().c_str());
  return kUsage;
}
