// `ptrain doctor RUN_DIR | LOGFILE`: reads what a run left behind and names
// what went wrong, in the diagnosis flowchart's classes, with the lines that
// show it and the next step as recipe overrides.
//
// A run folder holds what `ptrain run` records: launch.log (every line the
// launcher printed, its workers' with "[rank R] "), exit.json (how each
// worker ended), metrics.jsonl and recipe.yaml. A log file is any saved
// output of ptrain (e.g. of a launch refused before it made a folder).
//
// Classes, the first that matches wins (most specific first): stopped by the
// user or scheduler (not a failure), plugin load failure, layout mismatch,
// out of memory, communication timeout, lost rank, configuration or data
// error, loss divergence / NaN / fp16 overflow storm; else an unclassified
// failure, or a healthy run. Every command it suggests runs on the folder it
// read (resumeCommand): --resume where a checkpoint exists, else the run's
// recipe in a new folder.
#include <algorithm>
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
#include "ptrain/core/text.h"
#include "ptrain/engine/checkpoint_io.h"
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
  bool failure = true;             // false: the run ended as asked (stopped by a signal)
};

// What a run left behind.
struct RunRecord {
  std::string name;                // the folder or the log file, as given
  bool isRunDir = false;
  std::vector<Line> lines;         // the log's lines
  std::optional<nlohmann::json> exit;
  std::vector<nlohmann::json> steps;  // training lines of metrics.jsonl
  std::optional<nlohmann::json> summary;  // its summary row (the last)
  std::optional<Recipe> recipe;
  // metrics.jsonl's damaged lines (a cut last line aside): how many, and
  // what is wrong with the first, said after the verdict.
  int damagedMetricsLines = 0;
  std::string firstDamagedMetricsLine;
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
    const std::string ext = fs::path(path).extension().string();
    if (ext == ".yaml" || ext == ".yml") {
      throw ConfigError(path + " is a recipe, not a run: give the folder `ptrain run` wrote (its --run-dir), or a "
                        "saved log of ptrain's output");
    }
    r.lines = readLines(path, fs::path(path).filename().string());
    const bool ptrainOutput = std::any_of(r.lines.begin(), r.lines.end(), [](const Line& l) {
      return l.text.find("ptrain") != std::string::npos || l.text.rfind("[rank ", 0) == 0;
    });
    if (!ptrainOutput) {
      throw ConfigError(path + ": not a ptrain log (no line of ptrain's output in it): give the folder `ptrain run` "
                        "wrote (its --run-dir), or a saved log of ptrain's output");
    }
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
    // A launcher killed while writing it leaves only exit.json.tmp, which is
    // not read; an exit.json itself is whole, or damaged by something else.
    nlohmann::json j;
    try {
      std::ifstream in(file);
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(file.string() + ": not valid JSON (" + std::string(e.what()) +
                        "): the file is damaged; move it aside to diagnose from the log alone");
    }
    const bool shaped = j.is_object() && j.contains("result") && j["result"].is_number_integer() &&
                        j.contains("first_failure_rank") && j["first_failure_rank"].is_number_integer() &&
                        j.contains("ranks") && j["ranks"].is_array() &&
                        std::all_of(j["ranks"].begin(), j["ranks"].end(), [](const nlohmann::json& k) {
                          return k.is_object() && k.contains("rank") && k["rank"].is_number_integer() &&
                                 k.contains("code") && k["code"].is_number_integer() && k.contains("signal");
                        });
    if (!shaped) {
      throw ConfigError(file.string() + ": not an exit record (expected result, first_failure_rank and ranks[] with "
                        "rank, code and signal): the file is damaged; move it aside to diagnose from the log alone");
    }
    // Several nodes: the first that failed speaks for the job.
    if (!r.exit || ((*r.exit)["result"].get<int>() == 0 && j["result"].get<int>() != 0)) r.exit = j;
  }
  const std::string metricsPath = (fs::path(path) / "metrics.jsonl").string();
  std::ifstream metrics(metricsPath);
  std::string text;
  uint64_t offset = 0;
  for (int64_t n = 1; std::getline(metrics, text); ++n, offset += text.size() + 1) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      nlohmann::json j = text::parseJsonLine(text, metricsPath, n, offset, "one JSON object a line");
      if (!j.is_object()) continue;
      if (j.value("kind", "") == "summary") r.summary = j;
      if (j.contains("loss") && j.contains("step")) r.steps.push_back(std::move(j));
    } catch (const ConfigError& e) {
      // A last line cut off by a crash is expected; anything else is damage
      // the diagnosis should not hide.
      if (metrics.eof() && text::isCutJsonRow(text)) continue;
      if (r.damagedMetricsLines++ == 0) r.firstDamagedMetricsLine = e.what();
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

// What resumeCommand(r) does, in brackets.
std::string resumeNote(const RunRecord& r) {
  std::optional<int64_t> latest;
  try {
    if (r.isRunDir) latest = latestCheckpoint(r.name);
  } catch (const Error&) {
  }
  if (latest) {
    return "(continues from step_" + std::to_string(*latest) + ", the newest checkpoint; checkpoint.every sets how "
           "much a failure loses)";
  }
  return "(no checkpoint was saved, so it starts again; checkpoint.every sets how much a failure loses)";
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

// A command that runs on this folder: --resume where there is a checkpoint
// (`from` > 0 picks an earlier one), with --allow-changes when `overrides`
// change the recipe; otherwise the run's own recipe started again in a new
// folder (--resume would find nothing). A log file has no folder: RECIPE.
std::string resumeCommand(const RunRecord& r, const std::string& overrides = "", int64_t from = -1) {
  const std::string extra = overrides.empty() ? "" : " " + overrides;
  if (!r.isRunDir) return "ptrain run RECIPE" + extra;
  std::optional<int64_t> latest;
  try {
    latest = latestCheckpoint(r.name);
  } catch (const Error&) {
  }
  if (latest && from != 0) {
    return "ptrain run --resume --run-dir " + r.name + (from > 0 ? " --from-step " + std::to_string(from) : "") +
           extra + (overrides.empty() ? "" : " --allow-changes");
  }
  const std::string recipe = r.recipe ? (fs::path(r.name) / "recipe.yaml").string() : "RECIPE";
  return "ptrain run " + recipe + extra + " --run-dir " + r.name + "-retry";
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
// prediction is put on the measured footing (the worker's reported peak less
// the predicted one is added to each step), so each step's figure compares
// with the cap; only steps predicted to fit with 10% to spare are offered, the
// first of them as a command. The fixed
// order, said to be unpredicted, when the recipe cannot be sized.
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
          // What the plan does not see (the libraries this libtorch loads,
          // the allocator's arenas) is a fixed amount, not a share: the
          // measured peak over the predicted one is added to every step.
          const double offset = measured - plan::peakMemory(*shape, layout, device).total();
          // The plan is calibrated to within 10% (docs/planning.md): a step
          // is offered when it fits with that much to spare.
          const double cap = recipe.getFloat("train.max_memory_mb") * 1024.0 * 1024.0;
          device.memory_gib = std::max(0.0, 0.9 * cap - offset) / (1024.0 * 1024.0 * 1024.0);
          // The flowchart's steps add up (each keeps the ones before it): the
          // command carries every override up to the first step that fits.
          const auto advice = plan::adviseWhenOverMemory(*shape, layout, device);
          std::vector<std::pair<std::string, std::string>> levers;  // key, "key=value", in order
          for (const auto& a : advice) {
            const std::string key = a.override_text.substr(0, a.override_text.find('='));
            auto same = std::find_if(levers.begin(), levers.end(), [&](const auto& l) { return l.first == key; });
            if (same != levers.end()) same->second = a.override_text;
            else levers.emplace_back(key, a.override_text);
            if (!a.fits) continue;
            std::string overrides;
            for (const auto& l : levers) overrides += (overrides.empty() ? "" : " ") + l.second;
            out.push_back(resumeCommand(r, overrides) + "   (predicted peak " + memoryText(a.total_bytes + offset) +
                          ", under train.max_memory_mb=" +
                          text::formatNumber(recipe.getFloat("train.max_memory_mb")) + " with 10% to spare)");
            break;
          }
          if (out.empty()) {
            out.push_back("no lever is predicted to fit under train.max_memory_mb=" +
                          text::formatNumber(recipe.getFloat("train.max_memory_mb")) +
                          " (offload, smaller micro-batches, recomputation, the distributed optimizer): the model "
                          "needs more devices (parallel.tensor_model_parallel_size or pipeline_model_parallel_size, "
                          "with --nproc to match), or a larger cap (reserved before any tensor: " +
                          memoryText(device.reserved_gib * 1024 * 1024 * 1024 + offset) + ")");
          }
          return out;
        }
      }
    } catch (const Error&) {
      out.clear();  // the fixed order below
    }
  }
  out.push_back("the recipe could not be sized, so these are the flowchart's steps in order, not predictions:");
  out.push_back(resumeCommand(r, "offload.params=true"));
  out.push_back("then " + (micro > 1 ? "train.micro_batch_size=" + std::to_string(micro / 2)
                                     : std::string("a smaller train.micro_batch_size")));
  out.push_back("then model.recompute=full");
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
  return Diagnosis{"out of memory", "a worker ran out of memory", evidence, memoryAdvice(r)};
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
                   resumeCommand(r) + "   " + resumeNote(r)}};
      return d;
    }
  }
  auto timeouts = matching(r, {"timed out after"});
  if (!timeouts.empty()) {
    const std::string exit = exitLine(r);
    if (!exit.empty()) timeouts.push_back(exit);
    // The peers that never answered: ranks that neither failed nor finished
    // by themselves, so that the launcher had to kill them.
    std::string missing;
    if (r.exit) {
      for (const auto& rank : (*r.exit)["ranks"]) {
        if (rank["signal"].is_string() && rank["code"].get<int>() != 0) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(rank["rank"].get<int>());
        }
      }
    }
    std::string summary = "a collective waited past communication.timeout_s for a peer that was stuck or missing";
    if (!missing.empty()) {
      summary += "; the peer that never answered: rank " + missing + " (it did not fail by itself: the launcher "
                 "stopped it afterwards)";
    }
    return Diagnosis{"communication timeout", summary, timeouts,
                     {"find what " + (missing.empty() ? std::string("the stuck rank") : "rank " + missing) +
                          " was doing (a long checkpoint, a data stall, a hung GPU, a stopped process); "
                          "NCCL_DEBUG=INFO under communication.nccl shows the collective",
                      "if the wait was legitimate: communication.timeout_s=<more seconds>",
                      resumeCommand(r) + "   " + resumeNote(r)}};
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
  // fp16's loss scale starts at 2^32 and backs off until the gradients fit:
  // the skips before the first applied step are that search, not trouble.
  // A storm is skipping that persists once the scale has settled, or that
  // drives it down to precision.min_loss_scale.
  double minScale = 1;
  if (r.recipe && r.recipe->has("precision.min_loss_scale")) minScale = r.recipe->getFloat("precision.min_loss_scale");
  bool settled = false;
  int skippedAfter = 0, stepsAfter = 0, run = 0, longestRun = 0, nonFinite = 0, skippedAll = 0;
  bool atFloor = false;
  double first = NAN, minimum = INFINITY, last = NAN;
  int firstBad = -1, firstGrown = -1;
  for (const auto& j : r.steps) {
    const bool skip = j.contains("skipped") && j["skipped"].is_boolean() && j["skipped"].get<bool>() &&
                      !(j.contains("nonfinite") && j["nonfinite"].is_boolean() && j["nonfinite"].get<bool>());
    skippedAll += skip ? 1 : 0;
    if (skip && j.contains("loss_scale") && j["loss_scale"].is_number() && j["loss_scale"].get<double>() <= minScale) {
      atFloor = true;
    }
    if (!skip) settled = true;
    if (settled) {
      ++stepsAfter;
      skippedAfter += skip ? 1 : 0;
      run = skip ? run + 1 : 0;
      longestRun = std::max(longestRun, run);
    }
    const bool finite = j["loss"].is_number() && std::isfinite(j["loss"].get<double>());
    if (!finite) {
      ++nonFinite;
      if (firstBad < 0) firstBad = j["step"].get<int>();
      continue;
    }
    const double loss = j["loss"].get<double>();
    if (std::isnan(first)) first = loss;
    minimum = std::min(minimum, loss);
    if (firstGrown < 0 && loss > 2 * minimum && loss > first) firstGrown = j["step"].get<int>();
    last = loss;
  }
  const bool storm = atFloor || longestRun >= 3 || (stepsAfter >= 8 && skippedAfter * 4 >= stepsAfter);
  const bool diverged = !std::isnan(last) && last > 2 * minimum && last > first;
  if (nonFinite == 0 && !storm && !diverged) return std::nullopt;
  const std::string precision = r.recipe && r.recipe->has("precision.name") ? r.recipe->getString("precision.name") : "";
  double lr = 0;
  if (r.recipe && r.recipe->has("optimizer.lr")) lr = r.recipe->getFloat("optimizer.lr");
  Diagnosis d;
  if (storm) {
    d.kind = "fp16 overflow storm";
    d.summary = atFloor ? "steps were still skipped for inf/NaN gradients with the loss scale at its floor "
                          "(precision.min_loss_scale=" + text::formatNumber(minScale) + "): nothing fits fp16's range"
                        : std::to_string(skippedAfter) + " of the " + std::to_string(stepsAfter) +
                              " steps after the loss scale first settled were skipped for inf/NaN gradients (at most " +
                              std::to_string(longestRun) + " in a row): the loss scale cannot find a range that fits";
    evidence.push_back("metrics.jsonl: " + std::to_string(skippedAll) + " lines with \"skipped\": true; the last: " +
                       r.steps.back().dump());
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
  const std::string exit = exitLine(r);
  if (!exit.empty()) evidence.push_back(exit);
  d.evidence = evidence;
  // The changes, as overrides of one command that runs on this folder.
  std::string overrides;
  if (precision == "fp16") {
    overrides += "precision.name=bf16";
    d.next.push_back("precision.name=bf16   (the same range as fp32, no loss scale to find)");
  }
  if (lr > 0) {
    // A loss that went non-finite needs a larger step back than one that
    // only grew.
    const bool tenth = nonFinite > 0 && !storm;
    char lower[64];
    std::snprintf(lower, sizeof lower, "optimizer.lr=%g", tenth ? lr / 10 : lr / 2);
    overrides += (overrides.empty() ? "" : " ") + std::string(lower);
    d.next.push_back(std::string(lower) + (tenth ? "   (a tenth of the learning rate)" : "   (half the learning rate)"));
  }
  const double clip = r.recipe && r.recipe->has("optimizer.clip_grad") ? r.recipe->getFloat("optimizer.clip_grad") : 1.0;
  if (clip <= 0 || clip > 1) d.next.push_back("optimizer.clip_grad=1.0   (clipping is " + std::string(clip <= 0 ? "off" : "loose") + ")");
  const int64_t warmup = r.recipe && r.recipe->has("optimizer.warmup_steps") ? r.recipe->getInt("optimizer.warmup_steps") : 0;
  if (warmup == 0) d.next.push_back("optimizer.warmup_steps=100   (a gentler start)");
  // Non-finite steps are never saved, so the newest checkpoint comes before
  // them; a loss that grew may have been saved after it began to grow.
  int64_t from = -1;
  if (nonFinite == 0 && firstGrown > 0 && r.isRunDir) {
    from = 0;
    try {
      for (int64_t step : listCheckpoints(r.name)) {
        if (step < firstGrown) from = step;
      }
    } catch (const Error&) {
    }
    if (from > 0 && latestCheckpoint(r.name) == from) from = -1;  // the newest is before it anyway
  }
  d.next.push_back(resumeCommand(r, overrides, from) + "   " +
                   (from == 0 ? std::string("(every checkpoint is from after the loss began to grow: starts again)")
                              : from > 0 ? "(from step_" + std::to_string(from) + ", before the loss began to grow at step " +
                                               std::to_string(firstGrown) + ")"
                                         : resumeNote(r)));
  return d;
}

