// Test support: GoogleTest matchers for dlock::Status, so that a failure
// prints the error itself, without a hand-written `<< s.to_string()`:
//
//   EXPECT_THAT(session->remove(q, id, deadline), IsOk());
//   EXPECT_THAT(result.status(), StatusIs(ErrorCode::kSessionLost));
#ifndef DLOCK_TESTS_SUPPORT_STATUS_MATCHERS_HPP_
#define DLOCK_TESTS_SUPPORT_STATUS_MATCHERS_HPP_

#include <gmock/gmock.h>

#include <ostream>
#include <string>

#include "dlock/status.hpp"

namespace dlock {

// How GoogleTest prints a Status (found by argument-dependent lookup).
inline void PrintTo(const Status& status, std::ostream* out) { *out << status.to_string(); }

namespace testing {

// GoogleTest prints the Status itself on failure (PrintTo above).
MATCHER(IsOk, "is OK") { return arg.ok(); }

MATCHER_P(StatusIs, code, "has code " + std::string(::dlock::ErrorCodeName(code))) { return arg.code() == code; }

}  // namespace testing
}  // namespace dlock

#endif  // DLOCK_TESTS_SUPPORT_STATUS_MATCHERS_HPP_
