// The `llm_grpo` trainer plugin's one exported descriptor.
#include "grpo_trainer.h"

PTRAIN_DEFINE_PLUGIN(::ptrain::plugin_kind::kTrainer, "llm_grpo", "0.1.0", ::ptrain::grpo::GrpoTrainer)
