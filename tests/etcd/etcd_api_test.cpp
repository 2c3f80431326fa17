// The etcd v3 API that the etcd store is to be built on, called directly
// through the stubs generated at build time (dlock_etcd_proto): proof that
// the plumbing works end to end against a real etcd, and a record of the
// exact calls and answers docs/etcd.md relies on.
//
// Runs on the server a tests/servers/etcd.sh fixture started: the endpoints
// are those of the first etcd:// URL in DLOCK_TEST_URLS (one member, or a
// three-member cluster: every endpoint goes into one gRPC channel, which
// picks one that answers). Without such a URL the tests skip. Every call has
// a deadline; every stream read is bounded by its context's deadline.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "etcd/mvcc/mvccpb/kv.pb.h"
#include "stores/etcd/etcd_layout.hpp"

namespace {

using dlock::internal::etcd::LeaseHex;
using dlock::internal::etcd::PrefixEnd;
using etcdserverpb::Compare;
using etcdserverpb::RangeRequest;
using std::chrono::seconds;

// "127.0.0.1:1,127.0.0.1:2" from the first etcd://[user:pw@]hosts[/prefix][?q] URL, or "".
std::string EndpointsFromEnv() {
  const char* urls = std::getenv("DLOCK_TEST_URLS");
  if (urls == nullptr) return "";
  std::istringstream in(urls);
  std::string url;
  while (in >> url) {
    constexpr std::string_view kScheme = "etcd://";
    if (url.rfind(kScheme, 0) != 0) continue;
    std::string rest = url.substr(kScheme.size());
    rest = rest.substr(0, rest.find_first_of("/?"));
    if (auto at = rest.rfind('@'); at != std::string::npos) rest = rest.substr(at + 1);
    return rest;
  }
  return "";
}

void SetDeadline(grpc::ClientContext& ctx, seconds timeout = seconds(5)) {
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
}

std::string RandomSuffix() {
  std::random_device rd;
  std::ostringstream out;
  out << std::hex << rd() << rd();
  return out.str();
}

class EtcdApi : public ::testing::Test {
 protected:
  void SetUp() override {
    endpoints_ = EndpointsFromEnv();
    if (endpoints_.empty()) GTEST_SKIP() << "no etcd:// URL in DLOCK_TEST_URLS (tests/servers/etcd.sh run DIR CMD)";
    // "ipv4:a:p,b:q": one channel over every endpoint (pick_first: the first
    // that connects; another when it fails).
    channel_ = grpc::CreateChannel("ipv4:" + endpoints_, grpc::InsecureChannelCredentials());
    ASSERT_TRUE(channel_->WaitForConnected(std::chrono::system_clock::now() + seconds(10)))
        << "no connection to " << endpoints_;
    kv_ = etcdserverpb::KV::NewStub(channel_);
    lease_ = etcdserverpb::Lease::NewStub(channel_);
    watch_ = etcdserverpb::Watch::NewStub(channel_);
    maintenance_ = etcdserverpb::Maintenance::NewStub(channel_);
    prefix_ = "dlock-api-test/" + RandomSuffix();
  }

  std::int64_t Grant(std::int64_t ttl) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    etcdserverpb::LeaseGrantRequest req;
    req.set_ttl(ttl);  // ID 0: the server picks the lease ID
    etcdserverpb::LeaseGrantResponse resp;
    grpc::Status status = lease_->LeaseGrant(&ctx, req, &resp);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(resp.error().empty()) << resp.error();
    EXPECT_EQ(resp.ttl(), ttl);
    EXPECT_GT(resp.id(), 0);
    return resp.id();
  }

  // The owner query of Go's Mutex: the key with the lowest create revision
  // under `dir` (clientv3.WithFirstCreate).
  static void FirstCreate(RangeRequest* range, const std::string& dir) {
    range->set_key(dir);
    range->set_range_end(PrefixEnd(dir));
    range->set_sort_target(RangeRequest::CREATE);
    range->set_sort_order(RangeRequest::ASCEND);
    range->set_limit(1);
  }

  // Go's Mutex.Lock, first step, in one Txn: If CreateRevision(key) == 0
  // Then Put(key, "", lease) and the owner query Else Get(key) and the owner
  // query.
  etcdserverpb::TxnResponse AppendTxn(const std::string& dir, const std::string& key, std::int64_t lease) {
    etcdserverpb::TxnRequest txn;
    Compare* cmp = txn.add_compare();
    cmp->set_key(key);
    cmp->set_target(Compare::CREATE);
    cmp->set_result(Compare::EQUAL);
    cmp->set_create_revision(0);
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value("");
    put->set_lease(lease);
    FirstCreate(txn.add_success()->mutable_request_range(), dir);
    txn.add_failure()->mutable_request_range()->set_key(key);
    FirstCreate(txn.add_failure()->mutable_request_range(), dir);
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    etcdserverpb::TxnResponse resp;
    grpc::Status status = kv_->Txn(&ctx, txn, &resp);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return resp;
  }

