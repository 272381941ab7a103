// `ptrain doctor RUN_DIR | LOGFILE`: reads what a run left behind and names
// what went wrong, in the diagnosis flowchart's classes, with the lines that
// show it and the next step as recipe overrides.
//
// A run folder holds what `ptrain run` records: launch.log (every line the
// launcher printed, its workers' with "[rank R] "), exit.json (how each
// worker ended), metrics.jsonl and recipe.yaml. A log file is any saved
// output of ptrain (e.g. of a launch refused before it made a folder).
//
// Classes, the first that matches wins (most specific first): plugin load
// failure, layout mismatch, out of memory, communication timeout, lost rank,
// configuration or data error, loss divergence / NaN / fp16 overflow storm;
// else an unclassified failure, or a healthy run.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "ptrain/core/error.h"
#include "ptrain/engine/recipe_layout.h"
#include "ptrain/engine/trainer.h"
#include "ptrain/plan/cost_model.h"
#include "ptrain/plugin/plugin.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"

namespace fs = std::filesystem;

namespace ptrain::cli {

bool extendSchemaFromTrainer(const Recipe& recipe, Schema& schema, std::string* whyNot,
                             std::unique_ptr<Plugin>* trainerOut);

namespace {

struct Line {
  std::string where;  // "launch.log:12"
  std::string text;
};

struct Diagnosis {
  std::string kind;                // e.g. "out of memory"
  std::string summary;             // one sentence
  std::vector<std::string> evidence;
  std::vector<std::string> next;   // the flowchart's next steps
};

// What a run left behind.
struct RunRecord {
  std::string name;                // the folder or the log file, as given
  bool isRunDir = false;
  std::vector<Line> lines;         // the log's lines
  std::optional<nlohmann::json> exit;
  std::vector<nlohmann::json> steps;  // training lines of metrics.jsonl
  std::optional<Recipe> recipe;
};

std::vector<Line> readLines(const fs::path& path, const std::string& label) {
  std::vector<Line> out;
  std::ifstream in(path);
  std::string text;
  for (int n = 1; std::getline(in, text); ++n) {
    if (!text.empty()) out.push_back({label + ":" + std::to_string(n), text});
  }
  return out;
}

RunRecord readRecord(const std::string& path) {
  RunRecord r;
  r.name = path;
  if (fs::is_regular_file(path)) {
    r.lines = readLines(path, fs::path(path).filename().string());
    return r;
  }
  if (!fs::is_directory(path)) throw ConfigError(path + ": no such run folder or log file");
  r.isRunDir = true;
  std::vector<fs::path> logs, exits;
  for (const auto& entry : fs::directory_iterator(path)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("launch", 0) == 0 && entry.path().extension() == ".log") logs.push_back(entry.path());
    if (file.rfind("exit", 0) == 0 && entry.path().extension() == ".json") exits.push_back(entry.path());
  }
  std::sort(logs.begin(), logs.end());
  std::sort(exits.begin(), exits.end());
  for (const auto& log : logs) {
    auto lines = readLines(log, log.filename().string());
    r.lines.insert(r.lines.end(), lines.begin(), lines.end());
  }
  if (logs.empty() && !fs::exists(fs::path(path) / "metrics.jsonl")) {
    throw ConfigError(path + ": not a run folder (no launch.log and no metrics.jsonl); give the folder `ptrain "
                      "run` wrote, or a saved log file");
  }
  for (const auto& file : exits) {
    try {
      std::ifstream in(file);
      nlohmann::json j = nlohmann::json::parse(in);
      // Several nodes: the first that failed speaks for the job.
      if (!r.exit || ((*r.exit)["result"].get<int>() == 0 && j["result"].get<int>() != 0)) r.exit = j;
    } catch (const nlohmann::json::exception&) {
      // A launcher killed while writing it leaves only the temporary file.
    }
  }
  std::ifstream metrics(fs::path(path) / "metrics.jsonl");
  std::string text;
  while (std::getline(metrics, text)) {
    try {
      nlohmann::json j = nlohmann::json::parse(text);
      if (j.contains("loss") && j.contains("step")) r.steps.push_back(std::move(j));
    } catch (const nlohmann::json::exception&) {
      // A line cut off by a crash.
    }
  }
  if (fs::exists(fs::path(path) / "recipe.yaml")) {
    try {
      r.recipe = Recipe::load((fs::path(path) / "recipe.yaml").string());
    } catch (const Error&) {
    }
  }
  return r;
}

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

// The log's lines holding any of `parts`, at most `limit`.
std::vector<std::string> matching(const RunRecord& r, std::initializer_list<const char*> parts, size_t limit = 3) {
  std::vector<std::string> out;
  for (const auto& line : r.lines) {
    for (const char* part : parts) {
      if (contains(line.text, part)) {
        out.push_back(line.where + ": " + line.text);
        break;
      }
    }
    if (out.size() >= limit) break;
  }
  return out;
}

std::string exitLine(const RunRecord& r) {
  if (!r.exit) return "";
  const auto& e = *r.exit;
  const int first = e["first_failure_rank"].get<int>();
  for (const auto& rank : e["ranks"]) {
    if (rank["rank"].get<int>() != first) continue;
    std::string what = rank["signal"].is_null() ? "exited with code " + std::to_string(rank["code"].get<int>())
                                                : "was killed by " + rank["signal"].get<std::string>();
    return "exit.json: rank " + std::to_string(first) + " " + what + " first; the launcher stopped the others";
  }
  if (!e["launcher_signal"].is_null()) {
    return "exit.json: the launcher was stopped by " + e["launcher_signal"].get<std::string>();
  }
  return "exit.json: result " + std::to_string(e["result"].get<int>());
}

int exitCodeOfFirstFailure(const RunRecord& r) {
  if (!r.exit) return -1;
  const int first = (*r.exit)["first_failure_rank"].get<int>();
  for (const auto& rank : (*r.exit)["ranks"]) {
    if (rank["rank"].get<int>() == first) return rank["code"].get<int>();
  }
  return (*r.exit)["result"].get<int>();
}

// The run folder keeps the resolved recipe it ran: resuming from it needs no
// other file.
std::string resumeCommand(const RunRecord& r) {
  if (!r.isRunDir) return "ptrain run RECIPE";
  const std::string recipe = r.recipe ? (fs::path(r.name) / "recipe.yaml").string() : "RECIPE";
  return "ptrain run " + recipe + " --resume --run-dir " + r.name;
}

// The peak a worker reported when it went over its cap ("reached 208 MB"),
// in bytes; 0 when the log does not say.
double measuredPeakBytes(const RunRecord& r) {
  static const std::regex reached(R"(out of memory: rank \d+ of runtime '[^']*' reached (\d+) MB)");
  double peak = 0;
  for (const auto& line : r.lines) {
    std::smatch m;
    if (std::regex_search(line.text, m, reached)) peak = std::max(peak, std::stod(m[1].str()) * 1024 * 1024);
  }
  return peak;
}

// Out of memory: the planner's flowchart on the recorded recipe. The model's
// prediction is put on the measured scale (the worker's reported peak over
// the predicted one), so each step's figure compares with the cap. The fixed
// order when the recipe cannot be sized.
std::vector<std::string> memoryAdvice(const RunRecord& r) {
  std::vector<std::string> out;
  int64_t micro = 0;
  if (r.recipe) {
    try {
      Recipe recipe = *r.recipe;
      Schema schema;
      describeCoreKeys(schema);
      std::string whyNot;
      std::unique_ptr<Plugin> trainerPlugin;
      if (extendSchemaFromTrainer(recipe, schema, &whyNot, &trainerPlugin)) {
        recipe.validate(schema);
        const int world = r.exit ? static_cast<int>((*r.exit)["ranks"].size())
                                 : static_cast<int>(recipe.getInt("launch.nproc"));
        const LayoutPlan sized = planLayout(recipe, world);
        micro = sized.micro_batch_size;
        auto& trainer = static_cast<Trainer&>(*trainerPlugin);
        trainer.setup(recipe);
        const double measured = measuredPeakBytes(r);
        const auto shape = trainer.modelShape();
        if (shape && measured > 0 && recipe.has("train.max_memory_mb")) {
          const plan::Layout layout = planLayoutOf(recipe, sized);
          int64_t count = 0;
          plan::DeviceSpec device = resolvePlanDevice("", "host", &count, world);
          const double scale = measured / plan::peakMemory(*shape, layout, device).total();
          device.memory_gib = recipe.getFloat("train.max_memory_mb") / 1024.0 / scale;
          const auto advice = plan::adviseWhenOverMemory(*shape, layout, device);
          for (const auto& a : advice) {
            out.push_back(a.override_text + "   (predicted peak " + memoryText(a.total_bytes * scale) +
                          (a.fits ? ": fits)" : ")"));
          }
          if (!advice.empty() && !advice.back().fits) {
            out.push_back("still over: the model needs more devices (parallel.tensor_model_parallel_size or "
                          "pipeline_model_parallel_size, with --nproc to match), or a larger train.max_memory_mb "
                          "(reserved before any tensor: " +
                          memoryText(device.reserved_gib * 1024 * 1024 * 1024 * scale) + ")");
          }
        }
      }
    } catch (const Error&) {
      out.clear();  // the fixed order below
    }
  }
  if (out.empty()) {
    out.push_back("offload.params=true");
    out.push_back(micro > 1 ? "train.micro_batch_size=" + std::to_string(micro / 2)
                            : "a smaller train.micro_batch_size");
    out.push_back("model.recompute=full");
  }
  return out;
}

std::optional<Diagnosis> pluginFailure(const RunRecord& r) {
  auto evidence = matching(r, {"plugin ABI version", ": built for '", "cannot load the library", "not a ptrain plugin",
                               "unknown plugin kind", "duplicate plugin", "plugin file or folder not found",
                               "no plugin named", "is a comm plugin", "is a trainer plugin"});
  if (evidence.empty()) return std::nullopt;
  Diagnosis d{"plugin load failure", "a plugin could not be loaded, so the run stopped before training", evidence, {}};
  if (contains(evidence.front(), "ABI version") || contains(evidence.front(), "built for '")) {
    d.next.push_back("rebuild the plugin against this ptrain (its SDK headers and the same libtorch), or remove it "
                     "from plugins.paths / PTRAIN_PLUGIN_PATH");
  } else {
    d.next.push_back("check plugins.paths and PTRAIN_PLUGIN_PATH (`ptrain plugins` lists what is found and why "
                     "a file is refused)");
  }
  return d;
}

std::optional<Diagnosis> layoutMismatch(const RunRecord& r) {
  auto evidence = matching(r, {"is not divisible by tensor_model_parallel_size", "world size ",
                               "does not divide num_", "does not divide seq_length", "data_parallel_shares",
                               "needs pipeline_model_parallel_size", "rollout", "was saved with a layout",
                               "expert_model_parallel_size=", "is not divisible by micro_batch_size*dp"});
  // Only refusals (the launcher's or a worker's one line), not logged layouts.
  std::vector<std::string> refusals;
  for (auto& e : evidence)
    if (contains(e, "ptrain: ")) refusals.push_back(e);
  if (refusals.empty()) return std::nullopt;
  Diagnosis d{"layout mismatch",
              "the parallel sizes do not fit each other, the model or the world size (for GRPO: the actor's and "
              "the rollout's sizes must both divide the world)",
              refusals,
              {"apply the fix the line gives, then `ptrain check RECIPE --nproc N` before launching"}};
  // The flowchart's answer to an actor/rollout mismatch: one size for both
  // (0 takes the actor's), at the cost of the rollout's own layout.
  for (const auto& e : refusals) {
    if (contains(e, "actor_rollout_ref.rollout.tensor_model_parallel_size=")) {
      d.next.push_back("or unify the rollout with the actor: actor_rollout_ref.rollout.tensor_model_parallel_size=0");
      break;
    }
  }
  return d;
}

std::optional<Diagnosis> outOfMemory(const RunRecord& r) {
  auto evidence = matching(r, {"out of memory", "CUDA out of memory", "std::bad_alloc", "Cannot allocate memory"});
  if (evidence.empty() && exitCodeOfFirstFailure(r) != 3) return std::nullopt;
  const std::string exit = exitLine(r);
  if (!exit.empty()) evidence.push_back(exit);
  Diagnosis d{"out of memory", "a worker ran out of memory", evidence, {}};
  for (const auto& step : memoryAdvice(r)) d.next.push_back((d.next.empty() ? resumeCommand(r) + " " : "then ") + step);
  return d;
}

std::optional<Diagnosis> commFailure(const RunRecord& r) {
  // A rank that vanished (killed by a signal) comes first: the others' time-
  // outs and closed connections are what its absence caused.
  if (r.exit) {
    const int first = (*r.exit)["first_failure_rank"].get<int>();
    for (const auto& rank : (*r.exit)["ranks"]) {
      if (rank["rank"].get<int>() != first || rank["signal"].is_null()) continue;
      const std::string signal = rank["signal"].get<std::string>();
      std::vector<std::string> evidence = {exitLine(r)};
      for (auto& e : matching(r, {"was killed by signal", "closed its connection", "timed out after"}, 2)) {
        evidence.push_back(e);
      }
      Diagnosis d{"lost rank",
                  "rank " + std::to_string(first) + " was killed by " + signal +
                      " while the others ran (the kernel's out-of-memory killer, a node failure, or a kill)",
                  evidence,
                  {"look for the cause on that rank's host (`dmesg` for the OOM killer; SIGKILL without one is an "
                   "outside kill)",
                   resumeCommand(r) + "   (continues from the newest checkpoint; checkpoint.every sets how much "
                                      "is lost)"}};
      return d;
    }
  }
  auto timeouts = matching(r, {"timed out after"});
  if (!timeouts.empty()) {
    const std::string exit = exitLine(r);
    if (!exit.empty()) timeouts.push_back(exit);
    return Diagnosis{"communication timeout",
                     "a collective waited past communication.timeout_s for a peer that was stuck or missing",
                     timeouts,
                     {"find the rank the message names as missing and what it was doing (a long checkpoint, a "
                      "data stall, a hung GPU); NCCL_DEBUG=INFO under communication.nccl shows the collective",
                      "if the wait was legitimate: communication.timeout_s=<more seconds>",
                      resumeCommand(r)}};
  }
  auto closed = matching(r, {"closed its connection"});
  if (!closed.empty()) {
    return Diagnosis{"lost rank", "a peer closed its connection in the middle of a collective", closed,
                     {"the first rank that failed (above in the log) is the cause", resumeCommand(r)}};
  }
  return std::nullopt;
}

std::optional<Diagnosis> configError(const RunRecord& r) {
  // One refusing line: "ptrain: <file>:<line>:<col>: ..." or "<command line>".
  static const std::regex refusal(R"(ptrain: (\S+\.ya?ml(:\d+:\d+)?|<command line>|<default>|<set>): )");
  std::vector<std::string> evidence;
  for (const auto& line : r.lines) {
    if (std::regex_search(line.text, refusal)) evidence.push_back(line.where + ": " + line.text);
    if (evidence.size() >= 3) break;
  }
  if (evidence.empty()) {
    evidence = matching(r, {"data: ", "dataset", "ConfigError"}, 3);
    if (evidence.empty() || exitCodeOfFirstFailure(r) != 2) return std::nullopt;
  }
  return Diagnosis{"configuration or data error", "the recipe (or its data) was refused before or while starting",
                   evidence,
                   {"fix the key the line names as it says; `ptrain check RECIPE` checks everything without "
                    "starting, and `ptrain keys` lists every key"}};
}

std::optional<Diagnosis> divergence(const RunRecord& r) {
  if (r.steps.empty()) return std::nullopt;
  std::vector<std::string> evidence;
  int skipped = 0, run = 0, longestRun = 0, nonFinite = 0;
  double first = NAN, minimum = INFINITY, last = NAN;
  int firstBad = -1;
  for (const auto& j : r.steps) {
    const bool skip = j.contains("skipped") && j["skipped"].get<bool>();
    skipped += skip ? 1 : 0;
    run = skip ? run + 1 : 0;
    longestRun = std::max(longestRun, run);
    const bool finite = j["loss"].is_number() && std::isfinite(j["loss"].get<double>());
    if (!finite) {
      ++nonFinite;
      if (firstBad < 0) firstBad = j["step"].get<int>();
      continue;
    }
    const double loss = j["loss"].get<double>();
    if (std::isnan(first)) first = loss;
    minimum = std::min(minimum, loss);
    last = loss;
  }
  const int steps = static_cast<int>(r.steps.size());
  const bool storm = longestRun >= 3 || (steps >= 8 && skipped * 4 >= steps);
  const bool diverged = !std::isnan(last) && last > 2 * minimum && last > first;
  if (nonFinite == 0 && !storm && !diverged) return std::nullopt;
  const std::string precision = r.recipe && r.recipe->has("precision.name") ? r.recipe->getString("precision.name") : "";
  double lr = 0;
  if (r.recipe && r.recipe->has("optimizer.lr")) lr = r.recipe->getFloat("optimizer.lr");
  Diagnosis d;
  if (storm) {
    d.kind = "fp16 overflow storm";
    d.summary = std::to_string(skipped) + " of " + std::to_string(steps) +
                " steps were skipped for inf/NaN gradients (at most " + std::to_string(longestRun) +
                " in a row): the loss scale cannot find a range that fits";
    const auto& lastLine = r.steps.back();
    evidence.push_back("metrics.jsonl: " + std::to_string(skipped) + " lines with \"skipped\": true; the last: " +
                       lastLine.dump());
  } else {
    d.kind = nonFinite > 0 ? "loss NaN" : "loss divergence";
    d.summary = nonFinite > 0 ? "the loss became NaN or infinite from step " + std::to_string(firstBad)
                              : "the loss grew from " + std::to_string(minimum) + " (its lowest) to " +
                                    std::to_string(last);
    for (const auto& j : r.steps) {
      const bool finite = j["loss"].is_number() && std::isfinite(j["loss"].get<double>());
      if (!finite || (diverged && j["loss"].get<double>() > 2 * minimum)) {
        evidence.push_back("metrics.jsonl: " + j.dump());
        break;
      }
    }
  }
  d.evidence = evidence;
  if (precision == "fp16") d.next.push_back("precision.name=bf16   (the same range as fp32, no loss scale to find)");
  char halved[64];
  std::snprintf(halved, sizeof halved, "optimizer.lr=%g", lr > 0 ? lr / 2 : 0.0);
  d.next.push_back(lr > 0 ? std::string(halved) + "   (half the learning rate)" : "a lower optimizer.lr");
  d.next.push_back("optimizer.clip_grad=1.0 and optimizer.warmup_steps (a gentler start)");
  d.next.push_back(resumeCommand(r) + " from a checkpoint before the trouble, or start again");
  return d;
}

}  // namespace

