#include "ptrain/nn/parameter_seed.h"

#include "ptrain/nn/parameter_init.h"

namespace ptrain {

uint64_t parameterSeed(uint64_t baseSeed, const std::string& name) {
  uint64_t hash = 1469598037103934211ULL;
  for (unsigned char ch : name) hash = (hash ^ ch) * 1099511628211ULL;
  return nn::splitmix64(baseSeed + hash * 0x9E3779B97F4A7C15ULL);
}

}  // namespace ptrain
