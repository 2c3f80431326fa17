// Test support: counting this process's threads, for tests that promise
// dlock adds few and leaves none behind.
#ifndef DLOCK_TESTS_SUPPORT_THREADS_HPP_
#define DLOCK_TESTS_SUPPORT_THREADS_HPP_

#include <string>

namespace dlock::testing {

// The threads of this process, less gRPC's process-wide pools (its timer
// threads, executors and event engine: named "grpc_global_tim",
// "default-executo", ...). gRPC grows those under load and keeps them past
// any one channel, so counting them made the etcd runs fail on a loaded
// machine with no dlock thread left behind. The first call also starts
// (and joins) one thread, for ThreadSanitizer's own helper thread.
int ThreadCount();

// The names of this process's threads, all of them, for a failure message.
std::string ThreadNames();

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_THREADS_HPP_
