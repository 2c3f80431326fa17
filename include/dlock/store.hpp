// File: dlock/store.hpp
//
// The coordination-store interface: the few primitives every dlock recipe is
// built from. Recipes (Mutex, Semaphore, ReadWriteLock) see only this file;
// each store (mem://, file://, zk://, redis://, ...) implements it behind a URL.
//
// The model, in the terms of ZooKeeper's lock recipe:
//
//  - A *session* owns everything it creates. While it is kConnected its
//    entries are alive. kSuspended means contact with the store is lost and
//    may come back; the entries may or may not survive. kLost means the
//    session expired: all its entries are gone, or will be before any other
//    session can observe them as gone. kClosed means it was closed locally.
//
//  - A *queue* (named like a lock: "orders/42") holds *entries* in order. A
//    session appends an ephemeral entry tagged with a kind ("lock", "read",
//    "write", "lease", "candidate"), an owner record and, for an election
//    candidate, a value that it may change in place. Every entry gets a fencing token,
//    a number that only grows for its queue (ZooKeeper's czxid and the file
//    store's counter grow across the whole store; Redis keeps one counter per
//    queue), so a resource can refuse a holder whose token is older than one
//    it has already seen.
//
//  - Waiting is for one thing only: until some given entries are gone. The
//    store wakes the waiter (a watch, a blocking query, a pub/sub message, the
//    kernel); it never sleeps and polls.
//
// Stores are thread-safe: every method may be called from any thread at once.
//
// Queue names are lock names (ValidateLockName below, which every store
// applies); the recipes add suffixes such as "/locks" and "/leases", which
// are lock names too. Queues whose names nest ("a" and "a/b") are unrelated:
// no entry of one is ever listed in, or waited for by, the other.
#ifndef DLOCK_STORE_HPP_
#define DLOCK_STORE_HPP_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "dlock/clock.hpp"
#include "dlock/export.hpp"
#include "dlock/status.hpp"

