// File: dlock/export.hpp
//
// DLOCK_EXPORT marks dlock's public API. libdlock.so is built with hidden
// visibility (-fvisibility=hidden -fvisibility-inlines-hidden): only what is
// marked here is in its dynamic symbol table, so dlock's internals and its
// private dependencies (nlohmann-json, the ZooKeeper and Redis C clients)
// cannot clash with an application's own copies.
//
// ABI policy, one for every public class and function: while the version is
// 0.x, a new minor version (0.1 -> 0.2) may change the API and the ABI, and
// a patch version (0.1.0 -> 0.1.1) changes neither; the SONAME stays
// libdlock.so.0, and the CMake package accepts only the same minor version
// (SameMinorVersion). To let a patch version change the implementation, the
// classes with state of their own keep it behind pointers to internal
// types (Client, Hold, Mutex, SemaphoreMutex, ReadWriteLock, MemStore,
// ManualClock); Semaphore holds only what it was given (a Client, the name,
// the count). Plain structs (ClientOptions, OwnerRecord, Entry, ...) and the
// virtual functions of the interfaces applications implement (Store,
// Session, Clock) are part of the ABI as written. Nothing under namespace
// dlock::internal is API: public headers only declare what a class names
// privately.
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
