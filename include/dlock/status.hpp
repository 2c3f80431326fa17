// File: dlock/status.hpp
//
// dlock's error model. Operations that can fail for reasons outside the
// caller's control (a store that is down, a deadline, a lost session) return a
// `Status` or a `Result<T>`; nothing is hidden in a global errno. The standard
// lock concepts (`lock()`, `std::unique_lock`) cannot return a value, so those
// entry points throw `dlock::Error`, which carries the same `ErrorCode`.
//
//   dlock::Result<dlock::Client> client = dlock::Client::open("file:///tmp/l");
//   if (!client.ok()) {
//     std::fprintf(stderr, "%s\n", client.status().to_string().c_str());
//   }
//
// `unlock()`, `release()` and destructors never throw and never return errors
// a caller must act on: a failed removal is retried in the background.
#ifndef DLOCK_STATUS_HPP_
#define DLOCK_STATUS_HPP_

#include <cassert>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "dlock/export.hpp"

namespace dlock {

// dlock::ErrorCode
//
// What went wrong, and what a caller should do about it:
//  - kUnavailable: the store cannot be reached right now; retrying the same
//    call may succeed.
//  - kDeadlineExceeded: the deadline passed. For an acquire this means "not
//    acquired"; dlock has already removed (or is removing) its entry.
//  - kSessionLost: the session that owned an entry expired; everything it held
//    is gone. Retrying acquires a new session.
//  - kInvalidArgument / kFailedPrecondition: fix the call or the state before
//    retrying (a malformed URL or name; unlocking a lock not held).
//  - kUnauthenticated / kPermissionDenied: fix the credentials.
//
// Do not `switch` on this enum without a `default:`; codes may be added.
enum class ErrorCode {
  kOk = 0,
  kCancelled = 1,
  kInvalidArgument = 2,
  kDeadlineExceeded = 3,
  kNotFound = 4,
  kAlreadyExists = 5,
  kPermissionDenied = 6,
  kFailedPrecondition = 7,
  kAborted = 8,
  kUnavailable = 9,
  kSessionLost = 10,
  kUnauthenticated = 11,
  kUnimplemented = 12,
  kInternal = 13,
};

// Returns the enumerator's name without the `k`, e.g. "DeadlineExceeded".
DLOCK_EXPORT std::string_view ErrorCodeName(ErrorCode code) noexcept;

// dlock::Status
//
// An error code and a message, or OK. Cheap to copy when OK. Thread-compatible:
// const methods may be called concurrently.
class [[nodiscard]] DLOCK_EXPORT Status {
 public:
  Status() noexcept = default;
  Status(ErrorCode code, std::string message)
      : code_(code), message_(code == ErrorCode::kOk ? std::string() : std::move(message)) {}

  bool ok() const noexcept { return code_ == ErrorCode::kOk; }
  ErrorCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }

  // "DeadlineExceeded: waiting for orders/42". The format is for humans; do
  // not parse it.
  std::string to_string() const;

  // Marks a deliberately dropped error.
  void ignore_error() const noexcept {}

  friend bool operator==(const Status& a, const Status& b) noexcept {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status OkStatus() noexcept { return Status(); }
inline Status CancelledError(std::string m) { return {ErrorCode::kCancelled, std::move(m)}; }
inline Status InvalidArgumentError(std::string m) { return {ErrorCode::kInvalidArgument, std::move(m)}; }
inline Status DeadlineExceededError(std::string m) { return {ErrorCode::kDeadlineExceeded, std::move(m)}; }
inline Status NotFoundError(std::string m) { return {ErrorCode::kNotFound, std::move(m)}; }
inline Status AlreadyExistsError(std::string m) { return {ErrorCode::kAlreadyExists, std::move(m)}; }
inline Status PermissionDeniedError(std::string m) { return {ErrorCode::kPermissionDenied, std::move(m)}; }
inline Status FailedPreconditionError(std::string m) { return {ErrorCode::kFailedPrecondition, std::move(m)}; }
inline Status AbortedError(std::string m) { return {ErrorCode::kAborted, std::move(m)}; }
inline Status UnavailableError(std::string m) { return {ErrorCode::kUnavailable, std::move(m)}; }
inline Status SessionLostError(std::string m) { return {ErrorCode::kSessionLost, std::move(m)}; }
inline Status UnauthenticatedError(std::string m) { return {ErrorCode::kUnauthenticated, std::move(m)}; }
inline Status UnimplementedError(std::string m) { return {ErrorCode::kUnimplemented, std::move(m)}; }
inline Status InternalError(std::string m) { return {ErrorCode::kInternal, std::move(m)}; }

// dlock::Error
//
// The exception thrown by the entry points that cannot return a Status
// (constructors, `lock()`, `Client::connect`). `what()` is `status().to_string()`.
class DLOCK_EXPORT Error : public std::runtime_error {
 public:
  explicit Error(Status status);
  const Status& status() const noexcept { return status_; }
  ErrorCode code() const noexcept { return status_.code(); }

 private:
  Status status_;
};

// Throws dlock::Error if `status` is not OK.
DLOCK_EXPORT void ThrowIfError(const Status& status);

// dlock::Result<T>
//
// A T or a non-OK Status. `value()` on an error throws dlock::Error.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : rep_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : rep_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(rep_).ok() && "Result needs a value or an error");
    if (std::get<Status>(rep_).ok()) rep_ = Status(ErrorCode::kInternal, "OK Status given to Result");
  }

  bool ok() const noexcept { return std::holds_alternative<T>(rep_); }
  Status status() const { return ok() ? Status() : std::get<Status>(rep_); }

  T& value() & {
    check();
    return std::get<T>(rep_);
  }
  const T& value() const& {
    check();
    return std::get<T>(rep_);
  }
  T&& value() && {
    check();
    return std::get<T>(std::move(rep_));
  }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void check() const {
    if (!ok()) throw Error(std::get<Status>(rep_));
  }
  std::variant<T, Status> rep_;
};

}  // namespace dlock

#endif  // DLOCK_STATUS_HPP_