namespace dlock {

// dlock::SessionState
enum class SessionState {
  kConnected,  // entries are alive and the store is answering
  kSuspended,  // contact lost; entries may survive if contact comes back in time
  kLost,       // expired: every entry of the session is gone (or going)
  kClosed,     // closed locally; entries were removed or are going with it
};
DLOCK_EXPORT std::string_view SessionStateName(SessionState state) noexcept;

// Kind tags the recipes write. Entries of other clients (Curator, kazoo) are
// mapped onto these where their meaning is the same.
namespace entry_kind {
inline constexpr std::string_view kLock = "lock";            // exclusive (Mutex)
inline constexpr std::string_view kRead = "read";            // shared side of ReadWriteLock
inline constexpr std::string_view kWrite = "write";          // exclusive side of ReadWriteLock
inline constexpr std::string_view kLease = "lease";          // one semaphore permit
inline constexpr std::string_view kCandidate = "candidate";  // an election participant (docs/election.md)
}  // namespace entry_kind

// Who made an entry. For people (`dlock status`), never for decisions.
struct OwnerRecord {
  std::string host;
  std::int64_t pid = 0;
  std::string thread;                 // the acquiring thread, or a label for thread-agnostic holds
  std::string label;                  // free text, e.g. the command `dlock run` started
  std::int64_t acquired_unix_ms = 0;  // wall clock at append time
  std::int64_t elected_unix_ms = 0;   // wall clock when a candidate was told it leads; 0: not recorded
};

// A compact JSON object. Decode accepts unknown fields and rejects anything
// that is not a JSON object with fields of the right types.
DLOCK_EXPORT std::string EncodeOwnerRecord(const OwnerRecord& owner);
DLOCK_EXPORT Result<OwnerRecord> DecodeOwnerRecord(std::string_view data);

// What to append.
struct EntrySpec {
  std::string kind;
  // Unique per acquire attempt (32 lower-case hex digits). If the reply to an
  // append is lost, `Session::find_own` finds the entry by it, so a retry can
  // adopt or delete it instead of leaving an orphan.
  std::string attempt_id;
  OwnerRecord owner;
  // If set, the entry takes this existing sequence instead of a new one, so
  // it sorts exactly where another entry of the same session is (lock
  // downgrade: the read entry takes the place of the write entry).
  std::optional<std::int64_t> sequence;
  // The entry's published value (an election candidate's proposal), kept
  // where the other clients of the store's layout read it. nullopt: none.
  // UTF-8 text of at most 64 KiB (kInvalidArgument otherwise).
  std::optional<std::string> value;
};

// An entry as read back from a store.
struct Entry {
  std::string id;                      // unique within its queue; what remove/wait take
  std::string kind;                    // an entry_kind, or "foreign" if unknown
  std::int64_t sequence = 0;           // queue order, smaller first (ties: by id)
  std::optional<std::uint64_t> token;  // fencing token, where the listing has it
  std::string attempt_id;              // empty for entries of other clients
  std::optional<OwnerRecord> owner;    // present if listed with owners
  std::optional<std::string> value;    // present if listed (or read) with values and the entry has one
  // Changes whenever the value does (never goes back for one entry); its
  // starting number is the store's. Set where `value` may be.
  std::uint64_t value_version = 0;
  // The store's own wall-clock time of the entry's making, where it keeps one
  // and the reading fetched it (zk: the node's ctime, in a listing with
  // owners or values and in read_head), so entries of other clients have one
  // too. 0: unknown (the owner record's acquired_unix_ms is dlock's own).
  std::int64_t created_unix_ms = 0;
};

// Queue order: by sequence, then by id.
DLOCK_EXPORT bool QueueOrder(const Entry& a, const Entry& b) noexcept;

struct Appended {
  Entry entry;  // always has its token
  // The whole queue right after the append, where the store read it in the
  // same atomic step (one round trip instead of two). Sorted.
  std::optional<std::vector<Entry>> queue;
};

struct ListOptions {
  bool with_owners = false;  // may cost a request per entry on some stores
  bool with_values = false;  // the same
};

// What to change in an entry of one's own (Session::update_entry). Its id,
// token, sequence and kind never change.
struct EntryUpdate {
  std::optional<std::string> value;  // the new value (UTF-8, at most 64 KiB)
  std::optional<OwnerRecord> owner;  // the new owner record
};

// The first entry of a queue, as one reading found it.
struct Head {
  std::optional<Entry> entry;  // with its value (and owner, if asked); nullopt: the queue was empty
  // Where in the store's history the reading was made, for
  // Session::async_watch_head; opaque to callers (0 where a store needs none).
  std::int64_t position = 0;
};

// dlock::Session
//
// A handle on one store session. Thread-safe. Blocking methods block the
// calling thread for at most about `deadline` (plus one store round trip) and
// return kUnavailable while the session is suspended rather than wait for it.
class DLOCK_EXPORT Session {
 public:
  virtual ~Session() = default;

  // A short printable id ("0x1000a3c9e5f0001", "pid 4242 #3").
  virtual std::string id() const = 0;

  // The state now. It folds in the session's own clock: once the moment at
  // which the session counts itself lost has passed, this returns kLost even
  // if no store thread has noticed yet (a process resumed after a pause reads
  // kLost at once, before any subscriber has been told).
  virtual SessionState state() const noexcept = 0;

  // Calls `fn(state)` on every state change after this call, in order, one
  // call at a time. `fn` runs on a store thread (or on the thread that closed
  // the session or injected a fault) without any lock of the store held, so
  // it may call back into the store and the library, close() included: a
  // change that such a call causes is delivered after `fn` returns. `fn` must
  // not block for long. An exception thrown by `fn` is caught and dropped.
  // The returned handle unsubscribes when destroyed; it does not wait for a
  // call already running, so `fn` should capture weak references.
  virtual std::shared_ptr<void> subscribe(std::function<void(SessionState)> fn) = 0;

