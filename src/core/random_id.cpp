#include "core/random_id.hpp"

#include <sys/random.h>

#include <cerrno>
#include <random>

namespace dlock::internal {

std::string RandomHex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      // No getrandom (Linux < 3.17, or a seccomp filter): random_device reads
      // the same kernel source another way.
      std::random_device device;
      for (; got < bytes; ++got) raw[got] = static_cast<char>(device());
    }
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes * 2);
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace dlock::internal
