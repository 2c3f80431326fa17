// Internal: one ZooKeeper session of the zk:// store.
//
// A ZkSession owns one handle of the official C client (zookeeper_init2), and
// so one server session, shared by every lock and thread of a dlock::Client.
// Requests use the asynchronous C API so that each call can be bounded by its
// own deadline, and so that several requests can be pipelined in one network
// round trip (the server answers a session's requests in order).
//
// Session states:
//  - kConnected once the handshake and a first request have succeeded.
//  - kSuspended as soon as the C client reports the connection gone
//    (ZOO_CONNECTING_STATE and friends).
//  - kLost when the server says the session expired, or when this process
//    decides so on its own: once the session timeout (less a margin of a
//    tenth, at most 1 s) has passed since `basis`, a moment no later than
//    the leader's last touch of the session that this process can prove.
//    Only the leader expires sessions, and a follower cut off from it keeps
//    answering reads (syncLimit * tickTime), so answered requests prove
//    nothing; the session thread sends syncs, which go through the leader,
//    and moves `basis` by the rule explained in zk_session.cpp (Heartbeats),
//    which assumes that the leader pings its followers at least every third
//    of the session timeout (ZooKeeper's default minSessionTimeout is
//    2 * tickTime, and leaders ping every tickTime/2). So a holder hears
//    kLost before the leader can give its lock to someone else. state()
//    says kLost as soon as that moment has passed, even before the session
//    thread has noticed. A lost handle is closed at once and is never
//    reported connected again; the store opens a new session.
//  - kClosed after close().
//
// Threads: the C client runs an I/O thread and a completion thread per
// handle; every callback of ours runs on the completion thread and only
// updates state under a mutex. Each session also runs one thread of its own
// that delivers state changes to subscribers (in order, without locks),
// keeps the lost-timer, sends heartbeats, sets the watches of waits and runs
// their completions, and closes the handle, always after
// the notes queued before: a close() from any other thread waits for it, so
// that subscribers hear kClosed before the server deletes the entries. Callbacks
// never own the session and never call the C API, so zookeeper_close (which
// joins the C threads) cannot deadlock with them. Waits (wait_any_gone and
// async_wait_any_gone, the blocking form waiting on the other) cost no thread:
// three threads per session, whatever the number of waits.
#ifndef DLOCK_SRC_STORES_ZOOKEEPER_ZK_SESSION_HPP_
#define DLOCK_SRC_STORES_ZOOKEEPER_ZK_SESSION_HPP_

#include <memory>
#include <thread>

#include "dlock/clock.hpp"
#include "dlock/store.hpp"
#include "stores/zookeeper/zk_config.hpp"

namespace dlock::internal::zk {

class Core;

class ZkSession final : public Session {
 public:
  // Starts connecting and returns at once; await_open() waits for the outcome.
  static std::shared_ptr<ZkSession> start(std::shared_ptr<const Config> config, std::shared_ptr<Clock> clock);
  ~ZkSession() override;
  ZkSession(const ZkSession&) = delete;
  ZkSession& operator=(const ZkSession&) = delete;

  // OK once the session is open. kUnavailable if no server answered before
  // `deadline` or the connect timeout; kUnauthenticated if the credentials
  // were rejected or do not allow reading the chroot.
  Status await_open(Clock::time_point deadline);
  // Still connecting, or open and neither lost nor closed.
  bool reusable() const noexcept;
  // Of the negotiated session timeout, how much is left before this session
  // counts itself lost (the lost deadline less now).
  Clock::duration time_left() const noexcept;
  Clock::duration negotiated_timeout() const noexcept;

  std::string id() const override;
  SessionState state() const noexcept override;
  std::shared_ptr<void> subscribe(std::function<void(SessionState)> fn) override;
  Result<Appended> append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline) override;
  Result<std::vector<Entry>> list(std::string_view queue, const ListOptions& options,
                                  Clock::time_point deadline) override;
  Status wait_any_gone(std::string_view queue, std::span<const std::string> ids, Clock::time_point deadline,
                       std::stop_token stop) override;
  void async_append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline,
                    std::function<void(Result<Appended>)> done) override;
  void async_list(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                  std::function<void(Result<std::vector<Entry>>)> done) override;
  void async_remove(std::string_view queue, std::string_view id, Clock::time_point deadline,
                    std::function<void(Status)> done) override;
  void async_find_own(std::string_view queue, std::string_view attempt_id, Clock::time_point deadline,
                      std::function<void(Result<std::optional<Entry>>)> done) override;
  std::shared_ptr<void> async_wait_any_gone(std::string_view queue, std::span<const std::string> ids,
                                            std::function<void(Status)> done) override;
  std::shared_ptr<void> async_wait_turn(std::string_view queue, std::span<const std::string> ids,
                                        std::span<const std::string> ahead, std::string_view own,
                                        std::function<void(Status, bool)> done) override;
  Status remove(std::string_view queue, std::string_view id, Clock::time_point deadline) override;
  Result<std::optional<Entry>> find_own(std::string_view queue, std::string_view attempt_id,
                                        Clock::time_point deadline) override;
  // Published values (docs/election.md §2.1): a node's data, Curator's way.
  bool keeps_values() const noexcept override { return true; }
  bool keeps_owners_beside_values() const noexcept override { return false; }
  Result<Entry> update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                             Clock::time_point deadline) override;
  void async_update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                          Clock::time_point deadline, std::function<void(Result<Entry>)> done) override;
  void async_read_head(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                       std::function<void(Result<Head>)> done) override;
  std::shared_ptr<void> async_watch_head(std::string_view queue, const Head& seen,
                                         std::function<void(Status)> done) override;
  void close() noexcept override;

 private:
  explicit ZkSession(std::shared_ptr<Core> core);
  const std::shared_ptr<Core> core_;
  std::jthread thread_;  // runs Core::run; holds its own reference to the core
};

}  // namespace dlock::internal::zk

#endif  // DLOCK_SRC_STORES_ZOOKEEPER_ZK_SESSION_HPP_
