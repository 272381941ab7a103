// ptrain check: its implementation arrives with the part it belongs to.
#include "cli/commands.h"
#include "ptrain/core/error.h"

namespace ptrain::cli {
int cmdCheck(const CheckArgs&) { throw ConfigError("ptrain check: not built yet"); }
}  // namespace ptrain::cli
