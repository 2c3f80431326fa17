// The zk store parses the names of every child of a lock znode, written by
// dlock, Curator, kazoo or anyone. Sequences and UUIDs round-trip.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"
#include "stores/zookeeper/zk_names.hpp"

namespace zk = dlock::internal::zk;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto e = zk::ParseChildName(text)) {
    DLOCK_FUZZ_CHECK(e->id == text);
    DLOCK_FUZZ_CHECK(zk::ValidateEntryId(e->id).ok());
  }
  // Ten digits above INT32_MAX wrap by design (a counter printed unsigned),
  // so the canonical form is what must round-trip.
  if (auto seq = zk::ParseSequence(text)) DLOCK_FUZZ_CHECK(zk::ParseSequence(zk::FormatSequence(*seq)) == seq);
  if (auto id = zk::UuidToAttemptId(text)) {
    auto uuid = zk::AttemptIdToUuid(*id);
    DLOCK_FUZZ_CHECK(uuid.has_value() && uuid->size() == 36);
  }
  std::vector<std::string> children;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '\n') {
      children.emplace_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  auto parsed = zk::ParseChildren(children);
  const auto& entries = parsed.entries;
  for (std::size_t i = 1; i < entries.size(); ++i) DLOCK_FUZZ_CHECK(!dlock::QueueOrder(entries[i], entries[i - 1]));
  for (const auto& e : entries) DLOCK_FUZZ_CHECK(zk::HasKnownEntryShape(e.id));
  // A queue name the store accepts never has a segment of a known entry shape.
  if (zk::ValidateQueueName(text).ok()) DLOCK_FUZZ_CHECK(!zk::HasKnownEntryShape(text.substr(text.rfind('/') + 1)));
  return 0;
}
