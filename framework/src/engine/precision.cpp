#include "ptrain/engine/precision.h"

#include <cmath>

#include "ptrain/core/text.h"
#include "ptrain/plugin/registry.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain {

PrecisionPlugin::~PrecisionPlugin() = default;

PrecisionSettings PrecisionSettings::fromRecipe(const Recipe& r) {
  PrecisionSettings s;
  s.name = r.getString("precision.name");
  // The loss scale's keys are precision/fp16's: under another plugin they
  // are not in the schema, and the defaults here stand.
  if (r.has("precision.loss_scale")) s.loss_scale = r.getFloat("precision.loss_scale");
  if (r.has("precision.initial_loss_scale")) s.initial_loss_scale = r.getFloat("precision.initial_loss_scale");
  if (r.has("precision.min_loss_scale")) s.min_loss_scale = r.getFloat("precision.min_loss_scale");
  if (r.has("precision.loss_scale_window")) s.loss_scale_window = r.getInt("precision.loss_scale_window");
  if (r.has("precision.hysteresis")) s.hysteresis = r.getInt("precision.hysteresis");
  if (r.has("precision.fp16_lm_cross_entropy")) s.fp16_lm_cross_entropy = r.getBool("precision.fp16_lm_cross_entropy");
  return s;
}

LossScalerOptions PrecisionSettings::scalerOptions() const {
  LossScalerOptions o;
  o.dynamic = loss_scale <= 0;
  o.initial_scale = static_cast<float>(o.dynamic ? initial_loss_scale : loss_scale);
  o.min_scale = static_cast<float>(min_loss_scale);
  o.window = loss_scale_window;
  o.hysteresis = hysteresis;
  return o;
}

namespace {

// "file:line:col: key: ", how a problem line starts.
std::string at(const Recipe& recipe, const std::string& key) { return recipe.location(key).str() + ": " + key + ": "; }

// Loss-scale settings that cannot work together (fp16).
void checkLossScale(const Recipe& recipe, std::vector<std::string>& problems) {
  const PrecisionSettings s = PrecisionSettings::fromRecipe(recipe);
  if (s.loss_scale <= 0 && s.min_loss_scale > s.initial_loss_scale) {
    problems.push_back(at(recipe, "precision.min_loss_scale") + text::formatNumber(s.min_loss_scale) +
                       " is above precision.initial_loss_scale=" + text::formatNumber(s.initial_loss_scale) +
                       "; the dynamic scale starts at the initial one and never goes below the minimum: "
                       "lower min_loss_scale or raise initial_loss_scale");
  }
  for (const char* k : {"loss_scale", "initial_loss_scale", "min_loss_scale"}) {
    const std::string key = std::string("precision.") + k;
    const double v = recipe.getFloat(key);
    // fp16 gradients are scaled in float32: a scale beyond it is inf.
    if (std::isfinite(v) && v > 3.0e38) {
      problems.push_back(at(recipe, key) + text::formatNumber(v) + " does not fit in float32; use at most 2^127");
    }
  }
}

}  // namespace

std::vector<std::string> checkPrecision(const Recipe& recipe, PluginRegistry& registry) {
  std::vector<std::string> problems;
  const std::string name = recipe.getString("precision.name");
  // fp16's keys under another plugin are refused by the schema (they are
  // precision/fp16's own, engine/recipe_schema.h).
  if (recipe.has("precision.loss_scale")) checkLossScale(recipe, problems);
  if (!problems.empty()) return problems;
  // The plugin, made once here: a name no plugin has fails with the installed
  // ones listed, and settings it refuses fail before any worker starts.
  try {
    PluginContext ctx;
    ctx.recipe = &recipe;
    registry.create(plugin_kind::kPrecision, name, ctx, "precision.name");
  } catch (const Error& e) {
    problems.push_back(recipe.location("precision.name").str() + ": " + e.what());
  }
  return problems;
}

}  // namespace ptrain
