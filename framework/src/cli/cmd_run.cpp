// ptrain run: its implementation arrives with the part it belongs to.
#include "cli/commands.h"
#include "ptrain/core/error.h"

namespace ptrain::cli {
int cmdRun(const RunArgs&) { throw ConfigError("ptrain run: not built yet"); }
}  // namespace ptrain::cli
