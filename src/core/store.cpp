#include "dlock/store.hpp"

#include <nlohmann/json.hpp>
#include <thread>

#include "core/dlock_thread.hpp"

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

// ------------------------------------------- default asynchronous primitives
//
// The blocking forms, run where they are called. Stores override these with
// their own asynchronous machinery; the defaults keep a store that has none
// (or a test double that wraps the blocking forms) correct, if not thrifty.

void Session::async_append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline,
                           std::function<void(Result<Appended>)> done) {
  done(append(queue, spec, deadline));
}

void Session::async_list(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                         std::function<void(Result<std::vector<Entry>>)> done) {
  done(list(queue, options, deadline));
}

void Session::async_remove(std::string_view queue, std::string_view id, Clock::time_point deadline,
                           std::function<void(Status)> done) {
  done(remove(queue, id, deadline));
}

void Session::async_find_own(std::string_view queue, std::string_view attempt_id, Clock::time_point deadline,
                             std::function<void(Result<std::optional<Entry>>)> done) {
  done(find_own(queue, attempt_id, deadline));
}

namespace {

// A blocking wait on a thread of its own; destroying the handle stops it and
// waits for `done` (kCancelled, or what came first) to have run.
class ThreadWait {
 public:
  ThreadWait(Session& session, std::string queue, std::vector<std::string> ids, std::function<void(Status)> done)
      : thread_(
            [&session, queue = std::move(queue), ids = std::move(ids), done = std::move(done)](std::stop_token stop) {
              internal::MarkDlockThread("dlock-wait");
              Status outcome;
              try {
                outcome = session.wait_any_gone(queue, ids, kNoDeadline, std::move(stop));
              } catch (const std::exception& e) {  // out of memory, at worst: still exactly one outcome
                outcome = InternalError(std::string("wait_any_gone: ") + e.what());
              }
              done(std::move(outcome));
            }) {}
  ThreadWait(const ThreadWait&) = delete;
  ThreadWait& operator=(const ThreadWait&) = delete;
  ~ThreadWait() {
    thread_.request_stop();
    if (thread_.get_id() == std::this_thread::get_id()) thread_.detach();  // from inside `done`
  }

 private:
  std::jthread thread_;
};

}  // namespace

std::shared_ptr<void> Session::async_wait_any_gone(std::string_view queue, std::span<const std::string> ids,
                                                   std::function<void(Status)> done) {
  return std::make_shared<ThreadWait>(*this, std::string(queue), std::vector<std::string>(ids.begin(), ids.end()),
                                      std::move(done));
}

std::shared_ptr<void> Session::async_wait_turn(std::string_view queue, std::span<const std::string> ids,
                                               std::span<const std::string> /*ahead*/, std::string_view /*own*/,
                                               std::function<void(Status, bool)> done) {
  return async_wait_any_gone(queue, ids, [done = std::move(done)](Status s) { done(std::move(s), false); });
}

bool Session::waits_on_calling_thread() const noexcept { return false; }

bool Session::keeps_values() const noexcept { return false; }

bool Session::keeps_owners_beside_values() const noexcept { return true; }

Result<Entry> Session::update_entry(std::string_view /*queue*/, std::string_view /*id*/, const EntryUpdate& /*update*/,
                                    Clock::time_point /*deadline*/) {
  return UnimplementedError("this store cannot change an entry in place");
}

void Session::async_update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                                 Clock::time_point deadline, std::function<void(Result<Entry>)> done) {
  done(update_entry(queue, id, update, deadline));
}

void Session::async_read_head(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                              std::function<void(Result<Head>)> done) {
  if (!keeps_values()) {
    done(UnimplementedError("this store keeps no values"));
    return;
  }
  ListOptions with_values = options;
  with_values.with_values = true;
  async_list(queue, with_values, deadline, [done = std::move(done)](Result<std::vector<Entry>> listed) {
    if (!listed.ok()) {
      done(listed.status());
      return;
    }
    Head head;
    if (!listed->empty()) head.entry = std::move(listed->front());
    done(std::move(head));
  });
}

std::shared_ptr<void> Session::async_watch_head(std::string_view /*queue*/, const Head& /*seen*/,
                                                std::function<void(Status)> done) {
  done(UnimplementedError("this store cannot watch a queue's head"));
  return nullptr;
}

bool QueueOrder(const Entry& a, const Entry& b) noexcept {
  if (a.sequence != b.sequence) return a.sequence < b.sequence;
  return a.id < b.id;
}

std::string EncodeOwnerRecord(const OwnerRecord& owner) {
  nlohmann::json j = {
      {"host", owner.host}, {"pid", owner.pid}, {"thread", owner.thread}, {"at", owner.acquired_unix_ms}};
  if (!owner.label.empty()) j["label"] = owner.label;
  if (owner.elected_unix_ms != 0) j["elected"] = owner.elected_unix_ms;
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
  // Newer than the other fields: a record of another writer that has an
  // "elected" of another type still decodes, without it.
  if (!number("elected", out.elected_unix_ms)) out.elected_unix_ms = 0;
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
