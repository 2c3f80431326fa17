// The file store parses the names of every file in a queue directory, which
// any process of the user can create. It accepts exactly what it formats.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"
#include "stores/file/layout.hpp"

namespace fs = dlock::internal::file_store;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto name = fs::ParseEntryName(text);
  if (name) {
    DLOCK_FUZZ_CHECK(fs::FormatEntryName(*name) == text);
    DLOCK_FUZZ_CHECK(fs::IsValidKind(name->kind) && fs::IsValidAttemptId(name->attempt_id) && fs::IsNonce(name->nonce));
  }
  return 0;
}
