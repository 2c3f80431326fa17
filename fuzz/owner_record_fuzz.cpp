// DecodeOwnerRecord reads what another process (or anyone with access to
// the store) wrote: any bytes. A decoded record survives a round trip.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dlock/store.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto owner = dlock::DecodeOwnerRecord(text);
  if (!owner.ok()) return 0;
  auto again = dlock::DecodeOwnerRecord(dlock::EncodeOwnerRecord(*owner));
  DLOCK_FUZZ_CHECK(again.ok());
  DLOCK_FUZZ_CHECK(again->host == owner->host && again->pid == owner->pid && again->thread == owner->thread &&
                   again->label == owner->label && again->acquired_unix_ms == owner->acquired_unix_ms);
  return 0;
}
