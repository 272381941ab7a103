// Which parallel plugins execute a layout.
#pragma once

#include <string>
#include <vector>

#include "ptrain/layout/parallel_layout.h"

namespace ptrain {

// In order of application: "tensor" (tp > 1), "context" (cp > 1), "expert"
// (ep > 1; etp only splits experts, so it needs them), "pipeline" (pp > 1), and always "data" last.
PTRAIN_API std::vector<std::string> parallelPluginsFor(const LayoutSizes& sizes);

}  // namespace ptrain
