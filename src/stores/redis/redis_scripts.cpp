#include "stores/redis/redis_scripts.hpp"

#include <array>

namespace dlock::internal::redis {
namespace {

// Shared by the queue scripts. ARGV[1] is the queue's key prefix
// "dlock:{Q}:", ARGV[2] its pub/sub channel, KEYS[1] its sorted set.
//
// prune() drops the entries whose session mirror is gone (that session's
// lease ran out), publishes their ids, and returns the smallest PTTL of the
// mirrors of the sessions still present (-1 if none): when the next one can
// run out, for the waiters' fallback re-check.
//
// forget_counter() deletes the counter of a queue that has become empty:
// nothing is kept per name once nobody uses it. The next append takes its
// token from the server's clock (see kAppend), which is past every token
// handed out as long as the counter is behind the clock; in the rare case it
// is not (appends within one microsecond), the counter stays until the queue
// empties again.
//
// head_changed() marks a change of the queue's head (another entry first,
// the queue emptied or no longer empty, the head's value changed): it moves
// the queue's head stamp dlock:{Q}:p on, or deletes it with the queue's
// last entry (nothing is kept for an empty queue), and publishes on the head
// channel dlock:{Q}:h[:DB] (named like the removal channel ARGV[2], so no
// caller passes it). The stamp is a head watch's Head::position, so that a
// head that came and went between a reading and the watch's check still
// shows: a reading that finds no stamp makes one (kReadHead), and like
// tokens a stamp takes the server's clock in microseconds when that is
// ahead, so a stamp made after one went never repeats it.
//
// An entry is emitted as 5 strings: id, seq, token, kind, attempt (+ owner)
// (+ value version and value, a nil reply when it has none).
constexpr const char* kPrelude = R"lua(
local base, chan, zkey = ARGV[1], ARGV[2], KEYS[1]
local hchan, pkey = base .. 'h' .. string.sub(chan, #base + 2), base .. 'p'
local function ekey(id) return base .. 'e:' .. id end
local function mkey(sid) return base .. 's:' .. sid end
local function next_stamp()
  local t = redis.call('TIME')
  local p = math.max(tonumber(redis.call('GET', pkey) or '0') + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
  return string.format('%.0f', p)
end
local function head_changed()
  if redis.call('EXISTS', zkey) == 0 then
    redis.call('DEL', pkey)
    redis.call('PUBLISH', hchan, 'empty')
    return
  end
  local ps = next_stamp()
  redis.call('SET', pkey, ps)
  redis.call('PUBLISH', hchan, ps)
end
local function forget_counter()
  if redis.call('EXISTS', zkey) == 1 then return end
  local n = redis.call('GET', base .. 'n')
  if not n then return end
  local t = redis.call('TIME')
  if tonumber(n) < tonumber(t[1]) * 1000000 + tonumber(t[2]) then redis.call('DEL', base .. 'n') end
end
local function prune()
  local ids = redis.call('ZRANGE', zkey, 0, -1)
  local seen, dead, soonest = {}, {}, -1
  for i = 1, #ids do
    local id = ids[i]
    local sid = redis.call('HGET', ekey(id), 'session')
    local live = false
    if sid then
      live = seen[sid]
      if live == nil then
        local pttl = redis.call('PTTL', mkey(sid))
        live = pttl ~= -2
        seen[sid] = live
        if pttl >= 0 and (soonest < 0 or pttl < soonest) then soonest = pttl end
      end
    end
    if not live then
      redis.call('ZREM', zkey, id)
      redis.call('DEL', ekey(id))
      dead[#dead + 1] = id
    end
  end
  if #dead > 0 then
    redis.call('PUBLISH', chan, table.concat(dead, ' '))
    forget_counter()
    if dead[1] == ids[1] then head_changed() end
  end
  return soonest
end
local function emit(out, id, owners, values)
  local f = redis.call('HMGET', ekey(id), 'seq', 'token', 'kind', 'attempt', 'owner')
  out[#out + 1] = id
  out[#out + 1] = f[1] or '0'
  out[#out + 1] = f[2] or '0'
  out[#out + 1] = f[3] or ''
  out[#out + 1] = f[4] or ''
  if owners then out[#out + 1] = f[5] or '' end
  if values then
    -- Apart: the lock path's readings need not copy values of up to 64 KiB.
    local v = redis.call('HMGET', ekey(id), 'vv', 'value')
    out[#out + 1] = v[1] or '1'
    out[#out + 1] = v[2]
  end
end
local function emit_all(out, owners, values)
  local ids = redis.call('ZRANGE', zkey, 0, -1)
  for i = 1, #ids do emit(out, ids[i], owners, values) end
end
)lua";

// KEYS: zset, counter, entry hash, own mirror.
// ARGV: prefix, channel, id, kind, attempt, session, owner, mirror ttl (ms),
//       sequence ('' for a new one)[, value].
// Returns {seq, token, queue...}, or {'fenced'} if find_own has given up on
// the attempt (see kFindOwn): then it makes nothing. Idempotent: running it
// again with the same id changes nothing and returns the same entry.
//
// The token is one more than the counter, and at least the server's clock in
// microseconds. A server that restarted from an older snapshot or
// append-only file, or a promoted replica that lagged, has an older counter
// (or none): the clock has moved on past every token handed out since, so
// tokens keep growing across such a data loss, as long as the server's clock
// does not step back (and, on a failover, the new primary's clock is not
// behind the old one's). Tokens are at most a few steps ahead of the clock:
// an append takes longer than a microsecond. Doubles hold integers exactly
// up to 2^53: good until the year 2255.
constexpr const char* kAppend = R"lua(
prune()
if redis.call('EXISTS', KEYS[3]) == 0 and redis.call('GET', base .. 'a:' .. ARGV[5]) == ARGV[6] then
  return {'fenced'}
end
local want = tonumber(ARGV[8])
local pttl = redis.call('PTTL', KEYS[4])
if pttl == -2 then
  redis.call('SET', KEYS[4], ARGV[6], 'PX', want)
elseif pttl < want then
  redis.call('PEXPIRE', KEYS[4], want)
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  -- A retry of an append that already happened (the id is random and new
  -- per append): answer as the first time, without a second token.
  local f = redis.call('HMGET', KEYS[3], 'seq', 'token')
  local again = {f[1], f[2]}
  emit_all(again, false, false)
  return again
end
local t = redis.call('TIME')
local token = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
local tok = string.format('%.0f', token)
redis.call('SET', KEYS[2], tok)
local seq = ARGV[9]
if seq == '' then seq = tok end
redis.call('ZADD', zkey, 'NX', seq, ARGV[3])
redis.call('HSET', KEYS[3], 'seq', seq, 'token', tok, 'kind', ARGV[4], 'attempt', ARGV[5],
           'session', ARGV[6], 'owner', ARGV[7], 'vv', '1')
if ARGV[10] then redis.call('HSET', KEYS[3], 'value', ARGV[10]) end
if redis.call('ZRANK', zkey, ARGV[3]) == 0 then head_changed() end
local out = {seq, tok}
emit_all(out, false, false)
return out
)lua";

// ARGV: prefix, channel, id, remover's session. Removes the entry whoever
// owns it; 1 if it was there. Publishes the id so waiters wake. The
// remover's mirror goes too once it has no entry left in the queue (an
// append makes it again), and the counter once the queue is empty.
constexpr const char* kRemove = R"lua(
local was_head = redis.call('ZRANK', zkey, ARGV[3]) == 0
local n = redis.call('ZREM', zkey, ARGV[3])
redis.call('DEL', ekey(ARGV[3]))
if n == 1 then redis.call('PUBLISH', chan, ARGV[3]) end
local ids = redis.call('ZRANGE', zkey, 0, -1)
local mine = false
for i = 1, #ids do
  if redis.call('HGET', ekey(ids[i]), 'session') == ARGV[4] then
    mine = true
    break
  end
end
if not mine then redis.call('DEL', mkey(ARGV[4])) end
forget_counter()
if was_head then head_changed() end
return n
)lua";

// ARGV: prefix, channel, '1' to include owners, '1' to include values.
constexpr const char* kList = R"lua(
prune()
local out = {}
emit_all(out, ARGV[3] == '1', ARGV[4] == '1')
return out
)lua";

// ARGV: prefix, channel, '1' to include owners. Returns {soonest mirror PTTL
// (as prune()), head stamp, the head with its value...}: one reading for
// async_read_head and for a head watch's check (whose fallback re-check
// prunes a crashed head's entry here). A queue without a stamp gets one;
// an empty queue's lasts a minute: a later reading that makes a new one
// differs, which can only wake a watch too often, never too seldom.
constexpr const char* kReadHead = R"lua(
local soonest = prune()
local stamp = redis.call('GET', pkey)
if not stamp then
  stamp = next_stamp()
  if redis.call('EXISTS', zkey) == 1 then
    redis.call('SET', pkey, stamp)
  else
    redis.call('SET', pkey, stamp, 'PX', 60000)
  end
end
local out = {soonest, stamp}
local head = redis.call('ZRANGE', zkey, 0, 0)
if head[1] then emit(out, head[1], ARGV[3] == '1', true) end
return out
)lua";

// ARGV: prefix, channel, id, session, '1' if a value is given, the value,
// the owner record ('' to keep it). Changes the session's own live entry in
// place: never its seq, token or kind. Returns the entry (with owner and
// value), or {'gone'} if it is not there or not the session's. Sent again
// after a lost reply it sets the same value once more (a new version).
constexpr const char* kUpdate = R"lua(
prune()
local id = ARGV[3]
if not redis.call('ZSCORE', zkey, id) or redis.call('HGET', ekey(id), 'session') ~= ARGV[4] then
  return {'gone'}
end
if ARGV[7] ~= '' then redis.call('HSET', ekey(id), 'owner', ARGV[7]) end
if ARGV[5] == '1' then
  redis.call('HSET', ekey(id), 'value', ARGV[6])
  redis.call('HINCRBY', ekey(id), 'vv', 1)
  if redis.call('ZRANK', zkey, id) == 0 then head_changed() end
end
local out = {}
emit(out, id, true, true)
return out
)lua";

// KEYS: zset, own mirror. ARGV: prefix, channel, attempt id, session,
// mirror ttl (ms), fence ttl (ms). The entry or {}. A found entry's mirror is
// extended like append does, since the session now counts on it again.
//
// Either way the attempt is settled: the fence key dlock:{Q}:a:ATTEMPT (its
// value is the session) makes an append of it by this session that is still
// on its way (sent on a connection that timed out) make nothing when it
// arrives, for as long as the fence lasts (the session's TTL). It is also the
// write that a WAIT after this script waits for: it comes after the entry's
// append on the server.
constexpr const char* kFindOwn = R"lua(
prune()
redis.call('SET', base .. 'a:' .. ARGV[3], ARGV[4], 'PX', ARGV[6])
local ids = redis.call('ZRANGE', zkey, 0, -1)
for i = 1, #ids do
  local f = redis.call('HMGET', ekey(ids[i]), 'attempt', 'session')
  if f[1] == ARGV[3] and f[2] == ARGV[4] then
    local want = tonumber(ARGV[5])
    if redis.call('PTTL', KEYS[2]) < want then redis.call('PEXPIRE', KEYS[2], want) end
    local out = {}
    emit(out, ids[i], false, false)
    return out
  end
end
return {}
)lua";

// ARGV: prefix, channel, own session ('' for none), ids...
// Returns {soonest mirror PTTL, own mirror exists (1/0), gone ids...}: the
// waiter's own lease in the queue is checked on the way, so that a session
// whose lease the server lost (a restart without data) hears it here first.
constexpr const char* kCheckGone = R"lua(
local soonest = prune()
local own = 1
if ARGV[3] ~= '' then own = redis.call('EXISTS', mkey(ARGV[3])) end
local out = {soonest, own}
for i = 4, #ARGV do
  if not redis.call('ZSCORE', zkey, ARGV[i]) then out[#out + 1] = ARGV[i] end
end
return out
)lua";

// KEYS: zset, own mirror. ARGV: prefix, channel. Ends the session in this
// queue: without its mirror, prune() removes (and announces) its entries.
constexpr const char* kCloseQueue = R"lua(
redis.call('DEL', KEYS[2])
prune()
forget_counter()
return 1
)lua";

// KEYS: mirror. ARGV: ttl (ms), prefix, session, ids...
// Extends the mirror to at least ttl (never shortens it). Returns {0} if the
// mirror is gone, else {1, ids...}: those of the given entries (the ones the
// session holds on to) that are no longer the session's entries in the
// queue, which a server that lost data would show.
//
// A mirror that is gone stays gone: it ran out (or the server lost it), its
// entries are dead, and a renewal that arrives late must not bring them back.
constexpr const char* kRenewMirror = R"lua(
local want = tonumber(ARGV[1])
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then return {0} end
if pttl < want then redis.call('PEXPIRE', KEYS[1], want) end
local out = {1}
for i = 4, #ARGV do
  local id = ARGV[i]
  if redis.call('HGET', ARGV[2] .. 'e:' .. id, 'session') ~= ARGV[3] or
     not redis.call('ZSCORE', ARGV[2] .. 'q', id) then
    out[#out + 1] = id
  end
end
return out
)lua";

constexpr const char* kProbe = "return 1";

std::array<std::string, kScriptCount> Build() {
  std::array<std::string, kScriptCount> out;
  auto queue = [](const char* body) { return std::string(kPrelude) + body; };
  out[static_cast<int>(ScriptId::kAppend)] = queue(kAppend);
  out[static_cast<int>(ScriptId::kRemove)] = queue(kRemove);
  out[static_cast<int>(ScriptId::kList)] = queue(kList);
  out[static_cast<int>(ScriptId::kReadHead)] = queue(kReadHead);
  out[static_cast<int>(ScriptId::kUpdate)] = queue(kUpdate);
  out[static_cast<int>(ScriptId::kFindOwn)] = queue(kFindOwn);
  out[static_cast<int>(ScriptId::kCheckGone)] = queue(kCheckGone);
  out[static_cast<int>(ScriptId::kCloseQueue)] = queue(kCloseQueue);
  out[static_cast<int>(ScriptId::kRenewMirror)] = kRenewMirror;
  out[static_cast<int>(ScriptId::kProbe)] = kProbe;
  return out;
}

}  // namespace

const std::string& ScriptSource(ScriptId id) {
  static const std::array<std::string, kScriptCount> sources = Build();  // immutable after init
  return sources[static_cast<int>(id)];
}

std::string_view ScriptName(ScriptId id) {
  switch (id) {
    case ScriptId::kAppend: return "append";
    case ScriptId::kRemove: return "remove";
    case ScriptId::kList: return "list";
    case ScriptId::kReadHead: return "read_head";
    case ScriptId::kUpdate: return "update";
    case ScriptId::kFindOwn: return "find_own";
    case ScriptId::kCheckGone: return "check_gone";
    case ScriptId::kCloseQueue: return "close_queue";
    case ScriptId::kRenewMirror: return "renew_mirror";
    case ScriptId::kProbe: return "probe";
    case ScriptId::kCount: break;
  }
  return "?";
}

}  // namespace dlock::internal::redis
