// Environment settings that make libtorch's math libraries use this host
// well, given to every worker process the launcher starts.
//
// - OMP_WAIT_POLICY=PASSIVE, where two thread pools share the cores: idle
//   OpenMP threads sleep instead of spinning, as libtorch's OpenMP pool and
//   OpenBLAS's own threads take turns at the rank's cores and spinning OpenMP
//   threads take them from the GEMMs. Not with ptrain's host kernels
//   (nn/host_kernels.h), where OpenMP is the only pool: there OpenMP's default
//   (spin briefly, then sleep) hands work to its threads sooner.
// - OPENBLAS_CORETYPE: OpenBLAS picks its kernels from the CPU's model
//   number, and a release older than the CPU (Debian 12's 0.3.21 on Sapphire
//   Rapids, for one) falls back to its SSE3 "Prescott" kernels, several times
//   slower. When the kernels OpenBLAS chose need less than the CPU offers, the
//   workers are told the kernel set the CPU's features support (SkylakeX for
//   AVX-512, Haswell for AVX2 with FMA, Sandybridge for AVX).
//
// A variable the user set is never replaced.
//
// Not part of the plugin SDK: this header belongs to the ptrain_launch
// library (with launch/launcher.h), which the ptrain command line and the
// bench link and libptrain_core.so does not.
#pragma once

#include <string>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain {

struct HostTuning {
  std::vector<std::string> env;    // "KEY=VALUE" for the workers
  std::vector<std::string> notes;  // one line per setting worth telling the user about
};

// What to add to the workers' environment, from this process's environment,
// its CPU and the OpenBLAS it has loaded (none of it when BLAS is not OpenBLAS).
// `oneThreadPool`: the workers run ptrain's host kernels.
PTRAIN_API HostTuning hostTuning(bool oneThreadPool = false);

// The OpenBLAS kernel set this CPU's features support ("SkylakeX", "Haswell",
// "Sandybridge"), or "" for none of them.
PTRAIN_API std::string openblasCoreTypeForCpu();

// The kernel set the loaded OpenBLAS chose (openblas_get_corename, lower case),
// or "" when OpenBLAS is not loaded.
PTRAIN_API std::string openblasCoreInUse();

// Orders kernel set names by the instructions they need: 0 SSE only,
// 1 AVX, 2 AVX2 + FMA, 3 AVX-512. Case-insensitive; unknown names are 0.
PTRAIN_API int openblasCoreLevel(const std::string& coreName);

}  // namespace ptrain
