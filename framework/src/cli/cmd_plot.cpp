// `ptrain plot RUN_DIR [RUN_DIR...] [--out FILE.png] [--size WxH]`: a run's
// curves from its metrics.jsonl as one PNG, several runs overlaid.
// `ptrain plot --trace TRACE.json [TRACE.json...]`: the timeline of the steps
// log.profile_steps traced, one band per rank (plot_trace.h).
//
// metrics.jsonl holds one JSON object per line. Newer lines say what they are
// ("kind": train, eval, startup, checkpoint, summary); older ones do not, and
// are told apart by their keys: a "loss" makes a training line, an "eval_*"
// key an evaluation. A resumed run appends again from its checkpoint's step,
// so a step may appear twice: the later line is the one that stands, as it is
// for the run's own record (the steps after the checkpoint were trained again).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/plot_png.h"
#include "cli/plot_trace.h"
#include "ptrain/core/error.h"
#include "ptrain/core/text.h"

namespace fs = std::filesystem;

namespace ptrain::cli {
namespace {

using nlohmann::json;

// The rows of one run that are drawn, the last per step.
struct RunMetrics {
  std::string name;   // the run folder's name, in the legend
  std::map<double, json> train;
  std::map<double, json> eval;
};

// Writers in other languages (Python's json) put NaN and Infinity as bare
// words, which JSON does not have; they become null here, and null is a value
// the plot leaves out, like a non-finite number.
std::string nonFiniteAsNull(const std::string& line) {
  std::string out;
  out.reserve(line.size());
  bool inString = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (inString) {
      out += c;
      if (c == '\\' && i + 1 < line.size()) out += line[++i];
      else if (c == '"') inString = false;
      continue;
    }
    if (c == '"') inString = true;
    bool replaced = false;
    for (const char* word : {"-Infinity", "Infinity", "NaN"}) {
      const size_t n = std::char_traits<char>::length(word);
      if (line.compare(i, n, word) == 0) {
        out += "null";
        i += n - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return out;
}

bool hasEvalKey(const json& row) {
  for (auto it = row.begin(); it != row.end(); ++it) {
    if (it.key().rfind("eval_", 0) == 0) return true;
  }
  return false;
}

RunMetrics readRun(const std::string& given) {
  fs::path dir = given;
  fs::path file = dir / "metrics.jsonl";
  // The file itself names its run as well as its folder does.
  if (fs::is_regular_file(dir) && dir.extension() == ".jsonl") {
    file = dir;
    dir = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  }
  if (!fs::is_regular_file(file)) {
    throw ConfigError("ptrain plot: " + file.string() +
                      " not found: give the folder a run wrote (ptrain run --run-dir)");
  }
  std::ifstream in(file);
  if (!in) throw ConfigError("ptrain plot: " + file.string() + ": cannot be read");

  RunMetrics run;
  run.name = fs::absolute(dir).lexically_normal().filename().string();
  if (run.name.empty()) run.name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  std::string text;
  uint64_t offset = 0;  // of the line in the file
  for (int n = 1; std::getline(in, text); ++n, offset += text.size() + 1) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = file.string() + ":" + std::to_string(n);
    json row;
    try {
      row = text::parseJsonLine(nonFiniteAsNull(text), file.string(), n, offset,
                                "JSON lines, one object a line, as ptrain run writes metrics.jsonl");
    } catch (const ConfigError&) {
      // The last line of a run still training may be half written (every
      // row ends with a newline once written whole): the curves so far. Only
      // the start of a row is taken for that; anything else is not metrics.
      if (in.eof() && text::isCutJsonRow(text)) break;
      throw;
    }
    if (!row.is_object()) throw ConfigError("ptrain plot: " + where + ": expected a JSON object, found " +
                                            std::string(row.type_name()));
    std::string kind;
    if (row.contains("kind")) {
      if (!row["kind"].is_string()) throw ConfigError("ptrain plot: " + where + ": \"kind\" is not a string");
      kind = row["kind"].get<std::string>();
    } else if (row.contains("loss")) {
      kind = "train";
    } else if (hasEvalKey(row)) {
      kind = "eval";
    }
    if (kind != "train" && kind != "eval") continue;  // startup, checkpoint, summary: not curves
    if (!row.contains("step") || !row["step"].is_number()) {
      throw ConfigError("ptrain plot: " + where + ": a " + kind + " row without a numeric \"step\"");
    }
    const double step = row["step"].get<double>();
    (kind == "train" ? run.train : run.eval)[step] = std::move(row);
  }
  if (run.train.empty()) {
    throw ConfigError("ptrain plot: " + file.string() +
                      " has no training rows: the run stopped before its first step (ptrain doctor " + given +
                      " says why)");
  }
  return run;
}

// A number of a row, NaN where it is absent, null or not a number: a gap.
double valueOf(const json& row, const std::string& key) {
  auto it = row.find(key);
  if (it == row.end() || !it->is_number()) return std::nan("");
  return it->get<double>();
}

// One curve from `rows`: `key` at every step that has it; none when no row has
// it, so that a panel without data is left out.
bool addSeries(plot::Panel& panel, const std::map<double, json>& rows, const std::string& key,
               const std::string& name, int run, bool markers = false, double factor = 1) {
  plot::Series series{name, run, {}, {}, markers};
  for (const auto& [step, row] : rows) {
    if (!row.contains(key)) continue;
    series.x.push_back(step);
    series.y.push_back(valueOf(row, key) * factor);
  }
  if (series.x.empty()) return false;
  panel.series.push_back(std::move(series));
  return true;
}

// The throughput key of a run: the first of tokens_per_s, samples_per_s,
// images_per_s that it logs, else any other "<unit>_per_s".
std::string throughputKey(const RunMetrics& run) {
  std::set<std::string> found;
  for (const auto& [step, row] : run.train) {
    for (auto it = row.begin(); it != row.end(); ++it) {
      const std::string& key = it.key();
      if (key.size() > 6 && key.compare(key.size() - 6, 6, "_per_s") == 0) found.insert(key);
    }
  }
  for (const char* known : {"tokens_per_s", "samples_per_s", "images_per_s"}) {
    if (found.count(known)) return known;
  }
  return found.empty() ? "" : *found.begin();
}

plot::Panel emptyPanel(const std::string& title, const std::string& yLabel) {
  plot::Panel panel;
  panel.title = title;
  panel.yLabel = yLabel;
  return panel;
}

std::vector<plot::Panel> panelsOf(const std::vector<RunMetrics>& runs, const std::vector<std::string>& fields) {
  plot::Panel loss = emptyPanel("loss", "loss");
  plot::Panel evals = emptyPanel("evaluation", "value");
  plot::Panel lr = emptyPanel("learning rate", "lr");
  plot::Panel throughput = emptyPanel("throughput", "");
  plot::Panel memory = emptyPanel("memory", "MiB");
  plot::Panel grad = emptyPanel("gradient norm", "grad_norm");
  plot::Panel mfu = emptyPanel("model FLOPs utilisation", "MFU (%)");
  plot::Panel phases = emptyPanel("step time by phase", "seconds");
  std::set<std::string> units;
  for (int r = 0; r < static_cast<int>(runs.size()); ++r) {
    const RunMetrics& run = runs[r];
    addSeries(loss, run.train, "loss", "train", r);
    addSeries(loss, run.eval, "eval_loss", "eval", r, true);
    // Every other evaluation figure of the run, in one panel: they are the
    // trainer's own (exact match, mAP, AUC, reward), few and of like scale.
    std::set<std::string> keys;
    for (const auto& [step, row] : run.eval) {
      for (auto it = row.begin(); it != row.end(); ++it) {
        if (it.key().rfind("eval_", 0) == 0 && it.key() != "eval_loss" && (it->is_number() || it->is_null())) {
          keys.insert(it.key());
        }
      }
    }
    for (const auto& key : keys) addSeries(evals, run.eval, key, key, r, true);
    addSeries(lr, run.train, "lr", "lr", r);
    const std::string rate = throughputKey(run);
    if (!rate.empty()) {
      const std::string unit = rate.substr(0, rate.size() - 6);
      if (addSeries(throughput, run.train, rate, unit + "/s", r)) units.insert(unit);
    }
    for (const char* key : {"mem_mb", "peak_rss_mb", "device_mem_mb", "peak_device_mb"}) {
      addSeries(memory, run.train, key, key, r);
    }
    addSeries(grad, run.train, "grad_norm", "grad_norm", r);
    addSeries(mfu, run.train, "mfu", mfu.yLabel, r, false, 100.0);  // a fraction in the file, a percentage to read
    // The phase timers (time_<phase>_s) that took any time in this run.
    for (const char* phase : {"forward_backward", "grad_reduce", "pipeline_wait", "optimizer", "data", "rollout",
                              "eval", "checkpoint", "other"}) {
      const std::string key = std::string("time_") + phase + "_s";
      bool used = false;
      for (const auto& [step, row] : run.train) used = used || valueOf(row, key) > 0;
      if (used) addSeries(phases, run.train, key, phase, r);
    }
  }
  throughput.yLabel = units.size() == 1 ? *units.begin() + "/s" : "per second";

  // The loss panel stays even when empty (it says "no finite values": a run
  // that diverged at once); the others only when some run logged them.
  std::vector<plot::Panel> panels{loss};
  for (plot::Panel* p : {&evals, &lr, &throughput, &memory, &grad, &mfu, &phases}) {
    if (!p->series.empty()) panels.push_back(std::move(*p));
  }
  // The fields asked for by name, a panel each, after the standard ones.
  for (const auto& field : fields) {
    plot::Panel panel = emptyPanel(field, field);
    for (int r = 0; r < static_cast<int>(runs.size()); ++r) addSeries(panel, runs[r].train, field, field, r);
    if (panel.series.empty()) {
      throw ConfigError("ptrain plot: --field " + field + ": no training row of " +
                        (runs.size() == 1 ? "the run" : "any run") + " has it (a field of metrics.jsonl's "
                        "\"kind\": \"train\" rows, e.g. loss_scale, critic/score/mean)");
    }
    panels.push_back(std::move(panel));
  }
  return panels;
}

void parseSize(const std::string& text, int* width, int* height) {
  static const std::regex kSize(R"((\d{1,5})[xX](\d{1,5}))");
  std::smatch m;
  const int lo = 200, hi = 10000;  // below, nothing legible fits; above, memory runs out for nothing
  if (std::regex_match(text, m, kSize)) {
    *width = std::stoi(m[1]);
    *height = std::stoi(m[2]);
    if (*width >= lo && *width <= hi && *height >= lo && *height <= hi) return;
  }
  throw ConfigError("ptrain plot: --size " + text + ": expected WIDTHxHEIGHT in pixels, each from " +
                    std::to_string(lo) + " to " + std::to_string(hi) + " (e.g. 1200x900)");
}

bool endsWithPng(const std::string& path) {
  if (path.size() < 4) return false;
  std::string tail = path.substr(path.size() - 4);
  for (char& c : tail) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return tail == ".png";
}

// Labels that more than one band would carry (rank0.json of two runs) name
// the run as well: the folder above traces/, else the trace's own folder.
void distinguishLabels(std::vector<plot::Trace>* traces) {
  std::map<std::string, int> seen;
  for (const auto& t : *traces) ++seen[t.label];
  for (auto& t : *traces) {
    if (seen[t.label] < 2) continue;
    fs::path dir = fs::absolute(t.path).lexically_normal().parent_path();
    if (dir.filename() == "traces") dir = dir.parent_path();
    t.label = dir.filename().string() + " " + t.label;
  }
}

int plotTraces(const PlotArgs& args) {
  plot::Timeline timeline;
  if (!args.size.empty()) parseSize(args.size, &timeline.width, &timeline.height);
  const fs::path firstDir = fs::path(args.traces[0]).parent_path();
  const std::string out = args.out.empty() ? (firstDir / "timeline.png").string() : args.out;
  if (!args.out.empty() && !endsWithPng(out)) {
    throw ConfigError("ptrain plot: --out " + out + ": the picture is a PNG; give a name ending in .png");
  }
  for (const auto& path : args.traces) timeline.traces.push_back(plot::readTrace(path));
  distinguishLabels(&timeline.traces);
  if (timeline.height == 0) timeline.height = plot::timelineHeight(timeline);

  const std::string why = plot::writeTimelinePng(timeline, out);
  if (!why.empty()) throw ConfigError("ptrain plot: cannot write " + out + ": " + why);
  std::string labels;
  for (const auto& t : timeline.traces) labels += (labels.empty() ? "" : ", ") + t.label;
  std::printf("wrote %s (%dx%d): timeline of %s\n", out.c_str(), timeline.width, timeline.height, labels.c_str());
  return 0;
}

}  // namespace

int cmdPlot(const PlotArgs& args) {
  if (!args.traces.empty() && !args.run_dirs.empty()) {
    throw ConfigError("ptrain plot: give run folders or --trace files, not both (a run's traces are in "
                      "RUN_DIR/traces)");
  }
  if (!args.traces.empty()) return plotTraces(args);
  plot::Figure figure;
  if (!args.size.empty()) parseSize(args.size, &figure.width, &figure.height);
  if (args.run_dirs.empty()) {
    throw ConfigError("ptrain plot: give a run folder (ptrain plot RUN_DIR) or traces (ptrain plot --trace "
                      "RUN_DIR/traces/rank0.json)");
  }
  // The output is checked before any file is read: a mistyped name should
  // not wait for a long metrics file to be parsed.
  const std::string out = args.out.empty() ? (fs::path(args.run_dirs[0]) / "curves.png").string() : args.out;
  if (!args.out.empty() && !endsWithPng(out)) {
    throw ConfigError("ptrain plot: --out " + out + ": the picture is a PNG; give a name ending in .png");
  }

  std::vector<RunMetrics> runs;
  for (const auto& dir : args.run_dirs) runs.push_back(readRun(dir));
  // Runs from runs/<recipe>/<timestamp> can share a folder name; then the
  // legend names each by its parent as well.
  std::map<std::string, int> seen;
  for (const auto& run : runs) ++seen[run.name];
  for (size_t i = 0; i < runs.size(); ++i) {
    std::string name = runs[i].name;
    if (seen[name] > 1) {
      const fs::path dir = fs::absolute(args.run_dirs[i]).lexically_normal();
      const fs::path parent = (dir.filename().empty() ? dir.parent_path() : dir).parent_path().filename();
      name = (parent / name).string();
    }
    figure.runs.push_back(name);
  }
  figure.panels = panelsOf(runs, args.fields);

  const std::string why = plot::writePng(figure, out);
  if (!why.empty()) throw ConfigError("ptrain plot: cannot write " + out + ": " + why);
  std::string titles;
  for (const auto& panel : figure.panels) titles += (titles.empty() ? "" : ", ") + panel.title;
  std::printf("wrote %s (%dx%d): %s\n", out.c_str(), figure.width, figure.height, titles.c_str());
  return 0;
}

}  // namespace ptrain::cli
