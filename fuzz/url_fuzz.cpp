// ParseUrl: any bytes; a parsed URL is consistent and its redacted form
// never shows the password.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/url.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto url = dlock::internal::ParseUrl(text);
  if (!url.ok()) {
    DLOCK_FUZZ_CHECK(url.status().code() == dlock::ErrorCode::kInvalidArgument);
    DLOCK_FUZZ_CHECK(!url.status().message().empty());
    return 0;
  }
  DLOCK_FUZZ_CHECK(!url->scheme.empty());
  DLOCK_FUZZ_CHECK(url->path.empty() || url->path[0] == '/');
  const std::string redacted = url->redacted();
  // Read back, the redacted form has no password but the mask (the password
  // itself may still occur elsewhere, e.g. in a query value).
  if (auto again = dlock::internal::ParseUrl(redacted); again.ok() && url->password)
    DLOCK_FUZZ_CHECK(again->password == std::string("***"));
  (void)dlock::internal::QueryDuration(*url, "ttl", std::chrono::milliseconds(1));
  (void)dlock::internal::QueryInt(*url, "db", 0, 0, 100);
  return 0;
}
