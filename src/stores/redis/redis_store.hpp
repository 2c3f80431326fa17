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
//  - wait_replicas=N: every append is followed by WAIT N; if fewer than N
//    replicas acknowledge within wait_timeout (default 1s), the store removes
//    the entry again and the append fails with kAborted. find_own WAITs too
//    before it returns an entry it found (and takes it back the same way).
//    Removes WAIT as well, but one that falls short has still happened on
//    the primary: it counts as done.
//
// What this store guarantees, honestly:
//  - Against one Redis primary that keeps running, entries, leases and
//    fencing tokens behave as dlock/store.hpp says.
//  - Replication in Redis is asynchronous, and a restart from an RDB snapshot
//    or an append-only file (fsync every second) can lose the last writes. A
//    failover can promote a replica that had not yet received an append, and
//    a restart can bring back an older state: two holders can then overlap.
//    WAIT narrows the window (the write reached N replicas) but is not
//    consensus: the promoted replica need not be one that acknowledged.
//  - After such a loss, fencing tokens still grow: each append takes
//    max(counter + 1, the server's clock in microseconds), so it is past
//    every token handed out before, as long as the server's clock does not
//    step back (and a promoted replica's clock is not behind the old
//    primary's). A holder whose entry was lost is told kLost at its next
//    renewal (every ttl/3), which checks that the session's entries still
//    exist; until then another client may already hold the lock, with a
//    larger token. Fencing tokens are how a resource protects itself. (An
//    entry someone else removed, `dlock break`, ends its holder's session
//    the same way.)
//  - A renewal never makes a lease again: one that arrives after the lease
//    ran out on the server leaves the session's dead entries dead.
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
