#include "core/url.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

namespace dlock::internal {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> PercentDecode(std::string_view in, std::string_view what) {
  std::string out;
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) {
      return InvalidArgumentError("truncated percent-escape in the URL's " + std::string(what));
    }
    int hi = HexValue(in[i + 1]);
    int lo = HexValue(in[i + 2]);
    if (hi < 0 || lo < 0) {
      return InvalidArgumentError("bad percent-escape in the URL's " + std::string(what));
    }
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  if (out.find('\0') != std::string::npos) {
    return InvalidArgumentError("NUL byte in the URL's " + std::string(what));
  }
  return out;
}

Result<HostPort> ParseHostPort(std::string_view text) {
  HostPort hp;
  std::string_view host = text;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {  // [::1]:2181
    auto close = text.find(']');
    if (close == std::string_view::npos)
      return InvalidArgumentError("unclosed '[' in host '" + std::string(text) + "'");
    host = text.substr(1, close - 1);
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':')
        return InvalidArgumentError("unexpected text after ']' in host '" + std::string(text) + "'");
      port = rest.substr(1);
      if (port.empty()) return InvalidArgumentError("empty port in '" + std::string(text) + "'");
    }
  } else {
    auto colon = text.rfind(':');
    if (colon != std::string_view::npos) {
      host = text.substr(0, colon);
      port = text.substr(colon + 1);
      if (port.empty()) return InvalidArgumentError("empty port in '" + std::string(text) + "'");
    }
  }
  if (host.empty()) return InvalidArgumentError("empty host in the URL");
  for (char c : host) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':')) {
      return InvalidArgumentError("invalid character in host '" + std::string(host) + "'");
    }
  }
  hp.host = std::string(host);
  if (!port.empty()) {
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || port.size() > 5) {
      return InvalidArgumentError("port '" + std::string(port) + "' is not a number");
    }
    if (value == 0 || value > 65535) {
      return InvalidArgumentError("port " + std::string(port) + " is out of range (1-65535)");
    }
    hp.port = static_cast<std::uint16_t>(value);
  }
  return hp;
}

// The inverse of PercentDecode for the characters that would change how
// the text parses back (`special`), '%' itself and anything not printable.
std::string PercentEncode(std::string_view in, std::string_view special) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : in) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '%' || u <= 0x20 || u >= 0x7f || special.find(c) != std::string_view::npos) {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string ParsedUrl::redacted() const {
  std::string out = scheme + "://";
  if (user) {
    // Escaped, so that a ':' or '@' in a user name cannot make part of it
    // read as a password (or a host) when the redacted URL is parsed again.
    out += PercentEncode(*user, ":@/?#[],");
    if (password) out += ":***";
    out += "@";
  }
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    if (i) out += ",";
    // Appends piece by piece: GCC 12 -O3 warns (-Wrestrict, falsely) on "[" + s.
    const bool v6 = hosts[i].host.find(':') != std::string::npos;
    if (v6) out += '[';
    out += hosts[i].host;
    if (v6) out += ']';
    if (hosts[i].port) {
      out += ':';
      out += std::to_string(*hosts[i].port);
    }
  }
  out += PercentEncode(path, "?#");
  char sep = '?';
  for (const auto& [k, v] : query) {
    out += sep + PercentEncode(k, "&=#") + "=" + PercentEncode(v, "&=#");
    sep = '&';
  }
  return out;
}

namespace {

Result<std::string> ParseScheme(std::string_view scheme_text) {
  std::string scheme = Lower(scheme_text);
  if (scheme.empty()) return InvalidArgumentError("store URL has an empty scheme");
  for (char c : scheme) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.')) {
      return InvalidArgumentError("invalid character in URL scheme '" + scheme + "'");
    }
  }
  return scheme;
}

// USER[:PASSWORD], percent-decoded.
Status ParseUserInfo(std::string_view userinfo, ParsedUrl& out) {
  std::string_view user = userinfo;
  if (auto colon = userinfo.find(':'); colon != std::string_view::npos) {
    user = userinfo.substr(0, colon);
    auto password = PercentDecode(userinfo.substr(colon + 1), "password");
    if (!password.ok()) return password.status();
    out.password = *password;
  }
  auto name = PercentDecode(user, "user name");
  if (!name.ok()) return name.status();
  out.user = *name;
  return OkStatus();
}

// HOST[:PORT][,HOST[:PORT]...]
Status ParseHosts(std::string_view hosts, ParsedUrl& out) {
  if (hosts.empty()) return OkStatus();
  std::size_t start = 0;
  while (true) {
    auto comma = hosts.find(',', start);
    std::string_view one =
        hosts.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    auto host = ParseHostPort(one);
    if (!host.ok()) return host.status();
    out.hosts.push_back(*host);
    if (comma == std::string_view::npos) return OkStatus();
    start = comma + 1;
  }
}

