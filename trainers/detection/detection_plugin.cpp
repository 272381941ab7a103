// The `detection` trainer plugin's one exported descriptor.
#include "detection_trainer.h"

PTRAIN_DEFINE_PLUGIN(::ptrain::plugin_kind::kTrainer, "detection", "0.1.0", ::ptrain::detection::DetectionTrainer)
