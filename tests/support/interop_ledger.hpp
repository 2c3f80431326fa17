// Test support: a ledger of turns taken on one lock by holders of several
// clients (dlock threads, and other clients' drivers in other processes:
// Curator, kazoo, Go's concurrency.Mutex). Each holder appends
// "enter KIND TAG [TOKEN]" after it acquires and "exit KIND TAG" before it
// releases, each line in one write(2) on an O_APPEND file, so that lines of
// concurrent writers never mix; the file's order is the order of the
// writes. CheckLedger() then finds any two holders that were inside
// together.
#ifndef DLOCK_TESTS_SUPPORT_INTEROP_LEDGER_HPP_
#define DLOCK_TESTS_SUPPORT_INTEROP_LEDGER_HPP_

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "dlock/dlock.hpp"

namespace dlock::testing {

// Checks a ledger ("enter KIND TAG [TOKEN]" / "exit KIND TAG" lines, KIND
// one of lock, read, write): nobody enters while a writer or a lock holder
// is inside, and a writer or lock holder enters only an empty room. Where
// exclusive entries carry a fencing token, each is larger than the one of
// every earlier exclusive entry. Returns "" or the first violation, with
// its line number. `entries` counts the holds; `handoffs` the holds whose
// tag's first word (the client: "dlock", "peer", "go") differs from the
// previous hold's.
inline std::string CheckLedger(const std::string& path, std::size_t* entries = nullptr,
                               std::size_t* handoffs = nullptr) {
  std::ifstream in(path);
  std::string line, last_client;
  std::size_t number = 0, readers = 0, entered = 0, switched = 0;
  std::uint64_t last_token = 0;
  bool exclusive_inside = false;
  while (std::getline(in, line)) {
    ++number;
    std::istringstream words(line);
    std::string what, kind, tag;
    std::uint64_t token = 0;
    words >> what >> kind >> tag;
    if (!(words >> token)) token = 0;
    const bool shared = kind == "read";
    const std::string where = "line " + std::to_string(number) + " (" + line + ")";
    if (what == "enter") {
      ++entered;
      const std::string client = tag.substr(0, tag.find('-'));
      if (!last_client.empty() && client != last_client) ++switched;
      last_client = client;
      if (exclusive_inside) return where + ": entered while an exclusive holder was inside";
      if (!shared && readers > 0) return where + ": entered while readers were inside";
      if (shared) {
        ++readers;
      } else {
        exclusive_inside = true;
        if (token != 0) {
          if (token <= last_token)
            return where + ": fencing token " + std::to_string(token) + " after " + std::to_string(last_token);
          last_token = token;
        }
      }
    } else if (what == "exit") {
      if (shared ? readers == 0 : !exclusive_inside) return where + ": exit of no one inside";
      if (shared)
        --readers;
      else
        exclusive_inside = false;
    } else {
      return where + ": not a ledger line";
    }
  }
  if (entries) *entries = entered;
  if (handoffs) *handoffs = switched;
  return "";
}

// A ledger file in the temporary directory, removed when dropped, with the
// rounds of this process's holders.
class Ledger {
 public:
  Ledger() {
    static std::atomic<int> n{0};
    path_ = (std::filesystem::temp_directory_path() /
             ("dlock-interop-ledger-" + std::to_string(::getpid()) + "-" + std::to_string(n++)))
                .string();
    std::filesystem::remove(path_);
  }
  ~Ledger() { std::filesystem::remove(path_); }
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  const std::string& path() const { return path_; }

  // One write(2) on an O_APPEND file, like the peers' drivers.
  void append(const std::string& line) const {
    int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    const std::string l = line + "\n";
    EXPECT_EQ(::write(fd, l.data(), l.size()), static_cast<ssize_t>(l.size()));
    ::close(fd);
  }

  // Acquire-hold-release rounds with `acquire()`, logged as `kind tag`;
  // exclusive holds with their fencing token when `with_token`.
  template <typename Acquire>
  void cycles(int rounds, const std::string& kind, const std::string& tag, Acquire acquire,
              bool with_token = false) const {
    using namespace std::chrono_literals;
    for (int i = 0; i < rounds; ++i) {
      std::optional<Hold> hold = acquire();
      ASSERT_TRUE(hold) << tag << " round " << i;
      append("enter " + kind + " " + tag + (with_token ? " " + std::to_string(hold->fencing_token()) : ""));
      std::this_thread::sleep_for(200us);  // let another contender try to get in
      append("exit " + kind + " " + tag);
      hold->release();
    }
  }

 private:
  std::string path_;
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_INTEROP_LEDGER_HPP_