  // Appends an entry for this session. Errors: kUnavailable (outcome unknown:
  // the entry may exist; see find_own), kAborted (the store did not keep the
  // entry, e.g. too few replicas acknowledged it in time, and nothing is
  // left of it: retrying will not help soon), kSessionLost, kPermissionDenied.
  virtual Result<Appended> append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline) = 0;

  // The queue's live entries, sorted. Entries of dead sessions are left out.
  // A queue that does not exist is empty.
  virtual Result<std::vector<Entry>> list(std::string_view queue, const ListOptions& options,
                                          Clock::time_point deadline) = 0;

  // Returns OK as soon as any entry in `ids` is gone from `queue` (already
  // gone counts). Keeps waiting through a suspension. Errors:
  // kDeadlineExceeded, kCancelled (`stop` requested), kSessionLost (this
  // session expired: its own entries are gone too), kUnavailable.
  virtual Status wait_any_gone(std::string_view queue, std::span<const std::string> ids, Clock::time_point deadline,
                               std::stop_token stop) = 0;

  // Removes one entry; OK if it was already gone. May remove another
  // session's entry (the operator's `dlock break`).
  virtual Status remove(std::string_view queue, std::string_view id, Clock::time_point deadline) = 0;

  // The entry this session appended with `attempt_id`, if it exists and is
  // still owned by this very session; nullopt otherwise. An entry it returns
  // is as durable as one a successful append returns (kAborted as for
  // append otherwise). Once it has returned nullopt, no append with
  // `attempt_id` still in flight can make the entry afterwards.
  virtual Result<std::optional<Entry>> find_own(std::string_view queue, std::string_view attempt_id,
                                                Clock::time_point deadline) = 0;

