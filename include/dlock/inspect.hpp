// File: dlock/inspect.hpp
//
// Who holds and who waits for a lock name, for tools and dashboards
// (`dlock status`, `dlock break`). Reads the store; takes no lock.
//
//   for (const auto& e : dlock::Inspect(client, "deploy").value()) {
//     std::printf("%s %s %s\n", e.holds ? "holder" : "waiter", e.entry.kind.c_str(), e.entry.id.c_str());
//   }
#ifndef DLOCK_INSPECT_HPP_
#define DLOCK_INSPECT_HPP_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "dlock/client.hpp"
#include "dlock/export.hpp"
#include "dlock/status.hpp"
#include "dlock/store.hpp"

namespace dlock {

struct EntryInfo {
  std::string queue;         // the store queue: the name, or "<name>/leases", "<name>/locks" for a Semaphore
  Entry entry;               // with its owner record where the store has one
  bool holds = false;        // by the same rules the recipes grant with
  std::size_t position = 0;  // 0-based place in its queue
};

// Entries of every recipe that can use `name`: Mutex / ReadWriteLock / Election entries
// in the name's own queue, then Semaphore leases (holders) and Semaphore
// acquirers (waiters). Holders first within each queue; queue order kept.
// Entries carry their values where the store keeps them (an election
// candidate's; `dlock status --json` shows it as "value").
DLOCK_EXPORT Result<std::vector<EntryInfo>> Inspect(const Client& client, std::string_view name);

}  // namespace dlock

#endif  // DLOCK_INSPECT_HPP_
