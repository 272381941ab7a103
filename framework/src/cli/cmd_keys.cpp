// ptrain keys: every recipe key the core knows, as a terminal table or as the
// markdown table kept in docs/recipes.md.
#include <cstdio>

#include "cli/commands.h"
#include "ptrain/recipe/schema.h"

namespace ptrain::cli {

int cmdKeys(bool markdown) {
  Schema schema;
  describeCoreKeys(schema);
  const std::string out = markdown ? schema.markdown() : schema.text();
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace ptrain::cli
