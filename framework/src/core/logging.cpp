#include "ptrain/core/logging.h"

#include <mutex>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace ptrain {
namespace {

std::mutex gMutex;
std::shared_ptr<spdlog::logger> gLogger;

std::shared_ptr<spdlog::logger> makeLogger(int rank, int worldSize, const std::string& level) {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto log = std::make_shared<spdlog::logger>("ptrain", sink);
  // The launcher already prefixes worker output with the rank; a worker
  // started by another launcher (torchrun, srun, mpirun) gets it here.
  std::string pattern = "%^%l%$: %v";
  if (worldSize > 1 && std::getenv("PTRAIN_WORKER") == nullptr) {
    pattern = "[rank " + std::to_string(rank) + "] " + pattern;
  }
  log->set_pattern(pattern);
  log->set_level(spdlog::level::from_str(level));
  log->flush_on(spdlog::level::info);
  return log;
}

}  // namespace

void initLogging(int rank, int worldSize, const std::string& level) {
  std::lock_guard<std::mutex> lock(gMutex);
  gLogger = makeLogger(rank, worldSize, level);
}

std::shared_ptr<spdlog::logger> logger() {
  std::lock_guard<std::mutex> lock(gMutex);
  if (!gLogger) gLogger = makeLogger(0, 1, "info");
  return gLogger;
}

}  // namespace ptrain
