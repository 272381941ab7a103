// One function per `ptrain` subcommand, each in its own cmd_*.cpp file.
// Each returns the exit code; user errors are thrown as ptrain::Error and
// turned into one line by cli::main.
#pragma once

#include <string>
#include <vector>

namespace ptrain::cli {

struct LaunchArgs {
  int nproc = 0;  // 0: the recipe's launch.nproc (or 1)
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;  // empty: 127.0.0.1
  int master_port = 0;      // 0: a free port
};

struct RunArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  std::string run_dir;  // empty: runs/<name>/<timestamp>
  bool resume = false;
  LaunchArgs launch;
  std::vector<std::string> argv;  // the whole command line, to re-run as workers
};

struct CheckArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  int nproc = 0;  // 0: the recipe's launch.nproc (or 1)
};

struct BenchCommArgs {
  LaunchArgs launch;
  std::string backend = "gloo";
  std::vector<std::string> ops;  // empty: all
  int64_t min_bytes = 1024;
  int64_t max_bytes = 16 << 20;
  int iters = 20;
  int warmup = 5;
  std::string dtype = "float32";
  double timeout_s = 60;
  std::vector<std::string> argv;
};

struct PlanArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  int nproc = 0;        // 0: the cluster's count, else the recipe's launch.nproc
  std::string cluster;  // a cluster file (YAML); empty: --device
  std::string device;   // a preset name, or host (the default: this machine, measured)
};

int cmdRun(const RunArgs& args);
int cmdPlan(const PlanArgs& args);
int cmdCheck(const CheckArgs& args);
int cmdPlugins(const std::vector<std::string>& extraPaths);
int cmdBenchComm(const BenchCommArgs& args);
int cmdKeys(bool markdown, const std::string& trainer, bool nccl);

}  // namespace ptrain::cli
