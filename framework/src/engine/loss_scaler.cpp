#include "ptrain/engine/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace ptrain {

LossScaler::LossScaler(const LossScalerOptions& o) : options_(o) {
  PTRAIN_CHECK_AS(ConfigError, std::isfinite(o.initial_scale) && o.initial_scale > 0,
                  "loss scale: the initial scale must be a positive number, got ", o.initial_scale);
  if (o.dynamic) {
    PTRAIN_CHECK_AS(ConfigError, o.min_scale > 0 && o.min_scale <= o.initial_scale,
                    "loss scale: min_loss_scale must be in (0, initial_loss_scale], got ", o.min_scale);
    PTRAIN_CHECK_AS(ConfigError, o.growth > 1, "loss scale: the growth factor must exceed 1, got ", o.growth);
    PTRAIN_CHECK_AS(ConfigError, o.backoff > 0 && o.backoff < 1, "loss scale: the backoff factor must be in (0, 1), got ",
                    o.backoff);
    PTRAIN_CHECK_AS(ConfigError, o.window > 0, "loss scale: loss_scale_window must be at least 1, got ", o.window);
    PTRAIN_CHECK_AS(ConfigError, o.hysteresis > 0, "loss scale: hysteresis must be at least 1, got ", o.hysteresis);
  }
  state_.scale = o.initial_scale;
  state_.growth_tracker = 0;
  state_.hysteresis_tracker = o.hysteresis;
}

void LossScaler::update(bool foundOverflow) {
  if (!options_.dynamic) return;
  if (foundOverflow) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker -= 1;
    if (state_.hysteresis_tracker <= 0) state_.scale = std::max(state_.scale * options_.backoff, options_.min_scale);
    return;
  }
  state_.growth_tracker += 1;
  if (state_.growth_tracker == options_.window) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker = options_.hysteresis;
    state_.scale = state_.scale * options_.growth;
  }
}

void LossScaler::load(const LossScalerState& state) {
  PTRAIN_CHECK_AS(CheckpointError, std::isfinite(state.scale) && state.scale > 0,
                  "loss scaler state: the scale must be a positive number, got ", state.scale);
  PTRAIN_CHECK_AS(CheckpointError, state.growth_tracker >= 0 && state.growth_tracker < options_.window,
                  "loss scaler state: growth tracker ", state.growth_tracker, " is outside [0, loss_scale_window ",
                  options_.window, ")");
  state_ = state;
}

}  // namespace ptrain