// KEY=VALUE[&KEY=VALUE...], percent-decoded; a key given twice is an error
// (which one was meant?), empty pairs are skipped.
Status ParseQuery(std::string_view query, ParsedUrl& out) {
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view kv = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (kv.empty()) continue;
    auto eq = kv.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return InvalidArgumentError("URL query parameter '" + std::string(kv) + "' is not key=value");
    }
    auto key = PercentDecode(kv.substr(0, eq), "query");
    auto value = PercentDecode(kv.substr(eq + 1), "query");
    if (!key.ok()) return key.status();
    if (!value.ok()) return value.status();
    if (out.query.count(*key)) return InvalidArgumentError("URL query parameter '" + *key + "' given twice");
    out.query[*key] = *value;
  }
  return OkStatus();
}

}  // namespace

// SCHEME://[USERINFO@]HOSTS[/PATH][?QUERY], each part parsed by its own step.
Result<ParsedUrl> ParseUrl(std::string_view url) {
  if (url.empty()) return InvalidArgumentError("empty store URL");
  if (url.size() > 4096) return InvalidArgumentError("store URL longer than 4096 bytes");
  if (url.find('\0') != std::string_view::npos) return InvalidArgumentError("NUL byte in store URL");
  auto sep = url.find("://");
  if (sep == std::string_view::npos) {
    return InvalidArgumentError("store URL '" + std::string(url) +
                                "' has no scheme; expected e.g. file:///dir, mem://, zk://host:2181");
  }
  ParsedUrl out;
  auto scheme = ParseScheme(url.substr(0, sep));
  if (!scheme.ok()) return scheme.status();
  out.scheme = *scheme;
  std::string_view rest = url.substr(sep + 3);
  std::string_view query;
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  std::string_view authority = rest;
  std::string_view path;
  if (auto slash = rest.find('/'); slash != std::string_view::npos) {
    authority = rest.substr(0, slash);
    path = rest.substr(slash);
  }
  if (auto at = authority.rfind('@'); at != std::string_view::npos) {
    if (Status s = ParseUserInfo(authority.substr(0, at), out); !s.ok()) return s;
    authority = authority.substr(at + 1);
  }
  if (Status s = ParseHosts(authority, out); !s.ok()) return s;
  auto decoded_path = PercentDecode(path, "path");
  if (!decoded_path.ok()) return decoded_path.status();
  out.path = *decoded_path;
  if (Status s = ParseQuery(query, out); !s.ok()) return s;
  return out;
}

Result<std::chrono::milliseconds> QueryDuration(const ParsedUrl& url, const std::string& key,
                                                std::chrono::milliseconds fallback) {
  auto it = url.query.find(key);
  if (it == url.query.end()) return fallback;
  auto d = ParseDuration(it->second);
  if (!d.ok()) return InvalidArgumentError("URL parameter " + key + ": " + d.status().message());
  return *d;
}

Result<std::int64_t> QueryInt(const ParsedUrl& url, const std::string& key, std::int64_t fallback, std::int64_t min,
                              std::int64_t max) {
  auto it = url.query.find(key);
  if (it == url.query.end()) return fallback;
  std::int64_t v = 0;
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) {
    return InvalidArgumentError("URL parameter " + key + "='" + s + "' is not an integer");
  }
  if (v < min || v > max) {
    return InvalidArgumentError("URL parameter " + key + "=" + s + " is out of range (" + std::to_string(min) + "-" +
                                std::to_string(max) + ")");
  }
  return v;
}

Status CheckQueryKeys(const ParsedUrl& url, std::initializer_list<std::string_view> known) {
  for (const auto& [k, v] : url.query) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      std::string list;
      for (auto n : known) list += (list.empty() ? "" : ", ") + std::string(n);
      return InvalidArgumentError("unknown URL parameter '" + k + "' for " + url.scheme + "://" +
                                  (list.empty() ? std::string(" (it takes none)") : " (known: " + list + ")"));
    }
  }
  return OkStatus();
}

}  // namespace dlock::internal

namespace dlock {

Result<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  if (text.empty()) return InvalidArgumentError("empty duration");
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0) return InvalidArgumentError("duration '" + std::string(text) + "' does not start with a number");
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + digits, value);
  if (ec != std::errc() || value > (1ULL << 40)) {
    return InvalidArgumentError("duration '" + std::string(text) + "' is too large");
  }
  std::string_view unit = text.substr(digits);
  using namespace std::chrono;
  std::int64_t v = static_cast<std::int64_t>(value);
  if (unit.empty()) {
    // A bare number once meant milliseconds, which nobody guessed (`--timeout
    // 10` was 10 ms): a duration says its unit.
    return InvalidArgumentError("duration '" + std::string(text) + "' has no unit: write it like " + std::string(text) +
                                "s, " + std::string(text) + "ms, " + std::string(text) + "m or " + std::string(text) +
                                "h (units: us, ms, s, m, h)");
  }
  if (unit == "ms") return milliseconds(v);
  if (unit == "us") return duration_cast<milliseconds>(microseconds(v));
  if (unit == "s") return milliseconds(v * 1000);
  if (unit == "m") return milliseconds(v * 60'000);
  if (unit == "h") return milliseconds(v * 3'600'000);
  return InvalidArgumentError("duration '" + std::string(text) + "' has unknown unit '" + std::string(unit) +
                              "' (use ms, s, m or h)");
}

}  // namespace dlock
