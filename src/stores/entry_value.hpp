// Internal: the rule every store applies to an entry's published value
// (EntrySpec::value, EntryUpdate::value in dlock/store.hpp).
#ifndef DLOCK_SRC_STORES_ENTRY_VALUE_HPP_
#define DLOCK_SRC_STORES_ENTRY_VALUE_HPP_

#include <optional>
#include <string>

#include "dlock/status.hpp"

namespace dlock::internal {

// At most 64 KiB: what every store can keep in one entry (a ZooKeeper
// node's data, a Redis field, an etcd value, a file) with room to spare.
inline constexpr std::size_t kMaxEntryValue = 64 * 1024;

inline Status CheckEntryValue(const std::optional<std::string>& value) {
  if (value && value->size() > kMaxEntryValue) {
    return InvalidArgumentError("an entry's value is " + std::to_string(value->size()) + " bytes; the limit is " +
                                std::to_string(kMaxEntryValue));
  }
  return OkStatus();
}

}  // namespace dlock::internal

#endif  // DLOCK_SRC_STORES_ENTRY_VALUE_HPP_
