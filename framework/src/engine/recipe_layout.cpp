#include "ptrain/engine/recipe_layout.h"

#include <map>
#include <memory>
#include <optional>

#include "ptrain/core/text.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain {
namespace {

std::optional<int64_t> optionalInt(const Recipe& recipe, const char* key) {
  if (!recipe.has(key)) return std::nullopt;
  return recipe.getInt(key);
}

// parallel.groups' entries into the request, each problem one line at the
// entry's key.
void readGroups(const Recipe& recipe, LayoutRequest& q) {
  const std::string key = "parallel.groups";
  const auto entries = recipe.getMapList(key);
  if (entries.empty()) {
    q.group_problems.push_back(recipe.location(key).str() + ": " + key +
                               " is empty: give one entry per device group, e.g. [{ranks: 4, "
                               "tensor_model_parallel_size: 2}, {ranks: 2}], or remove it");
    return;
  }
  const char* known = "name, ranks, tensor_model_parallel_size, pipeline_model_parallel_size, "
                      "virtual_pipeline_model_parallel_size, expert_model_parallel_size, expert_tensor_parallel_size, "
                      "micro_batch_size, share";
  // Each group's name (its given one, or the group<i> it gets) and the
  // entry that first had it: metrics, `ptrain doctor` and checkpoints name
  // groups by it, so two may not share one.
  std::map<std::string, std::string> named;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Recipe::MapEntry& entry = entries[i];
    const std::string path = key + "[" + std::to_string(i) + "]";
    LayoutRequest::Group g;
    g.where = entry.at.str();
    bool hasRanks = false;
    std::string nameAt = entry.at.str() + ": " + path;
    for (const Recipe::MapField& f : entry.fields) {
      const std::string at = f.at.str() + ": " + path + "." + f.key + ": ";
      if (f.key == "name") nameAt = f.at.str() + ": " + path + ".name";
      auto wholeAtLeastOne = [&](int64_t* out) {
        int64_t v = 0;
        if (!text::parseInt(f.value, &v) || v < 1) {
          q.group_problems.push_back(at + "expected an integer >= 1, got '" + f.value + "'");
          return false;
        }
        *out = v;
        return true;
      };
      if (f.key == "name") {
        g.name = f.value;
      } else if (f.key == "ranks") {
        wholeAtLeastOne(&g.ranks);
        hasRanks = true;
      } else if (f.key == "tensor_model_parallel_size") {
        wholeAtLeastOne(&g.tp);
      } else if (f.key == "pipeline_model_parallel_size") {
        wholeAtLeastOne(&g.pp);
      } else if (f.key == "virtual_pipeline_model_parallel_size") {
        wholeAtLeastOne(&g.vpp);
      } else if (f.key == "expert_model_parallel_size") {
        wholeAtLeastOne(&g.ep);
      } else if (f.key == "expert_tensor_parallel_size") {
        int64_t v = 0;
        if (wholeAtLeastOne(&v)) g.etp = v;
      } else if (f.key == "micro_batch_size") {
        int64_t v = 0;
        if (wholeAtLeastOne(&v)) g.micro_batch_size = v;
      } else if (f.key == "share") {
        double v = 0;
        if (!text::parseFloat(f.value, &v) || !(v > 0)) {
          q.group_problems.push_back(at + "expected a number > 0, got '" + f.value + "'");
        } else {
          g.share = v;
        }
      } else {
        q.group_problems.push_back(at + "unknown key; a device group takes " + known);
      }
    }
    if (!hasRanks) {
      q.group_problems.push_back(entry.at.str() + ": " + path +
                                 ": no ranks: give the group's rank count, e.g. ranks: 4");
    }
    const std::string name = g.name.empty() ? "group" + std::to_string(i) : g.name;
    const auto [first, fresh] = named.emplace(name, path);
    if (!fresh) {
      q.group_problems.push_back(nameAt + ": '" + name + "' already names " + first->second +
                                 "; give each device group a name of its own");
    }
    q.groups.push_back(std::move(g));
  }
}

}  // namespace

