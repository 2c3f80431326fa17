// Internal: the etcd store behind etcd:// URLs (docs/etcd.md).
//
//   etcd://[user:password@]host:port[,host:port...][/prefix]
//          [?ttl=10s&connect_timeout=10s&ca=FILE&cert=FILE&key=FILE]
//
//  - Every host:port goes into one gRPC channel, which connects to one that
//    answers and moves on when it fails. The default port is 2379.
//  - prefix: every key dlock writes starts with "prefix/"; without one, keys
//    start at the root of the keyspace, where Go's concurrency.NewMutex and
//    `etcdctl lock` put theirs, so that the same lock name meets theirs.
//  - ttl: the session's lease (default 10s, whole seconds; the server may
//    raise it to its minimum). A keep-alive renews it every ttl/3 on the
//    store's one LeaseKeepAlive stream; the client declares its session lost,
//    from its own monotonic clock, a tenth of the TTL before the lease can run
//    out on the server, counting from when the last answered renewal was
//    *sent*, and at once when a renewal answers TTL <= 0.
//  - ca / cert / key: TLS (PEM files): the CA that signed the server's
//    certificate; a client certificate and its key for servers that ask for
//    one. Any of them turns TLS on.
//  - user:password: etcd's authentication (a token from Authenticate, sent
//    with every call).
//
// What this store guarantees: etcd orders every change through its raft log,
// so entries, revisions and leases are those of the cluster's majority;
// fencing tokens (revisions) grow across the whole cluster, restarts and
// leader changes included. A leader change only extends leases (the new
// leader's lessor renews every lease to a full TTL), so a deadline the client
// computed from an answered renewal stays safe. The client times leases with
// the injected clock while the server times them in real time: that clock
// must not run slower than real time (Clock::system(); not a ManualClock).
#ifndef DLOCK_SRC_STORES_ETCD_ETCD_STORE_HPP_
#define DLOCK_SRC_STORES_ETCD_ETCD_STORE_HPP_

#include <memory>

#include "core/url.hpp"
#include "dlock/store.hpp"

namespace dlock::internal {

// Connects (within the connect timeout) and authenticates. Errors:
// kInvalidArgument (bad URL, unreadable TLS file), kUnavailable
// (unreachable), kUnauthenticated (wrong user or password).
Result<std::shared_ptr<Store>> OpenEtcdStore(const ParsedUrl& url, const StoreOptions& options);

}  // namespace dlock::internal

#endif  // DLOCK_SRC_STORES_ETCD_ETCD_STORE_HPP_
