#include "stores/zookeeper/zk_names.hpp"

#include <algorithm>
#include <array>
#include <cstdio>

namespace dlock::internal::zk {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHex(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
char ToLower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool AllDigits(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), IsDigit); }

std::uint64_t DigitsValue(std::string_view s) {  // at most 10 digits: no overflow
  std::uint64_t v = 0;
  for (char c : s) v = v * 10 + static_cast<std::uint64_t>(c - '0');
  return v;
}

// A tag a lock-recipe client puts right before the sequence, and the dlock
// kind it means. Longer tags first where one could end another.
struct Tag {
  std::string_view text;
  std::string_view kind;
};
constexpr std::array<Tag, 7> kTags{{
    {"-lock-", entry_kind::kLock},        // Curator InterProcessMutex, go-zookeeper
    {"-latch-", entry_kind::kCandidate},  // Curator LeaderLatch
    {"__WRIT__", entry_kind::kWrite},     // Curator read/write lock
    {"__READ__", entry_kind::kRead},
    {"-lease-", entry_kind::kLease},   // Curator InterProcessSemaphoreV2
    {"__rlock__", entry_kind::kRead},  // kazoo ReadLock
    {"__lock__", entry_kind::kLock},   // kazoo Lock and WriteLock
}};

// The sequence at the end of a name no recipe tag explains: the last ten
// digits, or '-' and nine digits (a negative number the server formatted).
// A '-' before ten digits is read as a separator (ZooKeeper's own recipes
// name nodes "x-<session>-<seq>"), unless the digits only fit as negative.
std::optional<std::int32_t> ForeignSequence(std::string_view name) {
  if (name.size() >= 10 && AllDigits(name.substr(name.size() - 10))) {
    std::uint64_t v = DigitsValue(name.substr(name.size() - 10));
    bool minus = name.size() >= 11 && name[name.size() - 11] == '-';
    if (v <= 0x7fffffffULL) return static_cast<std::int32_t>(v);
    if (minus && v == 0x80000000ULL) return INT32_MIN;
    if (v <= 0xffffffffULL) return static_cast<std::int32_t>(static_cast<std::uint32_t>(v));
    return std::nullopt;
  }
  if (name.size() >= 10 && name[name.size() - 10] == '-' && AllDigits(name.substr(name.size() - 9))) {
    return static_cast<std::int32_t>(-static_cast<std::int64_t>(DigitsValue(name.substr(name.size() - 9))));
  }
  return std::nullopt;
}

}  // namespace

Result<std::string> KindTag(std::string_view kind) {
  if (kind == entry_kind::kLock) return std::string("lock-");
  if (kind == entry_kind::kWrite) return std::string("__WRIT__");
  if (kind == entry_kind::kRead) return std::string("__READ__");
  if (kind == entry_kind::kLease) return std::string("lease-");
  if (kind == entry_kind::kCandidate) return std::string("latch-");
  return InvalidArgumentError("the zk store cannot append entries of kind '" + std::string(kind) +
                              "' (it writes lock, read, write, lease and candidate)");
}

std::optional<std::string> AttemptIdToUuid(std::string_view id) {
  if (id.size() != 32) return std::nullopt;
  std::string out;
  out.reserve(36);
  for (std::size_t i = 0; i < 32; ++i) {
    char c = id[i];
    if (!IsDigit(c) && !(c >= 'a' && c <= 'f')) return std::nullopt;
    if (i == 8 || i == 12 || i == 16 || i == 20) out.push_back('-');
    out.push_back(c);
  }
  return out;
}

std::optional<std::string> UuidToAttemptId(std::string_view uuid) {
  if (uuid.size() != 36) return std::nullopt;
  std::string out;
  out.reserve(32);
  for (std::size_t i = 0; i < 36; ++i) {
    char c = uuid[i];
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (c != '-') return std::nullopt;
      continue;
    }
    if (!IsHex(c)) return std::nullopt;
    out.push_back(ToLower(c));
  }
  return out;
}

Result<std::string> ProtectedPrefix(std::string_view attempt_id) {
  auto uuid = AttemptIdToUuid(attempt_id);
  if (!uuid) {
    return InvalidArgumentError("attempt id '" + std::string(attempt_id) + "' is not 32 lower-case hex digits");
  }
  return "_c_" + *uuid + "-";
}

Result<std::string> EntryNamePrefix(std::string_view kind, std::string_view attempt_id) {
  auto tag = KindTag(kind);
  if (!tag.ok()) return tag.status();
  auto prefix = ProtectedPrefix(attempt_id);
  if (!prefix.ok()) return prefix.status();
  return *prefix + *tag;
}

std::string FormatSequence(std::int32_t sequence) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%010d", sequence);
  return buf;
}

std::optional<std::int32_t> ParseSequence(std::string_view text) {
  if (text.size() == 10 && AllDigits(text)) {
    std::uint64_t v = DigitsValue(text);
    if (v > 0xffffffffULL) return std::nullopt;
    // Ten digits above INT32_MAX are a counter printed unsigned: wrap them.
    return static_cast<std::int32_t>(static_cast<std::uint32_t>(v));
  }
  if ((text.size() == 10 || text.size() == 11) && text[0] == '-' && AllDigits(text.substr(1))) {
    std::uint64_t v = DigitsValue(text.substr(1));
    if (v > 0x80000000ULL) return std::nullopt;
    return static_cast<std::int32_t>(-static_cast<std::int64_t>(v));
  }
  return std::nullopt;
}

