// Internal: znode names of the zk:// store, compatible with Curator and kazoo.
//
// An entry is an ephemeral child of the queue's znode. dlock names its own
// entries exactly as Curator's recipes do (with Curator's "protection" prefix,
// whose UUID is the entry's attempt id):
//
//   lock   _c_<uuid>-lock-<seq>      InterProcessMutex
//   write  _c_<uuid>-__WRIT__<seq>   InterProcessReadWriteLock, write side
//   read   _c_<uuid>-__READ__<seq>   InterProcessReadWriteLock, read side
//   lease  _c_<uuid>-lease-<seq>     InterProcessSemaphoreV2 lease
//   candidate  _c_<uuid>-latch-<seq>  LeaderLatch participant; data = its value
//
// <seq> is the server's suffix: the parent's cversion formatted "%010d"
// (signed: after 2^31 creations in one parent it wraps to negative numbers,
// e.g. "-000000005" or "-2147483648").
//
// The listing also understands kazoo's names (<32 hex>__lock__<seq> for Lock
// and WriteLock, <32 hex>__rlock__<seq> for ReadLock). Children without a
// sequence suffix (kazoo's Semaphore leases, stray nodes) are not entries.
//
// Nested queues. The queue "a/b" is a child znode of the queue "a", and a
// lock name's segment may end like a sequence ("acct-123456789",
// "run0000000001"). So that queues whose names nest never affect each other
// (store.hpp), a child counts as an entry only if:
//  - it has a known entry shape: Curator's protected names
//    (_c_<36-char uuid>-...<seq>, also go-zookeeper's _c_<32 hex>-...<seq>)
//    or kazoo's (<32 hex>__lock__<seq>, <32 hex>__rlock__<seq>); the kind
//    comes from the tag before the sequence, "foreign" if none is known; or
//  - it has any other sequence suffix and is ephemeral (owned by a session),
//    which the store checks with one pipelined exists() per such child
//    (ZooKeeper's own lock recipe, "x-<session>-<seq>", is one). A queue's
//    znode is a container or persistent node, never ephemeral.
// And the zk store refuses lock names with a segment of a known entry shape
// (ValidateQueueName), so a queue's znode never looks like a known entry.
#ifndef DLOCK_SRC_STORES_ZOOKEEPER_ZK_NAMES_HPP_
#define DLOCK_SRC_STORES_ZOOKEEPER_ZK_NAMES_HPP_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlock/status.hpp"
#include "dlock/store.hpp"

namespace dlock::internal::zk {

// The Curator tag of an entry kind ("lock" -> "lock-"); kInvalidArgument for
// kinds dlock does not write.
Result<std::string> KindTag(std::string_view kind);

// 32 lower-case hex digits -> the 36-character dashed UUID form; the inverse
// accepts upper case and returns lower case. Both return nullopt on bad input.
std::optional<std::string> AttemptIdToUuid(std::string_view attempt_id);
std::optional<std::string> UuidToAttemptId(std::string_view uuid);

// "_c_<uuid>-": the prefix every entry of one attempt starts with.
Result<std::string> ProtectedPrefix(std::string_view attempt_id);

// "_c_<uuid>-<tag>": the name dlock creates, to which the server appends the
// sequence (or to which FormatSequence(seq) is appended for a downgrade).
Result<std::string> EntryNamePrefix(std::string_view kind, std::string_view attempt_id);

// The server's format: "%010d".
std::string FormatSequence(std::int32_t sequence);

// Parses a sequence suffix exactly as the server writes it: ten digits, or
// '-' and nine or ten digits. Values are signed 32-bit.
std::optional<std::int32_t> ParseSequence(std::string_view text);

// The entry a child name stands for (id, kind, sequence, attempt_id), or
// nullopt if the child is not an entry.
std::optional<Entry> ParseChildName(std::string_view name);

// True if `name` has a known entry shape (see above): it is an entry whatever
// its znode is.
bool HasKnownEntryShape(std::string_view name);

// The children of a queue, split: `entries` of a known shape, sorted
// (QueueOrder), and `unsure`: names with a sequence suffix but no known shape,
// entries only if ephemeral (IsSessionOwner of their stat's ephemeralOwner).
struct ParsedChildren {
  std::vector<Entry> entries;
  std::vector<Entry> unsure;
};
ParsedChildren ParseChildren(const std::vector<std::string>& children);

// True if a znode's ephemeralOwner is a session: not 0 (persistent), not a
// container's or a TTL node's marker.
bool IsSessionOwner(std::int64_t ephemeral_owner);

// ValidateLockName, and no segment of a known entry shape: the zk store's
// rule for queue names.
Status ValidateQueueName(std::string_view queue);

// The znode path of a queue: chroot + "/" + queue ("" chroot: "/" + queue).
std::string QueuePath(std::string_view chroot, std::string_view queue);

// Every ancestor-or-self path of `path` below the root, shallowest first:
// "/a/b/c" -> {"/a", "/a/b", "/a/b/c"}.
std::vector<std::string> PathPrefixes(std::string_view path);

// An entry id as the store accepts it: a single, non-empty znode name.
Status ValidateEntryId(std::string_view id);

}  // namespace dlock::internal::zk

#endif  // DLOCK_SRC_STORES_ZOOKEEPER_ZK_NAMES_HPP_
