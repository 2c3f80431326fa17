// Internal: the host-local store behind file:// URLs: one directory, shared
// by every process of the user on this host; no daemon. Entries are files
// held with flock, so a crashed process's entries are gone at once; waits
// are FIFOs (one per entry) in one epoll thread per store, shared by all its
// sessions. See file_store.cpp and layout.hpp.
//
// Limits: the directory must be on a local file system (network ones are
// refused); each live entry costs its owner two file descriptors, each
// pending wait one per entry it waits for (out of descriptors, a wait ends
// with kUnavailable at once); a process forked without exec shares its
// parent's entries until it exits.
#ifndef DLOCK_SRC_STORES_FILE_FILE_STORE_HPP_
#define DLOCK_SRC_STORES_FILE_FILE_STORE_HPP_

#include <memory>

#include "core/unique_fd.hpp"
#include "core/url.hpp"
#include "dlock/store.hpp"

namespace dlock::internal {

// file:///dir, or file:// for the default directory.
Result<std::shared_ptr<Store>> OpenFileStore(const ParsedUrl& url, const StoreOptions& options);

// The directory file:// names: one per user, whatever the environment.
std::string DefaultFileStoreDirectory();

// Opens `path` (creating it if missing) as a private directory of this user
// in a shared place: not a symlink, owned by the effective uid, mode 0700.
Result<UniqueFd> OpenPrivateDirectory(const std::string& path);

}  // namespace dlock::internal

#endif  // DLOCK_SRC_STORES_FILE_FILE_STORE_HPP_
