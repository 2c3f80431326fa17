#include "dlock/status.hpp"

namespace dlock {

std::string_view ErrorCodeName(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kOk: return "OK";
    case ErrorCode::kCancelled: return "Cancelled";
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kDeadlineExceeded: return "DeadlineExceeded";
    case ErrorCode::kNotFound: return "NotFound";
    case ErrorCode::kAlreadyExists: return "AlreadyExists";
    case ErrorCode::kPermissionDenied: return "PermissionDenied";
    case ErrorCode::kFailedPrecondition: return "FailedPrecondition";
    case ErrorCode::kAborted: return "Aborted";
    case ErrorCode::kUnavailable: return "Unavailable";
    case ErrorCode::kSessionLost: return "SessionLost";
    case ErrorCode::kUnauthenticated: return "Unauthenticated";
    case ErrorCode::kUnimplemented: return "Unimplemented";
    case ErrorCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  std::string out(ErrorCodeName(code_));
  if (!message_.empty()) out += ": " + message_;
  return out;
}

Error::Error(Status status) : std::runtime_error(status.to_string()), status_(std::move(status)) {}

void ThrowIfError(const Status& status) {
  if (!status.ok()) throw Error(status);
}

}  // namespace dlock
