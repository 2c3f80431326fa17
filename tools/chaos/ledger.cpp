#include "ledger.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

namespace dlock::chaos {

std::int64_t MonotonicNanos() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void AppendLine(int fd, const std::string& line) {
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::perror("dlock-chaos: ledger");
}

namespace {

struct HoldRec {
  int slot = 0;
  long pid = 0;
  std::uint64_t token = 0;
  std::int64_t wait_begin = 0, start = 0, end = 0, uncertain = -1, lost = -1;
  std::string state;
  std::int64_t obs = -1;  // when a sample that saw kHeld last began (-1: none, or an old ledger)
  std::string lock = "chaos/lock";
  std::string mode = "x";  // x: exclusive, w / r: ReadWriteLock write / read
  int thread = 0;
  bool told() const { return uncertain >= 0 || lost >= 0; }
};

struct WaitRec {
  int slot = 0;
  long pid = 0;
  int thread = 0;
  std::int64_t begin = 0, end = -1;
  std::string outcome;
};

struct Interval {
  std::int64_t t0 = 0, t1 = 0;
};

// How long [a, b] overlaps the pauses of `pid`.
std::int64_t PausedWithin(const std::multimap<long, Interval>& stops, long pid, std::int64_t a, std::int64_t b) {
  std::int64_t total = 0;
  auto [lo, hi] = stops.equal_range(pid);
  for (auto it = lo; it != hi; ++it) {
    std::int64_t s = std::max(a, it->second.t0), e = std::min(b, it->second.t1);
    if (e > s) total += e - s;
  }
  return total;
}

}  // namespace

int CheckLedger(const std::string& path, const CheckOptions& options, std::ostream& out) {
  std::ifstream in(path);
  if (!in) {
    out << "cannot read ledger " << path << "\n";
    return 1;
  }
  std::vector<HoldRec> holds;
  std::map<std::tuple<long, int, std::int64_t>, WaitRec> waits;  // by (pid, thread, begin)
  std::map<std::string, int> faults;
  std::multimap<long, Interval> stops;
  std::set<long> killed;
  std::map<std::string, std::string> config;
  std::vector<std::string> crashes, hung, stuck;
  std::set<std::pair<long, std::int64_t>> stops_begun;  // P lines: (pid, t0)
  int malformed = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string tag;
    f >> tag;
    if (tag == "C") {
      for (std::string kv; f >> kv;) {
        auto eq = kv.find('=');
        if (eq != std::string::npos) config[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
    } else if (tag == "B") {
      WaitRec w;
      if (!(f >> w.slot >> w.pid >> w.begin)) {
        ++malformed;
        continue;
      }
      f >> w.thread;
      waits.emplace(std::make_tuple(w.pid, w.thread, w.begin), w);
    } else if (tag == "W") {
      WaitRec w;
      if (!(f >> w.slot >> w.pid >> w.begin >> w.end >> w.outcome)) {
        ++malformed;
        continue;
      }
      f >> w.thread;
      waits[std::make_tuple(w.pid, w.thread, w.begin)] = w;
    } else if (tag == "H") {
      HoldRec h;
      if (!(f >> h.slot >> h.pid >> h.token >> h.wait_begin >> h.start >> h.end >> h.uncertain >> h.lost >> h.state)) {
        ++malformed;
        continue;
      }
      f >> h.obs >> h.lock >> h.mode >> h.thread;  // absent in older ledgers
      holds.push_back(h);
    } else if (tag == "F") {
      std::string kind;
      long pid = 0;
      Interval iv;
      if (!(f >> kind >> pid >> iv.t0 >> iv.t1)) {
        ++malformed;
        continue;
      }
      ++faults[kind];
      if (kind == "stop") {
        stops.emplace(pid, iv);
        stops_begun.erase({pid, iv.t0});
      }
      if (kind == "kill") killed.insert(pid);
    } else if (tag == "P") {
      long pid = 0;
      std::int64_t t0 = 0;
      if (!(f >> pid >> t0)) {
        ++malformed;
        continue;
      }
      stops_begun.insert({pid, t0});
    } else if (tag == "STUCK") {
      stuck.push_back(line);
    } else if (tag == "D") {
      crashes.push_back(line);
    } else if (tag == "HUNG") {
      hung.push_back(line);
    } else if (!tag.empty()) {
      ++malformed;
    }
  }
  // A stop that was never continued (the runner died or hung): a pause to the end.
  std::vector<std::string> never_continued;
  for (const auto& [pid, t0] : stops_begun) {
    stops.emplace(pid, Interval{t0, std::numeric_limits<std::int64_t>::max()});
    never_continued.push_back("worker " + std::to_string(pid) + " SIGSTOPped at " + std::to_string(t0) +
                              " was never continued");
  }
  std::int64_t timeout_ms = options.acquire_timeout_ms;
  if (timeout_ms == 0 && config.count("acquire_timeout_ms")) timeout_ms = std::stoll(config["acquire_timeout_ms"]);

  std::sort(holds.begin(), holds.end(), [](const HoldRec& a, const HoldRec& b) { return a.start < b.start; });
  auto paused = [&](const HoldRec& h) { return PausedWithin(stops, h.pid, h.wait_begin, h.end) > 0; };
  // Two holds conflict unless both are read holds of a ReadWriteLock.
  auto conflict = [](const HoldRec& a, const HoldRec& b) { return !(a.mode == "r" && b.mode == "r"); };
  auto who = [](const HoldRec& h) {
    return "pid " + std::to_string(h.pid) + (h.thread ? " thread " + std::to_string(h.thread) : std::string()) +
           " token " + std::to_string(h.token);
  };
  std::map<std::string, std::vector<std::size_t>> by_lock;  // in start order
  for (std::size_t i = 0; i < holds.size(); ++i) by_lock[holds[i].lock].push_back(i);

  int overlaps = 0, overlap_paused = 0, overlap_told = 0, overlap_unexplained = 0, fencing_violations = 0;
  int duplicate_tokens = 0, rejected_writes = 0, out_of_order = 0, out_of_order_explained = 0;
  int observed_after = 0, observed_after_paused = 0, observations = 0;
  std::vector<std::string> details;
  for (const auto& [lock, idx] : by_lock) {
    const std::string in_lock = by_lock.size() > 1 ? " [" + lock + "]" : "";
    // Fencing: a resource that remembers the largest token it has seen and
    // accepts a write only with a token at least as large. Each hold writes at
    // its start and at its end.
    struct Write {
      std::int64_t t;
      std::size_t hold;
    };
    std::vector<Write> writes;
    for (const std::size_t i : idx) {
      writes.push_back({holds[i].start, i});
      writes.push_back({holds[i].end, i});
    }
    std::sort(writes.begin(), writes.end(), [](const Write& a, const Write& b) { return a.t < b.t; });
    std::map<std::size_t, bool> accepted;
    for (const std::size_t i : idx) accepted[i] = true;
    // A read hold's accesses are reads: checked against the largest write
    // token only, and they do not refuse each other; a write is checked
    // against every token seen.
    std::uint64_t max_token = 0, max_write = 0;
    for (const auto& w : writes) {
      const HoldRec& h = holds[w.hold];
      const bool read = h.mode == "r";
      if (h.token < (read ? max_write : max_token)) {
        accepted[w.hold] = false;
        ++rejected_writes;
      }
      max_token = std::max(max_token, h.token);
      if (!read) max_write = std::max(max_write, h.token);
    }

    // Overlapping pairs. The stale one is the one with the smaller token.
    for (std::size_t x = 0; x < idx.size(); ++x) {
      for (std::size_t y = x + 1; y < idx.size() && holds[idx[y]].start < holds[idx[x]].end; ++y) {
        const HoldRec& a = holds[idx[x]];
        const HoldRec& b = holds[idx[y]];
        if (!conflict(a, b)) continue;
        ++overlaps;
        if (a.token == b.token) ++duplicate_tokens;
        if (accepted[idx[x]] && accepted[idx[y]]) {
          ++fencing_violations;
          details.push_back("fencing" + in_lock + ": tokens " + std::to_string(a.token) + " and " +
                            std::to_string(b.token) + " overlapped and both were accepted");
        }
        const HoldRec& stale = a.token < b.token ? a : b;
        if (paused(stale)) {
          ++overlap_paused;
        } else if (stale.told()) {
          ++overlap_told;
        } else {
          ++overlap_unexplained;
          details.push_back("overlap not explained by a pause or a notice" + in_lock + ": " + who(stale) + " [" +
                            std::to_string(stale.start) + ", " + std::to_string(stale.end) + "] vs " +
                            who(&stale == &a ? b : a));
        }
      }
    }

    // Token order: a hold that began after a conflicting one ended must have
    // a larger token, unless it was paused between getting its token and
    // starting. (Read holds take their tokens in the queue and may be granted
    // together: a read is compared with the writes that ended only.)
    {
      std::vector<std::size_t> by_end = idx;
      std::sort(by_end.begin(), by_end.end(),
                [&](std::size_t x, std::size_t y) { return holds[x].end < holds[y].end; });
      std::size_t k = 0;
      std::uint64_t max_all = 0, max_ended_write = 0;
      bool any_all = false, any_ended_write = false;
      for (const std::size_t i : idx) {  // by start
        const HoldRec& b = holds[i];
        while (k < by_end.size() && holds[by_end[k]].end <= b.start) {
          const HoldRec& e = holds[by_end[k]];
          max_all = std::max(max_all, e.token);
          any_all = true;
          if (e.mode != "r") {
            max_ended_write = std::max(max_ended_write, e.token);
            any_ended_write = true;
          }
          ++k;
        }
        const bool any_ended = b.mode == "r" ? any_ended_write : any_all;
        const std::uint64_t max_ended = b.mode == "r" ? max_ended_write : max_all;
        if (any_ended && b.token <= max_ended) {
          if (b.token != max_ended && (paused(b) || b.told())) {
            ++out_of_order_explained;
          } else {
            ++out_of_order;
            details.push_back("token order" + in_lock + ": " + who(b) + " began after a hold with token " +
                              std::to_string(max_ended) + " ended");
          }
        }
      }
    }

    // Hold level: no holder may observe its hold kHeld (state() kHeld and
    // lost_token() not requested) after a later holder of the same lock was
    // granted. A sample that began at h.obs saw kHeld; g was granted at the
    // latest at g.start (when its acquire returned). g was granted after h
    // if it started later and either has the larger token or began waiting
    // after h had started (tokens alone cannot tell once a store has lost
    // data and hands out old tokens again); or if it started earlier with a
    // larger token while h was paused between its grant and its start. A
    // pause does not excuse the observation: the process looked after it.
    for (const std::size_t i : idx) {
      const HoldRec& h = holds[i];
      if (h.obs < 0) continue;
      ++observations;
      for (const std::size_t j : idx) {
        const HoldRec& g = holds[j];
        if (g.start >= h.obs) break;  // by start: none later can be earlier than the sample
        if (j == i || !conflict(h, g)) continue;
        const bool later =
            (g.start > h.start && (g.token > h.token || g.wait_begin > h.start)) ||
            (g.start <= h.start && g.token > h.token && PausedWithin(stops, h.pid, h.wait_begin, h.start) > 0);
        if (!later) continue;
        ++observed_after;
        if (paused(h)) ++observed_after_paused;
        details.push_back("hold level" + in_lock + ": " + who(h) + " saw kHeld " +
                          std::to_string((h.obs - g.start) / 1'000'000) + " ms after " + who(g) +
                          " was granted (sample at " + std::to_string(h.obs) + ", grant by " + std::to_string(g.start) +
                          (paused(h) ? "; the stale holder had been SIGSTOPped" : "") +
                          (h.told() ? "; it was told uncertain/lost at some point" : "; it was never told") + ")");
        break;
      }
    }
  }
  // Liveness: every acquire attempt ends within its timeout plus slack (not
  // counting time the worker spent stopped), unless its worker was killed.
  int waits_total = 0, waits_unended = 0, waits_too_long = 0;
  std::map<std::string, int> outcomes;
  std::int64_t longest_ms = 0;
  for (const auto& [key, w] : waits) {
    ++waits_total;
    if (w.end < 0) {
      if (!killed.count(w.pid)) {
        ++waits_unended;
        details.push_back("liveness: pid " + std::to_string(w.pid) + "'s wait from " + std::to_string(w.begin) +
                          " never ended");
      }
      continue;
    }
    ++outcomes[w.outcome];
    const std::int64_t ms = (w.end - w.begin - PausedWithin(stops, w.pid, w.begin, w.end)) / 1'000'000;
    longest_ms = std::max(longest_ms, ms);
    if (timeout_ms > 0 && ms > timeout_ms + options.liveness_slack_ms) {
      ++waits_too_long;
      details.push_back("liveness: pid " + std::to_string(w.pid) + " waited " + std::to_string(ms) + " ms (" +
                        w.outcome + ")");
    }
  }

  int lost_holds = 0, uncertain_holds = 0;
  for (const auto& h : holds) {
    if (h.lost >= 0)
      ++lost_holds;
    else if (h.uncertain >= 0)
      ++uncertain_holds;
  }

  // Per check, so that --known can set some aside (still reported).
  const std::vector<std::pair<std::string, int>> per_check = {
      {"fencing", fencing_violations},
      {"overlaps", overlap_unexplained},
      {"token-order", out_of_order},
      {"duplicates", duplicate_tokens},
      {"hold-level", observed_after},
      {"liveness", waits_unended + waits_too_long + static_cast<int>(hung.size())},
      {"crashes", static_cast<int>(crashes.size())},
      {"runner", static_cast<int>(stuck.size() + never_continued.size())},
      {"orphans", options.orphans > 0 ? 1 : 0},
      {"malformed", malformed > 0 ? 1 : 0},
  };
  int violations = 0;
  std::string known_text;
  for (const auto& [check, n] : per_check) {
    if (n == 0) continue;
    if (options.known.count(check))
      known_text += " " + check + "=" + std::to_string(n);
    else
      violations += n;
  }
  out << "ledger: " << path << "\n";
  for (const auto& [k, v] : config) out << "  " << k << " = " << v << "\n";
  out << "holds: " << holds.size() << " (told uncertain: " << uncertain_holds << ", told lost: " << lost_holds << ")\n";
  out << "faults:";
  int nfaults = 0;
  for (const auto& [k, v] : faults) {
    out << " " << k << "=" << v;
    nfaults += v;
  }
  out << " (total " << nfaults << ")\n";
  out << "acquire attempts: " << waits_total;
  for (const auto& [k, v] : outcomes) out << " " << k << "=" << v;
  out << ", longest " << longest_ms << " ms not counting pauses\n";
  out << "CHECK fencing: overlapping holds both accepted by a token-checking resource: " << fencing_violations
      << " (writes rejected: " << rejected_writes << ")\n";
  out << "CHECK wall-clock overlaps: " << overlaps << " (stale holder paused: " << overlap_paused
      << ", stale holder told uncertain/lost: " << overlap_told << ", unexplained: " << overlap_unexplained << ")\n";
  out << "CHECK duplicate tokens among overlapping holds: " << duplicate_tokens << "\n";
  out << "CHECK tokens out of order: " << out_of_order
      << " (explained by a pause or a notice: " << out_of_order_explained << ")\n";
  out << "CHECK hold level: kHeld observed after a later holder's grant: " << observed_after
      << " (of them by a holder that had been stopped: " << observed_after_paused
      << "; holds with a kHeld sample: " << observations << ")\n";
  out << "CHECK liveness: waits never ended: " << waits_unended << ", waits over the bound: " << waits_too_long
      << ", hung workers: " << hung.size() << "\n";
  out << "CHECK worker crashes: " << crashes.size() << "\n";
  out << "CHECK runner: stuck: " << stuck.size() << ", stops never continued: " << never_continued.size() << "\n";
  out << "CHECK orphans: " << (options.orphans < 0 ? std::string("not checked") : std::to_string(options.orphans))
      << "\n";
  if (malformed) out << "CHECK malformed ledger lines: " << malformed << "\n";
  for (const auto& l : crashes) out << "  crash: " << l << "\n";
  for (const auto& l : hung) out << "  hung: " << l << "\n";
  for (const auto& l : stuck) out << "  " << l << "\n";
  for (const auto& l : never_continued) out << "  " << l << "\n";
  const std::size_t shown = std::min<std::size_t>(details.size(), 20);
  for (std::size_t i = 0; i < shown; ++i) out << "  " << details[i] << "\n";
  const std::string known_note = known_text.empty() ? "" : " (known failures, not counted:" + known_text + ")";
  out << (violations == 0 ? "RESULT: OK" : "RESULT: " + std::to_string(violations) + " violation(s)") << known_note
      << "\n";
  return violations;
}

}  // namespace dlock::chaos