  // --- Asynchronous primitives -------------------------------------------
  //
  // The same operations without a blocked thread: what the acquisition
  // engine is built on, so one process can have any number of acquires
  // pending. Each takes a completion `done` that is called exactly once, with
  // what the blocking form would return, on a store thread or on the calling
  // thread before the call returns (a result known at once), with no lock of
  // the store held; `done` must not block, and must not throw.
  //
  // The defaults below run the blocking forms: requests on the calling
  // thread, a wait on a thread of its own. A store that has asynchronous
  // machinery of its own (watches, an event loop, the kernel) overrides
  // them; every store in this repository does (see "For implementers").
  virtual void async_append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline,
                            std::function<void(Result<Appended>)> done);
  virtual void async_list(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                          std::function<void(Result<std::vector<Entry>>)> done);
  virtual void async_remove(std::string_view queue, std::string_view id, Clock::time_point deadline,
                            std::function<void(Status)> done);
  virtual void async_find_own(std::string_view queue, std::string_view attempt_id, Clock::time_point deadline,
                              std::function<void(Result<std::optional<Entry>>)> done);

  // wait_any_gone without a deadline: `done` gets OK once any entry in `ids`
  // is gone, kSessionLost, kUnavailable or kInvalidArgument as for the
  // blocking form. Destroying the returned handle cancels the wait: if `done`
  // has not been called yet, it is called with kCancelled, at the latest
  // before the handle's destructor returns (unless the destructor runs inside
  // `done` itself). The caller keeps the session alive while it holds the
  // handle. Timeouts are the caller's: it destroys the handle on its own timer.
  virtual std::shared_ptr<void> async_wait_any_gone(std::string_view queue, std::span<const std::string> ids,
                                                    std::function<void(Status)> done);

  // async_wait_any_gone for a waiter whose own entry `own` (of this session)
  // was in the same reading of `queue` that named `ids` and `ahead` (the
  // entries ahead of `own` in it). `done` gets what async_wait_any_gone
  // would (it may also get OK when `own` goes first), plus `own_intact`:
  // true only with OK, when the store vouches that there was a moment, after
  // that reading, at which an entry of `ids` and every entry of `ahead` were
  // gone and `own` was still a live entry of the queue (as good as a list
  // read at that moment, as far as these entries go). False says nothing:
  // the caller reads the queue again. The default never vouches; a store
  // overrides it where its notifications prove it (ordered removals on one
  // connection, a check that reads them at once) at no extra round trip.
  virtual std::shared_ptr<void> async_wait_turn(std::string_view queue, std::span<const std::string> ids,
                                                std::span<const std::string> ahead, std::string_view own,
                                                std::function<void(Status, bool)> done);

  // Whether the blocking wait_any_gone sleeps in the calling thread itself,
  // woken by the kernel or the store's client (the file store polls the
  // entries' FIFOs there), rather than over async_wait_any_gone and a
  // hand-over from a store thread. If true, a blocking acquire whose steps
  // run on its caller's thread waits with it, on that thread, with its
  // deadline and stop token: one thread switch less per wake-up. Default
  // false.
  virtual bool waits_on_calling_thread() const noexcept;

  // --- Published values (elections) -------------------------------------
  //
  // What an election needs beyond a lock (docs/election.md): a value per
  // entry, changed in place, and a wake-up when a queue's head may have
  // changed.

  // Whether this store keeps EntrySpec::value and implements the calls
  // below. If false (the default), it ignores EntrySpec::value and
  // ListOptions::with_values, and the calls below answer kUnimplemented:
  // a caller that needs values checks this first.
  virtual bool keeps_values() const noexcept;

  // Whether an entry that carries a value keeps an owner record beside it
  // (default true). False on zk://, where a candidate's node data is its bare
  // value (Curator reads it as the participant's id): there, update_entry
  // with `owner` set on an entry that carries a value, or gets one in the
  // same update, answers kUnimplemented and changes nothing, and such an
  // entry lists with no owner.
  virtual bool keeps_owners_beside_values() const noexcept;

  // Changes this session's own live entry `id` of `queue` as `update` says,
  // keeping its id, token, sequence and kind; returns the entry as it is now
  // (with its value; value_version is new if `update.value` was set, and an
  // owner-only update need not wake a head watch). Errors: kFailedPrecondition
  // (no such entry, or it is not this session's), kSessionLost, kUnavailable
  // (outcome unknown: the same update may be sent again), kInvalidArgument,
  // kUnimplemented (the default; or an owner beside a value where
  // keeps_owners_beside_values() is false).
  virtual Result<Entry> update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                                     Clock::time_point deadline);
  virtual void async_update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                                  Clock::time_point deadline, std::function<void(Result<Entry>)> done);

  // One consistent reading of the queue's first entry, with its value.
  // Errors as async_list. Default: kUnimplemented where keeps_values() is
  // false, else async_list with values, its front (position 0).
  virtual void async_read_head(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                               std::function<void(Result<Head>)> done);

  // `done` gets OK as soon as the head of `queue` may differ from `seen` (a
  // reading of async_read_head; a Head made otherwise may fire at once):
  // another entry first, the queue emptied or no longer empty, or the
  // head's value_version changed; at once if it changed since the reading,
  // even if it changed back. It may also get OK when nothing changed (the
  // caller reads again), but never misses a change made after the reading
  // `seen` came from. On a store with no threads of its own (mem://), `done`
  // runs on the thread of the call that changed the head, whichever
  // session's. Keeps waiting through a suspension. Errors: kSessionLost
  // (this session ended), kUnavailable (could not be armed),
  // kInvalidArgument, kUnimplemented (the default); destroying the handle
  // cancels, with the rules of async_wait_any_gone. Woken by the store,
  // never by polling.
  virtual std::shared_ptr<void> async_watch_head(std::string_view queue, const Head& seen,
                                                 std::function<void(Status)> done);

  // Ends the session and its entries. Every subscriber hears kClosed, and has
  // returned, before any entry of the session can be seen as gone by another
  // session. Called from inside a subscriber, the close completes after that
  // subscriber returns. Idempotent; never throws.
  virtual void close() noexcept = 0;
};

