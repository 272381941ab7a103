#include "ptrain/cli/cli.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "ptrain/comm/rank_env.h"
#include "ptrain/core/error.h"
#include "ptrain/core/text.h"

namespace ptrain::cli {
namespace {

void addLaunchOptions(CLI::App* cmd, LaunchArgs& launch) {
  cmd->add_option("--nproc", launch.nproc, "worker processes on this host (default: launch.nproc, else 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--nnodes", launch.nnodes, "hosts taking part")->check(CLI::PositiveNumber);
  cmd->add_option("--node-rank", launch.node_rank, "this host's index in [0, nnodes)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--master-addr", launch.master_addr, "address of the host running rank 0");
  cmd->add_option("--master-port", launch.master_port, "port of the rendezvous store on rank 0")
      ->check(CLI::Range(0, 65535));
}

// CLI11's words, made specific where a user needs more: a misspelt
// subcommand gets the nearest real one; --nproc 0 says what is valid.
std::string parseErrorLine(const CLI::App& app, int argc, char** argv, const std::string& what) {
  if (argc > 1 && argv[1][0] != '-') {
    const std::string given = argv[1];
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), given) == names.end()) {
      const std::string best = text::nearest(given, names, 2);
      return "'" + given + "' is not a ptrain command" + (best.empty() ? "" : "; did you mean '" + best + "'?") +
             " (ptrain --help lists them)";
    }
  }
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--nproc" || arg == "--nnodes") && i + 1 < argc) {
      const std::string value = argv[i + 1];
      if (value.find_first_not_of("0123456789-") == std::string::npos && std::atoll(value.c_str()) < 1) {
        return arg + " " + value + ": expected a whole number of at least 1 (" +
               (arg == "--nproc" ? "worker processes on this host" : "hosts taking part") + ")";
      }
    }
  }
  return what + " (see ptrain --help)";
}

