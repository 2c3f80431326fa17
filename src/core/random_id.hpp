// Internal: random identifiers (attempt ids, session ids, nonces).
#ifndef DLOCK_SRC_CORE_RANDOM_ID_HPP_
#define DLOCK_SRC_CORE_RANDOM_ID_HPP_

#include <cstddef>
#include <string>

namespace dlock::internal {

// `bytes` bytes from the kernel's random source (getrandom(2)), as 2 * bytes
// lower-case hex digits. Unique enough to name an attempt or a session among
// every process that shares a store; never blocks once the system has booted.
std::string RandomHex(std::size_t bytes);

}  // namespace dlock::internal

#endif  // DLOCK_SRC_CORE_RANDOM_ID_HPP_
