// A Hold: one acquired lock that any thread may release, with its fencing
// token and the signal that it was lost; and errors as values, from
// Client::open instead of the throwing Client::connect.
#include <dlock/dlock.hpp>

#include <chrono>
#include <cstdio>
#include <optional>
#include <stop_token>
#include <thread>
#include <utility>

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  dlock::Result<dlock::Client> client = dlock::Client::open(argc > 1 ? argv[1] : "file://");
  if (!client.ok()) {  // e.g. "InvalidArgument: unknown store URL scheme 'gopher://' ..."
    std::fprintf(stderr, "%s\n", client.status().to_string().c_str());
    return 1;
  }

  dlock::Mutex reports(*client, "reports/daily");
  std::optional<dlock::Hold> hold = reports.acquire(10s);
  if (!hold) {
    std::puts("someone else is writing the report; not waiting longer");
    return 0;
  }
  std::printf("writing the report under token %llu\n", static_cast<unsigned long long>(hold->fencing_token()));

  // The hold moves to another thread, which releases it there.
  std::jthread worker([hold = std::move(*hold)]() mutable {
    std::stop_token lost = hold.lost_token();  // requested if the hold becomes uncertain or lost
    for (int part = 1; part <= 3 && !lost.stop_requested(); ++part) {
      std::printf("part %d written\n", part);
    }
    hold.release();  // or let the destructor do it
  });
}