// dlock::Store
//
// A connection to one store, shared by every lock of a Client. Thread-safe.
class DLOCK_EXPORT Store {
 public:
  virtual ~Store() = default;

  // The URL this store was opened with, password removed.
  virtual std::string url() const = 0;

  // Opens a new session, independent of every other: closing or losing one
  // never ends another. A session may outlive the Store that opened it (it
  // keeps what it needs alive). Errors: kUnavailable (unreachable within the
  // deadline), kUnauthenticated, kInvalidArgument.
  virtual Result<std::shared_ptr<Session>> open_session(Clock::time_point deadline) = 0;
};

// For implementers of a new store
//
//  1. Put it in src/stores/<name>/, behind a function
//       Result<std::shared_ptr<Store>> OpenXStore(const ParsedUrl&, const StoreOptions&);
//     and add one row to the table in src/core/open_store.cpp (scheme and
//     opener); SupportedSchemes() and the error texts follow from it.
//  2. Meet every rule in this file. The ones that need care:
//     - tokens only grow per queue, also across the store's own restarts and
//       failovers where it can lose data (seed from a clock if need be);
//     - state() folds in the session's own clock; a holder hears kLost from
//       that clock no later than the store could give its entries away;
//     - subscribers are called in order, one at a time, without locks held,
//       and may call back in (close() included); close() tells them first;
//     - an append whose outcome is unknown is kUnavailable, and find_own must
//       then be able to find the entry, and fence a late append off;
//     - queue names are ValidateLockName's, and nested names are unrelated;
//     - every wait follows StoreOptions::clock and its on_advance(), unless
//       the store cannot run on a hand-moved clock (say so, as Redis does);
//     - the asynchronous primitives are the ones the recipes use (and, for
//       a store that keeps values, async_update_entry, async_read_head and
//       async_watch_head): override them with the store's own asynchronous
//       machinery, so that pending acquires cost no thread each (at most 4
//       threads per store client, the acquisition engine's included), and
//       run every completion exactly once, cancellations included.
//  3. Run tests/store/conformance_test.cpp on it: a server script
//     tests/servers/<name>.sh, dlock_add_server_fixture() and one
//     dlock_add_server_suite() per shared suite (tests/CMakeLists.txt;
//     CONTRIBUTING.md, "Adding a store"); the recipe, injected-fault,
//     process and CLI suites take the same URL. A store is accepted when
//     those suites pass on it, under ASan and TSan too.

struct StoreOptions {
  std::shared_ptr<Clock> clock;  // nullptr: Clock::system()
  std::chrono::milliseconds connect_timeout{10'000};
};

// Opens the store a URL names:
//   mem://                    a new in-process store
//   file:///some/dir          host-local, multi-process, no daemon
//   file://                   the default directory: /tmp/dlock-<uid>, whatever the environment
// plus each server store compiled in (see README). Unknown schemes and
// malformed URLs fail with kInvalidArgument naming what is wrong.
DLOCK_EXPORT Result<std::shared_ptr<Store>> OpenStore(std::string_view url, const StoreOptions& options = {});

// The schemes this build of dlock understands, e.g. {"file", "mem", "zk"}.
DLOCK_EXPORT std::vector<std::string> SupportedSchemes();

// Lock names are path-like: "/"-separated segments of [A-Za-z0-9._-],
// at most 512 bytes; no empty, "." or ".." segments; no leading or trailing
// "/". Returns kInvalidArgument naming the problem.
DLOCK_EXPORT Status ValidateLockName(std::string_view name);

}  // namespace dlock

#endif  // DLOCK_STORE_HPP_