// Stopped on purpose (Ctrl-C, a scheduler's SIGTERM), with or without a save:
// not a failure.
std::optional<Diagnosis> stopped(const RunRecord& r) {
  if (!r.exit) return std::nullopt;
  const auto& e = *r.exit;
  const int result = e["result"].get<int>();
  const std::string signal = e["launcher_signal"].is_string() ? e["launcher_signal"].get<std::string>() : "";
  if (result == kExitStoppedAndSaved) {
    auto evidence = matching(r, {"stopped by SIG", "received SIG"});
    evidence.push_back("exit.json: result 75 (stopped by a signal after saving)");
    return Diagnosis{"stopped by the user or scheduler, checkpoint saved",
                     "the run was asked to stop" + (signal.empty() ? "" : " (" + signal + ")") +
                         ", saved a checkpoint at a step boundary and stopped: nothing failed",
                     evidence,
                     {resumeCommand(r) + "   " + resumeNote(r)},
                     false};
  }
  if (signal.empty()) return std::nullopt;
  auto evidence = matching(r, {"received SIG"});
  evidence.push_back(exitLine(r));
  return Diagnosis{"stopped by the user or scheduler",
                   "the launcher received " + signal + " and stopped the workers: nothing failed" +
                       (signal == "SIGTERM" || signal == "SIGUSR1" ? "" : " (" + signal + " does not save; SIGTERM does, checkpoint.on_signal)"),
                   evidence,
                   {resumeCommand(r) + "   " + resumeNote(r)},
                   false};
}

