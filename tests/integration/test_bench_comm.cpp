// `ptrain bench-comm` end to end: it launches its own workers, runs every
// collective on the gloo plugin, and reports exact results and consistent
// bandwidth columns.
#include <sstream>

#include <gtest/gtest.h>

#include "support/test_support.h"

namespace ptrain::test {
namespace {

struct Row {
  std::string op;
  long long bytes = 0, count = 0;
  std::string type;
  double time_us = 0, algbw = 0, busbw = 0;
  long long wrong = -1;
};

// Data rows of the table, each tagged with the collective of the header above it.
std::vector<Row> parseTable(const std::string& output) {
  std::vector<Row> rows;
  std::istringstream in(output);
  std::string line, op;
  while (std::getline(in, line)) {
    if (line.rfind("# ", 0) == 0 && line.find("(busbw = algbw x") != std::string::npos) {
      op = line.substr(2, line.find(' ', 2) - 2);
      continue;
    }
    if (line.empty() || line[0] == '#' || op.empty()) continue;
    std::istringstream fields(line);
    Row r;
    r.op = op;
    if (fields >> r.bytes >> r.count >> r.type >> r.time_us >> r.algbw >> r.busbw >> r.wrong) rows.push_back(r);
  }
  return rows;
}

TEST(BenchComm, FourRanksEveryCollectiveExact) {
  auto result = runPtrain({"bench-comm", "--nproc", "4", "--max-bytes", "65536", "--iters", "2", "--warmup", "1"}, {},
                          240);
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto rows = parseTable(result.output);
  // 1 KiB .. 64 KiB is 7 sizes for each of six collectives, plus one barrier row.
  ASSERT_EQ(rows.size(), 6u * 7u + 1u) << result.output;
  const std::vector<std::string> ops{"allreduce", "allgather", "reduce_scatter", "broadcast", "all_to_all", "sendrecv"};
  for (size_t k = 0; k < ops.size(); ++k) {
    for (int s = 0; s < 7; ++s) {
      const Row& r = rows[k * 7 + static_cast<size_t>(s)];
      EXPECT_EQ(r.op, ops[k]);
      EXPECT_EQ(r.bytes, 1024LL << s) << r.op;
      EXPECT_EQ(r.count, (1024LL << s) / 4) << r.op;  // float32
      EXPECT_EQ(r.type, "float32");
      EXPECT_EQ(r.wrong, 0) << r.op << " " << r.bytes;
      ASSERT_GT(r.time_us, 0) << r.op;
      // algbw = bytes / time in GB/s; busbw = algbw x nccl-tests' factor for 4 ranks.
      const double algbw = static_cast<double>(r.bytes) / (r.time_us * 1e-6) / 1e9;
      EXPECT_NEAR(r.algbw, algbw, 0.0015 + algbw * 0.01) << r.op << " " << r.bytes;
      const double factor = r.op == "allreduce" ? 1.5 : (r.op == "broadcast" || r.op == "sendrecv") ? 1.0 : 0.75;
      EXPECT_NEAR(r.busbw, r.algbw * factor, 0.0015 + r.algbw * 0.01) << r.op << " " << r.bytes;
    }
  }
  EXPECT_EQ(rows.back().op, "barrier");
  EXPECT_EQ(rows.back().wrong, 0);
  EXPECT_NE(result.output.find("# wrong elements: 0"), std::string::npos) << result.output;
}

TEST(BenchComm, ChosenOpsAndDtypeOnTwoRanks) {
  auto result = runPtrain({"bench-comm", "--nproc", "2", "--ops", "allreduce,all_to_all", "--dtype", "int64",
                           "--min-bytes", "4096", "--max-bytes", "16384", "--iters", "1", "--warmup", "0"},
                          {}, 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto rows = parseTable(result.output);
  ASSERT_EQ(rows.size(), 6u) << result.output;
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].op, i < 3 ? "allreduce" : "all_to_all");
    EXPECT_EQ(rows[i].type, "int64");
    EXPECT_EQ(rows[i].count, (4096LL << (i % 3)) / 8);
    EXPECT_EQ(rows[i].wrong, 0);
  }
}

TEST(BenchComm, RefusesAnUnknownCollectiveBeforeLaunching) {
  auto result = runPtrain({"bench-comm", "--nproc", "2", "--ops", "allreduce,alltoall"}, {}, 30);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("ptrain: --ops: unknown collective 'alltoall'; choose from allreduce,"),
            std::string::npos)
      << result.output;
}

TEST(BenchComm, RefusesMaxBytesBelowMinBytes) {
  auto result = runPtrain({"bench-comm", "--min-bytes", "4096", "--max-bytes", "1024"}, {}, 30);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--max-bytes (1024) is smaller than --min-bytes (4096)"), std::string::npos)
      << result.output;
}

TEST(BenchComm, AnUnknownBackendNamesTheOption) {
  auto result = runPtrain({"bench-comm", "--nproc", "1", "--backend", "carrier-pigeon"}, {}, 60);
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("--backend"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("carrier-pigeon"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace ptrain::test
