#include "stores/zookeeper/zk_store.hpp"

#include "stores/zookeeper/zk_config.hpp"
#include "stores/zookeeper/zk_session.hpp"

namespace dlock::internal {
namespace {

// Every open_session starts a ZooKeeper session of its own (store.hpp: a
// new, independent session). A Client opens one and shares it among all its
// locks, as Curator does with its one CuratorFramework.
class ZkStore final : public Store {
 public:
  ZkStore(std::shared_ptr<const zk::Config> config, std::shared_ptr<Clock> clock)
      : config_(std::move(config)), clock_(std::move(clock)) {}

  std::string url() const override { return config_->redacted_url; }

  Result<std::shared_ptr<Session>> open_session(Clock::time_point deadline) override {
    // A session counts its lost deadline from when it started connecting
    // (when the leader made it is unknown here). One that took most of the
    // timeout to open (a silent server tried first) would count itself lost
    // soon after: drop it and open another, within the caller's deadline.
    while (true) {
      std::shared_ptr<zk::ZkSession> session = zk::ZkSession::start(config_, clock_);
      // The attempt itself ends at the connect timeout; the caller's deadline
      // may end the wait for it sooner (the session is then closed).
      Status opened = session->await_open(deadline);
      if (!opened.ok()) return opened;
      // Out of time to try again: a session that will soon count itself
      // lost is still a session (its holds hear kLost; the next one opens).
      const bool fresh_enough = session->time_left() >= session->negotiated_timeout() / 2;
      if (fresh_enough || clock_->now() >= deadline) return std::shared_ptr<Session>(std::move(session));
      session->close();
    }
  }

 private:
  const std::shared_ptr<const zk::Config> config_;
  const std::shared_ptr<Clock> clock_;
};

}  // namespace

Result<std::shared_ptr<Store>> OpenZkStore(const ParsedUrl& url, const StoreOptions& options) {
  auto config = zk::ParseConfig(url, options);
  if (!config.ok()) return config.status();
  auto clock = options.clock ? options.clock : Clock::system();
  return std::shared_ptr<Store>(std::make_shared<ZkStore>(std::move(config).value(), std::move(clock)));
}

}  // namespace dlock::internal
