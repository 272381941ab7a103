// Groups, subgroups and failures: concurrent subgroups, a missing peer (the
// operation must time out naming op, group and rank, never hang), a missing
// group member, a peer that exits, and tensors the backend must refuse.
#include <unistd.h>

#include <gtest/gtest.h>

#include "conformance/comm_harness.h"
#include "support/test_support.h"

namespace ptrain::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

double secondsSince(steady_clock::time_point start) {
  return std::chrono::duration<double>(steady_clock::now() - start).count();
}

// A rank that must stay connected (a closed connection is another error)
// without taking part stays until the `workers` others are done; rank 0,
// which hosts the store, leaves only after the stayers have seen that.
void stayUntilDone(CommRank& comm, int workers) {
  while (comm.store()->add("test/done", 0) < workers) std::this_thread::sleep_for(milliseconds(20));
  comm.store()->add("test/left", 1);
}
void done(CommRank& comm, int stayers = 1) {
  comm.store()->add("test/done", 1);
  if (comm.rank() != 0) return;
  while (comm.store()->add("test/left", 0) < stayers) std::this_thread::sleep_for(milliseconds(20));
}

TEST(GlooGroups, DisjointSubgroupsRunDifferentOpsConcurrently) {
  runCommRanks("gloo", 4, [](CommRank& comm) {
    const int r = comm.rank();
    // {1,3} allreduce while {0,2} allgather; both after a world op, and the
    // world is used again afterwards.
    at::Tensor w = at::full({5}, r, at::kLong);
    comm.world().allreduce(w)->wait();
    EXPECT_TRUE(at::equal(w, at::full({5}, 0 + 1 + 2 + 3, at::kLong)));

    const bool odd = r % 2 == 1;
    auto g = odd ? comm.group("odd", {1, 3}) : comm.group("even", {0, 2});
    ASSERT_EQ(g->size(), 2);
    EXPECT_EQ(g->rank(), r / 2);
    EXPECT_EQ(g->globalRanks(), odd ? std::vector<int>({1, 3}) : std::vector<int>({0, 2}));
    for (int round = 0; round < 20; ++round) {
      if (odd) {
        at::Tensor t = at::arange(1000, at::kLong) * (r + round);
        g->allreduce(t)->wait();
        // (1 + round) + (3 + round) times the index
        EXPECT_TRUE(at::equal(t, at::arange(1000, at::kLong) * (4 + 2 * round))) << "odd round " << round;
      } else {
        at::Tensor in = at::full({3}, r * 10 + round, at::kFloat);
        at::Tensor out = at::zeros({6}, at::kFloat);
        g->allgather(out, in)->wait();
        at::Tensor expected = at::cat({at::full({3}, 0 + round, at::kFloat), at::full({3}, 20 + round, at::kFloat)});
        EXPECT_TRUE(at::equal(out, expected)) << "even round " << round;
      }
    }
    // A group whose members are not adjacent in the world, in an order
    // different from its global ranks' numbering: rank 3 is group rank 1.
    auto mixed = r == 0 || r == 3 ? comm.group("ends", {0, 3}) : nullptr;
    if (mixed) {
      at::Tensor t = at::full({2}, mixed->rank() == 0 ? 5 : -1, at::kInt);
      BroadcastOptions b;
      b.root = 0;
      mixed->broadcast(t, b)->wait();
      EXPECT_TRUE(at::equal(t, at::full({2}, 5, at::kInt)));
    }
    at::Tensor again = at::ones({4}, at::kDouble);
    comm.world().allreduce(again)->wait();
    EXPECT_TRUE(at::equal(again, at::full({4}, 4.0, at::kDouble)));
  });
}

TEST(GlooGroups, ANameCanBeReusedForANewGroup) {
  runCommRanks("gloo", 2, [](CommRank& comm) {
    for (int k = 0; k < 3; ++k) {
      auto g = comm.group("again", {0, 1});
      at::Tensor t = at::full({3}, comm.rank() + k, at::kLong);
      g->allreduce(t)->wait();
      EXPECT_TRUE(at::equal(t, at::full({3}, 1 + 2 * k, at::kLong))) << "generation " << k;
    }
  });
}

