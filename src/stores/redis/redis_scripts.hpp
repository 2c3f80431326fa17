// Internal: the Lua scripts of the redis:// store and its key layout.
//
// Key layout (Q = the queue name, SID = a session id, ID = an entry id):
//
//   dlock:session:SID      STRING, PX ttl. The session's lease; the value is
//                          a JSON note (host, pid) for people.
//   dlock:{Q}:q            ZSET member ID, score = the entry's sequence.
//   dlock:{Q}:e:ID         HASH seq, kind, attempt, session, token, owner,
//                          vv (value version, 1 at first), value (if any).
//   dlock:{Q}:s:SID        STRING, PX ttl: the session's lease *mirrored into
//                          this queue*. An entry is live while the mirror of
//                          its session exists.
//   dlock:{Q}:n            STRING counter: sequence and fencing token
//                          (kAppend in redis_scripts.cpp says why tokens
//                          keep growing).
//   dlock:{Q}:a:ATTEMPT    STRING, PX ttl: find_own settled this attempt; a
//                          late append of it makes nothing (kFindOwn).
//   dlock:{Q}:c[:DB]       pub/sub channel (not a key): the ids of entries
//                          removed from the queue, space separated.
//   dlock:{Q}:p            STRING: the head stamp, moved on whenever the
//                          queue's head changes (kPrelude's head_changed),
//                          deleted with the queue's last entry; a head
//                          reading of an empty queue makes one, PX 60s.
//   dlock:{Q}:h[:DB]       pub/sub channel: the new head stamp, for head
//                          watches.
//
// Why a mirror: every key of one queue carries the hash tag {Q}, so a queue
// lives in one cluster slot and each script touches one slot. The session key
// lives elsewhere, so the scripts cannot read it on a cluster; instead the
// keep-alive renews, next to the session key, one mirror per queue in which
// the session has entries, and the scripts test the mirror. The client counts
// its lease from the oldest of those renewals (see RedisSession).
//
// The scripts reach entry hashes and mirrors by names built from ARGV[1]
// (the "dlock:{Q}:" prefix) rather than through KEYS. They share the queue's
// hash tag, hence its slot, so this holds on a cluster too; it is the one
// liberty taken with the "declare every key" rule.
#ifndef DLOCK_SRC_STORES_REDIS_REDIS_SCRIPTS_HPP_
#define DLOCK_SRC_STORES_REDIS_REDIS_SCRIPTS_HPP_

#include <string>
#include <string_view>

namespace dlock::internal::redis {

enum class ScriptId {
  kAppend,       // KEYS zset, counter, entry, mirror
  kRemove,       // KEYS zset
  kList,         // KEYS zset
  kReadHead,     // KEYS zset
  kUpdate,       // KEYS zset
  kFindOwn,      // KEYS zset, mirror
  kCheckGone,    // KEYS zset
  kCloseQueue,   // KEYS zset, mirror
  kRenewMirror,  // KEYS mirror (checks the session's entries too)
  kProbe,        // no keys; checks that scripting works
  kCount,
};

inline constexpr int kScriptCount = static_cast<int>(ScriptId::kCount);

// The Lua source of a script.
const std::string& ScriptSource(ScriptId id);
std::string_view ScriptName(ScriptId id);

}  // namespace dlock::internal::redis

#endif  // DLOCK_SRC_STORES_REDIS_REDIS_SCRIPTS_HPP_
