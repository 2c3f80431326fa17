# Warnings for dlock's own targets only (PRIVATE: they never reach consumers).
function(dlock_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wold-style-cast -Wcast-align -Woverloaded-virtual)
  # clang checks the locking rules written as annotations
  # (src/core/thread_annotations.hpp); GCC has no such analysis.
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety)
  endif()
  if(DLOCK_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
