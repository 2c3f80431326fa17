// A MemStore and two clients (two sessions) on one hand-moved clock, for
// tests that step time themselves.
#pragma once

#include <memory>
#include <string>

#include "dlock/dlock.hpp"
#include "dlock/mem_store.hpp"

namespace dlock::testing {

struct ManualWorld {
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::shared_ptr<MemStore> store;
  Client a, b;
  ManualWorld() : store(MakeStore(clock)), a(MakeClient(store, clock)), b(MakeClient(store, clock)) {}
  static std::shared_ptr<MemStore> MakeStore(const std::shared_ptr<ManualClock>& clock) {
    MemStoreOptions options;
    options.clock = clock;
    return MemStore::create(options);
  }
  static Client MakeClient(const std::shared_ptr<MemStore>& store, const std::shared_ptr<ManualClock>& clock) {
    ClientOptions options;
    options.clock = clock;
    return Client::with_store(store, options);
  }
};

// The id of the session `c` has open now (opening one if need be).
inline std::string SessionOf(const Client& c) { return c.session().value()->id(); }

}  // namespace dlock::testing
