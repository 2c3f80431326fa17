// Internal: a list of callbacks that anyone may join and leave at any time,
// called without the list's lock held. Sessions, holds and the manual clock
// all tell their listeners this way.
#ifndef DLOCK_SRC_CORE_LISTENERS_HPP_
#define DLOCK_SRC_CORE_LISTENERS_HPP_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "core/thread_annotations.hpp"

namespace dlock::internal {

template <class... Args>
class ListenerList {
 public:
  using Fn = std::function<void(Args...)>;

  // Adds `fn`; the returned handle removes it when destroyed, and outlives
  // the list safely. A call already running may finish after the removal, so
  // `fn` should capture weak references.
  std::shared_ptr<void> add(Fn fn) {
    std::uint64_t key;
    {
      MutexLock g(rep_->mu);
      key = rep_->next++;
      rep_->fns.emplace(key, std::make_shared<Fn>(std::move(fn)));
    }
    std::weak_ptr<Rep> weak = rep_;
    return std::shared_ptr<void>(nullptr, [weak, key](void*) {
      if (auto rep = weak.lock()) {
        MutexLock g(rep->mu);
        rep->fns.erase(key);
      }
    });
  }

  // Calls every listener present now, in the order they joined, without the
  // lock held. A listener that throws is skipped; the others still hear.
  void notify(Args... args) const DLOCK_EXCLUDES(rep_->mu) {
    std::vector<std::shared_ptr<Fn>> fns;
    {
      MutexLock g(rep_->mu);
      for (const auto& [key, fn] : rep_->fns) fns.push_back(fn);
    }
    for (const auto& fn : fns) {
      try {
        (*fn)(args...);
      } catch (...) {
      }
    }
  }

  void clear() {
    MutexLock g(rep_->mu);
    rep_->fns.clear();
  }

 private:
  struct Rep {
    Mutex mu;
    std::uint64_t next DLOCK_GUARDED_BY(mu) = 0;
    std::map<std::uint64_t, std::shared_ptr<Fn>> fns DLOCK_GUARDED_BY(mu);  // by joining order
  };
  std::shared_ptr<Rep> rep_ = std::make_shared<Rep>();
};

}  // namespace dlock::internal

#endif  // DLOCK_SRC_CORE_LISTENERS_HPP_
