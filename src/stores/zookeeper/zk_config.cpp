#include "stores/zookeeper/zk_config.hpp"

namespace dlock::internal::zk {
namespace {

constexpr std::uint16_t kDefaultPort = 2181;

Status ValidateChroot(std::string_view path) {
  // path is "" or starts with '/'; the URL parser already decoded escapes.
  std::size_t start = 1;
  while (start <= path.size()) {
    auto slash = path.find('/', start);
    std::string_view seg = path.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (seg.empty()) return InvalidArgumentError("zk:// chroot '" + std::string(path) + "' has an empty segment");
    if (seg == "." || seg == "..") {
      return InvalidArgumentError("zk:// chroot '" + std::string(path) + "' has a '" + std::string(seg) + "' segment");
    }
    for (char c : seg) {
      auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f) return InvalidArgumentError("zk:// chroot has a control character");
    }
    if (start == 1 && seg == "zookeeper") {
      return InvalidArgumentError("zk:// chroot may not be under /zookeeper (reserved by ZooKeeper)");
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return OkStatus();
}

}  // namespace

Result<std::shared_ptr<const Config>> ParseConfig(const ParsedUrl& url, const StoreOptions& options) {
  if (auto s = CheckQueryKeys(url, {"session_timeout", "connect_timeout", "acl"}); !s.ok()) return s;
  auto cfg = std::make_shared<Config>();
  cfg->redacted_url = url.redacted();
  if (url.hosts.empty()) {
    return InvalidArgumentError("zk:// URL needs at least one host, e.g. zk://127.0.0.1:2181");
  }
  for (const auto& hp : url.hosts) {
    if (!cfg->hosts.empty()) cfg->hosts += ',';
    bool v6 = hp.host.find(':') != std::string::npos;
    cfg->hosts += v6 ? "[" + hp.host + "]" : hp.host;
    cfg->hosts += ":" + std::to_string(hp.port.value_or(kDefaultPort));
  }

  std::string chroot = url.path;
  if (chroot == "/") chroot.clear();
  if (!chroot.empty() && chroot.back() == '/') chroot.pop_back();
  if (auto s = ValidateChroot(chroot); !s.ok()) return s;
  cfg->chroot = chroot;

  if (url.user) {
    if (url.user->empty()) return InvalidArgumentError("zk:// URL has an empty user name");
    if (url.user->find(':') != std::string::npos) return InvalidArgumentError("zk:// user name may not contain ':'");
    if (!url.password) {
      return InvalidArgumentError("zk:// URL names user '" + *url.user +
                                  "' without a password (digest auth needs user:password)");
    }
    cfg->user = *url.user;
    cfg->digest = *url.user + ":" + *url.password;
  }

  auto session = QueryDuration(url, "session_timeout", cfg->session_timeout);
  if (!session.ok()) return session.status();
  if (*session < std::chrono::milliseconds(100) || *session > std::chrono::hours(24)) {
    return InvalidArgumentError("zk:// session_timeout must be between 100ms and 24h");
  }
  cfg->session_timeout = *session;

  auto connect = QueryDuration(url, "connect_timeout", options.connect_timeout);
  if (!connect.ok()) return connect.status();
  if (*connect <= std::chrono::milliseconds(0)) return InvalidArgumentError("zk:// connect_timeout must be positive");
  cfg->connect_timeout = *connect;

  std::string acl = url.query.count("acl") ? url.query.at("acl") : "open";
  // Each ACL: permissions, scheme, id. "auth" with an empty id means "the
  // identities this session authenticated with" (the creator).
  struct Spec {
    int perms;
    const char* scheme;
    const char* id;
  };
  std::vector<Spec> specs;
  if (acl == "open") {
    cfg->acl_mode = AclMode::kOpen;
    specs = {{ZOO_PERM_ALL, "world", "anyone"}};
  } else if (acl == "creator" || acl == "creator-read") {
    if (cfg->digest.empty()) {
      return InvalidArgumentError("zk:// acl=" + acl + " needs credentials in the URL (zk://user:password@host)");
    }
    cfg->acl_mode = acl == "creator" ? AclMode::kCreator : AclMode::kCreatorRead;
    specs = {{ZOO_PERM_ALL, "auth", ""}};
    if (cfg->acl_mode == AclMode::kCreatorRead) specs.push_back({ZOO_PERM_READ, "world", "anyone"});
  } else {
    return InvalidArgumentError("zk:// acl='" + acl + "' is not one of open, creator, creator-read");
  }
  cfg->acl_strings_.reserve(specs.size() * 2);  // no reallocation: acls_ points into it
  for (const auto& s : specs) {
    cfg->acl_strings_.emplace_back(s.scheme);
    cfg->acl_strings_.emplace_back(s.id);
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    ACL a{};
    a.perms = specs[i].perms;
    a.id.scheme = cfg->acl_strings_[2 * i].data();
    a.id.id = cfg->acl_strings_[2 * i + 1].data();
    cfg->acls_.push_back(a);
  }
  cfg->acl_vector_.count = static_cast<std::int32_t>(cfg->acls_.size());
  cfg->acl_vector_.data = cfg->acls_.data();
  return std::shared_ptr<const Config>(std::move(cfg));
}

}  // namespace dlock::internal::zk
