#include "ptrain/engine/parameter_seed.h"

namespace ptrain {

uint64_t parameterSeed(uint64_t baseSeed, const std::string& name) {
  uint64_t hash = 1469598037103934211ULL;
  for (unsigned char ch : name) hash = (hash ^ ch) * 1099511628211ULL;
  uint64_t z = baseSeed + hash * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace ptrain