  // If CreateRevision(key) == rev Then Delete(key): a removal that can never
  // delete a later entry under the same key.
  etcdserverpb::TxnResponse FencedDelete(const std::string& key, std::int64_t rev) {
    etcdserverpb::TxnRequest txn;
    Compare* cmp = txn.add_compare();
    cmp->set_key(key);
    cmp->set_target(Compare::CREATE);
    cmp->set_result(Compare::EQUAL);
    cmp->set_create_revision(rev);
    txn.add_success()->mutable_request_delete_range()->set_key(key);
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    etcdserverpb::TxnResponse resp;
    grpc::Status status = kv_->Txn(&ctx, txn, &resp);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return resp;
  }

  etcdserverpb::RangeResponse Range(const RangeRequest& req) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    etcdserverpb::RangeResponse resp;
    grpc::Status status = kv_->Range(&ctx, req, &resp);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return resp;
  }

  void Revoke(std::int64_t lease) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    etcdserverpb::LeaseRevokeRequest req;
    req.set_id(lease);
    etcdserverpb::LeaseRevokeResponse resp;
    grpc::Status status = lease_->LeaseRevoke(&ctx, req, &resp);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }

  std::string endpoints_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch_;
  std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance_;
  std::string prefix_;
};

TEST_F(EtcdApi, StatusNamesALeader) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  etcdserverpb::StatusResponse resp;
  grpc::Status status = maintenance_->Status(&ctx, etcdserverpb::StatusRequest(), &resp);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(resp.version().empty());
  EXPECT_NE(resp.leader(), 0u);
  EXPECT_NE(resp.header().member_id(), 0u);
  EXPECT_NE(resp.header().cluster_id(), 0u);
}

