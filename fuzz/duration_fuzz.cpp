// ParseDuration: any text; never a negative duration.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dlock/timeout.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto d = dlock::ParseDuration(std::string_view(reinterpret_cast<const char*>(data), size));
  if (d.ok())
    DLOCK_FUZZ_CHECK(d->count() >= 0);
  else
    DLOCK_FUZZ_CHECK(d.status().code() == dlock::ErrorCode::kInvalidArgument);
  return 0;
}
