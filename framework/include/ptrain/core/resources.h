// What this process has used so far, for metrics.
#pragma once

#include "ptrain/core/error.h"

namespace ptrain {

// Peak resident set size of this process, in MiB.
PTRAIN_API double peakRssMb();
// Resident set size of this process now, in MiB (0 where /proc is missing).
PTRAIN_API double currentRssMb();

// Seconds since the epoch, now (the wall clock: metrics' `time`).
PTRAIN_API double epochNow();

// The environment variable `ptrain run` gives its workers: the wall-clock
// time (seconds since the epoch) at which the command started.
constexpr const char* kLaunchTimeVariable = "PTRAIN_LAUNCH_TIME";
// Seconds since the job was launched: since kLaunchTimeVariable's time when
// set (a worker of `ptrain run`), else since this process started (a worker
// of torchrun, srun or mpirun).
PTRAIN_API double secondsSinceLaunch();

}  // namespace ptrain
