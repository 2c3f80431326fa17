// Internal: one connection to a Redis server, over hiredis.
//
// hiredis makes the TCP connection (redisConnectWithTimeout), formats commands
// (redisFormatCommandArgv) and parses replies (its redisReader). This class
// does the socket I/O itself, with poll(2) and a deadline on every operation,
// and writes with send(MSG_NOSIGNAL) so that a server that went away can never
// raise SIGPIPE in the host program.
//
// Not thread-safe: one thread uses a connection at a time (the pool hands
// them out; the subscriber and each keep-alive own theirs).
#ifndef DLOCK_SRC_STORES_REDIS_REDIS_CONN_HPP_
#define DLOCK_SRC_STORES_REDIS_REDIS_CONN_HPP_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/event_signal.hpp"
#include "dlock/status.hpp"

struct redisContext;
struct redisReader;
struct redisReply;

namespace dlock::internal::redis {

// Real time for socket I/O. (Lease timing uses the injected dlock::Clock;
// sockets can only ever wait in real time.)
using IoClock = std::chrono::steady_clock;

// Where and how to connect.
struct Endpoint {
  std::string host;
  std::uint16_t port = 6379;
  std::optional<std::string> user;      // ACL user (Redis 6+); needs a password
  std::optional<std::string> password;  // AUTH
  int db = 0;                           // SELECT, unless 0
};

// The most elements an array reply may have. hiredis 0.14 allocates an
// array's element table from its header, before any element arrives, and
// has no limit of its own: a hostile server could ask for gigabytes with a
// dozen bytes. dlock's longest replies are queue listings (a few elements
// per entry).
inline constexpr int kMaxReplyElements = 1 << 20;

// Makes `reader` refuse longer arrays: it then fails with hiredis's
// "Out of memory" error, which Conn reports as a reply too large.
void BoundArrayReplies(redisReader* reader) noexcept;

// A parsed reply; owns the hiredis reply object.
class Reply {
 public:
  Reply() = default;
  explicit Reply(redisReply* r) noexcept;
  Reply(Reply&&) noexcept = default;
  Reply& operator=(Reply&&) noexcept = default;

  const redisReply* get() const noexcept { return r_.get(); }

  bool is_error() const noexcept;
  bool is_nil() const noexcept;
  bool is_array() const noexcept;
  bool is_integer() const noexcept;
  bool is_string() const noexcept;        // bulk or status
  std::string_view str() const noexcept;  // string, status or error text
  long long integer() const noexcept;
  std::size_t size() const noexcept;  // array length
  const redisReply* element(std::size_t i) const noexcept;

 private:
  struct Free {
    void operator()(redisReply* r) const noexcept;
  };
  std::unique_ptr<redisReply, Free> r_;
};

// Reads a sub-reply of an array as a string ("" if it is not one).
std::string_view ElementStr(const redisReply* r) noexcept;
bool ElementIsNil(const redisReply* r) noexcept;
long long ElementInt(const redisReply* r) noexcept;

// Maps a Redis error reply ("NOAUTH ...", "WRONGPASS ...") to a Status with
// `what` as context.
Status ErrorReplyStatus(std::string_view error_text, std::string_view what);

using Command = std::vector<std::string>;

// An eventfd for a Conn's `interrupt_fd` (or another wake-up), empty if the
// process is out of descriptors: that only costs the early wake-up, as with
// no eventfd at all.
std::optional<EventSignal> MaybeSignal();
// Its descriptor, or -1 for none.
inline int FdOf(const std::optional<EventSignal>& signal) { return signal ? signal->fd() : -1; }

class Conn {
 public:
  // Connects, authenticates and selects the database, all before `deadline`.
  // Errors: kUnavailable (refused, unreachable, timed out), kUnauthenticated,
  // kPermissionDenied, kInvalidArgument (bad database number), kCancelled
  // (`interrupt_fd` became readable).
  //
  // `interrupt_fd` (an eventfd, or -1) is polled next to the socket by every
  // operation of the connection: when it is readable, the operation stops with
  // kCancelled and the connection is broken. The owner never drains it; it
  // is the owner's "shut down now".
  static Result<std::unique_ptr<Conn>> open(const Endpoint& ep, IoClock::time_point deadline, int interrupt_fd = -1);

  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Writes every command, then reads one reply per command. A socket error or
  // a timeout returns kUnavailable and breaks the connection (broken() is then
  // true; throw the connection away). Error *replies* are returned as replies.
  Result<std::vector<Reply>> pipeline(const std::vector<Command>& cmds, IoClock::time_point deadline);
  Result<Reply> run(const Command& cmd, IoClock::time_point deadline);

  // Lower level, for the subscriber: write without reading, and read one
  // reply if one is complete before `deadline` (nullopt on timeout, which
  // does not break the connection).
  Status write(const std::vector<Command>& cmds, IoClock::time_point deadline);
  Result<std::optional<Reply>> read_one(IoClock::time_point deadline);
  // A reply already buffered, without touching the socket.
  Result<std::optional<Reply>> buffered();

  int fd() const noexcept;
  bool broken() const noexcept { return broken_; }
  // The connection broke because a deadline passed (not because the server
  // closed it or a socket error): the request may still be running.
  bool timed_out() const noexcept { return timed_out_; }
  const std::string& where() const noexcept { return where_; }

 private:
  Conn(redisContext* c, std::string where, int interrupt_fd) noexcept
      : c_(c), where_(std::move(where)), interrupt_fd_(interrupt_fd) {}
  Status fail(std::string what);
  // Polls the socket for `events` and the interrupt fd until `deadline`:
  // 1 ready, 0 timed out, or an error (kCancelled, kUnavailable).
  Result<int> await(short events, IoClock::time_point deadline);

  redisContext* c_;
  std::string where_;  // "127.0.0.1:6379" for messages
  int interrupt_fd_ = -1;
  bool broken_ = false;
  bool timed_out_ = false;
};

}  // namespace dlock::internal::redis

#endif  // DLOCK_SRC_STORES_REDIS_REDIS_CONN_HPP_
