// The rendezvous store every comm backend builds on: TCP store across real
// processes, prefixes, and timeouts that name what was missing.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ptrain/comm/store.h"
#include "support/test_support.h"

namespace ptrain::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::shared_ptr<Store> connect(int rank, int size, int port, milliseconds timeout = std::chrono::seconds(20)) {
  TcpStoreOptions o;
  o.port = port;
  o.is_server = rank == 0;
  o.world_size = size;
  o.timeout = timeout;
  return createTcpStore(o);
}

TEST(TcpStore, RanksExchangeValuesAndCount) {
  std::string failures = runRanks(3, [](int rank, int size, int port) {
    auto store = connect(rank, size, port);
    store->set("hello/" + std::to_string(rank), bytes("from " + std::to_string(rank)));
    // Every rank adds its rank + 1: the last add sees 1 + 2 + 3.
    store->add("counter", rank + 1);
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(text(store->get("hello/" + std::to_string(r))), "from " + std::to_string(r));
    }
    store->wait({"hello/0", "hello/1", "hello/2"}, std::chrono::seconds(10));
    EXPECT_TRUE(store->check({"hello/0", "hello/1", "hello/2"}));
    EXPECT_FALSE(store->check({"never/set"}));
    store->add("arrived", 1);
    while (store->add("arrived", 0) < size) std::this_thread::sleep_for(milliseconds(10));
    EXPECT_EQ(store->add("counter", 0), 6);
    EXPECT_EQ(store->timeout(), std::chrono::seconds(20));
    // Nobody leaves while another rank may still talk to rank 0's server.
    store->add("done", 1);
    if (rank == 0) {
      while (store->add("done", 0) < size) std::this_thread::sleep_for(milliseconds(10));
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(TcpStore, PrefixesKeepUsersApart) {
  std::string failures = runRanks(1, [](int rank, int size, int port) {
    auto store = connect(rank, size, port);
    auto a = prefixStore(store, "a");
    auto b = prefixStore(store, "b");
    auto ab = prefixStore(a, "b");
    a->set("k", bytes("in a"));
    b->set("k", bytes("in b"));
    ab->set("k", bytes("in a/b"));
    EXPECT_EQ(text(a->get("k")), "in a");
    EXPECT_EQ(text(b->get("k")), "in b");
    EXPECT_EQ(text(store->get("a/k")), "in a");
    EXPECT_EQ(text(store->get("a/b/k")), "in a/b");
    EXPECT_EQ(a->add("n", 5), 5);
    EXPECT_EQ(b->add("n", 1), 1);
    EXPECT_TRUE(a->check({"k", "n"}));
    EXPECT_FALSE(a->check({"missing"}));
    a->wait({"k"}, milliseconds(100));
    EXPECT_EQ(a->timeout(), store->timeout());
  });
  EXPECT_EQ(failures, "");
}

TEST(TcpStore, WaitingForAKeyNobodySetsTimesOut) {
  std::string failures = runRanks(1, [](int rank, int size, int port) {
    auto store = connect(rank, size, port, milliseconds(800));
    auto start = steady_clock::now();
    try {
      store->wait({"nobody/sets/this"}, milliseconds(500));
      ADD_FAILURE() << "wait returned";
    } catch (const TimeoutError& e) {
      EXPECT_LT(std::chrono::duration<double>(steady_clock::now() - start).count(), 2.0);
      EXPECT_NE(std::string(e.what()).find("'nobody/sets/this'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
    }
    // get() blocks for the store's own timeout.
    start = steady_clock::now();
    EXPECT_THROW(store->get("nobody/sets/this/either"), TimeoutError);
    EXPECT_LT(std::chrono::duration<double>(steady_clock::now() - start).count(), 2.5);
  });
  EXPECT_EQ(failures, "");
}

TEST(TcpStore, AClientWithoutAServerTimesOutNamingHostAndPort) {
  std::string failures = runRanks(1, [](int, int, int port) {
    // Rank 1 of 2 whose rank 0 never starts.
    auto start = steady_clock::now();
    try {
      connect(1, 2, port, milliseconds(1500));
      ADD_FAILURE() << "connected to nothing";
    } catch (const TimeoutError& e) {
      EXPECT_LT(std::chrono::duration<double>(steady_clock::now() - start).count(), 4.0);
      std::string what = e.what();
      EXPECT_NE(what.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << what;
      EXPECT_NE(what.find("rendezvous store"), std::string::npos) << what;
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(TcpStore, AClientConnectsToAServerThatStartsLater) {
  std::string failures = runRanks(2, [](int rank, int size, int port) {
    if (rank == 0) std::this_thread::sleep_for(milliseconds(700));
    auto store = connect(rank, size, port);
    if (rank == 1) store->set("late", bytes("ok"));
    EXPECT_EQ(text(store->get("late")), "ok");
    store->add("done", 1);
    if (rank == 0) {
      while (store->add("done", 0) < size) std::this_thread::sleep_for(milliseconds(10));
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(TcpStore, RefusesAnOutOfRangePort) {
  TcpStoreOptions o;
  o.port = 70000;
  EXPECT_THROW(createTcpStore(o), ConfigError);
}

}  // namespace
}  // namespace ptrain::test
