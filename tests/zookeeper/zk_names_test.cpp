// The znode names of the zk:// store and of the clients it interoperates
// with, and URL checking. No server needed.
#include <gtest/gtest.h>

#include "core/url.hpp"
#include "dlock/dlock.hpp"
#include "stores/zookeeper/zk_config.hpp"
#include "stores/zookeeper/zk_names.hpp"

namespace dlock::internal::zk {
namespace {

constexpr const char* kAttempt = "f290140d985642adb9bf348ffc086062";
constexpr const char* kUuid = "f290140d-9856-42ad-b9bf-348ffc086062";

TEST(ZkNames, AttemptIdIsCuratorsUuid) {
  EXPECT_EQ(AttemptIdToUuid(kAttempt), kUuid);
  EXPECT_EQ(UuidToAttemptId(kUuid), kAttempt);
  EXPECT_EQ(UuidToAttemptId("F290140D-9856-42AD-B9BF-348FFC086062"), kAttempt);
  EXPECT_FALSE(AttemptIdToUuid("f290140d"));
  EXPECT_FALSE(AttemptIdToUuid("F290140D985642ADB9BF348FFC086062"));  // dlock writes lower case
  EXPECT_FALSE(AttemptIdToUuid("g290140d985642adb9bf348ffc086062"));
  EXPECT_FALSE(UuidToAttemptId("f290140d98-56-42ad-b9bf-348ffc086062"));
}

TEST(ZkNames, PrefixesPerKind) {
  EXPECT_EQ(*EntryNamePrefix("lock", kAttempt), std::string("_c_") + kUuid + "-lock-");
  EXPECT_EQ(*EntryNamePrefix("write", kAttempt), std::string("_c_") + kUuid + "-__WRIT__");
  EXPECT_EQ(*EntryNamePrefix("read", kAttempt), std::string("_c_") + kUuid + "-__READ__");
  EXPECT_EQ(*EntryNamePrefix("lease", kAttempt), std::string("_c_") + kUuid + "-lease-");
  EXPECT_EQ(*EntryNamePrefix("candidate", kAttempt), std::string("_c_") + kUuid + "-latch-");  // Curator's LeaderLatch
  EXPECT_EQ(EntryNamePrefix("foreign", kAttempt).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(EntryNamePrefix("lock", "nothex").status().code(), ErrorCode::kInvalidArgument);
}

TEST(ZkNames, SequencesAsTheServerFormatsThem) {
  EXPECT_EQ(FormatSequence(0), "0000000000");
  EXPECT_EQ(FormatSequence(759), "0000000759");
  EXPECT_EQ(FormatSequence(-5), "-000000005");
  EXPECT_EQ(FormatSequence(INT32_MIN), "-2147483648");
  EXPECT_EQ(FormatSequence(INT32_MAX), "2147483647");
  for (std::int32_t v : {0, 1, 759, INT32_MAX, -1, -5, -999999999, -1000000000, INT32_MIN}) {
    EXPECT_EQ(ParseSequence(FormatSequence(v)), v) << v;
  }
  EXPECT_EQ(ParseSequence("4294967295"), -1);  // an unsigned printing of the counter
  EXPECT_FALSE(ParseSequence("9999999999"));
  EXPECT_FALSE(ParseSequence("000000001"));
  EXPECT_FALSE(ParseSequence("-2147483649"));
  EXPECT_FALSE(ParseSequence("00000000x1"));
}

TEST(ZkNames, CuratorNames) {
  struct Case {
    std::string name;
    const char* kind;
    std::int64_t seq;
  };
  std::string p = std::string("_c_") + kUuid + "-";
  for (const Case& c : std::vector<Case>{{p + "lock-0000000759", "lock", 759},
                                         {p + "__WRIT__0000000003", "write", 3},
                                         {p + "__READ__0000000004", "read", 4},
                                         {p + "lease-0000000012", "lease", 12},
                                         {p + "__READ__-000000005", "read", -5},
                                         {p + "lock--2147483648", "lock", INT32_MIN}}) {
    auto e = ParseChildName(c.name);
    ASSERT_TRUE(e) << c.name;
    EXPECT_EQ(e->id, c.name);
    EXPECT_EQ(e->kind, c.kind) << c.name;
    EXPECT_EQ(e->sequence, c.seq) << c.name;
    EXPECT_EQ(e->attempt_id, kAttempt) << c.name;
    EXPECT_FALSE(e->token);
  }
}

TEST(ZkNames, KazooGoAndForeignNames) {
  auto k = ParseChildName("0123456789abcdef0123456789abcdef__lock__0000000031");
  ASSERT_TRUE(k);
  EXPECT_EQ(k->kind, "lock");
  EXPECT_EQ(k->sequence, 31);
  EXPECT_EQ(k->attempt_id, "");  // not Curator-protected
  auto r = ParseChildName("0123456789abcdef0123456789abcdef__rlock__0000000032");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->kind, "read");
  // go-zookeeper's protected names: 32 hex digits without dashes.
  auto g = ParseChildName("_c_0123456789abcdef0123456789abcdef-lock-0000000033");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->kind, "lock");
  EXPECT_EQ(g->attempt_id, "0123456789abcdef0123456789abcdef");
  // ZooKeeper's own lock recipes: foreign. Curator's leader latch: a candidate.
  auto x = ParseChildName("x-72057594037927936-0000000034");
  ASSERT_TRUE(x);
  EXPECT_EQ(x->kind, "foreign");
  EXPECT_EQ(x->sequence, 34);
  auto l = ParseChildName(std::string("_c_") + kUuid + "-latch-0000000035");
  ASSERT_TRUE(l);
  EXPECT_EQ(l->kind, "candidate");
  EXPECT_EQ(l->sequence, 35);
  EXPECT_EQ(l->attempt_id, kAttempt);
  auto n = ParseChildName("x--000000007");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->sequence, -7);
  // No sequence suffix: not an entry (kazoo semaphore leases, stray nodes).
  EXPECT_FALSE(ParseChildName("0123456789abcdef0123456789abcdef"));
  EXPECT_FALSE(ParseChildName("leases"));
  EXPECT_FALSE(ParseChildName("lock-12"));
}

