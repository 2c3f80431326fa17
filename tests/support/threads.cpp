#include "support/threads.hpp"

#include <dirent.h>

#include <array>
#include <fstream>
#include <string_view>
#include <thread>

namespace dlock::testing {
namespace {

// The thread names (cut to 15 characters by the kernel) of gRPC's pools.
constexpr std::array<std::string_view, 5> kGrpcPools = {"grpc_global_tim", "default-executo", "resolver-execut",
                                                        "event_engine", "timer_manager"};

bool IsGrpcPool(std::string_view name) {
  for (std::string_view pool : kGrpcPools) {
    if (name == pool) return true;
  }
  return false;
}

// Calls `each` with the name of every thread of this process.
template <class Each>
void ForEachThreadName(Each each) {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    each(name);
  }
  ::closedir(dir);
}

}  // namespace

int ThreadCount() {
  static const bool warm = [] {
    std::thread([] {}).join();
    return true;
  }();
  static_cast<void>(warm);
  int n = 0;
  ForEachThreadName([&](const std::string& name) { n += !IsGrpcPool(name); });
  return n;
}

std::string ThreadNames() {
  std::string names;
  ForEachThreadName([&](const std::string& name) { names += (names.empty() ? "" : ", ") + name; });
  return names;
}

}  // namespace dlock::testing
