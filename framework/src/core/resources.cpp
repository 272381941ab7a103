#include "ptrain/core/resources.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ptrain {
namespace {

double epochSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// When this process started, in seconds since the epoch: the kernel's boot
// time plus the process's start in clock ticks since boot (/proc/self/stat,
// field 22, after the command name, which may hold spaces).
double processStartEpochSeconds() {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  std::istringstream fields(close == std::string::npos ? std::string() : line.substr(close + 2));
  std::string field;
  unsigned long long ticks = 0;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
    if (i == 22) ticks = std::strtoull(field.c_str(), nullptr, 10);
  }
  std::ifstream procStat("/proc/stat");
  long long boot = 0;
  for (std::string key; procStat >> key;) {
    if (key == "btime") {
      procStat >> boot;
      break;
    }
  }
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (boot <= 0 || hz <= 0) return epochSeconds();
  return static_cast<double>(boot) + static_cast<double>(ticks) / static_cast<double>(hz);
}

}  // namespace

double peakRssMb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

double currentRssMb() {
  // /proc/self/statm: total and resident pages.
  std::ifstream statm("/proc/self/statm");
  unsigned long long total = 0, resident = 0;
  if (!(statm >> total >> resident)) return 0;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

double epochNow() { return epochSeconds(); }

double secondsSinceLaunch() {
  double start = 0;
  if (const char* launched = std::getenv(kLaunchTimeVariable)) start = std::strtod(launched, nullptr);
  if (start <= 0) start = processStartEpochSeconds();
  return epochSeconds() - start;
}

}  // namespace ptrain
