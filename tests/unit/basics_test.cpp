// Names, URLs, owner records, errors: the inputs dlock must refuse clearly.
#include <gtest/gtest.h>

#include "core/url.hpp"
#include "dlock/dlock.hpp"

namespace dlock {
namespace {

TEST(LockName, AcceptsPathLikeNames) {
  for (const char* ok : {"a", "orders/42", "a.b_c-d/E9", "x/y/z"}) {
    EXPECT_TRUE(ValidateLockName(ok).ok()) << ok;
  }
}

TEST(LockName, RejectsHostileNames) {
  const std::string nul("a\0b", 3);
  const std::string huge(1 << 20, 'a');
  for (const std::string& bad :
       {std::string(), std::string("/abs"), std::string("trail/"), std::string("a//b"), std::string("a/../b"),
        std::string(".."), std::string("./a"), nul, huge, std::string("sp ace"), std::string("uni\xc3\xa9")}) {
    Status s = ValidateLockName(bad);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << bad.substr(0, 20);
    EXPECT_FALSE(s.message().empty());
  }
  EXPECT_NE(ValidateLockName(nul).message().find("NUL"), std::string::npos);
}

TEST(LockName, RecipesRefuseBadNames) {
  auto client = Client::connect("mem://");
  EXPECT_THROW(Mutex(client, "a/../b"), Error);
  EXPECT_THROW(Semaphore(client, "", 1), Error);
  EXPECT_THROW(Semaphore(client, "ok", 0), Error);
}

TEST(Url, ParsesEveryPart) {
  auto u = internal::ParseUrl("zk://alice:s%3Acret@h1:2181,[::1]:2182,h3/app/locks?session_timeout=5s");
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  EXPECT_EQ(u->scheme, "zk");
  EXPECT_EQ(u->user, "alice");
  EXPECT_EQ(u->password, "s:cret");
  ASSERT_EQ(u->hosts.size(), 3u);
  EXPECT_EQ(u->hosts[1].host, "::1");
  EXPECT_EQ(u->hosts[1].port, 2182);
  EXPECT_FALSE(u->hosts[2].port);
  EXPECT_EQ(u->path, "/app/locks");
  EXPECT_EQ(u->query.at("session_timeout"), "5s");
  EXPECT_EQ(u->redacted().find("cret"), std::string::npos);
}

TEST(Url, RejectsMalformedUrlsClearly) {
  struct Case {
    const char* url;
    const char* says;
  } cases[] = {
      {"", "empty"},
      {"orders", "no scheme"},
      {"zk://h:0", "out of range"},
      {"zk://h:65536", "out of range"},
      {"zk://h:12ab", "not a number"},
      {"zk://h:", "empty port"},
      {"zk://h%zz", "invalid character"},
      {"redis://h/x?ttl", "key=value"},
      {"redis://h/x?a=1&a=2", "twice"},
  };
  for (const auto& c : cases) {
    auto u = internal::ParseUrl(c.url);
    ASSERT_FALSE(u.ok()) << c.url;
    EXPECT_EQ(u.status().code(), ErrorCode::kInvalidArgument) << c.url;
    EXPECT_NE(u.status().message().find(c.says), std::string::npos) << c.url << ": " << u.status().message();
  }
}

TEST(Url, OpenStoreNamesUnknownSchemes) {
  auto s = OpenStore("gopher://x");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("gopher"), std::string::npos);
  EXPECT_FALSE(OpenStore("mem://host").ok());
  EXPECT_FALSE(OpenStore("mem://?x=1").ok());
  EXPECT_THROW(Client::connect("nope"), Error);
  EXPECT_FALSE(Client::open("nope").ok());
}

TEST(Url, ParsesDurations) {
  EXPECT_EQ(internal::ParseDuration("500ms").value(), std::chrono::milliseconds(500));
  EXPECT_EQ(internal::ParseDuration("10s").value(), std::chrono::seconds(10));
  EXPECT_EQ(internal::ParseDuration("2m").value(), std::chrono::minutes(2));
  // A bare number has no unit: refused, with the forms that work.
  auto bare = internal::ParseDuration("250");
  ASSERT_FALSE(bare.ok());
  EXPECT_EQ(bare.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bare.status().message().find("250s"), std::string::npos) << bare.status().message();
  EXPECT_NE(bare.status().message().find("250ms"), std::string::npos) << bare.status().message();
  EXPECT_FALSE(internal::ParseDuration("ten").ok());
  EXPECT_FALSE(internal::ParseDuration("5 parsecs").ok());
  EXPECT_FALSE(internal::ParseDuration("99999999999999999999s").ok());
}

TEST(OwnerRecord, RoundTripsAndRejectsGarbage) {
  OwnerRecord o{"host-1", 4242, "thread 7", "nightly \"job\"", 1700000000000};
  auto back = DecodeOwnerRecord(EncodeOwnerRecord(o));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->host, o.host);
  EXPECT_EQ(back->pid, o.pid);
  EXPECT_EQ(back->thread, o.thread);
  EXPECT_EQ(back->label, o.label);
  EXPECT_EQ(back->acquired_unix_ms, o.acquired_unix_ms);
  for (const char* bad : {"", "null", "[1]", "{\"pid\":\"x\"}", "{", "\xff\xfe"}) {
    EXPECT_FALSE(DecodeOwnerRecord(bad).ok()) << bad;
  }
  EXPECT_TRUE(DecodeOwnerRecord("{\"future\":1}").ok()) << "unknown fields are fine";
}

TEST(Status, FormatsAndThrows) {
  Status s = DeadlineExceededError("waiting for x");
  EXPECT_EQ(s.to_string(), "DeadlineExceeded: waiting for x");
  EXPECT_TRUE(OkStatus().ok());
  Result<int> r = NotFoundError("nope");
  EXPECT_FALSE(r.ok());
  EXPECT_THROW(r.value(), Error);
  Result<int> v = 7;
  EXPECT_EQ(*v, 7);
}

TEST(Timeout, ConvertsWithoutOverflow) {
  EXPECT_EQ(ToTimeout(std::chrono::hours::max()), kForever);
  EXPECT_EQ(ToTimeout(std::chrono::seconds(-5)), Clock::duration::zero());
  EXPECT_EQ(ToTimeout(std::chrono::system_clock::time_point::max()), kForever);
  EXPECT_EQ(ToTimeout(std::chrono::milliseconds(3)), std::chrono::milliseconds(3));
}

}  // namespace
}  // namespace dlock