// Rank 1 never joins the allreduce: rank 0 must get TimeoutError within the
// group timeout plus slack, naming op, group and rank.
TEST(GlooFailures, AllreduceWithAMissingPeerTimesOut) {
  std::string failures = runRanks(2, [](int rank, int size, int port) {
    CommRank comm("gloo", rank, size, port, milliseconds(1500));
    if (rank == 1) return stayUntilDone(comm, 1);  // never joins the allreduce
    at::Tensor t = at::ones({16}, at::kFloat);
    auto start = steady_clock::now();
    try {
      comm.world().allreduce(t)->wait();
      ADD_FAILURE() << "allreduce returned without its peer";
    } catch (const TimeoutError& e) {
      double took = secondsSince(start);
      EXPECT_GE(took, 1.3);
      EXPECT_LT(took, 3.5);
      std::string what = e.what();
      EXPECT_NE(what.find("allreduce"), std::string::npos) << what;
      EXPECT_NE(what.find("world[0,1]"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 0 of 2"), std::string::npos) << what;
      EXPECT_NE(what.find("timed out after 1.5 s"), std::string::npos) << what;
    }
    // Gloo closes the group's connections on a timeout: the next operation
    // fails at once instead of waiting again.
    start = steady_clock::now();
    EXPECT_THROW(comm.world().barrier()->wait(), CommError);
    EXPECT_LT(secondsSince(start), 1.0);
    done(comm);
  }, 30);
  EXPECT_EQ(failures, "");
}

// A wait() timeout shorter than the group's applies to that wait.
TEST(GlooFailures, WaitTimeoutShorterThanTheGroupTimeout) {
  std::string failures = runRanks(2, [](int rank, int size, int port) {
    CommRank comm("gloo", rank, size, port, std::chrono::seconds(20));
    at::Tensor t = at::full({8}, rank + 1, at::kLong);
    if (rank == 1) std::this_thread::sleep_for(milliseconds(1500));
    auto work = comm.world().allreduce(t);
    if (rank == 0) {
      auto start = steady_clock::now();
      try {
        work->wait(milliseconds(300));
        ADD_FAILURE() << "wait returned before the peer joined";
      } catch (const TimeoutError& e) {
        EXPECT_LT(secondsSince(start), 1.2);
        std::string what = e.what();
        EXPECT_NE(what.find("allreduce on group world[0,1] (rank 0 of 2) timed out after 0.3 s"), std::string::npos)
            << what;
      }
      EXPECT_FALSE(work->isCompleted());
    }
    // The operation was still in flight: once the peer joins it completes.
    work->wait();
    EXPECT_TRUE(at::equal(t, at::full({8}, 3, at::kLong)));
  }, 30);
  EXPECT_EQ(failures, "");
}

TEST(GlooFailures, RecvFromASilentPeerTimesOut) {
  std::string failures = runRanks(2, [](int rank, int size, int port) {
    CommRank comm("gloo", rank, size, port, milliseconds(1000));
    if (rank == 1) return stayUntilDone(comm, 1);  // never sends
    at::Tensor t = at::zeros({4}, at::kFloat);
    auto start = steady_clock::now();
    try {
      comm.world().recv(t, 1)->wait();
      ADD_FAILURE() << "recv returned without a sender";
    } catch (const TimeoutError& e) {
      EXPECT_LT(secondsSince(start), 2.5);
      EXPECT_NE(std::string(e.what()).find("recv on group world[0,1] (rank 0 of 2) timed out"), std::string::npos)
          << e.what();
    }
    done(comm);
  }, 30);
  EXPECT_EQ(failures, "");
}

TEST(GlooFailures, CreatingAGroupWithAMissingMemberTimesOutNamingIt) {
  std::string failures = runRanks(3, [](int rank, int size, int port) {
    CommRank comm("gloo", rank, size, port);
    // Rank 2 is listed as a member of "trio" but never creates it.
    if (rank == 2) return stayUntilDone(comm, 2);
    auto start = steady_clock::now();
    try {
      comm.group("trio", {0, 1, 2}, milliseconds(1200));
      ADD_FAILURE() << "group creation returned without every member";
    } catch (const TimeoutError& e) {
      EXPECT_LT(secondsSince(start), 3.0);
      std::string what = e.what();
      EXPECT_NE(what.find("creating group trio[0,1,2]"), std::string::npos) << what;
      EXPECT_NE(what.find("rank " + std::to_string(rank) + " of 3"), std::string::npos) << what;
      EXPECT_NE(what.find("never joined: 2 (global 2)"), std::string::npos) << what;
    }
    done(comm);
  }, 30);
  EXPECT_EQ(failures, "");
}

TEST(GlooFailures, APeerThatExitsFailsTheOperationInsteadOfHanging) {
  std::string failures = runRanks(2, [](int rank, int size, int port) {
    CommRank comm("gloo", rank, size, port, std::chrono::seconds(5));
    if (rank == 1) {
      comm.world().barrier()->wait();
      _exit(0);  // gone, connections closed by the kernel
    }
    comm.world().barrier()->wait();
    std::this_thread::sleep_for(milliseconds(200));
    at::Tensor t = at::ones({1 << 16}, at::kFloat);
    auto start = steady_clock::now();
    try {
      comm.world().allreduce(t)->wait();
      ADD_FAILURE() << "allreduce returned without its peer";
    } catch (const CommError& e) {
      EXPECT_LT(secondsSince(start), 6.5);
      EXPECT_NE(std::string(e.what()).find("allreduce on group world[0,1] (rank 0 of 2)"), std::string::npos)
          << e.what();
    }
  }, 30);
  EXPECT_EQ(failures, "");
}

template <typename E, typename F>
std::string errorOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<other error> ") + e.what();
  }
  return "<no error>";
}

