// Internal: the library's one way into the private parts of the public
// handles (Client, Hold, Leadership). The public headers declare dlock::internal::Access
// as a friend and nothing more; it is defined only here, inside the library,
// so applications cannot reach a Client's or a Hold's internals.
#ifndef DLOCK_SRC_CORE_ACCESS_HPP_
#define DLOCK_SRC_CORE_ACCESS_HPP_

#include <memory>
#include <utility>

#include "dlock/client.hpp"
#include "dlock/election.hpp"
#include "dlock/hold.hpp"

namespace dlock::internal {

class ClientCore;
class HoldCore;
class LeadershipCore;

struct Access {
  static const std::shared_ptr<ClientCore>& core_of(const Client& client) noexcept { return client.core_; }
  static const std::shared_ptr<HoldCore>& core_of(const Hold& hold) noexcept { return hold.core_; }
  static Hold wrap(std::shared_ptr<HoldCore> core) noexcept { return Hold(std::move(core)); }
  static const std::shared_ptr<LeadershipCore>& core_of(const Leadership& l) noexcept { return l.core_; }
  static Leadership wrap(std::shared_ptr<LeadershipCore> core) noexcept { return Leadership(std::move(core)); }
};

inline const std::shared_ptr<ClientCore>& CoreOf(const Client& client) noexcept { return Access::core_of(client); }
inline const std::shared_ptr<HoldCore>& CoreOf(const Hold& hold) noexcept { return Access::core_of(hold); }
// A Hold over a HoldCore the recipes made.
inline Hold WrapHold(std::shared_ptr<HoldCore> core) noexcept { return Access::wrap(std::move(core)); }
inline const std::shared_ptr<LeadershipCore>& CoreOf(const Leadership& l) noexcept { return Access::core_of(l); }

}  // namespace dlock::internal

#endif  // DLOCK_SRC_CORE_ACCESS_HPP_
