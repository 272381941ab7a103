// The `llm` trainer plugin's one exported descriptor.
#include "llm_trainer.h"

PTRAIN_DEFINE_PLUGIN(::ptrain::plugin_kind::kTrainer, "llm", "0.1.0", ::ptrain::llm::LlmTrainer)
