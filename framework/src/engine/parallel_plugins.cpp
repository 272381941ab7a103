#include "ptrain/engine/parallel_plugins.h"

namespace ptrain {

std::vector<std::string> parallelPluginsFor(const LayoutSizes& sizes) {
  std::vector<std::string> names;
  if (sizes.tp > 1) names.push_back("tensor");
  if (sizes.cp > 1) names.push_back("context");
  if (sizes.ep > 1) names.push_back("expert");
  if (sizes.pp > 1) names.push_back("pipeline");
  names.push_back("data");
  return names;
}

}  // namespace ptrain
