// The process-wide logger, owned by the core and handed to plugins through
// PluginContext. Messages are prefixed with the rank when there is more than
// one; only errors go to stderr.
#pragma once

#include <memory>
#include <string>

#include "ptrain/core/error.h"

namespace spdlog {
class logger;
}

namespace ptrain {

// (Re)configures the logger: level is trace|debug|info|warn|error.
PTRAIN_API void initLogging(int rank, int worldSize, const std::string& level = "info");
// The logger; usable before initLogging (then: rank 0, level info).
PTRAIN_API std::shared_ptr<spdlog::logger> logger();

}  // namespace ptrain
