// Internal: the ZooKeeper store behind zk:// URLs (see zk_config.hpp for the
// URL, zk_names.hpp for the znode layout, zk_session.hpp for sessions).
#ifndef DLOCK_SRC_STORES_ZOOKEEPER_ZK_STORE_HPP_
#define DLOCK_SRC_STORES_ZOOKEEPER_ZK_STORE_HPP_

#include <memory>

#include "core/url.hpp"
#include "dlock/store.hpp"

namespace dlock::internal {

// zk://[user:password@]host[:port][,host[:port]...][/chroot][?options].
// Checks the URL only; open_session connects.
Result<std::shared_ptr<Store>> OpenZkStore(const ParsedUrl& url, const StoreOptions& options);

}  // namespace dlock::internal

#endif  // DLOCK_SRC_STORES_ZOOKEEPER_ZK_STORE_HPP_
