// ptrain plugins: its implementation arrives with the part it belongs to.
#include "cli/commands.h"
#include "ptrain/core/error.h"

namespace ptrain::cli {
int cmdPlugins(const std::vector<std::string>&) { throw ConfigError("ptrain plugins: not built yet"); }
}  // namespace ptrain::cli
