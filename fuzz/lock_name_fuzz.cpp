// ValidateLockName: a name it accepts has the documented shape, and the file
// store turns it into one safe directory name.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dlock/store.hpp"
#include "fuzz_check.hpp"
#include "stores/file/layout.hpp"

namespace {
bool Allowed(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-' || c == '/';
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view name(reinterpret_cast<const char*>(data), size);
  const dlock::Status s = dlock::ValidateLockName(name);
  if (!s.ok()) {
    DLOCK_FUZZ_CHECK(s.code() == dlock::ErrorCode::kInvalidArgument);
    return 0;
  }
  DLOCK_FUZZ_CHECK(!name.empty() && name.size() <= 512);
  DLOCK_FUZZ_CHECK(name.front() != '/' && name.back() != '/');
  for (char c : name) DLOCK_FUZZ_CHECK(Allowed(c));
  const std::string padded = "/" + std::string(name) + "/";
  DLOCK_FUZZ_CHECK(padded.find("//") == std::string::npos);
  DLOCK_FUZZ_CHECK(padded.find("/./") == std::string::npos);
  DLOCK_FUZZ_CHECK(padded.find("/../") == std::string::npos);
  const std::string dir = dlock::internal::file_store::QueueDirName(name);
  DLOCK_FUZZ_CHECK(!dir.empty() && dir.size() <= 255);
  DLOCK_FUZZ_CHECK(dir.find('/') == std::string::npos && dir.find('\0') == std::string::npos);
  DLOCK_FUZZ_CHECK(dir != "." && dir != "..");
  return 0;
}
