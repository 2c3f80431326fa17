#include "dlock/inspect.hpp"

#include "recipes/acquire.hpp"

namespace dlock {

Result<std::vector<EntryInfo>> Inspect(const Client& client, std::string_view name) {
  if (Status s = ValidateLockName(name); !s.ok()) return s;
  std::vector<EntryInfo> out;
  const std::string base(name);
  for (const std::string& queue : {base, base + "/leases", base + "/locks"}) {
    auto listed = client.list_entries(queue, /*with_owners=*/true);
    if (!listed.ok()) return listed.status();
    const std::vector<Entry>& entries = *listed;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      EntryInfo info{queue, entries[i], false, i};
      if (queue == base) {
        bool read = entries[i].kind == entry_kind::kRead;
        info.holds = (read ? internal::SharedRule(entries, i) : internal::ExclusiveRule(entries, i)).granted;
      } else {
        // Leases are held permits; the acquirers' queue only orders waiters.
        info.holds = queue == base + "/leases";
      }
      out.push_back(std::move(info));
    }
  }
  return out;
}

}  // namespace dlock
