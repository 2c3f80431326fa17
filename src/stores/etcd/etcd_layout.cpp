#include "stores/etcd/etcd_layout.hpp"

#include <algorithm>
#include <charconv>
#include <map>

#include <nlohmann/json.hpp>

namespace dlock::internal::etcd {

std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // etcd: "every key from the start key on"
}

std::string LeaseHex(std::int64_t lease) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, static_cast<std::uint64_t>(lease), 16);
  return std::string(buf, end);
}

std::string Layout::queue_dir(std::string_view queue) const { return prefix_ + std::string(queue) + "/"; }
std::string Layout::entry_key(std::string_view queue, std::string_view suffix) const {
  return queue_dir(queue) + std::string(suffix);
}
std::string Layout::record_dir(std::string_view queue) const {
  return prefix_ + "!dlock/m/" + std::string(queue) + "/";
}
std::string Layout::record_key(std::string_view queue, std::string_view suffix) const {
  return record_dir(queue) + std::string(suffix);
}
std::string Layout::fence_key(std::string_view attempt_id) const {
  return prefix_ + "!dlock/f/" + std::string(attempt_id);
}

std::string FirstSuffix(std::int64_t lease) { return LeaseHex(lease); }
std::string OtherSuffix(std::int64_t lease, std::string_view attempt) {
  return LeaseHex(lease) + "." + std::string(attempt);
}
std::string ReservationSuffix(std::string_view entry_suffix) { return std::string(entry_suffix) + ".d"; }
bool IsReservationSuffix(std::string_view suffix) { return suffix.size() > 2 && suffix.ends_with(".d"); }

std::string EntryId(std::string_view suffix, std::int64_t create_revision) {
  return std::string(suffix) + "@" + std::to_string(create_revision);
}

Result<ParsedId> ParseEntryId(std::string_view id) {
  const auto at = id.rfind('@');
  if (at == std::string_view::npos || at == 0 || at + 1 == id.size()) {
    return InvalidArgumentError("etcd store: '" + std::string(id) + "' is not an entry id (<key>@<revision>)");
  }
  ParsedId out;
  out.suffix = std::string(id.substr(0, at));
  if (out.suffix.find('/') != std::string::npos) {
    return InvalidArgumentError("etcd store: entry id '" + std::string(id) + "' names a nested key");
  }
  const std::string_view rev = id.substr(at + 1);
  auto [end, ec] = std::from_chars(rev.data(), rev.data() + rev.size(), out.create_revision);
  if (ec != std::errc() || end != rev.data() + rev.size() || out.create_revision <= 0) {
    return InvalidArgumentError("etcd store: entry id '" + std::string(id) + "' has no valid revision");
  }
  return out;
}

std::optional<std::string_view> OwnSegment(std::string_view key, std::string_view dir) {
  if (!key.starts_with(dir)) return std::nullopt;
  std::string_view rest = key.substr(dir.size());
  if (rest.empty() || rest.find('/') != std::string_view::npos) return std::nullopt;
  return rest;
}

std::string EncodeRecord(std::string_view kind, std::string_view attempt_id, const OwnerRecord& owner) {
  nlohmann::json j;
  j["kind"] = std::string(kind);
  j["attempt"] = std::string(attempt_id);
  j["owner"] = nlohmann::json::parse(EncodeOwnerRecord(owner), nullptr, /*allow_exceptions=*/false);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<Record> DecodeRecord(std::string_view json) {
  auto j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto kind = j.find("kind");
  auto attempt = j.find("attempt");
  if (kind == j.end() || !kind->is_string() || attempt == j.end() || !attempt->is_string()) return std::nullopt;
  Record r;
  r.kind = "foreign";
  for (auto k :
       {entry_kind::kLock, entry_kind::kRead, entry_kind::kWrite, entry_kind::kLease, entry_kind::kCandidate}) {
    if (kind->get<std::string>() == k) r.kind = std::string(k);
  }
  r.attempt_id = attempt->get<std::string>();
  if (auto owner = j.find("owner"); owner != j.end() && owner->is_object()) {
    auto decoded = DecodeOwnerRecord(owner->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    if (decoded.ok()) r.owner = std::move(*decoded);
  }
  return r;
}

std::vector<Listed> EntriesOf(const Layout& layout, std::string_view queue, const std::vector<KeyRead>& keys,
                              const std::vector<RecordRead>& records, const ListOptions& options) {
  const std::string record_dir = layout.record_dir(queue);
  std::map<std::string_view, const RecordRead*> by_suffix;
  for (const RecordRead& r : records) {
    if (auto suffix = OwnSegment(r.key, record_dir)) by_suffix.emplace(*suffix, &r);
  }
  const std::string dir = layout.queue_dir(queue);
  std::vector<Listed> out;
  for (const KeyRead& k : keys) {
    auto suffix = OwnSegment(k.key, dir);
    if (!suffix) continue;  // a nested queue's
    Listed l;
    l.lease = k.lease;
    Entry& e = l.entry;
    e.id = EntryId(*suffix, k.create_revision);
    e.sequence = k.create_revision;
    // Every entry keeps its creation's revision as token, whatever Puts (new
    // values) come after; a downgraded read entry's creation is its record's.
    e.token = static_cast<std::uint64_t>(k.create_revision);
    if (options.with_values) {
      if (!k.value.empty()) e.value = k.value;
      e.value_version = static_cast<std::uint64_t>(k.version);
    }
    auto rec = by_suffix.find(*suffix);
    std::optional<Record> record;
    if (rec != by_suffix.end()) record = DecodeRecord(rec->second->value);
    if (record) {
      if (IsReservationSuffix(*suffix)) e.token = static_cast<std::uint64_t>(rec->second->create_revision);
      e.kind = record->kind;
      e.attempt_id = record->attempt_id;
      if (options.with_owners) e.owner = std::move(record->owner);
    } else if (IsReservationSuffix(*suffix)) {
      continue;  // a write entry's reservation, not an entry of its own
    } else {
      e.kind = std::string(entry_kind::kLock);  // Go's Mutex, etcdctl lock, v3lock: exclusive
    }
    out.push_back(std::move(l));
  }
  std::sort(out.begin(), out.end(), [](const Listed& a, const Listed& b) { return QueueOrder(a.entry, b.entry); });
  return out;
}

}  // namespace dlock::internal::etcd
