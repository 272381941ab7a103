// The `recommender` trainer plugin's one exported descriptor.
#include "recommender_trainer.h"

PTRAIN_DEFINE_PLUGIN(::ptrain::plugin_kind::kTrainer, "recommender", "0.1.0", ::ptrain::recommender::RecommenderTrainer)
