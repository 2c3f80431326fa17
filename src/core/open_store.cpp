// Chooses the store implementation for a URL. The only file that knows every
// store; recipes never include a store header. To add a store: write its
// OpenXStore(const ParsedUrl&, const StoreOptions&), add one row to
// kStores below, and run tests/store/conformance_test.cpp on it (see
// "For implementers" in include/dlock/store.hpp).

#include "core/url.hpp"
#include "dlock/mem_store.hpp"
#include "dlock/store.hpp"
#include "stores/file/file_store.hpp"
#ifdef DLOCK_HAVE_ZOOKEEPER
#include "stores/zookeeper/zk_store.hpp"
#endif
#ifdef DLOCK_HAVE_REDIS
#include "stores/redis/redis_store.hpp"
#endif
#ifdef DLOCK_HAVE_ETCD
#include "stores/etcd/etcd_store.hpp"
#endif

namespace dlock {
namespace {

using Opener = Result<std::shared_ptr<Store>> (*)(const internal::ParsedUrl&, const StoreOptions&);

Result<std::shared_ptr<Store>> OpenMemStore(const internal::ParsedUrl& url, const StoreOptions& options) {
  if (!url.hosts.empty() || !url.path.empty() || url.user) {
    return InvalidArgumentError("mem:// takes no host, path or user: the store lives in this process");
  }
  if (auto s = internal::CheckQueryKeys(url, {}); !s.ok()) return s;
  return std::shared_ptr<Store>(MemStore::create({.clock = options.clock}));
}

struct StoreKind {
  std::string_view scheme;  // as SupportedSchemes() lists it
  std::string_view alias;   // another accepted spelling, or empty
  Opener open;
};

// Every store this build has, in the order SupportedSchemes() gives them:
// one row a store, whatever the preprocessor leaves out.
// clang-format off
constexpr StoreKind kStores[] = {
    {"file", "", &internal::OpenFileStore},
    {"mem", "", &OpenMemStore},
#ifdef DLOCK_HAVE_REDIS
    {"redis", "", &internal::OpenRedisStore},
#endif
#ifdef DLOCK_HAVE_ZOOKEEPER
    {"zk", "zookeeper", &internal::OpenZkStore},
#endif
#ifdef DLOCK_HAVE_ETCD
    {"etcd", "", &internal::OpenEtcdStore},
#endif
};
// clang-format on

// Stores dlock knows of but this build lacks: a clearer error than "unknown".
constexpr std::string_view kKnownElsewhere[] = {"zk", "zookeeper", "redis", "etcd", "consul"};

std::string KnownSchemesText() {
  std::string known;
  for (const StoreKind& k : kStores) known += (known.empty() ? "" : ", ") + std::string(k.scheme) + "://";
  return known;
}

}  // namespace

std::vector<std::string> SupportedSchemes() {
  std::vector<std::string> out;
  for (const StoreKind& k : kStores) out.emplace_back(k.scheme);
  return out;
}

Result<std::shared_ptr<Store>> OpenStore(std::string_view url, const StoreOptions& options_in) {
  StoreOptions options = options_in;
  if (!options.clock) options.clock = Clock::system();
  auto parsed = internal::ParseUrl(url);
  if (!parsed.ok()) return parsed.status();
  const std::string& scheme = parsed->scheme;
  for (const StoreKind& k : kStores) {
    if (scheme == k.scheme || (!k.alias.empty() && scheme == k.alias)) return k.open(*parsed, options);
  }
  for (std::string_view elsewhere : kKnownElsewhere) {
    if (scheme == elsewhere) {
      return UnimplementedError("this build of dlock has no " + scheme + ":// store (it has " + KnownSchemesText() +
                                ")");
    }
  }
  return InvalidArgumentError("unknown store URL scheme '" + scheme + "://' (this build knows " + KnownSchemesText() +
                              ")");
}

}  // namespace dlock
