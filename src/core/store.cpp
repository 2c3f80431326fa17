#include "dlock/store.hpp"

#include <nlohmann/json.hpp>

namespace dlock {

std::string_view SessionStateName(SessionState state) noexcept {
  switch (state) {
    case SessionState::kConnected: return "connected";
    case SessionState::kSuspended: return "suspended";
    case SessionState::kLost: return "lost";
    case SessionState::kClosed: return "closed";
  }
  return "unknown";
}

bool QueueOrder(const Entry& a, const Entry& b) noexcept {
  if (a.sequence != b.sequence) return a.sequence < b.sequence;
  return a.id < b.id;
}

std::string EncodeOwnerRecord(const OwnerRecord& owner) {
  nlohmann::json j = {
      {"host", owner.host}, {"pid", owner.pid}, {"thread", owner.thread}, {"at", owner.acquired_unix_ms}};
  if (!owner.label.empty()) j["label"] = owner.label;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<OwnerRecord> DecodeOwnerRecord(std::string_view data) {
  if (data.size() > 64 * 1024) return InvalidArgumentError("owner record larger than 64 KiB");
  nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgumentError("owner record is not a JSON object");
  OwnerRecord out;
  auto text = [&](const char* key, std::string& field) -> bool {
    auto it = j.find(key);
    if (it == j.end()) return true;
    if (!it->is_string()) return false;
    field = it->get<std::string>();
    return true;
  };
  auto number = [&](const char* key, std::int64_t& field) -> bool {
    auto it = j.find(key);
    if (it == j.end()) return true;
    if (!it->is_number_integer()) return false;
    field = it->get<std::int64_t>();
    return true;
  };
  if (!text("host", out.host) || !text("thread", out.thread) || !text("label", out.label) || !number("pid", out.pid) ||
      !number("at", out.acquired_unix_ms)) {
    return InvalidArgumentError("owner record has a field of the wrong type");
  }
  return out;
}

Status ValidateLockName(std::string_view name) {
  constexpr std::size_t kMaxName = 512;
  if (name.empty()) return InvalidArgumentError("lock name is empty");
  if (name.size() > kMaxName) {
    return InvalidArgumentError("lock name is " + std::to_string(name.size()) + " bytes long; the limit is " +
                                std::to_string(kMaxName));
  }
  if (name.front() == '/' || name.back() == '/') {
    return InvalidArgumentError("lock name '" + std::string(name) + "' must not start or end with '/'");
  }
  std::size_t start = 0;
  while (start <= name.size()) {
    auto slash = name.find('/', start);
    std::string_view seg = name.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (seg.empty()) return InvalidArgumentError("lock name '" + std::string(name) + "' has an empty segment ('//')");
    if (seg == "." || seg == "..") {
      return InvalidArgumentError("lock name '" + std::string(name) + "' has a '" + std::string(seg) + "' segment");
    }
    for (char c : seg) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                c == '-';
      if (!ok) {
        std::string shown = c == '\0'             ? std::string("NUL")
                            : (c < 32 || c > 126) ? "byte " + std::to_string(static_cast<unsigned char>(c))
                                                  : std::string("'") + c + "'";
        return InvalidArgumentError("lock name has an invalid character (" + shown +
                                    "); use letters, digits, '.', '_', '-' and '/'");
      }
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return OkStatus();
}

}  // namespace dlock
