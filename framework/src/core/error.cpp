#include "ptrain/core/error.h"

namespace ptrain {

// Out-of-line destructors give each exception type one home (its vtable and
// typeinfo live in libptrain_core), so plugins can throw and the CLI can catch
// across library boundaries.
Error::~Error() = default;
ConfigError::~ConfigError() = default;
PluginLoadError::~PluginLoadError() = default;
CommError::~CommError() = default;
PeerFailedError::~PeerFailedError() = default;
TimeoutError::~TimeoutError() = default;
CheckpointError::~CheckpointError() = default;
OutOfMemoryError::~OutOfMemoryError() = default;
InternalError::~InternalError() = default;
NonFiniteError::~NonFiniteError() = default;
StoppedBySignal::~StoppedBySignal() = default;

}  // namespace ptrain
