// Test support: loopback sockets and child processes, for the tests and the
// chaos runner (tools/chaos).
#ifndef DLOCK_TESTS_SUPPORT_LOOPBACK_HPP_
#define DLOCK_TESTS_SUPPORT_LOOPBACK_HPP_

#include <netinet/in.h>
#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace dlock::testing {

// 127.0.0.1:`port` (0: any free port, for bind).
sockaddr_in Loopback(int port);

// A TCP port on 127.0.0.1 nobody listens on right now (the kernel's pick),
// or -1.
int FreePort();

// A socket connected to 127.0.0.1:`port` whose reads give up after
// `read_timeout_s`, or -1.
int ConnectLoopback(int port, int read_timeout_s);

// Starts `args` (found on PATH); it dies with the process that started it
// (PR_SET_PDEATHSIG), even if that one crashes. With a `log`, stdout and
// stderr go there and it gets its own session (servers: a Ctrl-C to the
// runner's group does not reach them, and they do not hold the runner's
// output open). `block`: signals the child starts with blocked (kept across
// exec). Returns the pid, or -1.
pid_t Spawn(const std::vector<std::string>& args, const std::string& log = "", const sigset_t* block = nullptr);

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_LOOPBACK_HPP_
