// Runs test code in a forked child, so that a deadlock cannot hang the test
// binary.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace dlock::testing {

// Runs `body` in a forked child: "exit N" with what it returned (2 if it
// threw), "signal" if a signal ended it, or "HUNG" if it was still running
// after `limit` and had to be killed. With DLOCK_TEST_STACKS set, a hung
// child's threads are printed (gdb) before it is killed.
std::string RunInChild(const std::function<int()>& body, std::chrono::seconds limit);

}  // namespace dlock::testing
