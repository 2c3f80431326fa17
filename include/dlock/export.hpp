// File: dlock/export.hpp
//
// DLOCK_EXPORT marks dlock's public API. libdlock.so is built with hidden
// visibility (-fvisibility=hidden -fvisibility-inlines-hidden): only what is
// marked here is in its dynamic symbol table, so dlock's internals and its
// private dependencies (nlohmann-json, the ZooKeeper and Redis C clients)
// cannot clash with an application's own copies.
//
// ABI policy, for every public class: while the version is 0.x, the ABI may
// change with the minor version (0.1 -> 0.2), and the SONAME (libdlock.so.0)
// stays; the CMake package accepts only the same minor version
// (SameMinorVersion). Classes that hold state keep it behind one pointer to
// an internal type (Mutex, SemaphoreMutex, ReadWriteLock, Client, Hold), so
// that members can change without changing the classes' size; plain structs
// (ClientOptions, OwnerRecord, Entry, ...) are part of the ABI as written.
// Nothing under namespace dlock::internal is API: it is declared in public
// headers only where a class needs to name its private pointer.
//
// DLOCK_STATIC is defined for consumers of a static libdlock.a (the CMake
// package and dlock.pc set it); it makes DLOCK_EXPORT empty.
#ifndef DLOCK_EXPORT_HPP_
#define DLOCK_EXPORT_HPP_

#if defined(DLOCK_STATIC)
#define DLOCK_EXPORT
#elif defined(__GNUC__) || defined(__clang__)
#define DLOCK_EXPORT [[gnu::visibility("default")]]
#else
#define DLOCK_EXPORT
#endif

#endif  // DLOCK_EXPORT_HPP_
