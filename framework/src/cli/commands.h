// One function per `ptrain` subcommand, each in its own cmd_*.cpp file.
// Each returns the exit code; user errors are thrown as ptrain::Error and
// turned into one line by cli::main.
#pragma once

#include <string>
#include <vector>

#include "ptrain/layout/validation.h"
#include "ptrain/plan/cost_model.h"

namespace ptrain {
class Recipe;
struct PreparedRecipe;
}

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
  int64_t from_step = -1;      // --from-step: resume from this checkpoint (-1: the newest)
  bool allow_changes = false;  // --allow-changes: resume with a recipe that differs from the run's
  LaunchArgs launch;
  std::vector<std::string> argv;  // the whole command line, to re-run as workers
};

struct CheckArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  int nproc = 0;  // 0: the recipe's launch.nproc (or 1)
  // With either: the layout must also fit the device, by the planner's
  // memory model (an error with the first fix when it does not).
  std::string device;
  std::string cluster;
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
  bool search = false;  // rank every layout of the world instead
  bool json = false;    // the prediction as one JSON object (memory, time, their parts)
};

// The device `ptrain plan` and `ptrain check` size a layout for: a cluster
// file's, a preset by name, or this machine (measured, for `hostRanks`
// workers sharing its cores) when both are empty.
plan::DeviceSpec resolvePlanDevice(const std::string& cluster, const std::string& device, int64_t* clusterCount,
                                   int hostRanks);
// The planner's view of a recipe's layout and levers.
plan::Layout planLayoutOf(const Recipe& recipe, const LayoutPlan& sized);
// "1.25 GiB", "512.0 MiB".
std::string memoryText(double bytes);

// `parallel: auto`: when the recipe (with its overrides) says so, the layout
// `ptrain plan --search` ranks first for `world` processes (0: the recipe's
// launch.nproc) on the device the workers compute on (this machine, measured;
// on cuda the preset of the GPU's name), as overrides that replace it
// (`parallel=null` first, then each chosen key); empty when the recipe writes
// its layout. `summary` gets one line to log. Throws ConfigError when no
// layout fits or the GPU has no preset.
// With `nnodes` > 1 on the host the choice is refused: each node would
// measure its own machine and might choose differently.
std::vector<std::string> autoLayoutOverrides(const std::string& recipe, const std::vector<std::string>& overrides,
                                             int world, int nnodes, std::string* summary);

// The memory the plan predicts for one rank of a prepared recipe, against
// this host's whole memory (MemTotal): the refusal line when even one rank
// cannot fit ("RECIPE: the layout is predicted to need X per rank, this host
// has Y in all: ..."), "" when it fits, runs on cuda, or the trainer's model
// cannot be sized. `run` and `check` both ask, before anything starts; the
// caller throws OutOfMemoryError (exit code 3) with it.
std::string hostMemoryRefusal(const std::string& recipePath, const PreparedRecipe& prepared);

int cmdRun(const RunArgs& args);
int cmdPlan(const PlanArgs& args);
// `ptrain plan --table`: docs/device_tuning.md on stdout.
int cmdPlanTable();
int cmdCheck(const CheckArgs& args);
// `ptrain doctor RUN_DIR | LOGFILE`: 0 when nothing went wrong, 1 with a
// diagnosis, 2 when the path is neither (cmd_doctor.cpp).
int cmdDoctor(const std::string& path);
struct PlotArgs {
  std::vector<std::string> run_dirs;  // folders `ptrain run` wrote; several are overlaid
  std::vector<std::string> traces;    // --trace: Chrome traces of log.profile_steps, instead of run_dirs
  std::string out;                    // empty: RUN_DIR/curves.png, or timeline.png beside the first trace
  std::string size;                   // "WxH"; empty: 1200x900, or 1400 wide and as tall as the timeline needs
  std::vector<std::string> fields;    // --field: further metrics of the training rows, a panel each
};
// `ptrain plot RUN_DIR...`: the runs' curves from metrics.jsonl (loss,
// evaluation, learning rate, throughput, memory, and grad_norm and MFU when
// logged) as one PNG (cmd_plot.cpp). `ptrain plot --trace TRACE.json...`:
// the timeline of ptrain's ranges (phases, collectives, waits), one band
// per trace (plot_trace.h). ConfigError for a folder without metrics.jsonl,
// a malformed line, a run without training rows, a trace that is missing,
// not JSON or without ptrain ranges, run folders and traces together, a bad
// --size or an --out that is not a writable .png.
int cmdPlot(const PlotArgs& args);
int cmdPlugins(const std::vector<std::string>& extraPaths);
int cmdBenchComm(const BenchCommArgs& args);
int cmdKeys(bool markdown, const std::string& trainer, bool nccl);

// ptrain checkpoint consolidate STEP_DIR OUT: the checkpoint's tensors whole
// (engine/sharded_checkpoint.h, consolidateCheckpoint), then one line of what
// was written.
int cmdCheckpointConsolidate(const std::string& stepDir, const std::string& outDir);
// ptrain export STEP --format F OUT: the weights of a checkpoint (a step, run
// or runs/NAME folder) in another framework's format, written by the run's
// trainer (cmd_export.cpp).
int cmdExport(const std::string& from, const std::string& format, const std::string& outDir);
struct DataPrepareArgs {
  std::vector<std::string> inputs;
  std::string output;
  std::string tokenizer;
  int64_t vocab_size = 0;
  std::string json_key = "text";
};
// ptrain data prepare: text or JSONL in, an indexed data set out (cmd_data.cpp).
int cmdDataPrepare(const DataPrepareArgs& args);
struct DataExportArgs {
  std::string name;    // the built-in data set: mosaic, clicks
  std::string out;
  std::string recipe;  // its options (canvas, tables, seed, ...)
  std::vector<std::string> overrides;
  int64_t train = 0;
  int64_t validation = 0;
};
// ptrain data export NAME OUT --recipe R: a built-in data set as files the
// recipe's trainer reads back (cmd_data.cpp).
int cmdDataExport(const DataExportArgs& args);

}  // namespace ptrain::cli
