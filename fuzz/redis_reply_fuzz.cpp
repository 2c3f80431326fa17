// The redis store decodes the entry lists its scripts return (id, seq, token,
// kind, attempt [, owner] [, value version, value] per entry), and the head
// readings (soonest lease, head stamp, entry), from a server that may answer
// anything.
// The input is RESP, parsed by hiredis's reader as the connection does.
#include <cstddef>
#include <cstdint>

#include <hiredis/hiredis.h>

#include "fuzz_check.hpp"
#include "stores/redis/redis_conn.hpp"
#include "stores/redis/redis_entries.hpp"

namespace redis = dlock::internal::redis;

namespace {

// hiredis allocates an array's element table before reading any element
// (0.14 has no maxelements): refuse big ones, which only test the allocator.
decltype(redisReplyObjectFunctions::createArray) real_create_array = nullptr;

template <typename N>
void* CreateSmallArray(const redisReadTask* task, N elements) {
  return elements > 4096 ? nullptr : real_create_array(task, elements);
}

void Check(const redis::Reply& reply, std::size_t from, bool owners, bool values) {
  auto entries = redis::ParseEntries(reply, from, owners, values);
  if (!entries.ok()) {
    DLOCK_FUZZ_CHECK(entries.status().code() == dlock::ErrorCode::kInternal);
    return;
  }
  const std::size_t width = 5 + (owners ? 1 : 0) + (values ? 2 : 0);
  DLOCK_FUZZ_CHECK(reply.is_array() && entries->size() * width == reply.size() - from);
  for (std::size_t i = 0; i < entries->size(); ++i) {
    const dlock::Entry& e = (*entries)[i];
    DLOCK_FUZZ_CHECK(!e.id.empty());        // remove() and wait take it
    DLOCK_FUZZ_CHECK(e.token.has_value());  // find_own's entry must have one
    DLOCK_FUZZ_CHECK(redis::KnownKind(e.kind) == e.kind);
    DLOCK_FUZZ_CHECK(owners || !e.owner.has_value());
    DLOCK_FUZZ_CHECK(values || (!e.value.has_value() && e.value_version == 0));
    if (i > 0) DLOCK_FUZZ_CHECK(!dlock::QueueOrder(e, (*entries)[i - 1]));  // the recipes' rules need it
  }
}

void CheckHead(const redis::Reply& reply, bool owners) {
  auto read = redis::ParseHead(reply, owners);
  if (!read.ok()) {
    DLOCK_FUZZ_CHECK(read.status().code() == dlock::ErrorCode::kInternal);
    return;
  }
  DLOCK_FUZZ_CHECK(!read->head.entry || !read->head.entry->id.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  redisReader* reader = redisReaderCreate();
  if (reader == nullptr) return 0;
  redisReplyObjectFunctions fns = *reader->fn;
  real_create_array = fns.createArray;
  fns.createArray = &CreateSmallArray;
  reader->fn = &fns;
  void* parsed = nullptr;
  if (redisReaderFeed(reader, reinterpret_cast<const char*>(data), size) == REDIS_OK &&
      redisReaderGetReply(reader, &parsed) == REDIS_OK && parsed != nullptr) {
    const redis::Reply reply(static_cast<redisReply*>(parsed));
    for (std::size_t from : {0, 2}) {
      for (bool owners : {false, true}) {
        for (bool values : {false, true}) Check(reply, from, owners, values);
      }
    }
    for (bool owners : {false, true}) CheckHead(reply, owners);
  }
  redisReaderFree(reader);
  return 0;
}
