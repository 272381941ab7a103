// What this process has used so far, for metrics.
#pragma once

#include "ptrain/core/error.h"

namespace ptrain {

// Peak resident set size of this process, in MiB.
PTRAIN_API double peakRssMb();

}  // namespace ptrain
