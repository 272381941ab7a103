// The recipe's MoE keys (model.num_experts, model.moe_*), read for any
// trainer that builds ptrain::nn::MoeLayer, and the settings that cannot work.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/nn/moe.h"

namespace ptrain {

class Recipe;

struct PTRAIN_API MoeSettings {
  int64_t num_experts = 0;     // 0: a dense model
  int64_t layer_freq = 1;      // model.moe_layer_freq
  nn::MoeConfig routing;       // the routing keys; sizes and layer number are the model's to fill

  static MoeSettings fromRecipe(const Recipe& recipe);
};

// One line each (location, key, what to change): MoE keys set on a dense
// model, moe_pad_expert_input_to_capacity without a capacity factor
// (dropless routing has no capacity), a MoE model under tensor parallelism
// without sequence parallelism (each tensor rank must route its own sequence
// shard, as Megatron requires). `ptrain check` and `ptrain run` both ask it; the layout
// rules (experts divisible by ep, top-k, the expert grid) are checkLayout's.
PTRAIN_API std::vector<std::string> checkMoeSettings(const Recipe& recipe);

}  // namespace ptrain
