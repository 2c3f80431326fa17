// dlock-bench-participant: one participant of the election benchmark
// (bench/election.py, docs/benchmarks.md, "Failover and handover"). It
// campaigns for --rounds terms and writes one line per event to stdout, each
// stamped with CLOCK_MONOTONIC in nanoseconds, the clock every participant
// of the run shares whatever its language (Java's System.nanoTime and
// Python's time.monotonic_ns read the same one on Linux):
//
//   STARTED <ns>            connected; campaigning next
//   LEADER <ns> <term>      told it leads
//   RESIGN <ns>             about to resign (handover is measured from here)
//
// --hold-ms -1 holds the first term until the process is killed (failover).
#include <time.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <thread>

#include "dlock/dlock.hpp"

namespace {

std::int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"one participant of the election benchmark"};
  std::string url, name = "bench/election", value = "dlock";
  int rounds = 1, hold_ms = 100;
  app.add_option("--url", url)->required();
  app.add_option("--name", name);
  app.add_option("--value", value);
  app.add_option("--rounds", rounds, "terms to lead, one campaign each");
  app.add_option("--hold-ms", hold_ms, "how long each term lasts; -1: until killed");
  CLI11_PARSE(app, argc, argv);
  try {
    auto client = dlock::Client::connect(url);
    dlock::Election election(client, name);
    Say("STARTED " + std::to_string(NowNs()));
    for (int round = 0; round < rounds; ++round) {
      std::optional<dlock::Leadership> lead = election.campaign(value, std::chrono::minutes(5));
      if (!lead) return 3;
      Say("LEADER " + std::to_string(NowNs()) + " " + std::to_string(lead->term()));
      if (hold_ms < 0) {
        std::this_thread::sleep_for(std::chrono::hours(1));
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
      Say("RESIGN " + std::to_string(NowNs()));
      lead->resign();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dlock-bench-participant: %s\n", e.what());
    return 1;
  }
  return 0;
}
