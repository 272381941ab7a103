#include "ptrain/plugin/plugin.h"

namespace ptrain {

Plugin::~Plugin() = default;

}  // namespace ptrain
