// Finds plugin libraries, checks their descriptors and creates plugin objects.
//
// Search order: the recipe's `plugins.paths`, then PTRAIN_PLUGIN_PATH
// (colon-separated), then the plugin folder next to the ptrain binary
// (<prefix>/lib/ptrain/plugins). A folder is searched recursively for *.so
// files. When two folders hold a plugin of the same kind and name, the one
// found first wins; two in the same search entry are refused as duplicates.
//
// Thread-safety: a registry is used from one thread. Loaded libraries stay
// mapped until the process exits.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ptrain/plugin/plugin.h"

namespace ptrain {

// One plugin as found on disk.
struct PluginInfo {
  std::string kind;
  std::string name;
  std::string version;
  std::string path;
  std::string build_tag;
  // Its recipe keys (PluginDescriptor::describe_keys); null: none.
  PluginKeysFunction keys = nullptr;
  // A parallel plugin: the layout dimensions it executes ("tp", "dp", ...).
  std::vector<std::string> executes;
};

// The layout dimensions a parallel plugin may execute, in the order the
// engine applies the plugins that execute them: tp, cp, ep, etp, pp, dp.
PTRAIN_API const std::vector<std::string>& layoutDimensions();
PTRAIN_API bool isLayoutDimension(const std::string& name);

class PTRAIN_API PluginRegistry {
 public:
  // `paths` are searched in order; each entry is a folder or a library file.
  explicit PluginRegistry(std::vector<std::string> paths);
  ~PluginRegistry();
  PluginRegistry(const PluginRegistry&) = delete;
  PluginRegistry& operator=(const PluginRegistry&) = delete;

  // The default search path: `recipePaths`, PTRAIN_PLUGIN_PATH, then the
  // build/install plugin folder.
  static std::vector<std::string> defaultSearchPath(
      const std::vector<std::string>& recipePaths = {});

  // Scans every search entry. Throws PluginLoadError for a named file that is
  // missing, a library that is not a ptrain plugin or was built for another
  // ABI/build, and for duplicates. Idempotent.
  void discover();

  // Every plugin found, in search order (shadowed duplicates excluded).
  const std::vector<PluginInfo>& plugins();

  // Creates the plugin `name` of `kind`. Throws PluginLoadError naming what was
  // searched when there is none, or when `name` exists only as another kind.
  // `requestedBy` (e.g. "communication.backend") makes the message point at the
  // recipe key that asked for it.
  std::unique_ptr<Plugin> create(const std::string& kind, const std::string& name,
                                 const PluginContext& ctx,
                                 const std::string& requestedBy = "");

  // Reads and checks one library file; throws PluginLoadError on any problem.
  static PluginInfo inspect(const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ptrain
