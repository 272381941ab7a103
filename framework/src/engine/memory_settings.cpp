#include "ptrain/engine/memory_settings.h"

#include "ptrain/engine/offload.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain {

std::vector<std::string> checkMemorySettings(const Recipe& recipe) {
  std::vector<std::string> problems;
  const std::string key = "model.recompute_num_layers";
  // A trainer without recomputation does not declare the keys.
  if (!recipe.has(key)) return problems;
  const int64_t layers = recipe.getInt(key);
  if (!recipe.isExplicit(key) || layers == 0) return problems;
  const std::string where = recipe.location(key).str() + ": ";
  const std::string mode = recipe.getString("model.recompute");
  if (mode != "full") {
    problems.push_back(where + "recompute_num_layers applies to model.recompute: full, and model.recompute is " + mode +
                       "; remove it or set model.recompute: full");
    return problems;
  }
  if (!recipe.has("model.num_layers")) return problems;
  const int64_t pp = recipe.getInt("parallel.pipeline_model_parallel_size");
  const int64_t perStage = (recipe.getInt("model.num_layers") + pp - 1) / pp;
  if (layers > perStage) {
    problems.push_back(where + "recompute_num_layers=" + std::to_string(layers) + " exceeds the " +
                       std::to_string(perStage) + " blocks of a pipeline stage (num_layers / " +
                       "pipeline_model_parallel_size); use at most " + std::to_string(perStage) +
                       ", or 0 for every block");
  }
  return problems;
}

std::vector<std::string> memorySettingWarnings(const Recipe& recipe, int64_t dp, int64_t edp) {
  std::vector<std::string> warnings;
  const std::string key = "optimizer.distributed";
  const bool experts = recipe.has("model.num_experts") && recipe.getInt("model.num_experts") > 0;
  if (recipe.getBool(key) && dp == 1 && (!experts || edp == 1)) {
    warnings.push_back(recipe.location(key).str() + ": optimizer.distributed=true shards the optimizer over the " +
                       "data-parallel group, which has 1 rank here: it saves no memory; set it to false, or " +
                       "run with more ranks than tp * pp * cp");
  }
  for (auto& w : offloadWarnings(recipe)) warnings.push_back(std::move(w));
  return warnings;
}

}  // namespace ptrain
