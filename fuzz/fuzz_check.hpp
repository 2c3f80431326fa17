// Shared by the fuzz targets: an invariant that must hold for every input.
// Aborts (a finding for libFuzzer, a failure for the replay test).
#ifndef DLOCK_FUZZ_FUZZ_CHECK_HPP_
#define DLOCK_FUZZ_FUZZ_CHECK_HPP_

#include <cstdio>
#include <cstdlib>

#define DLOCK_FUZZ_CHECK(cond)                                                          \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

#endif  // DLOCK_FUZZ_FUZZ_CHECK_HPP_
