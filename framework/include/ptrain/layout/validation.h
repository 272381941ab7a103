// Layout checks: does a recipe's parallel layout split the model, the batch
// and the world it will run on?
//
// Run after Recipe::validate() with a schema holding the core keys (the
// checks read parallel.*, model.* and train.* through the getters). Each
// failure is one line, prefixed with the recipe location of the offending key,
// naming both numbers and what would fit, e.g.
//   recipe.yaml:7:3: pipeline_model_parallel_size=3 does not divide num_layers=8: use 1, 2, 4 or 8, ...
// Model keys a recipe leaves unset (a trainer without attention heads, say)
// are not checked.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/layout/parallel_layout.h"

namespace ptrain {

class Recipe;

// The layout a recipe resolves to for a world size.
struct LayoutPlan {
  LayoutSizes sizes;                     // world, tp, cp, pp, vpp, ep, etp
  int dp = 1;                            // world / (tp * cp * pp)
  int edp = 1;                           // world / (etp * ep * pp)
  int64_t global_batch_size = 0;
  int64_t micro_batch_size = 0;          // train.micro_batch_size, or global / dp when it is not set
  bool micro_batch_size_derived = false; // true when not set in the recipe
  int64_t micro_batches = 0;             // per step and data-parallel rank: global / (micro * dp)
};

// Every reason the recipe cannot run on `worldSize` ranks, one line each;
// empty when it can. Checks: the world splits into tp*pp*cp and into the
// expert grid etp*ep*pp; num_layers splits into pp (times vpp), or
// pipeline_layout has pp*vpp entries summing to num_layers; the schedule
// fits vpp; num_attention_heads and ffn_hidden_size split across tp;
// hidden_size across the heads; num_experts across ep (and moe_router_topk
// fits num_experts); global_batch_size splits into micro_batch_size * dp;
// seq_length splits across cp, and across tp*cp with sequence_parallel.
// Throws ConfigError only when a key it reads is missing or mistyped (the
// recipe was not validated).
PTRAIN_API std::vector<std::string> checkLayout(const Recipe& recipe, int worldSize);

// Settings that are allowed but do nothing or waste work, one line each
// (sequence_parallel with tp=1, fewer micro-batches than pipeline stages,
// expert parallel sizes on a dense model).
PTRAIN_API std::vector<std::string> layoutWarnings(const Recipe& recipe, int worldSize);

// The resolved layout. Throws ConfigError with the first checkLayout()
// message when the recipe does not fit `worldSize`.
PTRAIN_API LayoutPlan planLayout(const Recipe& recipe, int worldSize);

}  // namespace ptrain
