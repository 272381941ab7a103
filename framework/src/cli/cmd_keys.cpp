// ptrain keys: its implementation arrives with the part it belongs to.
#include "cli/commands.h"
#include "ptrain/core/error.h"

namespace ptrain::cli {
int cmdKeys(bool) { throw ConfigError("ptrain keys: not built yet"); }
}  // namespace ptrain::cli
