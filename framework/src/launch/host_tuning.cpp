#include "ptrain/launch/host_tuning.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace ptrain {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool isSet(const char* name) { return std::getenv(name) != nullptr; }

}  // namespace

int openblasCoreLevel(const std::string& coreName) {
  const std::string n = lower(coreName);
  if (n == "skylakex" || n == "cooperlake" || n == "sapphirerapids") return 3;
  if (n == "haswell" || n == "zen") return 2;
  if (n == "sandybridge") return 1;
  return 0;
}

std::string openblasCoreTypeForCpu() {
#if defined(__x86_64__) || defined(__i386__)
  // __builtin_cpu_supports also checks that the OS saves the vector
  // registers (XGETBV), so a "yes" means the instructions really run.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512cd")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  if (__builtin_cpu_supports("avx")) return "Sandybridge";
#endif
  return "";
}

std::string openblasCoreInUse() {
  using CoreNameFn = char* (*)();
  auto fn = reinterpret_cast<CoreNameFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (fn == nullptr) return "";
  const char* name = fn();
  return name == nullptr ? "" : lower(name);
}

HostTuning hostTuning(bool oneThreadPool) {
  HostTuning t;
  if (!oneThreadPool && !isSet("OMP_WAIT_POLICY")) t.env.emplace_back("OMP_WAIT_POLICY=PASSIVE");
  if (!isSet("OPENBLAS_CORETYPE")) {
    const std::string inUse = openblasCoreInUse();
    const std::string best = openblasCoreTypeForCpu();
    if (!inUse.empty() && !best.empty() && openblasCoreLevel(best) > openblasCoreLevel(inUse)) {
      t.env.push_back("OPENBLAS_CORETYPE=" + best);
      t.notes.push_back("OpenBLAS chose its '" + inUse + "' kernels, older than this CPU; workers use its '" + best +
                        "' kernels (OPENBLAS_CORETYPE=" + best + "; set it yourself to choose another)");
    }
  }
  return t;
}

}  // namespace ptrain