int cmdDoctor(const std::string& path) {
  const RunRecord r = readRecord(path);
  std::optional<Diagnosis> d;
  for (auto classify : {pluginFailure, layoutMismatch, outOfMemory, commFailure, configError, divergence}) {
    if ((d = classify(r))) break;
  }
  const int result = r.exit ? (*r.exit)["result"].get<int>() : -1;
  if (!d && result > 0) {
    std::vector<std::string> tail;
    for (size_t i = r.lines.size() > 5 ? r.lines.size() - 5 : 0; i < r.lines.size(); ++i) {
      tail.push_back(r.lines[i].where + ": " + r.lines[i].text);
    }
    tail.push_back(exitLine(r));
    d = Diagnosis{"unclassified failure", "the run failed in a way ptrain doctor does not recognise", tail,
                  {"read the last lines of the log above; a bug in ptrain or a plugin ends with \"internal error\""}};
  }
  if (!d) {
    if (!r.steps.empty()) {
      std::printf("ptrain doctor: %s: no failure found: %zu training steps, last loss %s\n", path.c_str(),
                  r.steps.size(), r.steps.back()["loss"].dump().c_str());
    } else {
      std::printf("ptrain doctor: %s: no failure found\n", path.c_str());
    }
    return 0;
  }
  std::printf("ptrain doctor: %s: %s\n  %s\n  evidence:\n", path.c_str(), d->kind.c_str(), d->summary.c_str());
  for (const auto& e : d->evidence) std::printf("    %s\n", e.c_str());
  std::printf("  next, in order:\n");
  for (const auto& n : d->next) std::printf("    %s\n", n.c_str());
  return 1;
}

}  // namespace ptrain::cli