// The whole life of a Go-compatible lock entry: lease, append + list in one
// Txn, the ordered listing, a watch that sees the holder's delete, a fenced
// delete, keep-alive, and revocation deleting what the lease held.
TEST_F(EtcdApi, LeaseTxnRangeWatchRevoke) {
  const std::string dir = prefix_ + "/m/";  // the Mutex named <prefix>/m
  const std::int64_t lease1 = Grant(5);
  const std::int64_t lease2 = Grant(5);
  const std::string key1 = dir + LeaseHex(lease1);
  const std::string key2 = dir + LeaseHex(lease2);

  // Uncontended: the put succeeds, and the owner query in the same Txn names
  // our own key: its create revision is the Txn's revision.
  etcdserverpb::TxnResponse t1 = AppendTxn(dir, key1, lease1);
  ASSERT_TRUE(t1.succeeded());
  ASSERT_EQ(t1.responses_size(), 2);
  ASSERT_TRUE(t1.responses(0).has_response_put());
  const std::int64_t rev1 = t1.header().revision();
  const etcdserverpb::RangeResponse& owner1 = t1.responses(1).response_range();
  ASSERT_EQ(owner1.kvs_size(), 1);
  EXPECT_EQ(owner1.kvs(0).key(), key1);
  EXPECT_EQ(owner1.kvs(0).create_revision(), rev1);
  EXPECT_EQ(owner1.kvs(0).lease(), lease1);
  EXPECT_EQ(owner1.kvs(0).value(), "");

  // The same Txn again (a retry whose first answer was lost): the Else
  // branch finds the key, with the same create revision; nothing new.
  etcdserverpb::TxnResponse again = AppendTxn(dir, key1, lease1);
  ASSERT_FALSE(again.succeeded());
  ASSERT_EQ(again.responses_size(), 2);
  ASSERT_EQ(again.responses(0).response_range().kvs_size(), 1);
  EXPECT_EQ(again.responses(0).response_range().kvs(0).create_revision(), rev1);
  EXPECT_EQ(again.header().revision(), rev1);  // a Txn that writes nothing leaves the revision

  // A second session contends: its key is created, but the owner is key1.
  etcdserverpb::TxnResponse t2 = AppendTxn(dir, key2, lease2);
  ASSERT_TRUE(t2.succeeded());
  const std::int64_t rev2 = t2.header().revision();
  EXPECT_GT(rev2, rev1);
  ASSERT_EQ(t2.responses(1).response_range().kvs_size(), 1);
  EXPECT_EQ(t2.responses(1).response_range().kvs(0).key(), key1);

  // The queue: a prefix range sorted by create revision.
  RangeRequest all;
  all.set_key(dir);
  all.set_range_end(PrefixEnd(dir));
  all.set_sort_target(RangeRequest::CREATE);
  all.set_sort_order(RangeRequest::ASCEND);
  etcdserverpb::RangeResponse listing = Range(all);
  ASSERT_EQ(listing.kvs_size(), 2);
  EXPECT_EQ(listing.kvs(0).key(), key1);
  EXPECT_EQ(listing.kvs(1).key(), key2);
  EXPECT_EQ(listing.kvs(1).create_revision(), rev2);
  EXPECT_EQ(listing.kvs(1).lease(), lease2);
  EXPECT_FALSE(listing.more());

  // The waiter's predecessor query (Go's waitDeletes): the highest create
  // revision below its own.
  RangeRequest before;
  before.set_key(dir);
  before.set_range_end(PrefixEnd(dir));
  before.set_sort_target(RangeRequest::CREATE);
  before.set_sort_order(RangeRequest::DESCEND);
  before.set_limit(1);
  before.set_max_create_revision(rev2 - 1);
  etcdserverpb::RangeResponse pred = Range(before);
  ASSERT_EQ(pred.kvs_size(), 1);
  EXPECT_EQ(pred.kvs(0).key(), key1);
  const std::int64_t read_rev = pred.header().revision();

  // The waiter watches key1 from just after the revision it read, deletes only.
  grpc::ClientContext wctx;
  SetDeadline(wctx, seconds(20));
  auto stream = watch_->Watch(&wctx);
  etcdserverpb::WatchRequest create;
  etcdserverpb::WatchCreateRequest* cr = create.mutable_create_request();
  cr->set_key(key1);
  cr->set_start_revision(read_rev + 1);
  cr->add_filters(etcdserverpb::WatchCreateRequest::NOPUT);
  ASSERT_TRUE(stream->Write(create));
  etcdserverpb::WatchResponse created;
  ASSERT_TRUE(stream->Read(&created));
  ASSERT_TRUE(created.created());
  EXPECT_FALSE(created.canceled());
  const std::int64_t watch_id = created.watch_id();

  // The holder releases: the fenced delete removes its key (once).
  etcdserverpb::TxnResponse del = FencedDelete(key1, rev1);
  ASSERT_TRUE(del.succeeded());
  ASSERT_EQ(del.responses_size(), 1);
  EXPECT_EQ(del.responses(0).response_delete_range().deleted(), 1);
  const std::int64_t del_rev = del.header().revision();
  // A stale retry of the same release deletes nothing.
  EXPECT_FALSE(FencedDelete(key1, rev1).succeeded());

  etcdserverpb::WatchResponse event;
  ASSERT_TRUE(stream->Read(&event));
  EXPECT_EQ(event.watch_id(), watch_id);
  ASSERT_EQ(event.events_size(), 1);
  EXPECT_EQ(event.events(0).type(), mvccpb::Event::DELETE);
  EXPECT_EQ(event.events(0).kv().key(), key1);
  EXPECT_EQ(event.events(0).kv().mod_revision(), del_rev);
  EXPECT_EQ(event.header().revision(), del_rev);

  // Cancel the watch on the same stream, then close the stream.
  etcdserverpb::WatchRequest cancel;
  cancel.mutable_cancel_request()->set_watch_id(watch_id);
  ASSERT_TRUE(stream->Write(cancel));
  etcdserverpb::WatchResponse canceled;
  ASSERT_TRUE(stream->Read(&canceled));
  EXPECT_TRUE(canceled.canceled());
  EXPECT_EQ(canceled.watch_id(), watch_id);
  stream->WritesDone();
  wctx.TryCancel();
  stream->Finish();

  // The waiter is now first: grant only after confirming its own key still
  // exists with its create revision.
  RangeRequest own;
  own.set_key(key2);
  etcdserverpb::RangeResponse mine = Range(own);
  ASSERT_EQ(mine.kvs_size(), 1);
  EXPECT_EQ(mine.kvs(0).create_revision(), rev2);

  // Keep-alive: one bidirectional stream, with the "hasleader" metadata Go's
  // client sends so that a member without a leader ends the stream.
  grpc::ClientContext kctx;
  SetDeadline(kctx, seconds(10));
  kctx.AddMetadata("hasleader", "true");
  auto keepalive = lease_->LeaseKeepAlive(&kctx);
  etcdserverpb::LeaseKeepAliveRequest ka;
  ka.set_id(lease2);
  ASSERT_TRUE(keepalive->Write(ka));
  etcdserverpb::LeaseKeepAliveResponse kar;
  ASSERT_TRUE(keepalive->Read(&kar));
  EXPECT_EQ(kar.id(), lease2);
  EXPECT_EQ(kar.ttl(), 5);

  // LeaseTimeToLive lists the keys the lease holds.
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    etcdserverpb::LeaseTimeToLiveRequest req;
    req.set_id(lease2);
    req.set_keys(true);
    etcdserverpb::LeaseTimeToLiveResponse resp;
    ASSERT_TRUE(lease_->LeaseTimeToLive(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.grantedttl(), 5);
    EXPECT_GT(resp.ttl(), 0);
    ASSERT_EQ(resp.keys_size(), 1);
    EXPECT_EQ(resp.keys(0), key2);
  }

  // Revoking the lease deletes its key.
  Revoke(lease2);
  EXPECT_EQ(Range(own).kvs_size(), 0);
  // A keep-alive of a revoked lease answers TTL <= 0 (not an error): lost.
  ASSERT_TRUE(keepalive->Write(ka));
  ASSERT_TRUE(keepalive->Read(&kar));
  EXPECT_LE(kar.ttl(), 0);
  keepalive->WritesDone();
  kctx.TryCancel();
  keepalive->Finish();
  // LeaseTimeToLive of a lease that is gone: TTL -1.
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    etcdserverpb::LeaseTimeToLiveRequest req;
    req.set_id(lease2);
    etcdserverpb::LeaseTimeToLiveResponse resp;
    ASSERT_TRUE(lease_->LeaseTimeToLive(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.ttl(), -1);
  }
  Revoke(lease1);
  // Revoking again: gRPC NOT_FOUND, "etcdserver: requested lease not found".
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    etcdserverpb::LeaseRevokeRequest req;
    req.set_id(lease1);
    etcdserverpb::LeaseRevokeResponse resp;
    grpc::Status status = lease_->LeaseRevoke(&ctx, req, &resp);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(status.error_message().find("lease not found"), std::string::npos) << status.error_message();
  }
  EXPECT_EQ(Range(all).kvs_size(), 0);
}

