#include "stores/zookeeper/zk_store.hpp"

#include <mutex>

#include "stores/zookeeper/zk_config.hpp"
#include "stores/zookeeper/zk_session.hpp"

namespace dlock::internal {
namespace {

// One session at a time, shared by everyone who opens one: a Client's locks
// all live in the same ZooKeeper session, as with Curator's one
// CuratorFramework. After the session is lost or closed, the next
// open_session starts a new one.
class ZkStore final : public Store {
 public:
  ZkStore(std::shared_ptr<const zk::Config> config, std::shared_ptr<Clock> clock)
      : config_(std::move(config)), clock_(std::move(clock)) {}

  std::string url() const override { return config_->redacted_url; }

  Result<std::shared_ptr<Session>> open_session(Clock::time_point deadline) override {
    std::shared_ptr<zk::ZkSession> session;
    std::shared_ptr<zk::ZkSession> old;  // released outside the lock: closing it may block
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!current_ || !current_->reusable()) {
        old = std::move(current_);
        current_ = zk::ZkSession::Start(config_, clock_);
      }
      session = current_;
    }
    old.reset();
    // Concurrent callers wait for the same connection attempt, each until
    // its own deadline; the attempt itself ends at the connect timeout.
    Status opened = session->await_open(deadline);
    if (!opened.ok()) {
      if (!session->reusable()) {
        std::lock_guard<std::mutex> g(mu_);
        if (current_ == session) old = std::move(current_);
      }
      old.reset();
      return opened;
    }
    return std::shared_ptr<Session>(std::move(session));
  }

 private:
  const std::shared_ptr<const zk::Config> config_;
  const std::shared_ptr<Clock> clock_;
  std::mutex mu_;
  std::shared_ptr<zk::ZkSession> current_;  // guarded by mu_
};

}  // namespace

Result<std::shared_ptr<Store>> OpenZkStore(const ParsedUrl& url, const StoreOptions& options) {
  auto config = zk::ParseConfig(url, options);
  if (!config.ok()) return config.status();
  auto clock = options.clock ? options.clock : Clock::system();
  return std::shared_ptr<Store>(std::make_shared<ZkStore>(std::move(config).value(), std::move(clock)));
}

}  // namespace dlock::internal
