// ptrain bench-comm: its implementation arrives with the part it belongs to.
#include "cli/commands.h"
#include "ptrain/core/error.h"

namespace ptrain::cli {
int cmdBenchComm(const BenchCommArgs&) { throw ConfigError("ptrain bench-comm: not built yet"); }
}  // namespace ptrain::cli
