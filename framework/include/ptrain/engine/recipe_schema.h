// The schema one recipe is checked against: the core's keys and the keys of
// the plugins that recipe uses, each owned by its plugin.
//
// The plugins a recipe uses: its trainer (trainer.name: Trainer::describeKeys
// and its descriptor's keys), its precision plugin (precision.name), its
// offload plugin (offload.name), its comm plugin (communication.backend;
// `auto`: every one it may pick) and the parallel plugins its layout needs
// (the parallel.* sizes, engine/parallel_plugins.h). A key only an installed
// plugin the recipe does not use reads is refused with that plugin's name and
// the key that would choose it (Schema::addUnused), as an unknown key is.
//
// Thread-safety: uses the registry, which belongs to one thread.
#pragma once

#include "ptrain/core/error.h"
#include "ptrain/recipe/schema.h"

namespace ptrain {

class PluginRegistry;
class Recipe;
class Trainer;

// Adds to `schema` (holding the core's keys, describeCoreKeys) the keys of
// the plugins `probe` uses, and marks those of the installed plugins it does
// not use. `probe` is read through the core's keys only: validate it against
// them first (Recipe::validate with allowUnknown). `trainer`: the recipe's
// trainer, or null (then only its descriptor's keys, if it is installed).
// Throws PluginLoadError when the registry cannot scan its search path.
PTRAIN_API void addPluginKeys(Schema& schema, const Recipe& probe, PluginRegistry& registry, const Trainer* trainer);

// Every key of every installed plugin, each owned by its plugin (for `ptrain
// keys`), after the core's; trainers' keys only with `withTrainers`.
PTRAIN_API Schema installedKeys(PluginRegistry& registry, bool withTrainers);

}  // namespace ptrain
