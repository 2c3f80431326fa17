// File: dlock/client.hpp
//
// dlock::Client is a connection to one coordination store, shared by every
// lock made from it. It is a cheap, copyable handle: copies share the store,
// the session and the per-process wait queues.
//
//   auto client = dlock::Client::connect("zk://127.0.0.1:2181/app");
//   dlock::Mutex m(client, "orders/42");
//   std::scoped_lock hold(m);
//
// Sessions: a Client opens one store session lazily, on the first acquire,
// and shares it among all locks and threads. If that session is lost, every
// hold made through it reports kLost, and the next acquire opens a new one.
// Connect once per store and process and pass copies around: dlock keeps no
// process-wide registry, so two connect() calls are two connections and two
// sessions (as two CuratorFramework or KazooClient instances would be).
//
// Thread-safety: all methods are thread-safe.
#ifndef DLOCK_CLIENT_HPP_
#define DLOCK_CLIENT_HPP_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dlock/clock.hpp"
#include "dlock/export.hpp"
#include "dlock/status.hpp"
#include "dlock/store.hpp"

namespace dlock {

namespace internal {
class ClientCore;
struct Access;  // defined only inside the library
}  // namespace internal

struct ClientOptions {
  // Time source for every deadline. nullptr: Clock::system().
  std::shared_ptr<Clock> clock;
  // How long opening the store and each session may take.
  std::chrono::milliseconds connect_timeout{10'000};
  // Written into owner records (`dlock status` shows it).
  std::string label;
  // Called with errors that no caller can receive: a removal that keeps
  // failing in the background (on dlock's removal thread), an unlock() by a
  // thread that does not hold the lock, or a removal that could not even be
  // scheduled (on the thread that called unlock() or release()). Never
  // called with a dlock lock held, so it may call back into dlock; it should
  // not block, since it delays the removals queued behind it. Exceptions it
  // throws are swallowed.
  std::function<void(const Status&)> on_background_error;
};

// A Client is a handle: copies share one store, one session at a time and
// the client's dlock threads. Lock objects, Holds and pending asynchronous
// acquires made through it share it too.
//
// Lifetime: when the last of those goes (the last copy, lock object, Hold,
// or an asynchronous acquire once its outcome is handed over), the session
// is closed and the client's threads are stopped; if that happens on a
// thread of the program's own, they have all ended when that destructor
// returns (it may wait for a session being opened, at most the connect
// timeout). If it happens on a dlock thread (inside a callback), they end
// shortly after, on their own.
class DLOCK_EXPORT Client {
 public:
  // Opens the store named by `url` (see OpenStore in dlock/store.hpp). Does
  // not open a session yet. Throws dlock::Error on a bad URL or an
  // unreachable store.
  static Client connect(std::string_view url, ClientOptions options = {});

  // The same, returning the error instead of throwing.
  static Result<Client> open(std::string_view url, ClientOptions options = {});

  // Uses a store built by hand, e.g. a MemStore with fault hooks.
  static Client with_store(std::shared_ptr<Store> store, ClientOptions options = {});

  // The store URL, password removed.
  std::string url() const;

  // The state of the current session; kClosed before the first acquire.
  SessionState session_state() const;

  // The current session, opening one if there is none or it was lost.
  Result<std::shared_ptr<Session>> session() const;

  // Inspection and repair, for tools: the entries of one store queue (a lock
  // name, or "name/leases" and "name/locks" for a Semaphore), and the
  // removal of one entry regardless of who owns it.
  Result<std::vector<Entry>> list_entries(std::string_view queue, bool with_owners = true) const;
  Status remove_entry(std::string_view queue, std::string_view id) const;

  // Closes the session: every hold made through it ends (kLost). Later
  // acquires open a new session.
  void close_session() noexcept;

 private:
  friend struct internal::Access;
  explicit Client(std::shared_ptr<internal::ClientCore> core) : core_(std::move(core)) {}
  std::shared_ptr<internal::ClientCore> core_;
};

}  // namespace dlock

#endif  // DLOCK_CLIENT_HPP_
