// The fp16 loss scale: a constant, or dynamic with Megatron-LM's semantics
// (megatron/core/optimizer/grad_scaler.py, DynamicGradScaler), so a recipe
// moved from Megatron sees the same scale step for step:
//
//   overflow: the clean-step count restarts at 0 and the hysteresis counter
//             drops by one; at or below 0 the scale is multiplied by `backoff`
//             (not below `min_scale`). The counter is not restored by the
//             backoff, so every further overflow backs off again.
//   clean:    the clean-step count grows; when it reaches `window`, it restarts
//             at 0, the hysteresis counter is restored to `hysteresis`, and the
//             scale is multiplied by `growth` (no upper bound). Only a full
//             window restores the hysteresis counter.
//
// The scale is a float32 value, as Megatron keeps it, so the arithmetic (and
// so every scale of a long run) is the same. Torch-free: the precision
// plugin owns one and saves its state in the checkpoint.
#pragma once

#include <cstdint>

#include "ptrain/core/error.h"

namespace ptrain {

struct LossScalerOptions {
  bool dynamic = true;
  float initial_scale = 4294967296.0f;  // 2^32; the constant scale when !dynamic
  float min_scale = 1.0f;
  float growth = 2.0f;
  float backoff = 0.5f;
  int64_t window = 1000;  // clean steps before the scale grows (Megatron's loss_scale_window)
  int64_t hysteresis = 2;  // overflows tolerated before the scale backs off
};

// What a checkpoint keeps of a scaler.
struct LossScalerState {
  float scale = 0;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 0;
};

class PTRAIN_API LossScaler {
 public:
  // Throws ConfigError naming the option when one is out of range.
  explicit LossScaler(const LossScalerOptions& options);

  float scale() const { return state_.scale; }
  bool dynamic() const { return options_.dynamic; }
  // After each step: whether any gradient on any rank was inf or NaN.
  void update(bool foundOverflow);

  const LossScalerState& state() const { return state_; }
  void load(const LossScalerState& state);

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace ptrain
