// Seeds for initialising parameters independently of the layout.
#pragma once

#include <cstdint>
#include <string>

#include "ptrain/core/error.h"

namespace ptrain {

// The seed of one parameter's own generator. A model draws each parameter
// from a stream of its own, seeded by the model's seed and the parameter's
// full name, so every layout (a rank builds only its shards or its pipeline
// stage, in any order) draws the same values for it as one rank does.
// FNV-1a over the name, mixed with the base seed by splitmix64's finaliser.
PTRAIN_API uint64_t parameterSeed(uint64_t baseSeed, const std::string& name);

}  // namespace ptrain
