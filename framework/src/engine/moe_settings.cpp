#include "ptrain/engine/moe_settings.h"

#include "ptrain/recipe/recipe.h"

namespace ptrain {
namespace {

const char* const kMoeKeys[] = {"moe_router_topk",           "moe_layer_freq",     "moe_router_score_function",
                                "moe_router_pre_softmax",    "moe_aux_loss_coeff", "moe_z_loss_coeff",
                                "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity"};

std::string at(const Recipe& recipe, const std::string& key) { return recipe.location(key).str() + ": "; }

}  // namespace

MoeSettings MoeSettings::fromRecipe(const Recipe& recipe) {
  // A trainer declares the keys its model reads (keys::addMoe); one it
  // leaves out keeps the default here.
  MoeSettings s;
  if (recipe.has("model.num_experts")) s.num_experts = recipe.getInt("model.num_experts");
  if (recipe.has("model.moe_layer_freq")) s.layer_freq = recipe.getInt("model.moe_layer_freq");
  nn::MoeConfig& r = s.routing;
  if (recipe.has("model.moe_router_topk")) r.topk = recipe.getInt("model.moe_router_topk");
  if (recipe.has("model.moe_router_score_function")) r.score_function = recipe.getString("model.moe_router_score_function");
  if (recipe.has("model.moe_router_pre_softmax")) r.pre_softmax = recipe.getBool("model.moe_router_pre_softmax");
  if (recipe.has("model.moe_aux_loss_coeff")) r.aux_loss_coeff = recipe.getFloat("model.moe_aux_loss_coeff");
  if (recipe.has("model.moe_z_loss_coeff")) r.z_loss_coeff = recipe.getFloat("model.moe_z_loss_coeff");
  if (recipe.has("model.moe_expert_capacity_factor")) {
    r.capacity_factor = recipe.getFloat("model.moe_expert_capacity_factor");
  }
  if (recipe.has("model.moe_pad_expert_input_to_capacity"))
    r.pad_to_capacity = recipe.getBool("model.moe_pad_expert_input_to_capacity");
  return s;
}

std::vector<std::string> checkMoeSettings(const Recipe& recipe) {
  std::vector<std::string> problems;
  // A trainer whose model has no experts does not declare the keys.
  if (!recipe.has("model.num_experts")) return problems;
  const int64_t experts = recipe.getInt("model.num_experts");
  if (experts == 0) {
    for (const char* k : kMoeKeys) {
      const std::string key = std::string("model.") + k;
      if (recipe.has(key) && recipe.isExplicit(key)) {
        problems.push_back(at(recipe, key) + k + " applies to MoE models only, and model.num_experts is 0; remove it "
                           "or set model.num_experts");
      }
    }
    return problems;
  }
  if (recipe.has("model.moe_pad_expert_input_to_capacity") &&
      recipe.getBool("model.moe_pad_expert_input_to_capacity") && !recipe.has("model.moe_expert_capacity_factor")) {
    problems.push_back(at(recipe, "model.moe_pad_expert_input_to_capacity") +
                       "moe_pad_expert_input_to_capacity pads to the experts' capacity, but routing is dropless "
                       "(no moe_expert_capacity_factor); set model.moe_expert_capacity_factor or remove it");
  }
  const int64_t tp = recipe.getInt("parallel.tensor_model_parallel_size");
  if (tp > 1 && !recipe.getBool("parallel.sequence_parallel")) {
    problems.push_back(at(recipe, "parallel.tensor_model_parallel_size") + "tensor_model_parallel_size=" +
                       std::to_string(tp) + " with a MoE model needs sequence parallelism (each tensor rank routes "
                       "its own sequence shard, as in Megatron-LM); set parallel.sequence_parallel: true");
  }
  return problems;
}

}  // namespace ptrain
