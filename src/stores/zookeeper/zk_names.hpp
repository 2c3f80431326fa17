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
//
// <seq> is the server's suffix: the parent's cversion formatted "%010d"
// (signed: after 2^31 creations in one parent it wraps to negative numbers,
// e.g. "-000000005" or "-2147483648").
//
// The listing also understands kazoo's names (<32 hex>__lock__<seq> for Lock
// and WriteLock, <32 hex>__rlock__<seq> for ReadLock) and reports any other
// child with a sequence suffix as kind "foreign". Children without a sequence
// suffix (kazoo's Semaphore leases, stray nodes) are not entries.
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

// Every entry among `children`, sorted (QueueOrder).
std::vector<Entry> ParseChildren(const std::vector<std::string>& children);

// The znode path of a queue: chroot + "/" + queue ("" chroot: "/" + queue).
std::string QueuePath(std::string_view chroot, std::string_view queue);

// Every ancestor-or-self path of `path` below the root, shallowest first:
// "/a/b/c" -> {"/a", "/a/b", "/a/b/c"}.
std::vector<std::string> PathPrefixes(std::string_view path);

// An entry id as the store accepts it: a single, non-empty znode name.
Status ValidateEntryId(std::string_view id);

}  // namespace dlock::internal::zk

#endif  // DLOCK_SRC_STORES_ZOOKEEPER_ZK_NAMES_HPP_
