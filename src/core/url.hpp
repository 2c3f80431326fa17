// Internal: parsing of store URLs.
//
//   scheme://[user[:password]@]host[:port][,host[:port]...][/path][?k=v&k=v]
//
// Percent-escapes are decoded in the user, password, path and query values.
// Every error names the part of the URL that is wrong.
#ifndef DLOCK_SRC_CORE_URL_HPP_
#define DLOCK_SRC_CORE_URL_HPP_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlock/status.hpp"
#include "dlock/timeout.hpp"

namespace dlock::internal {

struct HostPort {
  std::string host;
  std::optional<std::uint16_t> port;  // nullopt: the store's default
};

struct ParsedUrl {
  std::string scheme;  // lower case
  std::optional<std::string> user;
  std::optional<std::string> password;
  std::vector<HostPort> hosts;  // empty for file:///dir and mem://
  std::string path;             // "" or starting with '/'
  std::map<std::string, std::string> query;

  // The URL with the password replaced by "***", for logs and errors.
  std::string redacted() const;
};

Result<ParsedUrl> ParseUrl(std::string_view url);

using dlock::ParseDuration;  // public, in dlock/timeout.hpp

// Reads query[key] as a duration / integer, or returns `fallback` if absent.
Result<std::chrono::milliseconds> QueryDuration(const ParsedUrl& url, const std::string& key,
                                                std::chrono::milliseconds fallback);
Result<std::int64_t> QueryInt(const ParsedUrl& url, const std::string& key, std::int64_t fallback, std::int64_t min,
                              std::int64_t max);

// Fails with kInvalidArgument naming the first query key not in `known`.
Status CheckQueryKeys(const ParsedUrl& url, std::initializer_list<std::string_view> known);

}  // namespace dlock::internal

#endif  // DLOCK_SRC_CORE_URL_HPP_