// Device groups (parallel.groups): every group waits for the slowest at each
// step's gradient exchange. Names it, with the shares that would even the
// groups' busy time (each group's rows in proportion to its rows per busy
// second).
void slowestGroup(const RunRecord& r) {
  if (!r.summary || !r.summary->contains("device_groups")) return;
  const auto& groups = (*r.summary)["device_groups"];
  if (groups.size() < 2) return;
  size_t slowest = 0;
  double rate = 0;
  std::vector<double> rates;
  for (size_t i = 0; i < groups.size(); ++i) {
    const double busy = std::max(1e-9, groups[i]["busy_s"].get<double>());
    if (busy > groups[slowest]["busy_s"].get<double>()) slowest = i;
    rates.push_back(groups[i]["share"].get<double>() / busy);
    rate += rates.back();
  }
  std::string shares, waits;
  for (size_t i = 0; i < groups.size(); ++i) {
    shares += (shares.empty() ? "" : ", ") + groups[i]["name"].get<std::string>() + " " +
              text::formatNumber(std::round(1000.0 * rates[i] / rate) / 10.0);
    waits += (waits.empty() ? "" : ", ") + groups[i]["name"].get<std::string>() + " " +
             text::formatNumber(std::round(groups[i]["wait_s"].get<double>() * 1000.0) / 1000.0) + " s";
  }
  const auto& s = groups[slowest];
  std::printf("  device groups: the slowest is %s (%s s of work a step; waiting for the others: %s); shares that "
              "would even them: %s (parallel.groups share)\n",
              s["name"].get<std::string>().c_str(),
              text::formatNumber(std::round(s["busy_s"].get<double>() * 1000.0) / 1000.0).c_str(), waits.c_str(),
              shares.c_str());
}

}  // namespace