TEST(ZkNames, ChildrenSortBySequenceThenName) {
  std::string p = std::string("_c_") + kUuid + "-";
  auto parsed = ParseChildren({p + "lock-0000000010", "locks", p + "__READ__0000000002",
                               "0123456789abcdef0123456789abcdef__lock__0000000005", p + "__WRIT__0000000002"});
  EXPECT_TRUE(parsed.unsure.empty());
  const auto& entries = parsed.entries;
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].id, p + "__READ__0000000002");  // same sequence: by name
  EXPECT_EQ(entries[1].id, p + "__WRIT__0000000002");
  EXPECT_EQ(entries[2].sequence, 5);
  EXPECT_EQ(entries[3].sequence, 10);
}

// A nested queue's znode ("tenants/acct-123456789" under "tenants") may end
// like a sequence: only names of a known entry shape are entries for sure;
// other sequence-suffixed children are entries only if ephemeral.
TEST(ZkNames, OnlyKnownShapesAreCertainEntries) {
  std::string p = std::string("_c_") + kUuid + "-";
  auto parsed = ParseChildren({"acct-123456789", "run0000000001", p + "lock-0000000010", "x-1234-0000000002",
                               "0123456789abcdef0123456789abcdef__rlock__0000000003",
                               "_c_0123456789abcdef0123456789abcdef-lock-0000000004", p + "latch-0000000005",
                               "orders-lock-0000000006", "leases"});
  std::vector<std::string> sure, unsure;
  for (const auto& e : parsed.entries) sure.push_back(e.id);
  for (const auto& e : parsed.unsure) unsure.push_back(e.id);
  EXPECT_EQ(sure, (std::vector<std::string>{"0123456789abcdef0123456789abcdef__rlock__0000000003",
                                            "_c_0123456789abcdef0123456789abcdef-lock-0000000004",
                                            p + "latch-0000000005", p + "lock-0000000010"}));
  EXPECT_EQ(unsure, (std::vector<std::string>{"acct-123456789", "run0000000001", "x-1234-0000000002",
                                              "orders-lock-0000000006"}));
  EXPECT_EQ(parsed.unsure[3].kind, "lock");  // the tag still gives the kind
  EXPECT_EQ(parsed.entries[2].kind, "candidate");
  EXPECT_EQ(parsed.unsure[2].kind, "foreign");

  EXPECT_TRUE(IsSessionOwner(0x1000a3c9e5f0001));
  EXPECT_TRUE(IsSessionOwner(static_cast<std::int64_t>(0xc80000000000002aULL)));   // server id 200
  EXPECT_FALSE(IsSessionOwner(0));                                                 // persistent
  EXPECT_FALSE(IsSessionOwner(INT64_MIN));                                         // container
  EXPECT_FALSE(IsSessionOwner(static_cast<std::int64_t>(0xff00000000001000ULL)));  // TTL node
}

