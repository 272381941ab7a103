// ptrain plugins: every plugin found on the search path, one per line.
#include <cstdio>

#include "cli/commands.h"
#include "ptrain/plugin/registry.h"

namespace ptrain::cli {

int cmdPlugins(const std::vector<std::string>& extraPaths) {
  PluginRegistry registry(PluginRegistry::defaultSearchPath(extraPaths));
  const auto& plugins = registry.plugins();
  std::printf("%-10s %-14s %-9s %s\n", "KIND", "NAME", "VERSION", "PATH");
  for (const auto& p : plugins) {
    std::printf("%-10s %-14s %-9s %s\n", p.kind.c_str(), p.name.c_str(), p.version.c_str(), p.path.c_str());
  }
  return 0;
}

}  // namespace ptrain::cli
