// Leader election: campaign with a value (here, the address others should
// call), lead under a term a resource can fence by, publish a new value
// without giving up leadership, and follow who leads from anywhere.
#include <dlock/dlock.hpp>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  dlock::Client client = dlock::Client::connect(argc > 1 ? argv[1] : "file://");
  dlock::Election election(client, "billing/scheduler");

  // Told every change of leader, "no leader" included, on a dlock thread.
  auto following = election.observe([](const dlock::Observation& o) {
    std::string who = o.leader ? o.leader->value : "-";
    std::printf("observed: %s %s\n", std::string(dlock::LeaderStateName(o.state)).c_str(), who.c_str());
  });

  std::optional<dlock::Leadership> lead = election.campaign("10.0.0.7:8080", 10s);
  if (!lead) {
    std::puts("another scheduler leads; not waiting longer");
    return 0;
  }
  std::printf("leading in term %llu\n", static_cast<unsigned long long>(lead->term()));
  if (dlock::Status moved = lead->proclaim("10.0.0.7:9090"); !moved.ok()) {  // same term, new address
    std::printf("not published: %s\n", moved.to_string().c_str());
  }
  if (auto now = election.leader(); now.ok() && now->has_value()) {
    std::printf("leader: %s, term %llu\n", (*now)->value.c_str(), static_cast<unsigned long long>((*now)->term));
  }
  lead->resign();  // the next candidate leads at once; or let the destructor do it
}
