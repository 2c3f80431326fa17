#include "dlock/inspect.hpp"

#include "core/access.hpp"
#include "recipes/acquire.hpp"

namespace dlock {

Result<std::vector<EntryInfo>> Inspect(const Client& client, std::string_view name) {
  if (Status s = ValidateLockName(name); !s.ok()) return s;
  auto session = client.session();
  if (!session.ok()) return session.status();
  // An election's candidates show their values (dlock/election.hpp).
  const ListOptions options{.with_owners = true, .with_values = (*session)->keeps_values()};
  std::vector<EntryInfo> out;
  const std::string base(name);
  for (const std::string& queue : {base, base + "/leases", base + "/locks"}) {
    auto listed = (*session)->list(
        queue, options, DeadlineAfter(internal::CoreOf(client)->now(), internal::ClientCore::kRequestTimeout));
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
