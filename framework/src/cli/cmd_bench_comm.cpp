// ptrain bench-comm: start the workers (or, inside a worker, join the world
// group) and time every collective, printing an nccl-tests style table.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "ptrain/comm/backend.h"
#include "ptrain/comm/bench.h"
#include "ptrain/comm/rank_env.h"
#include "ptrain/core/logging.h"
#include "ptrain/core/device.h"
#include "ptrain/launch/launcher.h"
#include "ptrain/plugin/registry.h"

namespace ptrain::cli {
namespace {

std::string selfExe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "ptrain" : p.string();
}

// --ops takes "allreduce allgather" as well as "allreduce,allgather".
std::vector<std::string> splitOps(const std::vector<std::string>& given) {
  std::vector<std::string> ops;
  for (const auto& entry : given) {
    size_t start = 0;
    while (start <= entry.size()) {
      size_t comma = entry.find(',', start);
      if (comma == std::string::npos) comma = entry.size();
      if (comma > start) ops.push_back(entry.substr(start, comma - start));
      start = comma + 1;
    }
  }
  return ops;
}

CommBenchOptions benchOptions(const BenchCommArgs& args) {
  CommBenchOptions o;
  o.ops = splitOps(args.ops);
  o.min_bytes = args.min_bytes;
  o.max_bytes = args.max_bytes;
  o.iters = args.iters;
  o.warmup = args.warmup;
  o.dtype = args.dtype;
  validateCommBenchOptions(o);
  PTRAIN_CHECK_AS(ConfigError, args.timeout_s > 0, "--timeout must be positive, got ", args.timeout_s);
  return o;
}

const char* factorText(const std::string& op) {
  if (op == "allreduce") return "2(n-1)/n";
  if (op == "broadcast" || op == "sendrecv") return "1";
  if (op == "barrier") return "no payload";
  return "(n-1)/n";
}

class TablePrinter {
 public:
  explicit TablePrinter(int ranks) : ranks_(ranks) {}

  void row(const CommBenchResult& r) {
    if (r.op != op_) {
      op_ = r.op;
      std::printf("#\n# %s  (busbw = algbw x %s = %.3f)\n", r.op.c_str(), factorText(r.op),
                  commBenchBusFactor(r.op, ranks_));
      std::printf("# %12s %12s %8s %12s %12s %12s %8s\n", "size(B)", "count", "type", "time(us)", "algbw(GB/s)",
                  "busbw(GB/s)", "#wrong");
    }
    std::printf("  %12lld %12lld %8s %12.2f %12.3f %12.3f %8lld\n", static_cast<long long>(r.bytes),
                static_cast<long long>(r.count), r.dtype.c_str(), r.time_us, r.algbw_gbps, r.busbw_gbps,
                static_cast<long long>(r.wrong));
    std::fflush(stdout);
    wrong_ += r.wrong;
    if (r.op != "barrier") {
      busbw_ += r.busbw_gbps;
      ++rows_;
    }
  }

  void summary() const {
    std::printf("#\n# wrong elements: %lld%s\n", static_cast<long long>(wrong_),
                wrong_ == 0 ? " (every result matches its expected value)" : " (RESULTS DIFFER)");
    if (rows_ > 0) std::printf("# avg bus bandwidth: %.3f GB/s\n", busbw_ / rows_);
    std::fflush(stdout);
  }

  int64_t wrong() const { return wrong_; }

 private:
  int ranks_;
  std::string op_;
  int64_t wrong_ = 0;
  double busbw_ = 0;
  int rows_ = 0;
};

int runWorker(const BenchCommArgs& args, const CommBenchOptions& options) {
  RankEnv env = detectRankEnv();
  initLogging(env.rank, env.world_size, "warn");
  configureIntraOpThreads(env);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));

  TcpStoreOptions so;
  so.host = env.master_addr;
  so.port = env.master_port;
  so.is_server = env.rank == 0;
  so.world_size = env.world_size;
  so.timeout = timeout;
  auto store = createTcpStore(so);

  PluginRegistry registry(PluginRegistry::defaultSearchPath());
  PluginContext ctx;
  ctx.logger = logger();
  ctx.rank = env.rank;
  ctx.world_size = env.world_size;
  // NCCL moves GPU buffers: each worker takes the GPU of its local rank.
  if (args.backend == "nccl") ctx.device = selectDevice("cuda", env.local_rank);
  CommBenchOptions deviceOptions = options;
  deviceOptions.device = ctx.device.str();
  auto plugin = registry.create(plugin_kind::kComm, args.backend, ctx, "--backend");
  auto* backend = static_cast<CommBackend*>(plugin.get());

  GroupOptions go;
  go.name = "world";
  for (int r = 0; r < env.world_size; ++r) go.ranks.push_back(r);
  go.global_rank = env.rank;
  go.timeout = timeout;
  auto world = backend->createGroup(store, go);

  TablePrinter table(world->size());
  if (env.rank == 0) {
    std::printf("# ptrain bench-comm: backend %s, %d ranks, %s, %d iterations after %d warmup, %lld..%lld bytes\n",
                backend->backendName().c_str(), world->size(), options.dtype.c_str(), options.iters, options.warmup,
                static_cast<long long>(options.min_bytes), static_cast<long long>(options.max_bytes));
    std::printf("# time: mean per operation on the slowest rank; #wrong: elements differing from the expected "
                "result, summed over ranks\n");
  }
  auto results = runCommBench(*world, deviceOptions, [&](const CommBenchResult& r) {
    if (env.rank == 0) table.row(r);
  });
  int64_t wrong = 0;
  for (const auto& r : results) wrong += r.wrong;
  if (env.rank == 0) table.summary();
  // Nobody tears down connections while a peer may still be finishing.
  world->barrier()->wait();
  world.reset();
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int cmdBenchComm(const BenchCommArgs& args) {
  const CommBenchOptions options = benchOptions(args);
  if (isWorkerProcess()) return runWorker(args, options);

  // A missing backend is reported once, here, rather than by every worker.
  {
    PluginRegistry registry(PluginRegistry::defaultSearchPath());
    const auto& found = registry.plugins();
    bool present = std::any_of(found.begin(), found.end(), [&](const PluginInfo& p) {
      return p.kind == plugin_kind::kComm && p.name == args.backend;
    });
    if (!present) registry.create(plugin_kind::kComm, args.backend, PluginContext{}, "--backend");
  }

  LaunchOptions launch;
  launch.nproc_per_node = args.launch.nproc > 0 ? args.launch.nproc : 1;
  launch.nnodes = args.launch.nnodes;
  launch.node_rank = args.launch.node_rank;
  if (!args.launch.master_addr.empty()) launch.master_addr = args.launch.master_addr;
  launch.master_port = args.launch.master_port;
  // Only rank 0 prints the table; errors name their rank themselves.
  launch.prefix_output = false;
  launch.command = {selfExe()};
  launch.command.insert(launch.command.end(), args.argv.begin() + (args.argv.empty() ? 0 : 1), args.argv.end());
  return launchWorkers(launch);
}

}  // namespace ptrain::cli
