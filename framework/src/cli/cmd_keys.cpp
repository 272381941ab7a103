// ptrain keys: every recipe key the core and the installed plugins know (each
// plugin's under its name), as a terminal table or as the markdown table kept
// in docs/recipes.md; with --trainer NAME, followed by the keys that trainer
// plugin adds (found on the default plugin search path);
// with --nccl, the NCCL variables the communication.nccl map accepts instead.
#include <cstdio>

#include "cli/commands.h"
#include "ptrain/comm/nccl_settings.h"
#include "ptrain/core/logging.h"
#include "ptrain/engine/recipe_schema.h"
#include "ptrain/engine/trainer.h"
#include "ptrain/plugin/registry.h"
#include "ptrain/recipe/schema.h"

namespace ptrain::cli {

int cmdKeys(bool markdown, const std::string& trainer, bool nccl) {
  if (nccl) {
    const std::string out = markdown ? nccl::variablesMarkdown() : nccl::variablesText();
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  // The core's keys, then each installed plugin's (found on the default
  // search path), under its name.
  PluginRegistry registry(PluginRegistry::defaultSearchPath({}));
  const Schema schema = installedKeys(registry, /*withTrainers=*/false);
  std::string out = markdown ? schema.markdown() : schema.text();
  if (!trainer.empty()) {
    // Throws PluginLoadError (one line, exit 2) for a trainer that is not found.
    PluginContext ctx;
    ctx.logger = logger();
    std::unique_ptr<Plugin> plugin = registry.create(plugin_kind::kTrainer, trainer, ctx, "--trainer");
    Schema own;
    static_cast<const Trainer&>(*plugin).describeKeys(own);
    out += markdown ? "\n## Keys of trainer `" + trainer + "`\n\n" + own.markdown()
                    : "\nkeys of trainer " + trainer + ":\n" + own.text();
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace ptrain::cli