TEST(GlooFailures, TensorsTheBackendCannotMoveAreRefusedClearly) {
  runCommRanks("gloo", 1, [](CommRank& comm) {
    auto& g = comm.world();
    at::Tensor strided = at::zeros({4, 4}, at::kFloat).t();
    EXPECT_NE(errorOf<CommError>([&] { g.allreduce(strided); }).find("allreduce on group world[0] (rank 0 of 1): "
                                                                      "tensor is not contiguous"),
              std::string::npos);
    // bf16 is reduced as float32 (test_comm_collectives.cpp); a dtype Gloo
    // cannot reduce at all is refused with what to do.
    at::Tensor flags = at::zeros({4}, at::kBool);
    EXPECT_NE(errorOf<ConfigError>([&] { g.allreduce(flags); }).find("tensor has dtype Bool; the gloo backend reduces"),
              std::string::npos);
    at::Tensor out = at::zeros({3}, at::kFloat), in = at::zeros({2}, at::kFloat);
    EXPECT_NE(errorOf<CommError>([&] { g.allgather(out, in); }).find("output has 3 elements"), std::string::npos);
    at::Tensor outInt = at::zeros({2}, at::kInt);
    EXPECT_NE(errorOf<CommError>([&] { g.allgather(outInt, in); }).find("output has dtype Int but input has Float"),
              std::string::npos);
    BroadcastOptions b;
    b.root = 1;
    at::Tensor t = at::zeros({2}, at::kFloat);
    EXPECT_NE(errorOf<CommError>([&] { g.broadcast(t, b); }).find("root 1 is not a rank of this group"),
              std::string::npos);
    EXPECT_NE(errorOf<CommError>([&] { g.send(t, 0); }).find("peer 0 must be another rank"), std::string::npos);
    AllToAllOptions a;
    a.input_split_sizes = {1};
    a.output_split_sizes = {2};
    at::Tensor two = at::zeros({2}, at::kFloat);
    EXPECT_NE(errorOf<CommError>([&] { g.allToAll(two, two, a); }).find("input_split_sizes add up to 1 rows"),
              std::string::npos);
    at::Tensor sparse = at::zeros({2, 2}, at::kFloat).to_sparse();
    EXPECT_NE(errorOf<CommError>([&] { g.allreduce(sparse); }).find("has layout Sparse"), std::string::npos);
    // The group is still usable after refused calls.
    at::Tensor ok = at::ones({3}, at::kFloat);
    g.allreduce(ok)->wait();
    EXPECT_TRUE(at::equal(ok, at::ones({3}, at::kFloat)));
  });
}

TEST(GlooFailures, CreateGroupRefusesBadMembership) {
  runCommRanks("gloo", 1, [](CommRank& comm) {
    EXPECT_NE(errorOf<ConfigError>([&] { comm.group("other", {1, 2}); }).find("rank 0 is not a member of group "
                                                                               "other[1,2]"),
              std::string::npos);
    EXPECT_NE(errorOf<ConfigError>([&] { comm.group("unsorted", {0, 0}); }).find("sorted and distinct"),
              std::string::npos);
  });
}

}  // namespace
}  // namespace ptrain::test
