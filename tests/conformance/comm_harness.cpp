#include "conformance/comm_harness.h"

#include <gtest/gtest.h>

#include "ptrain/comm/store.h"
#include "ptrain/core/logging.h"
#include "ptrain/plugin/registry.h"
#include "support/test_support.h"

namespace ptrain::test {

const std::vector<CommPluginUnderTest>& commPluginsUnderTest() {
  static const std::vector<CommPluginUnderTest> plugins{
      {"gloo", binaryDir() + "/lib/ptrain/plugins/comm/libptrain_comm_gloo.so", 4},
      {"loopback", binaryDir() + "/examples/loopback_plugin/plugins/libptrain_comm_loopback.so", 1},
  };
  return plugins;
}

std::string commPluginPath(const std::string& backend) {
  for (const auto& p : commPluginsUnderTest()) {
    if (p.name == backend) return p.path;
  }
  throw std::runtime_error("no comm plugin under test named " + backend);
}

CommRank::CommRank(const std::string& backend, int rank, int worldSize, int port, std::chrono::milliseconds timeout)
    : rank_(rank), world_size_(worldSize) {
  // Ranks share the machine's two cores; one intra-op thread each keeps the
  // suite's run time flat.
  at::set_num_threads(1);
  PluginRegistry registry({commPluginPath(backend)});
  PluginContext ctx;
  ctx.logger = logger();
  ctx.rank = rank;
  ctx.world_size = worldSize;
  plugin_ = registry.create(plugin_kind::kComm, backend, ctx);
  backend_ = static_cast<CommBackend*>(plugin_.get());

  TcpStoreOptions so;
  so.host = "127.0.0.1";
  so.port = port;
  so.is_server = rank == 0;
  so.world_size = worldSize;
  so.timeout = std::chrono::seconds(30);
  store_ = createTcpStore(so);

  std::vector<int> all(static_cast<size_t>(worldSize));
  for (int r = 0; r < worldSize; ++r) all[static_cast<size_t>(r)] = r;
  world_ = group("world", all, timeout);
}

CommRank::~CommRank() {
  // Groups before the plugin whose code they run.
  world_.reset();
}

std::shared_ptr<ProcessGroup> CommRank::group(const std::string& name, const std::vector<int>& ranks,
                                              std::chrono::milliseconds timeout) {
  GroupOptions opts;
  opts.name = name;
  opts.ranks = ranks;
  opts.global_rank = rank_;
  opts.timeout = timeout;
  return backend_->createGroup(store_, opts);
}

void runCommRanks(const std::string& backend, int worldSize, const std::function<void(CommRank& comm)>& body,
                  double timeoutSeconds, std::chrono::milliseconds groupTimeout) {
  std::string failures = runRanks(
      worldSize,
      [&](int rank, int size, int port) {
        CommRank comm(backend, rank, size, port, groupTimeout);
        body(comm);
        // Every rank finishes its operations before any rank tears down its
        // connections, so a fast rank cannot fail a slow one's last op.
        comm.world().barrier()->wait();
      },
      timeoutSeconds);
  EXPECT_EQ(failures, "") << backend << " world " << worldSize;
}

const char* dtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    default: return "other";
  }
}

}  // namespace ptrain::test
