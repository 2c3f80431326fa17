// Internal: where the etcd store keeps things (docs/etcd.md, "Layout").
//
// With the URL's prefix P ("" or "team/"), a queue Q holds:
//
//   P Q/<lease hex>                 the entry: empty value, the session's lease
//   P Q/<lease hex>.<attempt id>    a further entry of the same session in Q
//   P Q/<entry suffix>.d            a write entry's downgrade reservation
//   P !dlock/m/Q/<entry suffix>     the entry's record {kind, attempt, owner}
//   P !dlock/f/<attempt id>         find_own's fence for an attempt
//
// The entry key is the one Go's concurrency.Mutex, `etcdctl lock` and the
// server's v3lock write, so they and dlock exclude each other: the owner is
// the key with the lowest create revision under "P Q/". Everything else of
// dlock's lives under "P !dlock/", which no lock name's range reaches ('!' is
// not a lock-name character).
//
// Entry id: "<entry suffix>@<create revision>", so every operation on an id
// is fenced by the revision: a key deleted and made again is another entry.
// Sequence: the create revision. Token: the create revision too (Go's
// Election's leaderRev), except for a downgraded read entry, which takes
// over its write entry's reservation with a new Put: its token is that
// Put's revision, which is its record's create revision (the record is made
// by that Put's Txn). Later Puts (new values, new owners) keep the token.
// Value: the entry key's value (Go's Election proposal; empty, read as none,
// for locks); value_version: the key's version.
#ifndef DLOCK_SRC_STORES_ETCD_ETCD_LAYOUT_HPP_
#define DLOCK_SRC_STORES_ETCD_ETCD_LAYOUT_HPP_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlock/status.hpp"
#include "dlock/store.hpp"

namespace dlock::internal::etcd {

// Go's clientv3.GetPrefixRangeEnd: the smallest key above every key that
// starts with `prefix`.
std::string PrefixEnd(std::string prefix);

// The lease ID as Go's fmt.Sprintf("%x", id) spells it.
std::string LeaseHex(std::int64_t lease);

class Layout {
 public:
  explicit Layout(std::string prefix) : prefix_(std::move(prefix)) {}

  const std::string& prefix() const { return prefix_; }
  // "P Q/": every entry of Q (and of the queues nested in it) starts so.
  std::string queue_dir(std::string_view queue) const;
  std::string entry_key(std::string_view queue, std::string_view suffix) const;
  // "P !dlock/m/Q/": the records of Q's entries.
  std::string record_dir(std::string_view queue) const;
  std::string record_key(std::string_view queue, std::string_view suffix) const;
  std::string fence_key(std::string_view attempt_id) const;

 private:
  std::string prefix_;
};

// Entry suffixes.
std::string FirstSuffix(std::int64_t lease);                            // "<lease hex>"
std::string OtherSuffix(std::int64_t lease, std::string_view attempt);  // "<lease hex>.<attempt>"
std::string ReservationSuffix(std::string_view entry_suffix);           // "<suffix>.d"
bool IsReservationSuffix(std::string_view suffix);

// Entry ids.
std::string EntryId(std::string_view suffix, std::int64_t create_revision);
struct ParsedId {
  std::string suffix;
  std::int64_t create_revision = 0;
};
// kInvalidArgument unless `id` is "<one key segment>@<revision > 0>".
Result<ParsedId> ParseEntryId(std::string_view id);

// The rest of `key` after `dir`, if it is one segment (no '/'): the key is
// then an entry (or record) of the queue itself, not of a nested one.
std::optional<std::string_view> OwnSegment(std::string_view key, std::string_view dir);

// An entry's record: what dlock keeps beside Go's empty entry.
struct Record {
  std::string kind;
  std::string attempt_id;
  std::optional<OwnerRecord> owner;
};
std::string EncodeRecord(std::string_view kind, std::string_view attempt_id, const OwnerRecord& owner);
// Unknown kinds read as "foreign"; a malformed record as nullopt.
std::optional<Record> DecodeRecord(std::string_view json);

// One key of a queue as a range read it.
struct KeyRead {
  std::string key;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t lease = 0;
  std::string value;         // when read with values
  std::int64_t version = 0;  // Puts since the key was made, the first included
};
struct RecordRead {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
};

// The queue's entries from one reading of its keys and records (both taken
// at one revision): keys of nested queues and reservations without a record
// are left out; a key without a record is another client's (Go's Mutex,
// etcdctl lock): kind "lock". Sorted by QueueOrder.
struct Listed {
  Entry entry;
  std::int64_t lease = 0;  // the entry key's lease (0: none)
};
std::vector<Listed> EntriesOf(const Layout& layout, std::string_view queue, const std::vector<KeyRead>& keys,
                              const std::vector<RecordRead>& records, const ListOptions& options);

}  // namespace dlock::internal::etcd

#endif  // DLOCK_SRC_STORES_ETCD_ETCD_LAYOUT_HPP_
