// Internal: the rule every store applies to an entry's published value
// (EntrySpec::value, EntryUpdate::value in dlock/store.hpp).
#ifndef DLOCK_SRC_STORES_ENTRY_VALUE_HPP_
#define DLOCK_SRC_STORES_ENTRY_VALUE_HPP_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dlock/status.hpp"

namespace dlock::internal {

// At most 64 KiB: what every store can keep in one entry (a ZooKeeper
// node's data, a Redis field, an etcd value, a file) with room to spare.
inline constexpr std::size_t kMaxEntryValue = 64 * 1024;

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or
// code points above U+10FFFF).
inline bool IsUtf8(std::string_view text) noexcept {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
    const unsigned char c = byte(i);
    std::size_t length = 0;
    std::uint32_t code = 0;
    std::uint32_t least = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      length = 2, code = c & 0x1fu, least = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      length = 3, code = c & 0x0fu, least = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      length = 4, code = c & 0x07u, least = 0x10000;
    } else {
      return false;
    }
    if (text.size() - i < length) return false;
    for (std::size_t k = 1; k < length; ++k) {
      if ((byte(i + k) & 0xc0) != 0x80) return false;
      code = (code << 6) | (byte(i + k) & 0x3fu);
    }
    if (code < least || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return false;
    i += length;
  }
  return true;
}

// Values are text: ZooKeeper's Curator and etcdctl read them as UTF-8, and
// the file store keeps them in JSON.
inline Status CheckEntryValue(const std::optional<std::string>& value) {
  if (!value) return OkStatus();
  if (value->size() > kMaxEntryValue) {
    return InvalidArgumentError("an entry's value is " + std::to_string(value->size()) + " bytes; the limit is " +
                                std::to_string(kMaxEntryValue));
  }
  if (!IsUtf8(*value)) return InvalidArgumentError("an entry's value must be UTF-8 text");
  return OkStatus();
}

}  // namespace dlock::internal

#endif  // DLOCK_SRC_STORES_ENTRY_VALUE_HPP_
