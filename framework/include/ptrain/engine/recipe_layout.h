// The layout a recipe asks for: reads parallel.*, the model's shape keys and
// the batch keys of a Recipe into the size-based layout module
// (ptrain/layout/validation.h, ptrain/layout/parallel_layout.h), so that
// module depends on no recipe.
//
// Every function here expects a recipe validated against a schema holding
// the core keys (describeCoreKeys) and throws ConfigError only when a key it
// reads is missing or mistyped (the recipe was not validated). Messages point
// at the recipe: a key the user wrote at its file:line:col or
// `<command line>`, one left at its default at its section (or the recipe
// file).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/layout/model_shape.h"
#include "ptrain/layout/parallel_layout.h"
#include "ptrain/layout/validation.h"

namespace ptrain {

class Recipe;

// The request for `worldSize` ranks. The request keeps its own copy of what
// `where` needs, so it may outlive `recipe`. Its model sizes are the model's
// shape as the trainer reports it (applyModelShape, from
// Trainer::modelShape() after setup): `ptrain run` and `ptrain check` set
// them so. Before a trainer is at hand they are read from the Megatron-named
// model.* keys a trainer declares (keys::addTransformerShape, keys::addMoe),
// and stay unset (not checked) where the recipe has none.
PTRAIN_API LayoutRequest layoutRequestFromRecipe(const Recipe& recipe, int worldSize);

// Sets the request's model sizes (layers, hidden, heads, ffn, sequence,
// experts, top-k) to `shape`'s.
PTRAIN_API void applyModelShape(LayoutRequest& request, const plan::ModelShape& shape);

// The rank grid for `worldSize` ranks. Following Megatron, the expert
// tensor-parallel size is tensor_model_parallel_size unless the recipe sets
// parallel.expert_tensor_parallel_size. Throws ConfigError when the sizes do
// not split the world (run checkLayout first for the full explanation).
PTRAIN_API ParallelLayout layoutFromRecipe(const Recipe& recipe, int worldSize);

// checkLayout, layoutWarnings and planLayout of layoutRequestFromRecipe(recipe, worldSize).
PTRAIN_API std::vector<std::string> checkLayout(const Recipe& recipe, int worldSize);
PTRAIN_API std::vector<std::string> layoutWarnings(const Recipe& recipe, int worldSize);
PTRAIN_API LayoutPlan planLayout(const Recipe& recipe, int worldSize);

// True when the recipe (before validation) writes `parallel: auto`: the
// layout is for `ptrain run` to choose (docs/planning.md).
PTRAIN_API bool writesAutoLayout(const Recipe& recipe);

}  // namespace ptrain