LayoutRequest layoutRequestFromRecipe(const Recipe& recipe, int worldSize) {
  LayoutRequest q;
  q.world = worldSize;
  q.tp = recipe.getInt("parallel.tensor_model_parallel_size");
  q.cp = recipe.getInt("parallel.context_parallel_size");
  q.pp = recipe.getInt("parallel.pipeline_model_parallel_size");
  q.vpp = recipe.getInt("parallel.virtual_pipeline_model_parallel_size");
  q.ep = recipe.getInt("parallel.expert_model_parallel_size");
  q.etp = recipe.getInt("parallel.expert_tensor_parallel_size");
  q.sequence_parallel = recipe.getBool("parallel.sequence_parallel");
  q.pipeline_schedule = recipe.getString("parallel.pipeline_schedule");
  if (recipe.has("parallel.pipeline_layout")) q.pipeline_layout = recipe.getIntList("parallel.pipeline_layout");

  q.num_layers = optionalInt(recipe, "model.num_layers");
  q.hidden_size = optionalInt(recipe, "model.hidden_size");
  q.num_attention_heads = optionalInt(recipe, "model.num_attention_heads");
  q.ffn_hidden_size = optionalInt(recipe, "model.ffn_hidden_size");
  q.seq_length = optionalInt(recipe, "model.seq_length");
  q.num_experts = optionalInt(recipe, "model.num_experts");
  q.moe_router_topk = optionalInt(recipe, "model.moe_router_topk");

  q.global_batch_size = recipe.getInt("train.global_batch_size");
  q.micro_batch_size = optionalInt(recipe, "train.micro_batch_size");
  if (recipe.has("parallel.data_parallel_shares")) q.data_parallel_shares = recipe.getFloatList("parallel.data_parallel_shares");
  if (recipe.has("parallel.groups")) readGroups(recipe, q);

  for (const auto& key : recipe.keysUnder("")) {
    if (recipe.isExplicit(key)) q.written.insert(key);
  }
  // A copy: the request may outlive the recipe it was read from.
  auto source = std::make_shared<const Recipe>(recipe);
  q.where = [source](const std::string& key) {
    if (source->isExplicit(key)) return source->location(key).str();
    // A default has no place in any file; point at the section it belongs to.
    return source->location(key.substr(0, key.find('.'))).str();
  };
  return q;
}

void applyModelShape(LayoutRequest& q, const plan::ModelShape& shape) {
  q.num_layers = shape.num_layers;
  q.hidden_size = shape.hidden;
  q.num_attention_heads = shape.heads;
  q.ffn_hidden_size = shape.ffn;
  q.seq_length = shape.seq;
  q.num_experts = shape.num_experts;
  q.moe_router_topk = shape.topk;
}

ParallelLayout layoutFromRecipe(const Recipe& recipe, int worldSize) {
  LayoutSizes s;
  s.world = worldSize;
  s.tp = static_cast<int>(recipe.getInt("parallel.tensor_model_parallel_size"));
  s.cp = static_cast<int>(recipe.getInt("parallel.context_parallel_size"));
  s.pp = static_cast<int>(recipe.getInt("parallel.pipeline_model_parallel_size"));
  s.vpp = static_cast<int>(recipe.getInt("parallel.virtual_pipeline_model_parallel_size"));
  s.ep = static_cast<int>(recipe.getInt("parallel.expert_model_parallel_size"));
  // Megatron: the expert tensor-parallel size defaults to the dense one.
  s.etp = recipe.isExplicit("parallel.expert_tensor_parallel_size")
              ? static_cast<int>(recipe.getInt("parallel.expert_tensor_parallel_size"))
              : s.tp;
  return ParallelLayout(s);
}

std::vector<std::string> checkLayout(const Recipe& recipe, int worldSize) {
  return checkLayout(layoutRequestFromRecipe(recipe, worldSize));
}

std::vector<std::string> layoutWarnings(const Recipe& recipe, int worldSize) {
  return layoutWarnings(layoutRequestFromRecipe(recipe, worldSize));
}

LayoutPlan planLayout(const Recipe& recipe, int worldSize) {
  return planLayout(layoutRequestFromRecipe(recipe, worldSize));
}

bool writesAutoLayout(const Recipe& recipe) {
  try {
    return recipe.getString("parallel") == "auto";
  } catch (const ConfigError&) {
    return false;  // a section of keys, or nothing: the recipe's own layout
  }
}

}  // namespace ptrain
