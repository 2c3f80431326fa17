// Internal: what election.cpp and election_observer.cpp share.
#ifndef DLOCK_SRC_RECIPES_ELECTION_INTERNAL_HPP_
#define DLOCK_SRC_RECIPES_ELECTION_INTERNAL_HPP_

#include "dlock/election.hpp"
#include "dlock/store.hpp"

namespace dlock::internal {

// What a reading says of one candidate.
LeaderInfo LeaderInfoOf(const Entry& e);

}  // namespace dlock::internal

#endif  // DLOCK_SRC_RECIPES_ELECTION_INTERNAL_HPP_
