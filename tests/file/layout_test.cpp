#include "stores/file/layout.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace dlock::internal::file_store {
namespace {

TEST(FileStoreLayout, QueueDirectoriesOfPrefixNamesDiffer) {
  std::set<std::string> dirs = {QueueDirName("a"),   QueueDirName("a/b"),   QueueDirName("a/locks"),
                                QueueDirName("a.b"), QueueDirName("a/b/c"), QueueDirName("a-b")};
  EXPECT_EQ(dirs.size(), 6u);
  EXPECT_EQ(QueueDirName("orders/42"), "q.orders%2F42");
  for (const auto& dir : dirs) EXPECT_EQ(dir.find('/'), std::string::npos) << dir;
}

TEST(FileStoreLayout, LongQueueNamesAreHashedBelowNameMax) {
  std::string a(500, 'x');
  std::string b = a;
  b.back() = 'y';
  std::string dir_a = QueueDirName(a);
  std::string dir_b = QueueDirName(b);
  EXPECT_NE(dir_a, dir_b);
  EXPECT_LE(dir_a.size(), 255u);
  EXPECT_EQ(dir_a.rfind("h.", 0), 0u);
  EXPECT_NE(QueueDirName(a + "/z"), QueueDirName(a));
}

TEST(FileStoreLayout, Sha256KnownAnswers) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(FileStoreLayout, EntryNamesRoundTrip) {
  EntryName name{42, 7, "write", "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"};
  std::string text = FormatEntryName(name);
  EXPECT_EQ(text,
            "00000000000000000042.00000000000000000007.write.0123456789abcdef0123456789abcdef."
            "fedcba9876543210fedcba9876543210");
  auto parsed = ParseEntryName(text);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->sequence, 42);
  EXPECT_EQ(parsed->token, 7u);
  EXPECT_EQ(parsed->kind, "write");
  EXPECT_EQ(parsed->attempt_id, name.attempt_id);
  EXPECT_EQ(parsed->nonce, name.nonce);

  name.attempt_id.clear();
  parsed = ParseEntryName(FormatEntryName(name));
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->attempt_id, "");
}

TEST(FileStoreLayout, MalformedEntryNamesAreRejected) {
  const std::string nonce = "fedcba9876543210fedcba9876543210";
  const std::string n20 = "00000000000000000001";
  EXPECT_FALSE(ParseEntryName(""));
  EXPECT_FALSE(ParseEntryName("."));
  EXPECT_FALSE(ParseEntryName(".tmp." + nonce));
  EXPECT_FALSE(ParseEntryName(n20 + "." + n20 + ".lock.." + nonce + ".extra"));
  EXPECT_FALSE(ParseEntryName(n20 + "." + n20 + "..." + nonce));                    // empty kind
  EXPECT_FALSE(ParseEntryName("1." + n20 + ".lock.." + nonce));                     // not padded
  EXPECT_FALSE(ParseEntryName("-0000000000000000001." + n20 + ".lock.." + nonce));  // negative
  EXPECT_FALSE(ParseEntryName(n20 + "." + n20 + ".lock..FEDCBA9876543210FEDCBA9876543210"));
  EXPECT_FALSE(ParseEntryName(n20 + "." + n20 + ".lo/ck.." + nonce));
  EXPECT_TRUE(ParseEntryName(n20 + "." + n20 + ".lock.." + nonce));
}

}  // namespace
}  // namespace dlock::internal::file_store