// A worker that failed has said why; it leaves at once with its code. Its
// communication threads and peers' sockets may be in any state, and tearing
// them down can block until the launcher's SIGKILL, which would then hide
// that this rank failed by itself (the launcher blames the first rank that
// exits with its own error).
int failed(int code) {
  if (!isWorkerProcess()) return code;
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ptrain: distributed training with recipes that say how the model is split"};
  app.set_version_flag("--version", std::string("ptrain ") + PTRAIN_VERSION);
  app.require_subcommand(1);

  std::vector<std::string> fullArgv(argv, argv + argc);

  RunArgs run;
  run.argv = fullArgv;
  auto* runCmd = app.add_subcommand("run", "train a recipe: ptrain run RECIPE [--nproc N] [key=value ...]");
  runCmd->add_option("recipe", run.recipe, "recipe file (YAML); with --resume, default: the run's RUN_DIR/recipe.yaml");
  runCmd->add_option("overrides", run.overrides, "overrides such as train.steps=20");
  runCmd->add_option("--run-dir", run.run_dir, "run folder (default runs/<recipe name>/<timestamp>)");
  runCmd->add_flag("--resume", run.resume, "continue from the newest checkpoint in --run-dir");
  runCmd->add_option("--from-step", run.from_step,
                     "with --resume: continue from checkpoint step_N instead of the newest (later ones are set aside)")
      ->check(CLI::NonNegativeNumber);
  runCmd->add_flag("--allow-changes", run.allow_changes,
                   "with --resume: continue with a recipe or overrides that differ from the run's (each change is "
                   "listed)");
  addLaunchOptions(runCmd, run.launch);

  CheckArgs check;
  auto* checkCmd = app.add_subcommand("check", "validate a recipe and its parallel layout without training");
  checkCmd->add_option("recipe", check.recipe, "recipe file (YAML)")->required();
  checkCmd->add_option("overrides", check.overrides, "overrides such as parallel.tensor_model_parallel_size=2");
  checkCmd->add_option("--nproc", check.nproc, "world size to check against (default: launch.nproc, else 1)")
      ->check(CLI::PositiveNumber);
  auto* checkCluster = checkCmd->add_option("--cluster", check.cluster,
                                            "also check that the layout fits this cluster's devices (YAML)");
  checkCmd->add_option("--device", check.device, "also check that the layout fits this device preset (or host)")
      ->excludes(checkCluster);

  PlanArgs planArgs;
  auto* planCmd = app.add_subcommand(
      "plan", "predict one rank's memory and step time for a recipe's layout on a cluster, and what to change");
  planCmd->add_option("recipe", planArgs.recipe, "recipe file (YAML); not with --table");
  planCmd->add_option("overrides", planArgs.overrides, "overrides such as train.micro_batch_size=2");
  planCmd->add_option("--nproc", planArgs.nproc, "world size (default: the cluster's count, else launch.nproc)")
      ->check(CLI::PositiveNumber);
  auto* clusterOpt = planCmd->add_option("--cluster", planArgs.cluster, "cluster file (YAML): groups of devices");
  planCmd->add_option("--device", planArgs.device, "a device preset (A100-80G, H100-80G, ...) or host (default)")
      ->excludes(clusterOpt);
  planCmd->add_flag("--search", planArgs.search,
                    "rank every layout of the world size (tp, pp, dp, micro-batch, recompute, offload) by predicted "
                    "throughput within memory");
  planCmd->add_flag("--json", planArgs.json, "print the prediction as one JSON object");
  bool planTable = false;
  planCmd->add_flag("--table", planTable,
                    "print docs/device_tuning.md: chosen layouts for GPT 1.3B-175B on 8/64/512 devices of each preset "
                    "beside the seed's rule and Megatron-LM's published layouts");

  std::string doctorPath;
  auto* doctorCmd = app.add_subcommand(
      "doctor", "read a run's folder (or a saved log) and say what went wrong, with the evidence and what to change");
  doctorCmd->add_option("path", doctorPath, "the run folder `ptrain run` wrote (launch.log, exit.json, "
                                            "metrics.jsonl), or a log file")
      ->required();

  PlotArgs plotArgs;
  auto* plotCmd = app.add_subcommand(
      "plot", "draw a run's curves (loss, evaluation, learning rate, throughput, memory) as a PNG; several runs "
              "overlaid; or with --trace the timeline of traced steps");
  // Neither is required here: cmdPlot says which one is missing, or that
  // both were given, in the command's own words.
  plotCmd->add_option("run_dirs", plotArgs.run_dirs, "run folders `ptrain run` wrote (their metrics.jsonl)");
  plotCmd->add_option("--trace", plotArgs.traces,
                      "instead of run folders: the traces log.profile_steps wrote (RUN_DIR/traces/rank<R>.json), "
                      "drawn as a timeline of ptrain's ranges, one band per rank");
  plotCmd->add_option("--out", plotArgs.out,
                      "the PNG to write (default: the first RUN_DIR/curves.png; with --trace, timeline.png beside "
                      "the first trace)");
  plotCmd->add_option("--field", plotArgs.fields,
                      "a further field of the training rows to draw, a panel each (e.g. GRPO's critic/score/mean "
                      "actor/kl_loss, fp16's loss_scale); repeat or list several");
  plotCmd->add_option("--size", plotArgs.size,
                      "picture size in pixels, WIDTHxHEIGHT (default 1200x900; with --trace 1400 wide and as tall "
                      "as the ranks need)");

  std::vector<std::string> pluginPaths;
  auto* pluginsCmd = app.add_subcommand("plugins", "list every plugin found: kind, name, version, path");
  pluginsCmd->add_option("--path", pluginPaths, "extra folders or files to search first");

  BenchCommArgs bench;
  bench.argv = fullArgv;
  auto* benchCmd = app.add_subcommand("bench-comm", "measure every collective (nccl-tests style table)");
  addLaunchOptions(benchCmd, bench.launch);
  benchCmd->add_option("--backend", bench.backend, "comm plugin");
  benchCmd->add_option("--ops", bench.ops, "collectives to run (default: all)");
  benchCmd->add_option("--min-bytes", bench.min_bytes, "smallest message")->check(CLI::PositiveNumber);
  benchCmd->add_option("--max-bytes", bench.max_bytes, "largest message")->check(CLI::PositiveNumber);
  benchCmd->add_option("--iters", bench.iters, "timed iterations per size")->check(CLI::PositiveNumber);
  benchCmd->add_option("--warmup", bench.warmup, "untimed iterations per size")->check(CLI::NonNegativeNumber);
  benchCmd->add_option("--dtype", bench.dtype, "float32, float64, int32 or int64");
  benchCmd->add_option("--timeout", bench.timeout_s, "seconds before a collective is declared hung");

  std::string consolidateFrom, consolidateTo;
  auto* checkpointCmd = app.add_subcommand("checkpoint", "work with a run's checkpoints");
  checkpointCmd->require_subcommand(1);
  auto* consolidateCmd = checkpointCmd->add_subcommand(
      "consolidate", "write a checkpoint's tensors whole, one safetensors file per model and kind "
                     "(model.safetensors, optimizer.safetensors), as any safetensors reader loads them");
  consolidateCmd->add_option("step", consolidateFrom, "a checkpoint folder: RUN_DIR/checkpoints/step_N")->required();
  consolidateCmd->add_option("out", consolidateTo, "the folder to write (created; one that exists must be empty)")->required();

  std::string exportFrom, exportFormat, exportTo;
  auto* exportCmd = app.add_subcommand(
      "export", "write a checkpoint's model in another framework's format: ptrain export STEP --format hf OUT");
  exportCmd->add_option("checkpoint", exportFrom, "a checkpoint folder RUN_DIR/checkpoints/step_N, or a run folder (its newest)")
      ->required();
  exportCmd->add_option("out", exportTo, "the folder to write (new, or empty)")->required();
  exportCmd->add_option("--format", exportFormat, "hf: a Hugging Face folder (the llm trainer's GPT as GPT-2)")
      ->required();

  DataPrepareArgs prepare;
  auto* dataCmd = app.add_subcommand("data", "make data sets from your files");
  dataCmd->require_subcommand(1);
  auto* prepareCmd = dataCmd->add_subcommand(
      "prepare", "text or JSONL in, a Megatron indexed data set (PREFIX.bin/.idx/.json) out, tokenised with "
                 "SentencePiece");
  prepareCmd->add_option("inputs", prepare.inputs, "text files (a document per paragraph) or JSONL (.jsonl, .json)")
      ->required();
  prepareCmd->add_option("--output", prepare.output, "the data set's prefix, e.g. data/wiki")->required();
  prepareCmd->add_option("--tokenizer", prepare.tokenizer, "a SentencePiece .model to tokenise with");
  prepareCmd->add_option("--vocab-size", prepare.vocab_size,
                         "train a SentencePiece model of this many pieces on the inputs (PREFIX.model)")
      ->check(CLI::PositiveNumber);
  prepareCmd->add_option("--json-key", prepare.json_key, "the JSONL field that holds a document's text (text)");
  DataExportArgs dataExport;
  auto* exportDataCmd = dataCmd->add_subcommand(
      "export", "write a built-in data set as files its trainer reads back: mosaic (a COCO folder), clicks "
                "(Criteo TSV)");
  exportDataCmd->add_option("name", dataExport.name, "mosaic or clicks")->required();
  exportDataCmd->add_option("out", dataExport.out, "where to write: a folder (mosaic) or a .tsv / .tsv.gz file (clicks)")
      ->required();
  exportDataCmd->add_option("--recipe", dataExport.recipe,
                            "the recipe whose data options (sizes, seed) the export uses, so that training from the "
                            "files gives its batches")
      ->required();
  exportDataCmd->add_option("overrides", dataExport.overrides, "overrides such as data.canvas=96");
  exportDataCmd->add_option("--train", dataExport.train, "training samples to write (default: what the recipe's "
                                                         "train.steps x global_batch_size reads)")
      ->check(CLI::NonNegativeNumber);
  exportDataCmd->add_option("--validation", dataExport.validation,
                            "validation samples to write (default: the recipe's evaluation set)")
      ->check(CLI::NonNegativeNumber);

  bool markdown = false;
  auto* keysCmd = app.add_subcommand("keys", "list every recipe key with its type, default and meaning");
  keysCmd->add_flag("--markdown", markdown, "print the table used in docs/recipes.md");
  std::string keysTrainer;
  auto* keysTrainerOpt =
      keysCmd->add_option("--trainer", keysTrainer, "also list the keys this trainer plugin adds (e.g. llm)");
  bool keysNccl = false;
  keysCmd->add_flag("--nccl", keysNccl, "list instead the NCCL variables communication.nccl accepts")
      ->excludes(keysTrainerOpt);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ptrain: %s\n", parseErrorLine(app, argc, argv, e.what()).c_str());
    return 2;
  }

  try {
    if (runCmd->parsed()) return cmdRun(run);
    if (checkCmd->parsed()) return cmdCheck(check);
    if (planCmd->parsed() && planTable) return cmdPlanTable();
    if (planCmd->parsed()) {
      if (planArgs.recipe.empty()) throw ConfigError("ptrain plan: give a recipe file (or --table)");
      return cmdPlan(planArgs);
    }
    if (doctorCmd->parsed()) return cmdDoctor(doctorPath);
    if (plotCmd->parsed()) return cmdPlot(plotArgs);
    if (pluginsCmd->parsed()) return cmdPlugins(pluginPaths);
    if (benchCmd->parsed()) return cmdBenchComm(bench);
    if (keysCmd->parsed()) return cmdKeys(markdown, keysTrainer, keysNccl);
    if (consolidateCmd->parsed()) return cmdCheckpointConsolidate(consolidateFrom, consolidateTo);
    if (exportCmd->parsed()) return cmdExport(exportFrom, exportFormat, exportTo);
    if (prepareCmd->parsed()) return cmdDataPrepare(prepare);
    if (exportDataCmd->parsed()) return cmdDataExport(dataExport);
  } catch (const Error& e) {
    // One line per problem (a layout can have several), each prefixed.
    std::string text = e.what();
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      // A line that names its command already ("ptrain plot: ...") is
      // printed as it is, not as "ptrain: ptrain plot: ...".
      const std::string line = text.substr(start, end - start);
      std::fprintf(stderr, line.rfind("ptrain ", 0) == 0 ? "%s\n" : "ptrain: %s\n", line.c_str());
      start = end + 1;
    }
    return failed(e.exitCode());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ptrain: out of memory: an allocation was refused; `ptrain plan RECIPE` predicts what each "
                         "rank needs, and `ptrain doctor RUN_DIR` what to change\n");
    return failed(OutOfMemoryError("").exitCode());
  } catch (const std::exception& e) {
    // libtorch's errors carry a C++ stack trace after their first line.
    const std::string text = e.what();
    const std::string first = text.substr(0, text.find('\n'));
    const bool memory = text.find("can't allocate memory") != std::string::npos ||
                        text.find("out of memory") != std::string::npos ||
                        text.find("Cannot allocate memory") != std::string::npos;
    if (memory) {
      std::fprintf(stderr, "ptrain: out of memory: %s; `ptrain plan RECIPE` predicts what each rank needs\n",
                   first.c_str());
      return failed(OutOfMemoryError("").exitCode());
    }
    const bool traced = first.size() < text.size() && std::getenv("PTRAIN_BACKTRACE") == nullptr;
    std::fprintf(stderr, "ptrain: internal error: %s%s\n", traced ? first.c_str() : text.c_str(),
                 traced ? " (PTRAIN_BACKTRACE=1 prints where it was raised)" : "");
    return failed(1);
  }
  return 0;
}

}  // namespace ptrain::cli
