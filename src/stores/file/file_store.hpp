// Internal: the host-local store behind file:// URLs.
#ifndef DLOCK_SRC_STORES_FILE_FILE_STORE_HPP_
#define DLOCK_SRC_STORES_FILE_FILE_STORE_HPP_

#include <memory>

#include "core/url.hpp"
#include "dlock/store.hpp"

namespace dlock::internal {

// file:///dir, or file:// for the default directory.
Result<std::shared_ptr<Store>> OpenFileStore(const ParsedUrl& url, const StoreOptions& options);

}  // namespace dlock::internal

#endif  // DLOCK_SRC_STORES_FILE_FILE_STORE_HPP_