std::optional<Entry> ParseChildName(std::string_view name) {
  // A server never lists such a name, but an id that remove() would refuse
  // must not become an entry (found by fuzz/zk_child_name_fuzz.cpp).
  if (!ValidateEntryId(name).ok()) return std::nullopt;
  Entry e;
  e.id = std::string(name);
  bool known = false;
  for (const Tag& tag : kTags) {
    // The tag must be followed by nothing but the sequence.
    for (std::size_t len : {std::size_t{10}, std::size_t{11}}) {
      if (name.size() < tag.text.size() + len) continue;
      std::size_t at = name.size() - len - tag.text.size();
      if (name.substr(at, tag.text.size()) != tag.text) continue;
      auto seq = ParseSequence(name.substr(at + tag.text.size()));
      if (!seq) continue;
      e.kind = std::string(tag.kind);
      e.sequence = *seq;
      known = true;
      break;
    }
    if (known) break;
  }
  if (!known) {
    auto seq = ForeignSequence(name);
    if (!seq) return std::nullopt;
    e.kind = "foreign";
    e.sequence = *seq;
  }
  // Curator's protection prefix: "_c_" + 36-char UUID + "-". go-zookeeper
  // writes the UUID as 32 hex digits without dashes.
  if (name.size() > 40 && name.substr(0, 3) == "_c_" && name[39] == '-') {
    if (auto id = UuidToAttemptId(name.substr(3, 36))) e.attempt_id = *id;
  } else if (name.size() > 36 && name.substr(0, 3) == "_c_" && name[35] == '-') {
    std::string_view hex = name.substr(3, 32);
    if (std::all_of(hex.begin(), hex.end(), IsHex)) {
      e.attempt_id.reserve(32);
      for (char c : hex) e.attempt_id.push_back(ToLower(c));
    }
  }
  return e;
}

bool HasKnownEntryShape(std::string_view name) {
  if (!ParseChildName(name)) return false;
  // Curator's (and go-zookeeper's) protection prefix.
  if (name.size() > 40 && name.substr(0, 3) == "_c_" && name[39] == '-' && UuidToAttemptId(name.substr(3, 36))) {
    return true;
  }
  if (name.size() > 36 && name.substr(0, 3) == "_c_" && name[35] == '-' &&
      std::all_of(name.begin() + 3, name.begin() + 35, IsHex)) {
    return true;
  }
  // kazoo: 32 hex digits, its tag, the sequence.
  if (name.size() > 32 && std::all_of(name.begin(), name.begin() + 32, IsHex)) {
    std::string_view rest = name.substr(32);
    for (std::string_view tag : {std::string_view("__lock__"), std::string_view("__rlock__")}) {
      if (rest.size() > tag.size() && rest.substr(0, tag.size()) == tag && ParseSequence(rest.substr(tag.size()))) {
        return true;
      }
    }
  }
  return false;
}

ParsedChildren ParseChildren(const std::vector<std::string>& children) {
  ParsedChildren out;
  out.entries.reserve(children.size());
  for (const auto& child : children) {
    auto e = ParseChildName(child);
    if (!e) continue;
    (HasKnownEntryShape(child) ? out.entries : out.unsure).push_back(std::move(*e));
  }
  std::sort(out.entries.begin(), out.entries.end(), QueueOrder);
  return out;
}

bool IsSessionOwner(std::int64_t ephemeral_owner) {
  // ZooKeeper marks containers with INT64_MIN and TTL nodes with 0xff in the
  // top byte (EphemeralType); session ids carry the server id there (< 255).
  if (ephemeral_owner == 0 || ephemeral_owner == INT64_MIN) return false;
  return (static_cast<std::uint64_t>(ephemeral_owner) >> 56) != 0xff;
}

Status ValidateQueueName(std::string_view queue) {
  if (Status s = ValidateLockName(queue); !s.ok()) return s;
  std::size_t start = 0;
  while (start <= queue.size()) {
    std::size_t slash = queue.find('/', start);
    std::string_view segment = queue.substr(start, slash == std::string_view::npos ? queue.npos : slash - start);
    if (HasKnownEntryShape(segment)) {
      return InvalidArgumentError("lock name '" + std::string(queue) + "': its segment '" + std::string(segment) +
                                  "' is shaped like a Curator or kazoo lock entry, which the zk store would "
                                  "take for an entry of the queue above it");
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return OkStatus();
}

std::string QueuePath(std::string_view chroot, std::string_view queue) {
  std::string out(chroot);
  out += '/';
  out += queue;
  return out;
}

std::vector<std::string> PathPrefixes(std::string_view path) {
  std::vector<std::string> out;
  for (std::size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') out.emplace_back(path.substr(0, i));
  }
  return out;
}

Status ValidateEntryId(std::string_view id) {
  if (id.empty()) return InvalidArgumentError("entry id is empty");
  if (id.size() > 1024) return InvalidArgumentError("entry id is longer than 1024 bytes");
  if (id == "." || id == ".." || id == "zookeeper") {
    return InvalidArgumentError("'" + std::string(id) + "' is not an entry id");
  }
  for (char c : id) {
    if (c == '/' || c == '\0') return InvalidArgumentError("entry id '" + std::string(id) + "' contains '/' or NUL");
  }
  return OkStatus();
}

}  // namespace dlock::internal::zk
