// The check the zk, etcd and Redis fault suites share (issue 16, "no stale
// leader after a reconnect"): an observer whose connection goes through
// `proxy` says kUnknown once it is cut off; the leader changes meanwhile;
// once contact is back it reads again and reports the new leader, never the
// old one again.
#ifndef DLOCK_TESTS_SUPPORT_OBSERVER_CUT_HPP_
#define DLOCK_TESTS_SUPPORT_OBSERVER_CUT_HPP_

#include <gtest/gtest.h>

#include <optional>

#include "dlock/dlock.hpp"
#include "support/observation_reports.hpp"
#include "support/poll.hpp"
#include "support/tcp_proxy.hpp"

namespace dlock::testing {

// `watcher` connects through `proxy` with a session that outlives the cut;
// `direct` connects to the store itself.
inline void ExpectAnObserverCutOffReportsTheLeaderNowNeverTheOldOne(const Client& watcher, const Client& direct,
                                                                    TcpProxy& proxy) {
  using namespace std::chrono_literals;
  ObservationReports seen;
  auto reports = [&] { return seen.all(); };
  std::optional<Leadership> old_leader = Election(direct, "e").campaign("old", 30s);
  ASSERT_TRUE(old_leader.has_value());
  std::shared_ptr<void> observing = Election(watcher, "e").observe(seen.fn());
  ASSERT_TRUE(Eventually([&] { return reports().size() == 1; }, 30s));
  ASSERT_EQ(reports()[0].state, LeaderState::kLeader);

  proxy.partition();
  proxy.drop_all();  // the connections end at once; redialling hangs in the partition
  ASSERT_TRUE(Eventually([&] { return reports().size() == 2; }, 60s)) << "never said unknown";
  EXPECT_EQ(reports()[1].state, LeaderState::kUnknown);
  old_leader->resign();  // while the observer cannot see it
  std::optional<Leadership> new_leader = Election(direct, "e").campaign("new", 30s);
  ASSERT_TRUE(new_leader.has_value());
  proxy.heal();
  proxy.drop_all();  // make the client redial now

  ASSERT_TRUE(Eventually(
      [&] {
        auto r = reports();
        return r.back().state == LeaderState::kLeader && r.back().leader->term == new_leader->term();
      },
      60s))
      << "never reported the new leader";
  auto r = reports();
  for (std::size_t i = 2; i < r.size(); ++i) {
    EXPECT_NE(r[i].state, LeaderState::kUnknown) << "report " << i;
    if (r[i].state == LeaderState::kLeader) {
      EXPECT_EQ(r[i].leader->term, new_leader->term()) << "report " << i << " names a superseded leader";
      EXPECT_EQ(r[i].leader->value, "new");
    }
  }
}

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_OBSERVER_CUT_HPP_