int cmdDoctor(const std::string& path) {
  const RunRecord r = readRecord(path);
  std::optional<Diagnosis> d;
  for (auto classify : {stopped, pluginFailure, layoutMismatch, outOfMemory, commFailure, configError, divergence}) {
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
  // Said after the verdict, which reads the lines that are whole.
  auto damage = [&r] {
    if (r.damagedMetricsLines == 0) return;
    std::printf("  note: %d %s of metrics.jsonl skipped as damaged; the first: %s\n", r.damagedMetricsLines,
                r.damagedMetricsLines == 1 ? "line" : "lines", r.firstDamagedMetricsLine.c_str());
  };
  if (!d) {
    if (!r.steps.empty()) {
      std::printf("ptrain doctor: %s: no failure found: %zu training steps, last loss %s\n", path.c_str(),
                  r.steps.size(), r.steps.back()["loss"].dump().c_str());
    } else {
      std::printf("ptrain doctor: %s: no failure found\n", path.c_str());
    }
    damage();
    slowestGroup(r);
    return 0;
  }
  std::printf("ptrain doctor: %s: %s\n  %s\n  evidence:\n", path.c_str(), d->kind.c_str(), d->summary.c_str());
  for (const auto& e : d->evidence) std::printf("    %s\n", e.c_str());
  std::printf("  next, in order:\n");
  for (const auto& n : d->next) std::printf("    %s\n", n.c_str());
  damage();
  return d->failure ? 1 : 0;
}

}  // namespace ptrain::cli
