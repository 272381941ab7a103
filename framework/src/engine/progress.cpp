#include "engine/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>

namespace ptrain {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string formatDuration(double s) {
  char buf[32];
  int total = static_cast<int>(s + 0.5);
  if (total >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", total / 3600, (total / 60) % 60);
  else std::snprintf(buf, sizeof buf, "%dm%02ds", total / 60, total % 60);
  return buf;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path) {
  if (!path.empty()) out_.open(path, std::ios::app);
}

void MetricsWriter::write(const nlohmann::json& line) {
  if (!out_.is_open()) return;
  out_ << line.dump() << '\n';
  out_.flush();
}

Progress::Progress(bool active, const std::string& mode, int64_t totalSteps, int64_t startStep,
                   const std::string& unit)
    : active_(active && mode != "none"),
      total_(totalSteps),
      start_(startStep),
      startTime_(now()),
      rateLabel_((unit == "tokens" ? std::string("tok") : unit) + "/s") {
  // Under the launcher, stdout is a pipe; it tells rank 0 whether the user's
  // terminal is one.
  const bool tty = std::getenv("PTRAIN_WORKER") ? std::getenv("PTRAIN_PROGRESS_TTY") != nullptr : isatty(1);
  bar_ = mode == "bar" || (mode == "auto" && tty);
}

void Progress::update(const ProgressLine& line, bool logLine) {
  if (!active_) return;
  const double elapsed = now() - startTime_;
  const double perStep = elapsed / static_cast<double>(std::max<int64_t>(1, line.step - start_));
  const double eta = perStep * static_cast<double>(total_ - line.step);
  // What follows the loss (fp16's scale, GRPO's scores), two spaces apart
  // like every other figure.
  const size_t from = line.extra.find_first_not_of(' ');
  const std::string extra = from == std::string::npos ? "" : "  " + line.extra.substr(from);
  char mfu[32] = "";
  if (line.mfu >= 0) std::snprintf(mfu, sizeof mfu, "  mfu %.1f%%", 100 * line.mfu);
  char figures[256];
  std::snprintf(figures, sizeof figures, "loss %.4f%s  lr %.2e  gnorm %.3g%s  %.0f %s  mem %.0f/%.0f MiB  ETA %s",
                line.loss, extra.c_str(), line.lr, line.grad_norm, mfu, line.rate, rateLabel_.c_str(),
                line.mem_mb, line.peak_mem_mb, formatDuration(eta).c_str());
  if (bar_) {
    const int width = 24;
    const int filled = static_cast<int>(width * line.step / std::max<int64_t>(1, total_));
    std::string bar(filled, '#');
    bar.resize(width, '.');
    std::printf("\r[%s] step %lld/%lld  %s ", bar.c_str(), static_cast<long long>(line.step),
                static_cast<long long>(total_), figures);
    std::fflush(stdout);
    barShown_ = true;
  } else if (logLine) {
    std::printf("step %lld/%lld  %s\n", static_cast<long long>(line.step), static_cast<long long>(total_), figures);
    std::fflush(stdout);
  }
}

void Progress::clearBar() {
  if (barShown_) {
    std::printf("\n");
    barShown_ = false;
  }
}

void Progress::note(const std::string& message) {
  if (!active_) return;
  clearBar();
  std::printf("%s\n", message.c_str());
  std::fflush(stdout);
}

void Progress::finish() {
  if (!active_) return;
  clearBar();
  std::fflush(stdout);
}

std::string formatEval(int64_t step, const std::map<std::string, double>& eval) {
  std::ostringstream os;
  os << "eval @ step " << step << ":";
  for (const auto& [k, v] : eval) os << "  " << k << " " << v;
  return os.str();
}

}  // namespace ptrain
