#include "support/child.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

namespace dlock::testing {

std::string RunInChild(const std::function<int()>& body, std::chrono::seconds limit) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 1;
    try {
      rc = body();
    } catch (...) {
      rc = 2;
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  const auto end = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status)) : "signal";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (std::getenv("DLOCK_TEST_STACKS")) {  // where it hangs: every thread's stack
    std::string cmd = "gdb -q -batch -p " + std::to_string(pid) +
                      " -ex 'thread apply all bt 14' 2>/dev/null | grep -E '^(Thread|#)' | grep -E "
                      "'Thread|dlock::|lock|wait|Scenario' >&2";
    [[maybe_unused]] int rc = std::system(cmd.c_str());
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return "HUNG";
}

}  // namespace dlock::testing
