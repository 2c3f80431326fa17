// A holder for crash tests: opens a session on a store URL, appends one entry
// to a queue, prints "<entry id> <token>\n" and then does nothing until it is
// killed. The test kills it with SIGKILL, so it never releases.
//
//   dlock_redis_holder redis://127.0.0.1:6400?ttl=1s orders/1
#include <unistd.h>

#include <cstdio>
#include <string>

#include "dlock/store.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s URL QUEUE\n", argv[0]);
    return 2;
  }
  auto store = dlock::OpenStore(argv[1]);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().to_string().c_str());
    return 1;
  }
  auto session = (*store)->open_session(dlock::kNoDeadline);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().to_string().c_str());
    return 1;
  }
  dlock::EntrySpec spec;
  spec.kind = "lock";
  spec.attempt_id = "00000000000000000000000000000001";
  spec.owner.host = "holder";
  spec.owner.pid = ::getpid();
  auto appended = (*session)->append(argv[2], spec, dlock::kNoDeadline);
  if (!appended.ok()) {
    std::fprintf(stderr, "%s\n", appended.status().to_string().c_str());
    return 1;
  }
  std::printf("%s %llu\n", appended->entry.id.c_str(), static_cast<unsigned long long>(*appended->entry.token));
  std::fflush(stdout);
  for (;;) ::pause();
}
