#include "dlock/version.hpp"

#include "dlock/store.hpp"

namespace dlock {

std::string Version() {
  std::string out = "dlock " DLOCK_VERSION_STRING " (stores:";
  for (const auto& scheme : SupportedSchemes()) out += " " + scheme;
  return out + ")";
}

}  // namespace dlock
