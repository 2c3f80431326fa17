#include "stores/redis/redis_entries.hpp"

#include <algorithm>
#include <cstdint>

namespace dlock::internal::redis {

std::string KnownKind(std::string_view kind) {
  for (auto k : {entry_kind::kLock, entry_kind::kRead, entry_kind::kWrite, entry_kind::kLease}) {
    if (kind == k) return std::string(k);
  }
  return "foreign";
}

Result<std::vector<Entry>> ParseEntries(const Reply& r, std::size_t from, bool owners) {
  const std::size_t width = owners ? 6 : 5;
  if (!r.is_array() || r.size() < from || (r.size() - from) % width != 0) {
    return InternalError("redis store: malformed entry list from a script");
  }
  std::vector<Entry> out;
  out.reserve((r.size() - from) / width);
  for (std::size_t i = from; i < r.size(); i += width) {
    Entry e;
    e.id = std::string(ElementStr(r.element(i)));
    // remove() and wait refuse an empty id: such an entry could never go.
    if (e.id.empty()) return InternalError("redis store: entry without an id from a script");
    std::uint64_t token = 0;
    if (!ParseNumber(ElementStr(r.element(i + 1)), e.sequence) || !ParseNumber(ElementStr(r.element(i + 2)), token)) {
      return InternalError("redis store: malformed sequence or token of entry " + e.id);
    }
    e.token = token;
    e.kind = KnownKind(ElementStr(r.element(i + 3)));
    e.attempt_id = std::string(ElementStr(r.element(i + 4)));
    if (owners) {
      auto owner = DecodeOwnerRecord(ElementStr(r.element(i + 5)));
      if (owner.ok()) e.owner = std::move(*owner);
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), QueueOrder);
  return out;
}

}  // namespace dlock::internal::redis
