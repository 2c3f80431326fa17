// File: dlock/dlock.hpp
//
// dlock: distributed locks for C++20 on the stores you already run
// (ZooKeeper, Redis, ...) and on two embedded stores that need no server
// (mem:// in-process, file:// host-local). Include this one header.
//
//   auto client = dlock::Client::connect("file://");  // this user's /tmp/dlock-UID
//   dlock::Mutex m(client, "jobs/nightly");
//   std::unique_lock lock(m);  // <mutex>; std::shared_lock needs <shared_mutex>
//   do_work(*m.fencing_token());
//
// examples/quickstart.cpp is a whole program.
#ifndef DLOCK_DLOCK_HPP_
#define DLOCK_DLOCK_HPP_

#include "dlock/async.hpp"
#include "dlock/client.hpp"
#include "dlock/clock.hpp"
#include "dlock/election.hpp"
#include "dlock/hold.hpp"
#include "dlock/inspect.hpp"
#include "dlock/leader_latch.hpp"
#include "dlock/mem_store.hpp"
#include "dlock/mutex.hpp"
#include "dlock/read_write_lock.hpp"
#include "dlock/semaphore.hpp"
#include "dlock/status.hpp"
#include "dlock/store.hpp"
#include "dlock/timeout.hpp"
#include "dlock/version.hpp"

#endif  // DLOCK_DLOCK_HPP_
