// Internal: the Redis store behind redis:// URLs.
//
//   redis://[user:password@]host[:port][/db][?ttl=30s&connect_timeout=10s
//           &wait_replicas=N&wait_timeout=1s]
//
//  - ttl: the session lease (default 30s, at least 100ms). A keep-alive renews
//    it every ttl/3; the client declares its session lost, from its own
//    monotonic clock, a tenth of the TTL before the lease can run out on the
//    server, counting from the moment the last successful renewal was *sent*.
//  - connect_timeout: for connecting, and for each request (default: the
//    StoreOptions value, 10s).
//  - wait_replicas=N: every append and remove is followed by WAIT N, and fails
//    with kUnavailable if fewer than N replicas acknowledged it within
//    wait_timeout (default 1s).
//
// What this store guarantees, honestly:
//  - Against one Redis primary that keeps running, entries, leases and
//    fencing tokens behave as dlock/store.hpp says.
//  - Replication in Redis is asynchronous. A failover can promote a replica
//    that had not yet received an append, and a restart without persistence
//    forgets everything: two holders can then overlap. WAIT narrows the window
//    (the write reached N replicas) but is not consensus: the promoted replica
//    need not be one that acknowledged. Fencing tokens are how a resource
//    protects itself; this store's tokens keep growing even across such a
//    loss (they start from the server's clock, see redis_scripts.cpp), as
//    long as the servers' clocks do not step back.
//  - Redis expires keys by the server's wall clock. A server clock that jumps
//    forward ends leases early; dlock cannot detect that.
//  - Use `maxmemory-policy noeviction` (the default): an evicted lease key
//    ends its session early.
//  - The client times leases with the injected clock (StoreOptions::clock),
//    while the server times them in real time: that clock must not run slower
//    than real time. Clock::system() is right; a ManualClock is not.
//  - Sessions are single-node: the store speaks to one server and follows no
//    cluster redirection. The key layout is ready for a cluster (every key of
//    a queue shares its hash tag); see redis_scripts.hpp.
#ifndef DLOCK_SRC_STORES_REDIS_REDIS_STORE_HPP_
#define DLOCK_SRC_STORES_REDIS_REDIS_STORE_HPP_

#include <memory>

#include "core/url.hpp"
#include "dlock/store.hpp"

namespace dlock::internal {

// Connects (within the connect timeout), authenticates and loads the scripts.
// Errors: kInvalidArgument (bad URL), kUnavailable (unreachable),
// kUnauthenticated (wrong or missing password), kPermissionDenied (an ACL
// forbids a command dlock needs), kFailedPrecondition (the server refuses
// scripts, e.g. EVAL renamed or disabled).
Result<std::shared_ptr<Store>> OpenRedisStore(const ParsedUrl& url, const StoreOptions& options);

}  // namespace dlock::internal

#endif  // DLOCK_SRC_STORES_REDIS_REDIS_STORE_HPP_
