// Progress display and metrics file of rank 0.
#pragma once

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace ptrain {

// Appends one JSON object per line; inactive (writes nothing) when the path is empty.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path);
  void write(const nlohmann::json& line);

 private:
  std::ofstream out_;
};

// What one step's progress line shows.
struct ProgressLine {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double mfu = -1;        // fraction of the device's peak; < 0: not known (not shown)
  double rate = 0;        // items per second
  double mem_mb = 0;      // memory now and at its peak (the GPU's on cuda, else resident)
  double peak_mem_mb = 0;
  std::string extra;      // after the loss (e.g. the fp16 loss scale and skipped steps)
};

// A live bar on a terminal (step, loss, lr, grad norm, MFU, throughput,
// memory, ETA) or plain lines. mode: auto | bar | lines | none. Inactive on
// ranks other than 0.
class Progress {
 public:
  // `unit`: what the throughput counts ("tokens" prints as tok/s).
  Progress(bool active, const std::string& mode, int64_t totalSteps, int64_t startStep,
           const std::string& unit = "tokens");
  // `logLine`: whether this step is due for a plain line.
  void update(const ProgressLine& line, bool logLine);
  // A message printed on its own line (e.g. evaluation results).
  void note(const std::string& message);
  void finish();

 private:
  void clearBar();
  bool active_;
  bool bar_;
  int64_t total_;
  int64_t start_;
  double startTime_;
  std::string rateLabel_;  // e.g. "tok/s", "samples/s"
  bool barShown_ = false;
};

std::string formatEval(int64_t step, const std::map<std::string, double>& eval);

}  // namespace ptrain
