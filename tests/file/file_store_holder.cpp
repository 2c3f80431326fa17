// A helper process for the file store tests: holds entries in another process
// so that tests can kill it.
//
//   file_store_holder DIR QUEUE [COUNT]
//
// Opens file://DIR, appends COUNT (default 1) "lock" entries to QUEUE in one
// session, prints "ID TOKEN" for each on its own line, then holds them until
// its standard input closes, and exits 0 after closing the session.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/url.hpp"
#include "stores/file/file_store.hpp"

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s DIR QUEUE [COUNT]\n", argv[0]);
    return 2;
  }
  auto url = dlock::internal::ParseUrl(std::string("file://") + argv[1]);
  if (!url.ok()) {
    std::fprintf(stderr, "%s\n", url.status().to_string().c_str());
    return 1;
  }
  auto store = dlock::internal::OpenFileStore(*url, {});
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().to_string().c_str());
    return 1;
  }
  auto session = (*store)->open_session(dlock::kNoDeadline);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().to_string().c_str());
    return 1;
  }
  int count = argc == 4 ? std::atoi(argv[3]) : 1;
  for (int i = 0; i < count; ++i) {
    dlock::EntrySpec spec;
    spec.kind = "lock";
    spec.owner.pid = getpid();
    spec.owner.label = "file_store_holder";
    auto appended = (*session)->append(argv[2], spec, dlock::kNoDeadline);
    if (!appended.ok()) {
      std::fprintf(stderr, "%s\n", appended.status().to_string().c_str());
      return 1;
    }
    std::printf("%s %llu\n", appended->entry.id.c_str(), static_cast<unsigned long long>(*appended->entry.token));
  }
  std::fflush(stdout);
  char buf[64];
  while (read(STDIN_FILENO, buf, sizeof buf) > 0) {
  }
  (*session)->close();
  return 0;
}
