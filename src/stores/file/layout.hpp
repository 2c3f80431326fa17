// Internal: how the file store lays out a store directory.
//
//   DIR/.counter             8 bytes, little-endian: the last fencing token
//                            handed out; updated under an exclusive flock
//   DIR/.wake/NONCE          a FIFO per entry; its owner keeps it open for
//                            reading and writing so that waiters' poll() sees
//                            POLLHUP when the owner goes, or POLLIN when a
//                            remover writes a byte into it
//   DIR/q.QUEUE/ENTRY        one file per entry, flock(LOCK_EX)ed by its owner
//                            for as long as it lives; content: the owner
//                            record (JSON), plus "value" and "vv" (its
//                            version) for an entry with a published value
//   DIR/q.QUEUE/.tmp.NONCE   an entry being appended (not yet visible)
//   DIR/.heads/q.QUEUE/      made by the first watch of QUEUE's head, kept:
//     .position              8 bytes, little-endian: the largest token of an
//                            entry that became the head by its append since
//                            the directory was made (the counter then, at
//                            first), written under the counter's exclusive lock
//     NONCE                  a FIFO per pending head watch, open read-write by
//                            its watcher; a byte in it wakes the watch
//     .tmp.NONCE             a head watch's FIFO being made
//
// ENTRY is "SEQUENCE.TOKEN.KIND.ATTEMPT.NONCE" (numbers zero-padded to 20
// digits); it is also the entry's id.
#ifndef DLOCK_SRC_STORES_FILE_LAYOUT_HPP_
#define DLOCK_SRC_STORES_FILE_LAYOUT_HPP_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dlock::internal::file_store {

inline constexpr std::string_view kCounterFile = ".counter";
inline constexpr std::string_view kWakeDir = ".wake";
inline constexpr std::string_view kHeadsDir = ".heads";
inline constexpr std::string_view kPositionFile = ".position";
inline constexpr std::string_view kTempPrefix = ".tmp.";
inline constexpr std::size_t kNonceLength = 32;

// The one flat directory name of a queue (a valid lock name): "/" is
// escaped, so "a" and "a/b" never share a directory. Names too long for one
// path component are hashed.
std::string QueueDirName(std::string_view queue);

struct EntryName {
  std::int64_t sequence = 0;
  std::uint64_t token = 0;
  std::string kind;
  std::string attempt_id;
  std::string nonce;  // kNonceLength lower-case hex digits
};

std::string FormatEntryName(const EntryName& name);
// nullopt unless `text` is exactly what FormatEntryName makes.
std::optional<EntryName> ParseEntryName(std::string_view text);

// Kinds: 1-64 of [A-Za-z0-9_-]. Attempt ids: 0-64 of the same.
bool IsValidKind(std::string_view kind) noexcept;
bool IsValidAttemptId(std::string_view attempt_id) noexcept;
bool IsNonce(std::string_view text) noexcept;

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);

}  // namespace dlock::internal::file_store

#endif  // DLOCK_SRC_STORES_FILE_LAYOUT_HPP_
