// dlock: run a command under a distributed lock, see who holds what, break a
// stuck lock. A thin layer over the public library: everything it knows
// about stores and recipes comes from <dlock/dlock.hpp>.
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

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

constexpr const char* kExitHelp =
    "Exit status: the command's own status (128+N if it was killed by signal N), or\n"
    "  2  usage error\n"
    "  3  timed out waiting for the lock\n"
    "  4  the lock was lost while the command ran (it was sent SIGTERM, then SIGKILL)\n"
    "  5  the store is unreachable or refused the request\n"
    "  6  the command could not be started\n"
    "  128+N  dlock was stopped by signal N while still waiting (nothing is left in the store)";

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

std::string DefaultUrl() {
  const char* env = std::getenv("DLOCK_URL");
  return env && *env ? env : "file://";
}

dlock::Client ConnectOrDie(const std::string& url) {
  auto client = dlock::Client::open(url);
  if (!client.ok()) Die(ExitFor(client.status()), client.status().ToString() + " (store " + url + ")");
  return std::move(client).value();
}

std::chrono::milliseconds DurationOrDie(const std::string& text, const char* what) {
  auto d = dlock::ParseDuration(text);
  if (!d.ok()) Die(kUsage, std::string(what) + ": " + d.status().message());
  return *d;
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

std::string WaitingText(const dlock::Client& client, const RunOptions& o) {
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

int Run(const RunOptions& o) {
  if (o.command.empty()) Die(kUsage, "run: no command given (dlock run NAME -- COMMAND [ARG...])");
  if (o.shared && o.permits) Die(kUsage, "run: --shared and --permits cannot be combined");
  if (auto s = dlock::ValidateLockName(o.name); !s.ok()) Die(kUsage, s.message());
  const auto timeout = o.timeout.empty() ? dlock::kForever : dlock::ToTimeout(DurationOrDie(o.timeout, "--timeout"));
  const auto kill_after = DurationOrDie(o.kill_after, "--kill-after");

  // Signals are read from a signalfd; block them before any thread starts so
  // that every thread (dlock's included) inherits the mask.
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&handled, sig);
  sigset_t original;
  pthread_sigmask(SIG_BLOCK, &handled, &original);
  const int signals = signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signals < 0) Die(kStoreFailed, std::string("signalfd: ") + std::strerror(errno));

  auto client = ConnectOrDie(o.url);

  // 1. Wait for the lock on a helper thread; this one watches signals.
  const int acquired_fd = eventfd(0, EFD_CLOEXEC);
  std::stop_source cancel;
  std::optional<dlock::Hold> hold;
  std::optional<dlock::Status> failure;
  std::jthread acquirer([&] {
    try {
      if (o.permits) {
        dlock::Semaphore sem(client, o.name, o.permits);
        hold = sem.acquire(1, timeout, cancel.get_token());
      } else if (o.shared) {
        dlock::ReadWriteLock rw(client, o.name);
        hold = rw.acquire_read(timeout, cancel.get_token());
      } else {
        dlock::Mutex m(client, o.name);
        hold = m.acquire(timeout, cancel.get_token());
      }
    } catch (const dlock::Error& e) {
      failure = e.status();
    }
    std::uint64_t one = 1;
    if (::write(acquired_fd, &one, sizeof one) < 0) std::perror("dlock: eventfd");
  });
  StatusLine line(::isatty(STDERR_FILENO));
  int cancelled_by = 0;
  while (true) {
    pollfd fds[2] = {{signals, POLLIN, 0}, {acquired_fd, POLLIN, 0}};
    if (::poll(fds, 2, line.refresh_ms()) < 0 && errno != EINTR) break;
    if (fds[1].revents) break;
    if (fds[0].revents) {
      signalfd_siginfo info{};
      while (::read(signals, &info, sizeof info) == sizeof info) {
        if (info.ssi_signo != SIGCHLD && !cancelled_by) {
          cancelled_by = static_cast<int>(info.ssi_signo);
          cancel.request_stop();
        }
      }
      continue;
    }
    line.show(WaitingText(client, o));
  }
  acquirer.join();
  line.clear();
  if (failure) Die(ExitFor(*failure), failure->ToString());
  if (hold && cancelled_by) hold->release();  // told to stop: never start the command
  if (!hold || cancelled_by) {
    if (cancelled_by) {
      std::fprintf(stderr, "dlock: stopped by signal %d while waiting for %s\n", cancelled_by, o.name.c_str());
      return 128 + cancelled_by;
    }
    Die(kTimedOut, "timed out after " + o.timeout + " waiting for " + o.name);
  }

  // 2. Run the command; forward signals; stop it if the lock is lost.
  const int lost_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  auto subscription = hold->on_state_change([lost_fd](dlock::HoldState s) {
    if (s == dlock::HoldState::kLost) {
      std::uint64_t one = 1;
      if (::write(lost_fd, &one, sizeof one) < 0) {
      }
    }
  });
  if (hold->state() == dlock::HoldState::kLost) {
    std::uint64_t one = 1;
    if (::write(lost_fd, &one, sizeof one) < 0) std::perror("dlock: eventfd");
  }
  std::vector<std::string> env_storage;
  for (char** e = environ; *e; ++e) {
    std::string var(*e);
    if (var.rfind("DLOCK_NAME=", 0) == 0 || var.rfind("DLOCK_URL=", 0) == 0 ||
        var.rfind("DLOCK_FENCING_TOKEN=", 0) == 0) {
      continue;
    }
    env_storage.push_back(std::move(var));
  }
  env_storage.push_back("DLOCK_NAME=" + o.name);
  env_storage.push_back("DLOCK_URL=" + client.url());
  env_storage.push_back("DLOCK_FENCING_TOKEN=" + std::to_string(hold->fencing_token()));
  std::vector<char*> envp;
  for (auto& v : env_storage) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = o.command;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setsigmask(&attr, &original);
  posix_spawnattr_setsigdefault(&attr, &handled);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t child = 0;
  int rc = posix_spawnp(&child, argv[0], nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    hold->release();
    Die(kCannotStart, "cannot run '" + o.command[0] + "': " + std::strerror(rc));
  }

  const int kill_timer = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  bool lost = false;
  int child_status = 0;
  while (true) {
    pollfd fds[3] = {{signals, POLLIN, 0}, {lost_fd, POLLIN, 0}, {kill_timer, POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0 && errno != EINTR) break;
    if (fds[0].revents) {
      signalfd_siginfo info{};
      bool child_exited = false;
      while (::read(signals, &info, sizeof info) == sizeof info) {
        if (info.ssi_signo == SIGCHLD) {
          child_exited = ::waitpid(child, &child_status, WNOHANG) == child;
        } else {
          ::kill(child, static_cast<int>(info.ssi_signo));
        }
      }
      if (child_exited) break;
    }
    if (fds[1].revents && !lost) {
      lost = true;
      std::uint64_t n;
      if (::read(lost_fd, &n, sizeof n) < 0) {
      }
      std::fprintf(stderr, "dlock: the lock %s was lost (its store session ended); stopping the command\n",
                   o.name.c_str());
      ::kill(child, SIGTERM);
      itimerspec when{};
      when.it_value.tv_sec = kill_after.count() / 1000;
      when.it_value.tv_nsec = (kill_after.count() % 1000) * 1'000'000 + 1;
      timerfd_settime(kill_timer, 0, &when, nullptr);
    }
    if (fds[2].revents) {
      std::uint64_t n;
      if (::read(kill_timer, &n, sizeof n) < 0) {
      }
      ::kill(child, SIGKILL);
    }
  }
  subscription.reset();
  hold->release();
  if (lost) return kLockLost;
  if (WIFEXITED(child_status)) return WEXITSTATUS(child_status);
  if (WIFSIGNALED(child_status)) return 128 + WTERMSIG(child_status);
  return 1;
}

// ---------------------------------------------------------------- status

nlohmann::json EntryJson(const dlock::EntryInfo& e) {
  nlohmann::json j = {{"entry", e.entry.id},   {"queue", e.queue},
                      {"kind", e.entry.kind},  {"position", e.position},
                      {"role", e.holds ? "holder" : "waiter"}};
  j["token"] = e.entry.token ? nlohmann::json(*e.entry.token) : nlohmann::json(nullptr);
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

int Status(const std::string& url, const std::string& name, bool json) {
  if (auto s = dlock::ValidateLockName(name); !s.ok()) Die(kUsage, s.message());
  auto client = ConnectOrDie(url);
  auto entries = dlock::Inspect(client, name);
  if (!entries.ok()) Die(ExitFor(entries.status()), entries.status().ToString());
  if (json) {
    nlohmann::json out = {{"name", name}, {"url", client.url()}, {"holders", nlohmann::json::array()},
                          {"waiters", nlohmann::json::array()}};
    for (const auto& e : *entries) out[e.holds ? "holders" : "waiters"].push_back(EntryJson(e));
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  if (entries->empty()) {
    std::printf("%s: free (no holders, no waiters) on %s\n", name.c_str(), client.url().c_str());
    return 0;
  }
  std::printf("%-7s %-6s %-10s %-44s %-8s %-20s %-8s %s\n", "ROLE", "KIND", "TOKEN", "ENTRY", "QUEUE", "HOST", "PID",
              "SINCE");
  for (bool holders : {true, false}) {
    for (const auto& e : *entries) {
      if (e.holds != holders) continue;
      std::string queue = e.queue == name ? "." : e.queue.substr(name.size() + 1);
      std::string token = e.entry.token ? std::to_string(*e.entry.token) : "-";
      std::string host = e.entry.owner ? e.entry.owner->host : "-";
      std::string pid = e.entry.owner ? std::to_string(e.entry.owner->pid) : "-";
      std::string since = e.entry.owner && e.entry.owner->acquired_unix_ms > 0
                              ? HumanDuration(NowUnixMs() - e.entry.owner->acquired_unix_ms) + " ago"
                              : "-";
      std::printf("%-7s %-6s %-10s %-44s %-8s %-20s %-8s %s\n", e.holds ? "holder" : "waiter", e.entry.kind.c_str(),
                  token.c_str(), e.entry.id.c_str(), queue.c_str(), host.c_str(), pid.c_str(), since.c_str());
    }
  }
  return 0;
}

// ----------------------------------------------------------------- break

int Break(const std::string& url, const std::string& name, const std::string& entry_id) {
  if (auto s = dlock::ValidateLockName(name); !s.ok()) Die(kUsage, s.message());
  auto client = ConnectOrDie(url);
  auto entries = dlock::Inspect(client, name);
  if (!entries.ok()) Die(ExitFor(entries.status()), entries.status().ToString());
  std::vector<const dlock::EntryInfo*> targets;
  for (const auto& e : *entries) {
    if (entry_id.empty() ? e.holds : e.entry.id == entry_id) targets.push_back(&e);
  }
  if (targets.empty()) {
    Die(1, entry_id.empty() ? name + " has no holder" : "no entry " + entry_id + " in " + name);
  }
  if (targets.size() > 1) {
    std::string ids;
    for (auto* t : targets) ids += "\n  " + t->entry.id + " (" + t->entry.kind + ", " + Describe(*t) + ")";
    Die(kUsage, name + " has " + std::to_string(targets.size()) + " holders; name the entry to break:" + ids);
  }
  const auto& t = *targets.front();
  if (auto s = client.remove_entry(t.queue, t.entry.id); !s.ok()) Die(ExitFor(s), s.ToString());
  std::printf("removed %s entry %s of %s (token %s, %s)\n", t.holds ? "holder" : "waiter", t.entry.id.c_str(),
              t.queue.c_str(), t.entry.token ? std::to_string(*t.entry.token).c_str() : "-", Describe(t).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dlock: distributed locks from the shell.\n"
               "The store is --url, else $DLOCK_URL, else the embedded file:// store.\n"
               "Durations are written like 500ms, 10s, 2m."};
  app.footer(kExitHelp);
  app.require_subcommand(1);
  std::string url = DefaultUrl();

  RunOptions run;
  auto* run_cmd = app.add_subcommand("run", "Wait for the lock NAME, run COMMAND while holding it, release it.");
  run_cmd->add_option("--url", url, "store URL");
  run_cmd->add_option("--timeout", run.timeout, "give up waiting after this long (exit 3)");
  run_cmd->add_option("--permits", run.permits, "take one of N permits of a semaphore instead of the mutex")
      ->check(CLI::Range(1u, 1'000'000u));
  run_cmd->add_flag("--shared", run.shared, "take a shared hold: shared holders run together, excluding plain runs");
  run_cmd->add_option("--kill-after", run.kill_after, "if the lock is lost: SIGKILL this long after SIGTERM")
      ->capture_default_str();
  run_cmd->add_option("NAME", run.name, "lock name, e.g. cron/backup")->required();
  run_cmd->add_option("COMMAND", run.command, "the command and its arguments, after --")->required();
  run_cmd->footer(
      "The command gets DLOCK_NAME, DLOCK_URL and DLOCK_FENCING_TOKEN in its environment.\n"
      "INT, TERM and HUP go to the command; while still waiting they cancel the wait.\n\n" +
      std::string(kExitHelp));

  std::string status_name;
  bool json = false;
  auto* status_cmd = app.add_subcommand("status", "Show who holds and who waits for NAME, in queue order.");
  status_cmd->add_option("--url", url, "store URL");
  status_cmd->add_flag("--json", json, "one JSON object: {name, url, holders: [...], waiters: [...]}");
  status_cmd->add_option("NAME", status_name, "lock name")->required();
  status_cmd->footer("Exit status: 0 shown, 2 usage error, 5 the store is unreachable or refused the request.");

  std::string break_name, break_entry;
  auto* break_cmd =
      app.add_subcommand("break", "Remove the holder's entry of NAME (or the entry ENTRY): for a wedged holder.");
  break_cmd->add_option("--url", url, "store URL");
  break_cmd->add_option("NAME", break_name, "lock name")->required();
  break_cmd->add_option("ENTRY", break_entry, "the entry to remove, as `dlock status` shows it");
  break_cmd->footer(
      "Exit status: 0 removed, 1 nothing to remove, 2 usage error (or several holders: name ENTRY),\n"
      "5 the store is unreachable or refused the request.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kUsage;
  }
  if (*run_cmd) {
    run.url = url;
    return Run(run);
  }
  if (*status_cmd) return Status(url, status_name, json);
  if (*break_cmd) return Break(url, break_name, break_entry);
  return kUsage;
}