TEST(ZkNames, QueueNamesNeverLookLikeKnownEntries) {
  for (std::string ok : {"tenants/acct-123456789", "jobs/run0000000001", "orders-lock-0000000042", "_c_x/y",
                         "a/0123456789abcdef0123456789abcdef", "sem/locks", "sem/leases"}) {
    EXPECT_TRUE(ValidateQueueName(ok).ok()) << ok << ": " << ValidateQueueName(ok).to_string();
  }
  std::string protected_name = std::string("_c_") + kUuid + "-lock-0000000001";
  for (std::string bad : {"a/" + protected_name, protected_name + "/b",
                          std::string("a/_c_0123456789abcdef0123456789abcdef-lease-0000000007"),
                          std::string("a/_c_") + kUuid + "-latch-0000000008",
                          std::string("a/0123456789abcdef0123456789abcdef__lock__0000000001"),
                          std::string("0123456789abcdef0123456789abcdef__rlock__-000000001")}) {
    Status st = ValidateQueueName(bad);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ValidateQueueName("/abs").code(), ErrorCode::kInvalidArgument);  // and the lock-name rules
}

TEST(ZkNames, Paths) {
  EXPECT_EQ(QueuePath("", "a/b"), "/a/b");
  EXPECT_EQ(QueuePath("/root", "a"), "/root/a");
  EXPECT_EQ(PathPrefixes("/a/b/c"), (std::vector<std::string>{"/a", "/a/b", "/a/b/c"}));
  EXPECT_TRUE(ValidateEntryId("_c_x-lock-0000000001").ok());
  EXPECT_FALSE(ValidateEntryId("").ok());
  EXPECT_FALSE(ValidateEntryId("a/b").ok());
  EXPECT_FALSE(ValidateEntryId("..").ok());
}

Result<std::shared_ptr<const Config>> Parse(const std::string& url) {
  auto parsed = ParseUrl(url);
  if (!parsed.ok()) return parsed.status();
  return ParseConfig(*parsed, StoreOptions{});
}

TEST(ZkConfig, GoodUrls) {
  auto c = Parse("zk://alice:s%3Acret@h1:2181,h2,[::1]:2182/app/locks/?session_timeout=4s&acl=creator");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ((*c)->hosts, "h1:2181,h2:2181,[::1]:2182");
  EXPECT_EQ((*c)->chroot, "/app/locks");
  EXPECT_EQ((*c)->digest, "alice:s:cret");
  EXPECT_EQ((*c)->session_timeout, std::chrono::seconds(4));
  EXPECT_EQ((*c)->acl_mode, AclMode::kCreator);
  EXPECT_EQ((*c)->acl()->count, 1);
  EXPECT_STREQ((*c)->acl()->data[0].id.scheme, "auth");
  EXPECT_EQ((*c)->redacted_url.find("cret"), std::string::npos);
  auto r = Parse("zk://u:p@h/?acl=creator-read");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->chroot, "");
  EXPECT_EQ((*r)->acl()->count, 2);
  auto d = Parse("zookeeper://h");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->acl()->data[0].perms, ZOO_PERM_ALL);
  EXPECT_STREQ((*d)->acl()->data[0].id.scheme, "world");
}

TEST(ZkConfig, BadUrlsSayWhatIsWrong) {
  struct Case {
    const char* url;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"zk:///chroot", "host"},
           {"zk://alice@h", "password"},
           {"zk://h?acl=creator", "credentials"},
           {"zk://h?acl=everyone", "acl"},
           {"zk://h?session_timeout=10parsecs", "session_timeout"},
           {"zk://h?session_timeout=1ms", "session_timeout"},
           {"zk://h?connect_timeout=0", "connect_timeout"},
           {"zk://h?retries=3", "retries"},
           {"zk://h/a//b", "empty segment"},
           {"zk://h/a/../b", ".."},
           {"zk://h/zookeeper/x", "reserved"},
           {"zk://h:99999", "port"},
       }) {
    auto r = OpenStore(c.url);
    ASSERT_FALSE(r.ok()) << c.url;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << c.url;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << c.url << ": " << r.status().message();
  }
}

TEST(ZkConfig, SchemeIsListed) {
  auto schemes = SupportedSchemes();
  EXPECT_NE(std::find(schemes.begin(), schemes.end(), "zk"), schemes.end());
}

}  // namespace
}  // namespace dlock::internal::zk