// A watch from a compacted revision is cancelled at once with
// compact_revision set (ErrCompacted): the store re-reads instead.
TEST_F(EtcdApi, WatchFromACompactedRevisionIsCancelled) {
  const std::string key = prefix_ + "/compacted";
  std::int64_t first = 0;
  std::int64_t last = 0;
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    etcdserverpb::PutRequest put;
    put.set_key(key);
    put.set_value(std::to_string(i));
    etcdserverpb::PutResponse resp;
    ASSERT_TRUE(kv_->Put(&ctx, put, &resp).ok());
    if (i == 0) first = resp.header().revision();
    last = resp.header().revision();
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    etcdserverpb::CompactionRequest req;
    req.set_revision(last);
    etcdserverpb::CompactionResponse resp;
    grpc::Status status = kv_->Compact(&ctx, req, &resp);
    // Another test may have compacted past it already: OUT_OF_RANGE.
    ASSERT_TRUE(status.ok() || status.error_code() == grpc::StatusCode::OUT_OF_RANGE) << status.error_message();
  }
  // A read at a compacted revision: OUT_OF_RANGE ("mvcc: required revision has been compacted").
  {
    RangeRequest req;
    req.set_key(key);
    req.set_revision(first);
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    etcdserverpb::RangeResponse resp;
    grpc::Status status = kv_->Range(&ctx, req, &resp);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE) << status.error_message();
  }
  grpc::ClientContext wctx;
  SetDeadline(wctx, seconds(20));
  auto stream = watch_->Watch(&wctx);
  etcdserverpb::WatchRequest create;
  create.mutable_create_request()->set_key(key);
  create.mutable_create_request()->set_start_revision(first);
  ASSERT_TRUE(stream->Write(create));
  // etcd 3.4 first confirms the creation, then cancels the watch.
  etcdserverpb::WatchResponse resp;
  bool canceled = false;
  for (int i = 0; i < 3 && !canceled; ++i) {
    ASSERT_TRUE(stream->Read(&resp));
    canceled = resp.canceled();
  }
  ASSERT_TRUE(canceled);
  EXPECT_GE(resp.compact_revision(), last);
  EXPECT_EQ(resp.events_size(), 0);
  stream->WritesDone();
  wctx.TryCancel();
  stream->Finish();
}

}  // namespace
