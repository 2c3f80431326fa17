// Chooses the store implementation for a URL. The only file that knows every
// store; recipes never include a store header.
#include <cstdlib>
#include <unistd.h>

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

namespace dlock {

std::vector<std::string> SupportedSchemes() {
  std::vector<std::string> out = {"file", "mem"};
#ifdef DLOCK_HAVE_REDIS
  out.push_back("redis");
#endif
#ifdef DLOCK_HAVE_ZOOKEEPER
  out.push_back("zk");
#endif
  return out;
}

Result<std::shared_ptr<Store>> OpenStore(std::string_view url, const StoreOptions& options_in) {
  StoreOptions options = options_in;
  if (!options.clock) options.clock = Clock::system();
  auto parsed = internal::ParseUrl(url);
  if (!parsed.ok()) return parsed.status();
  const std::string& scheme = parsed->scheme;
  if (scheme == "mem") {
    if (!parsed->hosts.empty() || !parsed->path.empty() || parsed->user) {
      return InvalidArgumentError("mem:// takes no host, path or user: the store lives in this process");
    }
    if (auto s = internal::CheckQueryKeys(*parsed, {}); !s.ok()) return s;
    return std::shared_ptr<Store>(MemStore::create({.clock = options.clock}));
  }
  if (scheme == "file") return internal::OpenFileStore(*parsed, options);
#ifdef DLOCK_HAVE_ZOOKEEPER
  if (scheme == "zk" || scheme == "zookeeper") return internal::OpenZkStore(*parsed, options);
#endif
#ifdef DLOCK_HAVE_REDIS
  if (scheme == "redis") return internal::OpenRedisStore(*parsed, options);
#endif
  std::string known;
  for (const auto& s : SupportedSchemes()) known += (known.empty() ? "" : ", ") + s + "://";
  if (scheme == "zk" || scheme == "zookeeper" || scheme == "redis" || scheme == "etcd" || scheme == "consul") {
    return UnimplementedError("this build of dlock has no " + scheme + ":// store (it has " + known + ")");
  }
  return InvalidArgumentError("unknown store URL scheme '" + scheme + "://' (this build knows " + known + ")");
}

}  // namespace dlock
