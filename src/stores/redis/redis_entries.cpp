#include "stores/redis/redis_entries.hpp"

#include <algorithm>
#include <cstdint>

namespace dlock::internal::redis {

std::string KnownKind(std::string_view kind) {
  for (auto k :
       {entry_kind::kLock, entry_kind::kRead, entry_kind::kWrite, entry_kind::kLease, entry_kind::kCandidate}) {
    if (kind == k) return std::string(k);
  }
  return "foreign";
}

Result<std::vector<Entry>> ParseEntries(const Reply& r, std::size_t from, bool owners, bool values) {
  const std::size_t owner_at = 5;
  const std::size_t value_at = owner_at + (owners ? 1 : 0);
  const std::size_t width = value_at + (values ? 2 : 0);
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
      auto owner = DecodeOwnerRecord(ElementStr(r.element(i + owner_at)));
      if (owner.ok()) e.owner = std::move(*owner);
    }
    if (values) {
      if (!ParseNumber(ElementStr(r.element(i + value_at)), e.value_version)) {
        return InternalError("redis store: malformed value version of entry " + e.id);
      }
      if (!ElementIsNil(r.element(i + value_at + 1))) e.value = std::string(ElementStr(r.element(i + value_at + 1)));
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), QueueOrder);
  return out;
}

Result<HeadReading> ParseHead(const Reply& r, bool owners) {
  if (!r.is_array() || r.size() < 2) return InternalError("redis store: malformed reply to read_head");
  HeadReading out;
  out.soonest_ttl_ms = ElementInt(r.element(0));
  if (!ParseNumber(ElementStr(r.element(1)), out.head.position)) {
    return InternalError("redis store: malformed head stamp from read_head");
  }
  auto entries = ParseEntries(r, 2, owners, /*values=*/true);
  if (!entries.ok()) return entries.status();
  if (entries->size() > 1) return InternalError("redis store: more than one head from read_head");
  if (!entries->empty()) out.head.entry = std::move(entries->front());
  return out;
}

}  // namespace dlock::internal::redis
