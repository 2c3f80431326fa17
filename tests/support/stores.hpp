// Test support: a way to make several clients (each its own session) of one
// store, for the recipe suites that run on every store.
#ifndef DLOCK_TESTS_SUPPORT_STORES_HPP_
#define DLOCK_TESTS_SUPPORT_STORES_HPP_

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dlock/dlock.hpp"
#include "support/poll.hpp"  // Eventually, for the suites that include this

namespace dlock::testing {

// Something that makes clients of one shared store.
struct StoreFixture {
  std::string label;  // for test names
  std::function<Client()> new_client;
  // Live entries in a queue, seen by a fresh client.
  std::size_t entries(const std::string& queue) const {
    auto c = new_client();
    auto listed = c.list_entries(queue, false);
    return listed.ok() ? listed->size() : 0;
  }
};

// "mem" gives a fresh MemStore shared by the fixture's clients; anything else
// is a URL (each client connects on its own).
inline StoreFixture MakeFixture(const std::string& spec) {
  StoreFixture f;
  f.label = spec;
  if (spec == "mem") {
    auto store = MemStore::create();
    f.new_client = [store] { return Client::with_store(store); };
  } else {
    f.new_client = [spec] { return Client::connect(spec); };
  }
  return f;
}

// The stores the generic suites run on: "mem" always, plus the URLs in
// $DLOCK_TEST_URLS (space-separated), which the test scripts set after
// starting servers.
inline std::vector<std::string> StoreSpecs() {
  std::vector<std::string> out{"mem"};
  if (const char* env = std::getenv("DLOCK_TEST_URLS")) {
    std::istringstream in(env);
    for (std::string url; in >> url;) out.push_back(url);
  }
  return out;
}

// The stores whose clients can live in separate processes: a file:// store
// (spelled "file"; each suite makes its own scratch directory) and every URL
// in $DLOCK_TEST_URLS.
inline std::vector<std::string> MultiProcessSpecs() {
  std::vector<std::string> out{"file"};
  for (const auto& s : StoreSpecs()) {
    if (s != "mem") out.push_back(s);
  }
  return out;
}

// The stores the conformance suite runs on: "mem" and "file" (a scratch
// directory per test) always, and every URL in $DLOCK_TEST_URLS.
inline std::vector<std::string> ConformanceSpecs() {
  std::vector<std::string> out = StoreSpecs();
  out.insert(out.begin() + 1, "file");
  return out;
}

// A GoogleTest parameter name for a store spec: "zk___127_0_0_1_2181_1".
inline std::string SpecName(const std::string& spec, std::size_t index) {
  std::string s;
  for (char c : spec) s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return s.substr(0, 40) + "_" + std::to_string(index);
}

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_STORES_HPP_
