// Internal: decoding what the redis:// store's scripts return about entries
// (emit() in redis_scripts.cpp), apart from the store so that a fuzz target
// can reach it without a server.
#ifndef DLOCK_SRC_STORES_REDIS_REDIS_ENTRIES_HPP_
#define DLOCK_SRC_STORES_REDIS_REDIS_ENTRIES_HPP_

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "dlock/status.hpp"
#include "dlock/store.hpp"
#include "stores/redis/redis_conn.hpp"

namespace dlock::internal::redis {

// A whole decimal number, nothing before or after it.
template <typename T>
bool ParseNumber(std::string_view s, T& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

// `kind` if it is an entry_kind, else "foreign".
std::string KnownKind(std::string_view kind);

// The entries of array reply `r` from element `from` on: per entry the
// strings id, seq, token, kind, attempt (+ owner if `owners`) (+ value
// version and value, nil for none, if `values`). On success every entry has
// a non-empty id, a sequence, a token and a KnownKind, an owner only if
// `owners` (and it decoded), and the list is in QueueOrder. Anything else is
// kInternal.
Result<std::vector<Entry>> ParseEntries(const Reply& r, std::size_t from, bool owners, bool values = false);

// What the read-head script returns: the head, its stamp as the position,
// and the soonest lease end among the queue's sessions (-1: none).
struct HeadReading {
  Head head;
  std::int64_t soonest_ttl_ms = -1;
};
Result<HeadReading> ParseHead(const Reply& r, bool owners);

}  // namespace dlock::internal::redis

#endif  // DLOCK_SRC_STORES_REDIS_REDIS_ENTRIES_HPP_
