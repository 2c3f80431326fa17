// Internal: what a zk:// URL says.
//
//   zk://[user:password@]host[:port][,host[:port]...][/chroot][?options]
//
// options:
//   session_timeout=10s   requested session timeout (the server clamps it to
//                         its [minSessionTimeout, maxSessionTimeout])
//   connect_timeout=...   how long open_session waits for a server
//                         (default: StoreOptions::connect_timeout)
//   acl=open              entries and created parents: world:anyone, all (default)
//   acl=creator           creator-only (auth:, all); needs user:password
//   acl=creator-read      creator all, world read: other users can see who
//                         holds a lock and wait for it, but not break it
//
// The user and password are sent as ZooKeeper "digest" credentials.
#ifndef DLOCK_SRC_STORES_ZOOKEEPER_ZK_CONFIG_HPP_
#define DLOCK_SRC_STORES_ZOOKEEPER_ZK_CONFIG_HPP_

#include <zookeeper/zookeeper.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/url.hpp"
#include "dlock/store.hpp"

namespace dlock::internal::zk {

enum class AclMode { kOpen, kCreator, kCreatorRead };

struct Config {
  std::string hosts;   // the C client's host string: "127.0.0.1:2181,[::1]:2182"
  std::string chroot;  // "" or "/a/b"; no trailing '/'
  std::string user;    // empty: no credentials
  std::string digest;  // "user:password", sent with zoo_add_auth("digest")
  std::chrono::milliseconds session_timeout{10'000};
  std::chrono::milliseconds connect_timeout{10'000};
  AclMode acl_mode = AclMode::kOpen;
  std::string redacted_url;  // for messages: never has the password

  // The ACL list for created znodes (entries and parents). Points into this
  // object: valid while it lives.
  const ACL_vector* acl() const { return &acl_vector_; }

  Config() = default;
  Config(const Config&) = delete;
  Config& operator=(const Config&) = delete;

 private:
  friend Result<std::shared_ptr<const Config>> ParseConfig(const ParsedUrl&, const StoreOptions&);
  // Backing storage for acl(): the C struct wants non-const char*.
  std::vector<std::string> acl_strings_;
  std::vector<ACL> acls_;
  ACL_vector acl_vector_{0, nullptr};
};

Result<std::shared_ptr<const Config>> ParseConfig(const ParsedUrl& url, const StoreOptions& options);

}  // namespace dlock::internal::zk

#endif  // DLOCK_SRC_STORES_ZOOKEEPER_ZK_CONFIG_HPP_
